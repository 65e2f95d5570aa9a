//! What TLS costs: dlock's uncontended cycle (lock, release) over TLS
//! against the same over plain TCP, on one server that takes both and a
//! warm pool each, interleaved in blocks in one run. Target ≤ 1.10.
//!
//! - PostgreSQL: `ssl = on` beside plain `host` lines; `verify-full`
//!   against `disable`.
//! - MySQL (MariaDB): `--ssl-*` with `require_secure_transport` off;
//!   `verify-full` against `disable`.
//! - Redis: `--tls-port` beside `--port`; `rediss://` against `redis://`.
//! - ZooKeeper: `secureClientPort` beside `clientPort`, both on Netty;
//!   `verify-full` with a client certificate against `disable`.

mod common;

use std::sync::Arc;

use dlock::engines::mysql::{MysqlConfig, MysqlEngine};
use dlock::engines::postgres::{PostgresConfig, PostgresEngine};
use dlock::engines::redis::{RedisConfig, RedisEngine};
use dlock::engines::zookeeper::{ZooKeeperConfig, ZooKeeperEngine};
use dlock::kit::{Engine, TlsMode};
use dlock::{Lock, Registry, Settings};
use dlock_testkit::certificates::{certificates, tls_files};
use dlock_testkit::fixtures::mysql::MariaDb;
use dlock_testkit::fixtures::postgres::PgServer;
use dlock_testkit::fixtures::redis::redis_args;
use dlock_testkit::fixtures::zookeeper::secured_beside_plain;
use dlock_testkit::server::{TestServer, free_port};

use common::{Contender, Target, uncontended};

const CYCLES: usize = 6_000;
const BLOCK: usize = 100;

/// A lock of its own on `engine`, taken once to warm the pool.
async fn warm_lock(name: &str, engine: Arc<dyn Engine>) -> Lock {
    let registry = Registry::with_engine(name, engine, Settings::default()).expect("registry");
    let lock = registry.locks("bench").get(name);
    for _ in 0..20 {
        lock.lock().await.expect("warm").release().await.expect("warm");
    }
    lock
}

/// Runs the interleaved cycles of `plain` and `tls` on `engine`'s server
/// (process `server`), and adds the row.
async fn compare(engine: &str, server: u32, plain: Lock, tls: Lock) {
    uncontended(
        (engine, "uncontended cycle over TLS"),
        &[
            Contender::floor("dlock over plain TCP", Target::AtMost(1.10)),
            Contender::dlock("dlock over TLS"),
        ],
        (CYCLES, BLOCK),
        server,
        async |who, block| {
            let lock = if who == 0 { &plain } else { &tls };
            for _ in 0..block {
                lock.lock().await.expect("lock").release().await.expect("release");
            }
            None
        },
    )
    .await;
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let certs = certificates();

    let pg = PgServer::start_tls_beside_plain(&certs, "server");
    let with = |mode: TlsMode| PostgresConfig {
        tls_mode: Some(mode),
        tls: tls_files(&certs, Some("ca.crt"), false),
        ..PostgresConfig::new(pg.url())
    };
    let connect = async |mode| {
        Arc::new(PostgresEngine::connect("pg", &with(mode)).await.expect("connect")) as Arc<dyn Engine>
    };
    let plain = warm_lock("pg-plain", connect(TlsMode::Disable).await).await;
    let tls = warm_lock("pg-tls", connect(TlsMode::VerifyFull).await).await;
    compare("postgres", pg.pid(), plain, tls).await;
    drop(pg);

    let my = MariaDb::start_tls_beside_plain(&certs);
    let with = |mode: TlsMode| MysqlConfig {
        tls_mode: Some(mode),
        tls: tls_files(&certs, Some("ca.crt"), false),
        ..MysqlConfig::new(my.url())
    };
    let connect = async |mode| {
        Arc::new(MysqlEngine::connect("my", &with(mode)).await.expect("connect")) as Arc<dyn Engine>
    };
    let plain = warm_lock("my-plain", connect(TlsMode::Disable).await).await;
    let tls = warm_lock("my-tls", connect(TlsMode::VerifyFull).await).await;
    compare("mysql", my.pid(), plain, tls).await;
    drop(my);

    let tls_port = free_port();
    let file = |name: &str| certs.join(name).display().to_string();
    let (cert, key, ca) = (file("server.crt"), file("server.key"), file("ca.crt"));
    let redis = TestServer::start("redis-server", |port| {
        let extra = [
            "--tls-port",
            &tls_port.to_string(),
            "--tls-cert-file",
            &cert,
            "--tls-key-file",
            &key,
            "--tls-ca-cert-file",
            &ca,
            "--tls-auth-clients",
            "no",
        ]
        .map(str::to_owned);
        redis_args(port, &extra.iter().map(String::as_str).collect::<Vec<_>>())
    });
    let plain = RedisConfig::new(format!("redis://{}", redis.address()));
    let tls = RedisConfig {
        tls: tls_files(&certs, Some("ca.crt"), false),
        ..RedisConfig::new(format!("rediss://127.0.0.1:{tls_port}"))
    };
    let connect = async |config: &RedisConfig| {
        Arc::new(RedisEngine::connect("redis", config).await.expect("connect")) as Arc<dyn Engine>
    };
    let plain = warm_lock("redis-plain", connect(&plain).await).await;
    let tls = warm_lock("redis-tls", connect(&tls).await).await;
    compare("redis", redis.pid(), plain, tls).await;
    drop(redis);

    let (zk, plain_port) = secured_beside_plain(&certs);
    let plain = ZooKeeperConfig::new(format!("127.0.0.1:{plain_port}"));
    let tls = ZooKeeperConfig {
        tls_mode: Some(TlsMode::VerifyFull),
        tls: tls_files(&certs, Some("ca.crt"), true),
        ..ZooKeeperConfig::new(zk.address())
    };
    let connect = async |config: &ZooKeeperConfig| {
        Arc::new(ZooKeeperEngine::connect("zk", config).await.expect("connect")) as Arc<dyn Engine>
    };
    let plain = warm_lock("zk-plain", connect(&plain).await).await;
    let tls = warm_lock("zk-tls", connect(&tls).await).await;
    compare("zookeeper", zk.pid(), plain, tls).await;
}
