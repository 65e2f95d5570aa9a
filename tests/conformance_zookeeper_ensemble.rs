//! The conformance suite on a 3-node ZooKeeper ensemble on loopback, with
//! the leader killed part-way through: locks keep working, and a hold taken
//! before the failover survives it.

#![cfg(feature = "zookeeper")]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use dlock::engines::conformance::run_each;
use dlock::engines::zookeeper::{ZooKeeperConfig, ZooKeeperEngine};
use dlock::kit::Engine;
use dlock::{Registry, Settings};
use dlock_testkit::assert_still_held;
use dlock_testkit::fixtures::zookeeper::{four_letter, wait_serving, zookeeper_args};
use dlock_testkit::server::{TestServer, free_port};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn conformance_on_an_ensemble_losing_its_leader() {
    let ports: Vec<(u16, u16, u16)> = (0..3).map(|_| (free_port(), free_port(), free_port())).collect();
    let servers: Vec<TestServer> = (0..3)
        .map(|i| TestServer::start_at(ports[i].0, "java", |port| zookeeper_args(port, &ports, i + 1)))
        .collect();
    let addresses: Vec<String> = servers.iter().map(|s| s.address()).collect();
    for address in &addresses {
        wait_serving(address);
    }
    let leader = addresses
        .iter()
        .position(|a| four_letter(a, "srvr").contains("Mode: leader"))
        .expect("a leader");
    let config = ZooKeeperConfig {
        keeper_idle: Duration::from_secs(1),
        ..ZooKeeperConfig::new(addresses.join(","))
    };

    let survivor_engine = Arc::new(ZooKeeperEngine::connect("zk", &config).await.expect("connect"));
    let survivor = Registry::with_engine("zk", survivor_engine, Settings::default()).expect("registry");
    let held = survivor
        .locks("ensemble")
        .get("survivor")
        .lock()
        .await
        .expect("lock");

    let servers = Arc::new(Mutex::new(servers));
    let killer = tokio::spawn({
        let servers = servers.clone();
        async move {
            tokio::time::sleep(Duration::from_secs(3)).await;
            servers.lock().unwrap()[leader].kill();
            println!("ensemble: killed the leader, {}", addresses[leader]);
        }
    });
    run_each(|| async {
        Arc::new(ZooKeeperEngine::connect("zk", &config).await.expect("connect")) as Arc<dyn Engine>
    })
    .await;
    killer.await.expect("killer");

    let peer_engine = Arc::new(ZooKeeperEngine::connect("zk", &config).await.expect("connect"));
    let peer = Registry::with_engine("zk", peer_engine, Settings::default()).expect("registry");
    assert_still_held(held, &peer.locks("ensemble").get("survivor")).await;
}
