//! The etcd engine's fixture: one etcd member on free loopback ports, with a
//! temporary data directory, and the launcher the cluster test shares.

use std::time::Duration;

use crate::conformance::server::{TestServer, free_port, server_dir, wait_until};
use crate::conformance::{Breakable, Fixture};

/// One etcd member.
pub struct Etcd {
    /// The server process.
    pub server: TestServer,
}

/// The fixture's lease TTL: a dead holder's locks are free within it.
pub const SESSION_TTL: Duration = Duration::from_secs(2);

impl Fixture for Etcd {
    const NAME: &'static str = "etcd";

    fn start() -> Self {
        let peer = free_port();
        let server = TestServer::start("etcd", |port| etcd_args(port, &[(port, peer)], 0));
        wait_serving(&server.address());
        Etcd { server }
    }

    fn engine_config(&self) -> String {
        format!(
            "kind = \"etcd\"\nendpoints = [\"{}\"]\nsession_ttl = \"{}s\"",
            self.server.address(),
            SESSION_TTL.as_secs()
        )
    }
}

impl Breakable for Etcd {
    fn frees_dead_holder_within(&self) -> (Duration, &'static str) {
        (SESSION_TTL + Duration::from_millis(1500), "lease TTL 2 s")
    }

    fn kill(&mut self) {
        self.server.kill();
    }

    fn restart(&mut self) {
        self.server.restart();
        wait_serving(&self.server.address());
    }

    /// A dead holder's lease TTL, then the next in line's watch.
    fn recovers_within(&self) -> Duration {
        SESSION_TTL + Duration::from_millis(1500)
    }

    /// Revokes every lease: each client's session ends with its holds.
    fn kill_connections(&self) -> bool {
        let address = self.server.address();
        let listed = etcdctl(&address)
            .args(["lease", "list"])
            .output()
            .expect("etcdctl");
        for lease in String::from_utf8_lossy(&listed.stdout).lines().skip(1) {
            let _ = etcdctl(&address).args(["lease", "revoke", lease.trim()]).output();
        }
        true
    }
}

/// Arguments for `etcd` as member `id` (from 0) of `members`, each given as
/// (client port, peer port), all on loopback. Data goes to a fresh
/// directory per member; a restart on the same port keeps it.
pub fn etcd_args(port: u16, members: &[(u16, u16)], id: usize) -> Vec<String> {
    let dir = server_dir("etcd", port);
    let name = |i: usize| format!("m{i}");
    let cluster: Vec<String> = members
        .iter()
        .enumerate()
        .map(|(i, (_, peer))| format!("{}=http://127.0.0.1:{peer}", name(i)))
        .collect();
    let peer = members[id].1;
    [
        "--name".to_owned(),
        name(id),
        "--data-dir".to_owned(),
        dir.join("data").display().to_string(),
        "--listen-client-urls".to_owned(),
        format!("http://127.0.0.1:{port}"),
        "--advertise-client-urls".to_owned(),
        format!("http://127.0.0.1:{port}"),
        "--listen-peer-urls".to_owned(),
        format!("http://127.0.0.1:{peer}"),
        "--initial-advertise-peer-urls".to_owned(),
        format!("http://127.0.0.1:{peer}"),
        "--initial-cluster".to_owned(),
        cluster.join(","),
        "--initial-cluster-state".to_owned(),
        "new".to_owned(),
        "--heartbeat-interval".to_owned(),
        "50".to_owned(),
        "--election-timeout".to_owned(),
        "500".to_owned(),
        "--unsafe-no-fsync".to_owned(),
        "--log-level".to_owned(),
        "error".to_owned(),
        "--logger".to_owned(),
        "zap".to_owned(),
    ]
    .into()
}

/// `etcdctl` against `endpoints`, API v3.
pub fn etcdctl(endpoints: &str) -> std::process::Command {
    let mut command = std::process::Command::new("etcdctl");
    command.env("ETCDCTL_API", "3").arg("--endpoints").arg(endpoints);
    command
}

/// Waits until the member at `address` serves requests (a cluster member
/// only does once it has a leader).
pub fn wait_serving(address: &str) {
    wait_until(
        Duration::from_secs(60),
        || {
            etcdctl(address)
                .args(["endpoint", "health"])
                .output()
                .is_ok_and(|out| out.status.success())
        },
        || format!("etcd at {address} did not serve within 60 s"),
    );
}

/// Whether the member at `address` leads its cluster now.
pub fn is_leader(address: &str) -> bool {
    let Ok(out) = etcdctl(address)
        .args(["endpoint", "status", "-w", "fields"])
        .output()
    else {
        return false;
    };
    let text = String::from_utf8_lossy(&out.stdout);
    let field = |name: &str| {
        text.lines()
            .find(|l| l.starts_with(&format!("\"{name}\" :")))
            .and_then(|l| l.rsplit(' ').next())
            .map(str::to_owned)
    };
    out.status.success() && field("MemberID").is_some() && field("MemberID") == field("Leader")
}

/// One metric's value from the member's `/metrics` page at `address`.
pub fn metric(address: &str, name: &str) -> f64 {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(address).expect("connect to etcd");
    write!(stream, "GET /metrics HTTP/1.0\r\nHost: {address}\r\n\r\n").expect("request");
    let mut page = String::new();
    stream.read_to_string(&mut page).expect("metrics");
    page.lines()
        .find(|l| l.starts_with(name) && l[name.len()..].starts_with(' '))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
        .unwrap_or_else(|| panic!("no {name} in etcd's /metrics"))
}
