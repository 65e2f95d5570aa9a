//! Real servers for engine tests, on free loopback ports. Each server is
//! watched by a small shell loop that kills it when the test process exits,
//! so a server in a `static` does not outlive its test binary.

use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A server process on a loopback port, killed when dropped.
pub struct TestServer {
    /// The port it listens on.
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
        wait_until(
            Duration::from_secs(30),
            || TcpStream::connect(self.address()).is_ok(),
            || format!("{} did not listen on {}", self.program, self.address()),
        );
    }
}

/// Probes every 20 ms until `ready`; panics with `failure` after `limit`.
pub fn wait_until(limit: Duration, mut ready: impl FnMut() -> bool, failure: impl Fn() -> String) {
    let started = Instant::now();
    while !ready() {
        assert!(started.elapsed() < limit, "{} within {limit:?}", failure());
        std::thread::sleep(Duration::from_millis(20));
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        self.kill();
    }
}

fn spawn(program: &str, args: &[String]) -> Child {
    let mut command = Command::new(program);
    command.args(args).stdout(Stdio::null()).stderr(Stdio::null());
    spawn_watched(command, program)
}

/// Spawns `command` in a process group of its own, watched by a small shell
/// loop that kills the whole group (a server and any processes it forked)
/// once the test process exits.
pub fn spawn_watched(mut command: Command, program: &str) -> Child {
    use std::os::unix::process::CommandExt;
    let child = command
        .stdin(Stdio::null())
        .process_group(0)
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {program} (scripts/test installs it): {e}"));
    let watcher = format!(
        "while kill -0 {parent} 2>/dev/null && kill -0 {child} 2>/dev/null; do sleep 0.5; done; env kill -KILL -- -{child} 2>/dev/null",
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

/// Whether the tests run as root: some servers refuse to, or must be told
/// whom to run as.
pub fn is_root() -> bool {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let uids = status.lines().find_map(|l| l.strip_prefix("Uid:"));
    uids.and_then(|ids| ids.split_whitespace().nth(1)) == Some("0")
}

/// Under root, the ids of the first of `users` that exists, for a server
/// that refuses to run as root; `None` when the tests are not root.
pub fn server_user(users: &[&str]) -> Option<(u32, u32)> {
    if !is_root() {
        return None;
    }
    let passwd = std::fs::read_to_string("/etc/passwd").expect("/etc/passwd");
    let ids = |name: &str| {
        let line = passwd.lines().find(|l| l.starts_with(&format!("{name}:")))?;
        let fields: Vec<&str> = line.split(':').collect();
        Some((fields.get(2)?.parse().ok()?, fields.get(3)?.parse().ok()?))
    };
    let found = users.iter().find_map(|u| ids(u));
    Some(found.unwrap_or_else(|| panic!("none of the users {users:?} exists")))
}

/// Gives `paths` to `user` (from [`server_user`]), if there is one.
pub fn hand_over(user: Option<(u32, u32)>, paths: &[&std::path::Path]) {
    if let Some((uid, gid)) = user {
        for path in paths {
            std::os::unix::fs::chown(path, Some(uid), Some(gid)).expect("chown a server's file");
        }
    }
}

/// A fresh, empty `<tmp>/<prefix>-<pid>-<port>` for a server's files. Those
/// of test processes that are gone are removed first: a server kept in a
/// `static` is killed by its watcher, but nothing removes its directory.
pub fn server_dir(prefix: &str, port: u16) -> std::path::PathBuf {
    let tmp = std::env::temp_dir();
    for entry in std::fs::read_dir(&tmp).into_iter().flatten().flatten() {
        let name = entry.file_name();
        let Some(rest) = name
            .to_str()
            .and_then(|n| n.strip_prefix(prefix)?.strip_prefix('-'))
        else {
            continue;
        };
        let owner = rest.split('-').next().unwrap_or_default();
        if !std::path::Path::new("/proc").join(owner).exists() {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
    let dir = tmp.join(format!("{prefix}-{}-{port}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("server directory");
    dir
}

/// A port nothing listens on now (the OS picks it; a race with another
/// process taking it first is possible but rare on a test machine).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("free port")
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
