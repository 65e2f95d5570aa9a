//! The conformance suite on a 3-master Redis Cluster on loopback, then a
//! check that every node is empty once leases and retention have run out.

#![cfg(feature = "redis")]

use std::sync::Arc;
use std::time::{Duration, Instant};

use dlock::engines::conformance;
use dlock::engines::redis::{RedisClusterConfig, RedisEngine};
use dlock::kit::ClientSettings;
use dlock::kit::Engine;
use dlock_testkit::fixtures::redis::{RedisCluster, redis_cli};

dlock_testkit::conformance_suite!(RedisCluster);

async fn engine() -> Arc<dyn Engine> {
    dlock_testkit::engine(fixture()).await
}

/// An engine on the cluster that drops waiters silent for `waiter_ttl`.
async fn engine_with(waiter_ttl: Duration) -> Arc<dyn Engine> {
    let config = RedisClusterConfig {
        nodes: fixture()
            .nodes
            .iter()
            .map(|n| format!("redis://{}", n.address()))
            .collect(),
        client: ClientSettings::with_timeout(Duration::from_secs(5)),
        fence_retention: Duration::from_secs(1),
        waiter_ttl,
        credentials: Default::default(),
        tls: Default::default(),
    };
    let engine = RedisEngine::connect_cluster("cluster", &config).await;
    Arc::new(engine.expect("connect"))
}

/// The whole suite once more, in one test so the check after it sees every
/// key it made: each node ends up with no key but the registered label
/// (see `no_key_is_left_behind` in tests/redis.rs).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn no_key_is_left_on_any_node() {
    conformance::run_each(engine).await;
    let deadline = Instant::now() + Duration::from_secs(15);
    for node in &fixture().nodes {
        let port = node.port.to_string();
        // Other tests in this binary may still hold keys: wait for all to expire or go.
        loop {
            let keys = redis_cli(&["-p", &port, "keys", "*"]);
            let left: Vec<&str> = keys
                .lines()
                .filter(|key| !key.is_empty() && !key.starts_with("{dlock:}:label:"))
                .collect();
            if left.is_empty() {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "keys left on {}: {left:?}",
                node.address()
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
        ..dlock::engines::conformance::SETTINGS
    };
    let engine = || engine_with(Duration::from_secs(5));
    let holder_side = dlock::Registry::with_engine("cluster", engine().await, settings).expect("registry");
    let waiter_side =
        Arc::new(dlock::Registry::with_engine("cluster", engine().await, settings).expect("registry"));
    for round in 0..3 {
        let name = format!("wake-{round}");
        let held = holder_side
            .locks("sharded")
            .get(name.as_str())
            .lock()
            .await
            .expect("lock");
        let waiter = dlock_testkit::timed_writer(waiter_side.locks("sharded").get(name.as_str()));
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
