//! The Redis engine's fixtures: one redis-server, or a 3-master Redis
//! Cluster, on free loopback ports, with the launchers the Redis tests share.

use std::net::TcpListener;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::conformance::server::{TestServer, free_port};
use crate::conformance::{Breakable, Fixture};

/// One throwaway redis-server.
pub struct Redis {
    /// The server process.
    pub server: TestServer,
}

impl Fixture for Redis {
    const NAME: &'static str = "redis";

    fn start() -> Self {
        Redis {
            server: TestServer::start("redis-server", |port| redis_args(port, &[])),
        }
    }

    fn engine_config(&self) -> String {
        format!(
            "kind = \"redis\"\nurl = \"redis://{}\"\nfence_retention = \"2s\"",
            self.server.address()
        )
    }
}

impl Breakable for Redis {
    fn frees_dead_holder_within(&self) -> (Duration, &'static str) {
        (Duration::from_millis(1000 + 700), "lease 1 s")
    }

    fn kill(&mut self) {
        self.server.kill();
    }

    fn restart(&mut self) {
        self.server.restart();
    }

    fn recovers_within(&self) -> Duration {
        RECOVERY
    }

    fn kill_connections(&self) -> bool {
        kill_clients(&[self.server.port])
    }
}

/// A dead holder's lease (1 s), then a dead waiter's time at the head of
/// the queue (`waiter_ttl`, 3 s), then a poll.
const RECOVERY: Duration = Duration::from_millis(1000 + 3000 + 1000);

/// `CLIENT KILL` of every client of the servers on `ports`, subscribers too.
pub(crate) fn kill_clients(ports: &[u16]) -> bool {
    for port in ports {
        for kind in ["normal", "pubsub"] {
            redis_cli(&["-p", &port.to_string(), "client", "kill", "type", kind]);
        }
    }
    true
}

/// A primary with one replica, watched by 3 sentinels (quorum 2, a primary
/// is down after 1 s of silence).
pub struct RedisSentinel {
    /// The primary at the start (a failover may demote it).
    pub primary: TestServer,
    /// Its replica, which a failover promotes.
    pub replica: TestServer,
    /// The 3 sentinels.
    pub sentinels: Vec<TestServer>,
    /// The password of the data nodes and the sentinels, if set.
    pub password: Option<String>,
}

/// The name the sentinels monitor the primary under.
pub const MASTER_NAME: &str = "dlock-primary";

impl RedisSentinel {
    /// The sentinels' addresses as config urls (with the password, if set).
    pub fn sentinel_urls(&self) -> Vec<String> {
        let auth = self
            .password
            .as_ref()
            .map(|p| format!(":{p}@"))
            .unwrap_or_default();
        self.sentinels
            .iter()
            .map(|s| format!("redis://{auth}{}", s.address()))
            .collect()
    }

    /// `redis-cli` against `port`, with the password if set.
    fn cli(&self, port: u16, args: &[&str]) -> String {
        let port = port.to_string();
        let mut all = vec!["-p", &port];
        if let Some(password) = &self.password {
            all.extend(["-a", password, "--no-auth-warning"]);
        }
        all.extend(args);
        redis_cli(&all)
    }

    /// The port of the primary the sentinels name now.
    pub fn current_primary(&self) -> Option<u16> {
        let answer = self.cli(
            self.sentinels[0].port,
            &["sentinel", "get-master-addr-by-name", MASTER_NAME],
        );
        answer.lines().nth(1)?.trim().parse().ok()
    }

    /// Kills the primary and waits until the sentinels have promoted the
    /// replica; returns how long that took.
    pub fn fail_over(&mut self) -> Duration {
        let started = Instant::now();
        self.primary.kill();
        self.promoted_since(started)
    }

