//! The conformance suite on a real redis-server, started on a free loopback port.

#![cfg(feature = "redis")]

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use dlock::Engine;
use dlock::engines::conformance::server::{TestServer, redis_args};
use dlock::engines::redis::{RedisConfig, RedisEngine};

fn server() -> &'static TestServer {
    static SERVER: OnceLock<TestServer> = OnceLock::new();
    SERVER.get_or_init(|| TestServer::start("redis-server", |port| redis_args(port, &[])))
}

async fn engine() -> Arc<dyn Engine> {
    let config = RedisConfig {
        url: format!("redis://{}", server().address()),
        tls_ca_file: None,
        connect_timeout: Duration::from_secs(5),
        fence_retention: Duration::from_secs(2),
        waiter_ttl: Duration::from_secs(1),
    };
    Arc::new(RedisEngine::connect("redis", &config).await.expect("connect"))
}

dlock::engines::conformance_suite!(engine);
