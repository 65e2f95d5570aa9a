//! The ZooKeeper engine's fixture: a standalone ZooKeeper on a free loopback
//! port, with the launchers the ZooKeeper tests share (ensembles, four-letter
//! commands, Apache Curator peers).

use std::net::TcpStream;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::conformance::server::TestServer;
use crate::conformance::{Breakable, Fixture};

/// One standalone ZooKeeper.
pub struct ZooKeeper {
    /// The server process.
    pub server: TestServer,
}

impl Fixture for ZooKeeper {
    const NAME: &'static str = "zookeeper";

    fn start() -> Self {
        ZooKeeper { server: zookeeper() }
    }

    fn engine_config(&self) -> String {
        format!(
            "kind = \"zookeeper\"\nconnect = \"{}\"\nsession_timeout = \"2s\"\nkeeper_idle = \"1s\"",
            self.server.address()
        )
    }
}

impl Breakable for ZooKeeper {
    fn frees_dead_holder_within(&self) -> (Duration, &'static str) {
        (Duration::from_millis(2000 + 1500), "session timeout 2 s")
    }

    fn kill(&mut self) {
        self.server.kill();
    }

    fn restart(&mut self) {
        self.server.restart();
        wait_serving(&self.server.address());
    }

    /// A dead holder's session (2 s), then the next in line's watch.
    fn recovers_within(&self) -> Duration {
        Duration::from_millis(2000 + 1500)
    }
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

/// A standalone ZooKeeper on a free loopback port, serving.
pub fn zookeeper() -> TestServer {
    let server = TestServer::start("java", |port| zookeeper_args(port, &[], 0));
    wait_serving(&server.address());
    server
}