    /// Restarts the primary in place as one the sentinels cannot demote
    /// (`REPLICAOF` renamed away): after a failover it stays a writable
    /// primary, as an old one back before the sentinels reconfigure it.
    /// Returns once the replica follows it again.
    pub fn restart_primary_undemotable(&mut self) {
        let port = self.primary.port;
        let mut args = auth_args(self.password.as_deref());
        args.extend(
            [
                "--rename-command",
                "REPLICAOF",
                "",
                "--rename-command",
                "SLAVEOF",
                "",
            ]
            .map(String::from),
        );
        self.primary.kill();
        self.primary = TestServer::start_at(port, "redis-server", |port| {
            redis_args(port, &args.iter().map(String::as_str).collect::<Vec<_>>())
        });
        let started = Instant::now();
        while !self
            .cli(self.replica.port, &["info", "replication"])
            .contains("master_link_status:up")
        {
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "the replica did not follow the restarted primary"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Has the sentinels promote the replica at once (`SENTINEL FAILOVER`),
    /// the primary still running; returns once they name the replica.
    pub fn force_failover(&mut self) -> Duration {
        let started = Instant::now();
        let answer = self.cli(self.sentinels[0].port, &["sentinel", "failover", MASTER_NAME]);
        assert!(answer.starts_with("OK"), "SENTINEL FAILOVER: {answer}");
        self.promoted_since(started)
    }

    /// Waits until the sentinels name the replica and it is a primary.
    fn promoted_since(&self, started: Instant) -> Duration {
        let replica = self.replica.port;
        while self.current_primary() != Some(replica) {
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "no failover within 30 s"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        while !self.cli(replica, &["role"]).starts_with("master") {
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "the replica was not promoted"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        started.elapsed()
    }
}

impl RedisSentinel {
    /// Brings the failed old primary back as a replica of the new one, as
    /// an operator would (the sentinels would convert it too, within about
    /// 10 s, at their next look); then `primary` and `replica` name their
    /// new roles.
    pub fn rejoin_as_replica(&mut self) {
        let primary = self.replica.port.to_string();
        let port = self.primary.port;
        let auth = auth_args(self.password.as_deref());
        self.primary = TestServer::start_at(port, "redis-server", |port| {
            let mut args = vec!["--replicaof", "127.0.0.1", &primary];
            args.extend(auth.iter().map(String::as_str));
            redis_args(port, &args)
        });
        std::mem::swap(&mut self.primary, &mut self.replica);
    }

    /// Data nodes and sentinels that all require `password`.
    pub fn start_with_password(password: Option<&str>) -> Self {
        let auth = auth_args(password);
        let auth: Vec<&str> = auth.iter().map(String::as_str).collect();
        let primary = TestServer::start("redis-server", |port| redis_args(port, &auth));
        let primary_port = primary.port.to_string();
        let replica = TestServer::start("redis-server", |port| {
            let mut args = vec!["--replicaof", "127.0.0.1", &primary_port];
            args.extend(&auth);
            redis_args(port, &args)
        });
        let dir =
            std::env::temp_dir().join(format!("dlock-sentinel-{}-{}", std::process::id(), primary.port));
        std::fs::create_dir_all(&dir).expect("sentinel dir");
        let sentinel_auth = password
            .map(|p| {
                format!("sentinel auth-pass {MASTER_NAME} {p}\nrequirepass {p}\nsentinel sentinel-pass {p}\n")
            })
            .unwrap_or_default();
        let sentinels: Vec<TestServer> = (0..3)
            .map(|_| {
                TestServer::start("redis-server", |port| {
                    let conf = dir.join(format!("sentinel-{port}.conf"));
                    let text = format!(
                        "port {port}\nbind 127.0.0.1\ndir {}\nsentinel monitor {MASTER_NAME} 127.0.0.1 {primary_port} 2\n\
                         sentinel down-after-milliseconds {MASTER_NAME} 1000\nsentinel failover-timeout {MASTER_NAME} 5000\n{sentinel_auth}",
                        dir.display()
                    );
                    std::fs::write(&conf, text).expect("sentinel.conf");
                    vec![conf.display().to_string(), "--sentinel".to_owned()]
                })
            })
            .collect();
        let fixture = RedisSentinel {
            primary,
            replica,
            sentinels,
            password: password.map(str::to_owned),
        };
        // Ready once every sentinel knows the other two and the replica is in sync.
        let started = Instant::now();
        for sentinel in &fixture.sentinels {
            loop {
                let others = fixture.cli(sentinel.port, &["sentinel", "sentinels", MASTER_NAME]);
                let replicas = fixture.cli(sentinel.port, &["sentinel", "replicas", MASTER_NAME]);
                if others.matches("runid").count() == 2 && replicas.contains("master-link-status\nok") {
                    break;
                }
                assert!(
                    started.elapsed() < Duration::from_secs(60),
                    "sentinels not ready in 60 s"
                );
                std::thread::sleep(Duration::from_millis(100));
            }
        }
        fixture
    }
}

impl Fixture for RedisSentinel {
    const NAME: &'static str = "redis-sentinel";

    fn start() -> Self {
        Self::start_with_password(None)
    }

    fn engine_config(&self) -> String {
        let urls: Vec<String> = self.sentinel_urls().iter().map(|u| format!("\"{u}\"")).collect();
        let password = self
            .password
            .as_ref()
            .map(|p| format!("\npassword = \"{p}\""))
            .unwrap_or_default();
        format!(
            "kind = \"redis-sentinel\"\nsentinels = [{}]\nmaster_name = \"{MASTER_NAME}\"\n\
             fence_retention = \"2s\"{password}",
            urls.join(", ")
        )
    }
}

/// `--requirepass` and `--masterauth` for data nodes, if a password is set.
fn auth_args(password: Option<&str>) -> Vec<String> {
    password
        .map(|p| ["--requirepass", p, "--masterauth", p].map(String::from).into())
        .unwrap_or_default()
}

/// A Redis Cluster of 3 masters.
pub struct RedisCluster {
    /// The 3 masters.
    pub nodes: Vec<TestServer>,
}

impl Fixture for RedisCluster {
    const NAME: &'static str = "redis-cluster";

    fn start() -> Self {
        RedisCluster {
            nodes: redis_cluster(3),
        }
    }

    fn engine_config(&self) -> String {
        let nodes: Vec<String> = self
            .nodes
            .iter()
            .map(|n| format!("\"redis://{}\"", n.address()))
            .collect();
        format!(
            "kind = \"redis-cluster\"\nnodes = [{}]\nfence_retention = \"1s\"",
            nodes.join(", ")
        )
    }
}

impl Breakable for RedisCluster {
    fn frees_dead_holder_within(&self) -> (Duration, &'static str) {
        (Duration::from_millis(1000 + 700), "lease 1 s")
    }

    const CRASHES: bool = false;

    fn kill(&mut self) {
        unreachable!("a cluster is not crashed as a whole")
    }

    fn restart(&mut self) {
        unreachable!("a cluster is not crashed as a whole")
    }

    /// A cluster node (master of a third of the slots) restarted, its
    /// data lost; the others mark it failed and well again meanwhile.
    fn recovers_within(&self) -> Duration {
        RECOVERY + Duration::from_secs(3)
    }

    fn outage(&mut self, pick: u64, down: Duration) -> bool {
        let node = &mut self.nodes[pick as usize % 3];
        node.kill();
        std::thread::sleep(down);
        node.restart();
        let port = node.port.to_string();
        let started = Instant::now();
        while !redis_cli(&["-p", &port, "cluster", "info"]).contains("cluster_state:ok") {
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "cluster not ok within 30 s"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        true
    }

    fn kill_connections(&self) -> bool {
        kill_clients(&self.nodes.iter().map(|n| n.port).collect::<Vec<_>>())
    }
}

/// For the fault suites: a crash of the primary is a failover to the
/// replica, and its restart brings the old primary back as the new one's
/// replica.
impl Breakable for RedisSentinel {
    fn frees_dead_holder_within(&self) -> (Duration, &'static str) {
        (Duration::from_millis(1000 + 700), "lease 1 s")
    }

    fn kill(&mut self) {
        self.fail_over();
    }

    fn restart(&mut self) {
        self.rejoin_as_replica();
    }

    fn recovers_within(&self) -> Duration {
        RECOVERY
    }

    fn kill_connections(&self) -> bool {
        kill_clients(&[self.primary.port])
    }
}

/// Arguments for a throwaway redis-server on `port`, loopback only, nothing
/// persisted; `extra` is appended (a later flag overrides an earlier one).
pub fn redis_args(port: u16, extra: &[&str]) -> Vec<String> {
    // Its own directory: a replica still writes the full sync it receives.
    let dir = std::env::temp_dir().join(format!("dlock-redis-{}-{port}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("redis dir");
    let dir = dir.display().to_string();
    let base = [
        "--port",
        &port.to_string(),
        "--bind",
        "127.0.0.1",
        "--dir",
        &dir,
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

/// Field `name` of an `INFO` answer, parsed (`used_memory`, `used_cpu_sys`,
/// `total_commands_processed`, ...).
pub fn info_field<T: std::str::FromStr>(info: &str, name: &str) -> T {
    info.lines()
        .find_map(|line| line.strip_prefix(name)?.strip_prefix(':'))
        .and_then(|value| value.trim().parse().ok())
        .unwrap_or_else(|| panic!("INFO has no number {name}"))
}
