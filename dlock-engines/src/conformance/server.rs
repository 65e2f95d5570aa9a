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
