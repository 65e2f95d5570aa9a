//! The conformance suite on a real standalone ZooKeeper, started on a free
//! loopback port.

#![cfg(feature = "zookeeper")]

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use dlock::Engine;
use dlock::engines::conformance::server::{TestServer, wait_serving, zookeeper_args};
use dlock::engines::zookeeper::{ZooKeeperConfig, ZooKeeperEngine};

fn server() -> &'static TestServer {
    static SERVER: OnceLock<TestServer> = OnceLock::new();
    SERVER.get_or_init(|| {
        let server = TestServer::start("java", |port| zookeeper_args(port, &[], 0));
        wait_serving(&server.address());
        server
    })
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
