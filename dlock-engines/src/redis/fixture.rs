//! The Redis engine's fixtures: one redis-server, or a 3-master Redis
//! Cluster, on free loopback ports, with the launchers the Redis tests share.

use std::net::TcpListener;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::conformance::server::{TestServer, free_port};
use crate::conformance::{Breakable, Fixture};

/// One throwaway redis-server.
pub struct Redis {
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
            "kind = \"redis\"\nurl = \"redis://{}\"\nfence_retention = \"2s\"\nwaiter_ttl = \"1s\"",
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
}

/// A Redis Cluster of 3 masters.
pub struct RedisCluster {
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
            "kind = \"redis-cluster\"\nnodes = [{}]\nfence_retention = \"1s\"\nwaiter_ttl = \"1s\"",
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
