//! The conformance suite on a 3-master Redis Cluster on loopback, then a
//! check that every node is empty once leases and retention have run out.

#![cfg(feature = "redis")]

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::Command;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use dlock::Engine;
use dlock::engines::conformance;
use dlock::engines::conformance::server::{TestServer, free_port, redis_args};
use dlock::engines::redis::{RedisClusterConfig, RedisEngine};

struct Cluster {
    nodes: Vec<TestServer>,
}

/// A port whose cluster bus port (port + 10000) is free too.
fn node_port() -> u16 {
    loop {
        let port = free_port();
        if port <= 55_000 && TcpListener::bind(("127.0.0.1", port + 10_000)).is_ok() {
            return port;
        }
    }
}

fn redis_cli(args: &[&str]) -> String {
    let output = Command::new("redis-cli")
        .args(args)
        .output()
        .expect("redis-cli (package redis-tools)");
    String::from_utf8_lossy(&output.stdout).into_owned() + &String::from_utf8_lossy(&output.stderr)
}

fn cluster() -> &'static Cluster {
    static CLUSTER: OnceLock<Cluster> = OnceLock::new();
    CLUSTER.get_or_init(|| {
        let dir: PathBuf = std::env::temp_dir().join(format!("dlock-cluster-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("cluster dir");
        let nodes: Vec<TestServer> = (0..3)
            .map(|_| {
                TestServer::start_at(node_port(), "redis-server", |port| {
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
        Cluster { nodes }
    })
}

fn config() -> RedisClusterConfig {
    RedisClusterConfig {
        nodes: cluster()
            .nodes
            .iter()
            .map(|n| format!("redis://{}", n.address()))
            .collect(),
        connect_timeout: Duration::from_secs(5),
        fence_retention: Duration::from_secs(1),
    }
}

async fn engine() -> Arc<dyn Engine> {
    Arc::new(
        RedisEngine::connect_cluster("cluster", &config())
            .await
            .expect("connect"),
    )
}

dlock::engines::conformance_suite!(engine);

/// The whole suite once more, in one test so the check after it sees every
/// key it made: each node ends up empty.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn no_key_is_left_on_any_node() {
    conformance::run_each(engine).await;
    let deadline = Instant::now() + Duration::from_secs(15);
    for node in &cluster().nodes {
        let port = node.port.to_string();
        // Other tests in this binary may still hold keys: wait for all to expire or go.
        while redis_cli(&["-p", &port, "dbsize"]).trim() != "0" {
            assert!(
                Instant::now() < deadline,
                "keys left on {}: {}",
                node.address(),
                redis_cli(&["-p", &port, "keys", "*"])
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

/// With polling at 1 s, only a sharded pub/sub notification explains a
/// waiter that moves in well under that.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_wakes_the_next_waiter_through_sharded_pubsub() {
    use dlock::config::Polling;
    let settings = dlock::Settings {
        poll: Polling::Constant {
            interval: Duration::from_secs(1),
        },
        waiter_ttl: Duration::from_secs(5),
        ..dlock::engines::conformance::SETTINGS
    };
    let holder_side = dlock::Registry::with_engine("cluster", engine().await, settings);
    let waiter_side = Arc::new(dlock::Registry::with_engine("cluster", engine().await, settings));
    for round in 0..3 {
        let name = format!("wake-{round}");
        let held = holder_side
            .locks("sharded")
            .get(name.as_str())
            .lock()
            .await
            .expect("lock");
        let waiter = {
            let (registry, name) = (waiter_side.clone(), name.clone());
            tokio::spawn(async move {
                let guard = registry.locks("sharded").get(name).lock().await.expect("lock");
                let at = Instant::now();
                guard.release().await.expect("release");
                at
            })
        };
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let released = Instant::now();
        held.release().await.expect("release");
        let took = waiter.await.expect("task") - released;
        assert!(
            took < Duration::from_millis(300),
            "round {round}: waiter moved after {took:?}"
        );
    }
}
