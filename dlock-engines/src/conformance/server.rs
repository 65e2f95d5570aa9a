//! Real servers for engine tests, on free loopback ports. Each server is
//! watched by a small shell loop that kills it when the test process exits,
//! so a server in a `static` does not outlive its test binary.

use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct TestServer {
    pub port: u16,
    program: String,
    args: Vec<String>,
    child: Child,
}

impl TestServer {
    /// Starts `program` with `args(port)` on a free port and waits until it accepts.
    pub fn start(program: &str, args: impl FnOnce(u16) -> Vec<String>) -> Self {
        Self::start_at(free_port(), program, args)
    }

    /// Starts `program` with `args(port)` on `port` and waits until it accepts.
    pub fn start_at(port: u16, program: &str, args: impl FnOnce(u16) -> Vec<String>) -> Self {
        let args = args(port);
        let child = spawn(program, &args);
        let server = TestServer {
            port,
            program: program.to_owned(),
            args,
            child,
        };
        server.wait_ready();
        server
    }

    /// `127.0.0.1:<port>`.
    pub fn address(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// Kills the server (SIGKILL), as a crash would.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Starts the same server again on the same port.
    pub fn restart(&mut self) {
        self.kill();
        self.child = spawn(&self.program, &self.args);
        self.wait_ready();
    }

    fn wait_ready(&self) {
        let started = Instant::now();
        while TcpStream::connect(self.address()).is_err() {
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "{} did not listen on {} within 30 s",
                self.program,
                self.address()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        self.kill();
    }
}

fn spawn(program: &str, args: &[String]) -> Child {
    let child = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {program} (scripts/test installs it): {e}"));
    let watcher = format!(
        "while kill -0 {parent} 2>/dev/null && kill -0 {child} 2>/dev/null; do sleep 0.5; done; kill -9 {child} 2>/dev/null",
        parent = std::process::id(),
        child = child.id()
    );
    let mut watcher = Command::new("sh")
        .args(["-c", &watcher])
        .stdin(Stdio::null())
        .spawn()
        .expect("start the server's watcher");
    // Reaped in the background so it leaves no zombie.
    std::thread::spawn(move || watcher.wait());
    child
}

/// A port nothing listens on now (the OS picks it; a race with another
/// process taking it first is possible but rare on a test machine).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("free port")
}

/// Arguments for a throwaway redis-server on `port`, loopback only, nothing
/// persisted; `extra` is appended (a later flag overrides an earlier one).
pub fn redis_args(port: u16, extra: &[&str]) -> Vec<String> {
    let base = [
        "--port",
        &port.to_string(),
        "--bind",
        "127.0.0.1",
        "--save",
        "",
        "--appendonly",
        "no",
    ]
    .map(String::from);
    base.into_iter()
        .chain(extra.iter().map(|a| a.to_string()))
        .collect()
}

/// Arguments for `java` running a throwaway ZooKeeper on `port`, loopback
/// only, data under a fresh directory. `ensemble` lists every member's
/// (client, quorum, election) ports with this member at `id` (from 1);
/// empty for a standalone server. Nothing is synced to disk, and empty
/// containers are swept every 500 ms.
pub fn zookeeper_args(port: u16, ensemble: &[(u16, u16, u16)], id: usize) -> Vec<String> {
    let dir = std::env::temp_dir().join(format!("dlock-zk-{}-{port}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("ZooKeeper data dir");
    let mut cfg = format!(
        "tickTime=200\ninitLimit=50\nsyncLimit=25\ndataDir={}\nclientPort={port}\n\
         clientPortAddress=127.0.0.1\nminSessionTimeout=400\nmaxSessionTimeout=60000\n\
         admin.enableServer=false\n4lw.commands.whitelist=*\nforceSync=no\n",
        dir.display()
    );
    for (n, (client, quorum, election)) in ensemble.iter().enumerate() {
        cfg += &format!(
            "server.{}=127.0.0.1:{quorum}:{election};127.0.0.1:{client}\n",
            n + 1
        );
    }
    if !ensemble.is_empty() {
        std::fs::write(dir.join("myid"), id.to_string()).expect("myid");
    }
    let cfg_file = dir.join("zoo.cfg");
    std::fs::write(&cfg_file, cfg).expect("zoo.cfg");
    [
        "-Xmx256m",
        "-XX:+UseSerialGC",
        "-Dznode.container.checkIntervalMs=500",
        "-Dznode.container.maxPerMinute=1000000",
        "-cp",
        "/usr/share/java/zookeeper.jar:/usr/share/java/slf4j-nop.jar",
        "org.apache.zookeeper.server.quorum.QuorumPeerMain",
    ]
    .into_iter()
    .map(String::from)
    .chain([cfg_file.display().to_string()])
    .collect()
}

/// Sends a four-letter command (`srvr`, `cons`, ...) and returns the answer.
pub fn four_letter(address: &str, command: &str) -> String {
    use std::io::{Read, Write};
    let Ok(mut stream) = TcpStream::connect(address) else {
        return String::new();
    };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(2)));
    let _ = stream.write_all(command.as_bytes());
    let mut answer = String::new();
    let _ = stream.read_to_string(&mut answer);
    answer
}

/// Waits until the ZooKeeper at `address` serves requests (an ensemble
/// member only does once a quorum has formed).
pub fn wait_serving(address: &str) {
    let started = Instant::now();
    while !four_letter(address, "srvr").contains("Mode:") {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "ZooKeeper at {address} did not serve within 60 s"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Compiles a Java peer against Debian's Apache Curator (once per process)
/// and returns the classpath to run it with.
pub fn curator_classpath(source: &str) -> String {
    static CLASSES: std::sync::OnceLock<std::path::PathBuf> = std::sync::OnceLock::new();
    let jars = "/usr/share/java/curator-recipes.jar:/usr/share/java/slf4j-nop.jar";
    let classes = CLASSES.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("dlock-curator-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("classes dir");
        let status = Command::new("javac")
            .args(["-cp", jars, "-d"])
            .arg(&dir)
            .arg(source)
            .status()
            .expect("run javac (scripts/test installs it)");
        assert!(status.success(), "javac failed on {source}");
        dir
    });
    format!("{}:{jars}", classes.display())
}

/// A Redis Cluster of `masters` nodes on loopback, created with
/// `redis-cli --cluster create` and waited on until every node says ok.
pub fn redis_cluster(masters: usize) -> Vec<TestServer> {
    let dir = std::env::temp_dir().join(format!("dlock-cluster-{}-{}", std::process::id(), free_port()));
    std::fs::create_dir_all(&dir).expect("cluster dir");
    let nodes: Vec<TestServer> = (0..masters)
        .map(|_| {
            TestServer::start_at(cluster_port(), "redis-server", |port| {
                let conf = dir
                    .join(format!("nodes-{port}.conf"))
                    .to_string_lossy()
                    .into_owned();
                let cluster = [
                    "--cluster-enabled",
                    "yes",
                    "--cluster-config-file",
                    &conf,
                    "--cluster-node-timeout",
                    "3000",
                ];
                redis_args(port, &cluster)
            })
        })
        .collect();
    let addresses: Vec<String> = nodes.iter().map(TestServer::address).collect();
    let mut create = vec!["--cluster", "create"];
    create.extend(addresses.iter().map(String::as_str));
    create.extend(["--cluster-replicas", "0", "--cluster-yes"]);
    let created = redis_cli(&create);
    assert!(
        created.contains("All 16384 slots covered"),
        "cluster create failed:\n{created}"
    );
    let started = Instant::now();
    for node in &nodes {
        let port = node.port.to_string();
        while !redis_cli(&["-p", &port, "cluster", "info"]).contains("cluster_state:ok") {
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "cluster not ok within 30 s"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    nodes
}

/// A free port whose cluster bus port (port + 10000) is free too.
fn cluster_port() -> u16 {
    loop {
        let port = free_port();
        if port <= 55_000 && TcpListener::bind(("127.0.0.1", port + 10_000)).is_ok() {
            return port;
        }
    }
}

/// Runs `redis-cli` (package redis-tools) and returns what it printed.
pub fn redis_cli(args: &[&str]) -> String {
    let output = Command::new("redis-cli")
        .args(args)
        .output()
        .expect("redis-cli (package redis-tools)");
    String::from_utf8_lossy(&output.stdout).into_owned() + &String::from_utf8_lossy(&output.stderr)
}

/// A standalone ZooKeeper on a free loopback port, serving.
pub fn zookeeper() -> TestServer {
    let server = TestServer::start("java", |port| zookeeper_args(port, &[], 0));
    wait_serving(&server.address());
    server
}

/// An example program of this workspace, built by `cargo test` next to the
/// test binaries (`target/<profile>/examples/<name>`).
pub fn example(name: &str) -> std::path::PathBuf {
    let test = std::env::current_exe().expect("test path");
    let dir = test.parent().and_then(|d| d.parent()).expect("target dir");
    let path = dir.join("examples").join(name);
    assert!(
        path.exists(),
        "{} is not built: the whole `cargo test` builds examples (or run `cargo build --examples`)",
        path.display()
    );
    path
}
