//! The conformance suite on a real standalone ZooKeeper, started on a free
//! loopback port.

#![cfg(feature = "zookeeper")]

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use dlock::Engine;
use dlock::engines::conformance::server::{TestServer, zookeeper};
use dlock::engines::zookeeper::{ZooKeeperConfig, ZooKeeperEngine};

fn server() -> &'static TestServer {
    static SERVER: OnceLock<TestServer> = OnceLock::new();
    SERVER.get_or_init(zookeeper)
}

async fn engine() -> Arc<dyn Engine> {
    let config = ZooKeeperConfig {
        session_timeout: Duration::from_secs(4),
        keeper_idle: Duration::from_secs(1),
        ..ZooKeeperConfig::new(server().address())
    };
    Arc::new(ZooKeeperEngine::connect("zk", &config).await.expect("connect"))
}

dlock::engines::conformance_suite!(engine);
