//! The mysql engine's fixture: a throwaway MariaDB, its data directory made
//! by `mariadb-install-db` in a temporary folder, served by `mariadbd` on a
//! free loopback port and a private socket. Under root it runs as the
//! `mysql` user (`--user`), as MariaDB wants.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::conformance::server::{
    free_port, hand_over, is_root, kill_group, serve, server_dir, server_user, spawn_watched,
};
use crate::conformance::{Breakable, Fixture};

/// The user the tests connect with (over TCP, with a password).
pub const USER: &str = "dlock";
/// [`USER`]'s password.
pub const PASSWORD: &str = "dlock-test";
/// The database the tests use.
pub const DATABASE: &str = "dlock";

/// The mysql engine's fixture, on one MariaDB server.
pub struct Mysql {
    /// The server.
    pub server: MariaDb,
}

impl Fixture for Mysql {
    const NAME: &'static str = "mysql";

    fn start() -> Self {
        Mysql {
            server: MariaDb::start(),
        }
    }

    fn engine_config(&self) -> String {
        format!("kind = \"mysql\"\nurl = \"{}\"", self.server.url())
    }
}

impl Breakable for Mysql {
    fn frees_dead_holder_within(&self) -> (Duration, &'static str) {
        // Rows expire at the lease; a waiter sees it at its next poll (200 ms at most).
        (Duration::from_millis(1000 + 200 + 500), "lease 1 s, next poll")
    }

    fn kill(&mut self) {
        self.server.kill();
    }

    fn restart(&mut self) {
        self.server.restart();
    }

    /// A dead holder's lease, or a dead waiter's turn (`waiter_ttl`, 3 s);
    /// then a poll.
    fn recovers_within(&self) -> Duration {
        Duration::from_millis(1000 + 3000 + 1000)
    }

    fn kill_connections(&self) -> bool {
        let ids = self.server.sql(&format!(
            "SELECT id FROM information_schema.processlist WHERE id <> CONNECTION_ID() AND user = '{USER}'"
        ));
        for id in ids.lines() {
            // Gone already is fine: it ended on its own meanwhile.
            let _ = self.server.try_sql(&format!("KILL CONNECTION {id}"));
        }
        true
    }
}

/// One MariaDB server of the tests.
pub struct MariaDb {
    /// The TCP port it listens on.
    pub port: u16,
    dir: PathBuf,
    child: Child,
}

impl MariaDb {
    /// Makes a data directory, starts the server, and creates the test
    /// user and database; returns once it serves them.
    pub fn start() -> Self {
        let port = free_port();
        let dir = server_dir("dlock-mariadb", port);
        std::fs::create_dir_all(dir.join("data")).expect("data directory");
        // A tmpdir of its own: MariaDB deletes every `#sql*` file in its
        // tmpdir at startup, so servers sharing /tmp break each other.
        std::fs::create_dir_all(dir.join("tmp")).expect("tmp directory");
        hand_over(
            server_user(&["mysql"]),
            &[&dir, &dir.join("data"), &dir.join("tmp")],
        );
        let mut install = Command::new("mariadb-install-db");
        install
            .arg(format!("--datadir={}", dir.join("data").display()))
            .arg(format!("--tmpdir={}", dir.join("tmp").display()))
            .args([
                "--auth-root-authentication-method=normal",
                "--skip-test-db",
                "--no-defaults",
            ]);
        if is_root() {
            install.arg("--user=mysql");
        }
        let installed = install
            .stdout(Stdio::null())
            .output()
            .expect("run mariadb-install-db (scripts/test installs mariadb-server)");
        assert!(
            installed.status.success(),
            "mariadb-install-db failed: {}",
            String::from_utf8_lossy(&installed.stderr)
        );
        let server = MariaDb {
            port,
            child: Self::serve(&dir, port),
            dir,
        };
        server.sql(&format!(
            "CREATE DATABASE {DATABASE}; CREATE USER '{USER}'@'127.0.0.1' IDENTIFIED BY '{PASSWORD}'; \
             GRANT ALL ON {DATABASE}.* TO '{USER}'@'127.0.0.1'"
        ));
        server
    }

    /// Starts the server on `port` and returns once it answers on its socket.
    fn serve(dir: &Path, port: u16) -> Child {
        let socket = dir.join("sock");
        let ready = || {
            let probe = Command::new("mariadb-admin")
                .arg("--no-defaults")
                .arg(format!("--socket={}", socket.display()))
                .args(["-uroot", "--silent", "ping"])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
            probe.is_ok_and(|s| s.success())
        };
        let log = dir.join("error.log");
        serve(
            "mariadbd",
            Duration::from_secs(60),
            Some(&log),
            || Self::spawn(dir, port),
            ready,
        )
    }

    fn spawn(dir: &Path, port: u16) -> Child {
        let mut command = Command::new("mariadbd");
        command
            .arg("--no-defaults")
            .arg(format!("--datadir={}", dir.join("data").display()))
            .arg(format!("--socket={}", dir.join("sock").display()))
            .arg(format!("--pid-file={}", dir.join("pid").display()))
            .arg(format!("--tmpdir={}", dir.join("tmp").display()))
            .arg(format!("--log-error={}", dir.join("error.log").display()))
            .arg(format!("--port={port}"))
            .args([
                "--bind-address=127.0.0.1",
                "--skip-name-resolve",
                "--max-connections=500",
            ])
            // Commits reach the OS at once: a killed server keeps them.
            .args([
                "--innodb-flush-log-at-trx-commit=2",
                "--innodb-buffer-pool-size=32M",
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        if is_root() {
            command.arg("--user=mysql");
        }
        spawn_watched(command, "mariadbd")
    }

    /// `mysql://dlock:dlock-test@127.0.0.1:<port>/dlock`.
    pub fn url(&self) -> String {
        format!("mysql://{USER}:{PASSWORD}@127.0.0.1:{}/{DATABASE}", self.port)
    }

    /// Runs `sql` as root over the private socket; its output, tab-separated, trimmed.
    pub fn sql(&self, sql: &str) -> String {
        self.try_sql(sql)
            .unwrap_or_else(|error| panic!("mariadb {sql:?}: {error}"))
    }

    /// [`Self::sql`], or what the client printed on failure.
    pub fn try_sql(&self, sql: &str) -> Result<String, String> {
        let out = Command::new("mariadb")
            .arg("--no-defaults")
            .arg(format!("--socket={}", self.dir.join("sock").display()))
            .args(["-uroot", "-N", "-B", "-e", sql])
            .output()
            .expect("run mariadb");
        if !out.status.success() {
            return Err(String::from_utf8_lossy(&out.stderr).into_owned());
        }
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
    }

    /// The server process's id (a bench reads its CPU time, with its
    /// children's).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Kills the server (SIGKILL), as a crash would.
    pub fn kill(&mut self) {
        kill_group(&mut self.child);
    }

    /// Starts the crashed server again on its port; returns once it serves.
    pub fn restart(&mut self) {
        self.kill();
        self.child = Self::serve(&self.dir, self.port);
    }
}

impl Drop for MariaDb {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
