//! The postgres engine's fixture: a throwaway cluster, made by `initdb` in
//! a temporary directory, served by `postgres` on a free loopback port and
//! a private socket directory. PostgreSQL refuses to run as root, so under
//! root both run as the `postgres` user (or `nobody`).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::conformance::server::{self, free_port, server_dir, spawn_watched};
use crate::conformance::{Breakable, Fixture};

/// The superuser the fixture's cluster is made with; connections over TCP
/// must give [`PASSWORD`].
pub const USER: &str = "dlock";
/// [`USER`]'s password.
pub const PASSWORD: &str = "dlock-test";

/// The postgres engine's fixture, on one PostgreSQL server.
pub struct Postgres {
    /// The server.
    pub server: PgServer,
}

impl Fixture for Postgres {
    const NAME: &'static str = "postgres";

    fn start() -> Self {
        Postgres {
            server: PgServer::start(),
        }
    }

    fn engine_config(&self) -> String {
        format!("kind = \"postgres\"\nurl = \"{}\"", self.server.url())
    }
}

impl Breakable for Postgres {
    fn frees_dead_holder_within(&self) -> (Duration, &'static str) {
        // A killed holder's socket closes at once and its backend exits; a
        // paused one idles out after its 1 s lease.
        (
            Duration::from_millis(1000 + 700),
            "lease 1 s (idle_session_timeout)",
        )
    }

    fn kill(&mut self) {
        self.server.kill();
    }

    fn restart(&mut self) {
        self.server.restart();
    }

    /// A paused holder's session idles out after its lease; then a poll.
    fn recovers_within(&self) -> Duration {
        Duration::from_millis(1000 + 1000)
    }

    fn kill_connections(&self) -> bool {
        self.server.psql(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity \
             WHERE pid <> pg_backend_pid() AND backend_type = 'client backend'",
        );
        true
    }
}

/// One PostgreSQL server of the tests.
pub struct PgServer {
    /// The TCP port it listens on.
    pub port: u16,
    dir: PathBuf,
    child: Child,
}

impl PgServer {
    /// Makes a cluster and starts it; returns once it accepts connections.
    pub fn start() -> Self {
        let port = free_port();
        let dir = server_dir("dlock-pg", port);
        std::fs::write(dir.join("password"), PASSWORD).expect("password file");
        server::hand_over(server_user(), &[&dir, &dir.join("password")]);
        let initdb = as_server_user(Command::new(bin("initdb")))
            .args([
                "-D",
                "data",
                "-U",
                USER,
                "-E",
                "UTF8",
                "--locale=C.UTF-8",
                "--no-sync",
            ])
            .args([
                "--auth-local=trust",
                "--auth-host=scram-sha-256",
                "--pwfile=password",
            ])
            .current_dir(&dir)
            .stdout(Stdio::null())
            .output()
            .expect("run initdb (scripts/test installs postgresql)");
        assert!(
            initdb.status.success(),
            "initdb failed: {}",
            String::from_utf8_lossy(&initdb.stderr)
        );
        let child = Self::serve(&dir, port);
        PgServer { port, dir, child }
    }

    /// Starts the server on `port` and returns once it accepts connections.
    fn serve(dir: &Path, port: u16) -> Child {
        let ready = || {
            let probe = Command::new(bin("pg_isready"))
                .args(["-q", "-h", "127.0.0.1", "-p", &port.to_string()])
                .status();
            probe.is_ok_and(|s| s.success())
        };
        let log = dir.join("server.log");
        server::serve(
            "postgres",
            Duration::from_secs(60),
            Some(&log),
            || Self::spawn(dir, port),
            ready,
        )
    }

    fn spawn(dir: &Path, port: u16) -> Child {
        let log = std::fs::File::create(dir.join("server.log")).expect("server log");
        let mut command = as_server_user(Command::new(bin("postgres")));
        command
            .args([
                "-D",
                "data",
                "-p",
                &port.to_string(),
                "-k",
                dir.to_str().expect("utf-8 path"),
            ])
            .args(["-c", "listen_addresses=127.0.0.1", "-c", "max_connections=400"])
            .args([
                "-c",
                "shared_buffers=16MB",
                "-c",
                "fsync=off",
                "-c",
                "full_page_writes=off",
            ])
            .current_dir(dir)
            .stdout(Stdio::null())
            .stderr(log);
        spawn_watched(command, "postgres")
    }

    /// A key/value connection string for the superuser.
    pub fn url(&self) -> String {
        format!(
            "host=127.0.0.1 port={} user={USER} password={PASSWORD} dbname=postgres",
            self.port
        )
    }

    /// Runs `sql` through psql on the private socket; its output, trimmed.
    pub fn psql(&self, sql: &str) -> String {
        let out = Command::new(bin("psql"))
            .args([
                "-h",
                self.dir.to_str().expect("utf-8 path"),
                "-p",
                &self.port.to_string(),
            ])
            .args([
                "-U",
                USER,
                "-d",
                "postgres",
                "-XtAq",
                "-v",
                "ON_ERROR_STOP=1",
                "-c",
                sql,
            ])
            .output()
            .expect("run psql");
        assert!(
            out.status.success(),
            "psql {sql:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    }

    /// The server process's id (a bench reads its CPU time, with its
    /// children's).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Kills the server and every backend (SIGKILL), as a crash would.
    pub fn kill(&mut self) {
        server::kill_group(&mut self.child);
    }

    /// Starts the crashed server again on its port; returns once it serves.
    pub fn restart(&mut self) {
        self.kill();
        self.child = Self::serve(&self.dir, self.port);
    }
}

impl Drop for PgServer {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A program of the newest PostgreSQL under `/usr/lib/postgresql/<version>/bin`.
fn bin(program: &str) -> PathBuf {
    let newest = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| Some((e.file_name().to_str()?.parse::<u32>().ok()?, e.path())))
        .max();
    let (_, dir) = newest.expect("no /usr/lib/postgresql/<version> (scripts/test installs postgresql)");
    dir.join("bin").join(program)
}

/// The user the server runs as when the tests run as root.
fn server_user() -> Option<(u32, u32)> {
    server::server_user(&["postgres", "nobody"])
}

fn as_server_user(mut command: Command) -> Command {
    use std::os::unix::process::CommandExt;
    if let Some((uid, gid)) = server_user() {
        command.uid(uid).gid(gid);
    }
    command
}
