//! `rediss://`: a TLS-only redis-server with certificates made at test time.
#![cfg(feature = "redis-tls")]

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use dlock::engines::conformance::SETTINGS;
use dlock::engines::redis::{RedisConfig, RedisEngine};
use dlock::kit::TlsFiles;
use dlock::{Error, Registry};
use dlock_testkit::certificates::certificates;
use dlock_testkit::fixtures::redis::redis_args;
use dlock_testkit::server::TestServer;
use dlock_testkit::timed_writer;

fn tls_server(certs: &Path, auth_clients: &'static str) -> TestServer {
    let file = |name: &str| certs.join(name).to_string_lossy().into_owned();
    TestServer::start("redis-server", |port| {
        let (cert, key, ca, tls_port) = (
            file("server.crt"),
            file("server.key"),
            file("ca.crt"),
            port.to_string(),
        );
        // Plain port off, TLS only: later flags override the defaults.
        let tls = [
            "--port",
            "0",
            "--tls-port",
            &tls_port,
            "--tls-cert-file",
            &cert,
            "--tls-key-file",
            &key,
            "--tls-ca-cert-file",
            &ca,
            "--tls-auth-clients",
            auth_clients,
        ];
        redis_args(port, &tls)
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn locks_and_notifications_work_over_tls() {
    let certs = certificates();
    let server = tls_server(&certs, "no");
    let config = RedisConfig {
        tls: TlsFiles {
            tls_ca_file: Some(certs.join("ca.crt")),
            ..TlsFiles::default()
        },
        fence_retention: Duration::from_secs(1),
        waiter_ttl: Duration::from_secs(1),
        ..RedisConfig::new(format!("rediss://{}", server.address()))
    };
    let engine = Arc::new(
        RedisEngine::connect("tls", &config)
            .await
            .expect("connect over TLS"),
    );
    let registry = Registry::with_engine("tls", engine, SETTINGS).expect("registry");
    let held = registry.locks("tls").get("x").lock().await.expect("lock");
    let waiter = timed_writer(registry.locks("tls").get("x"));
    tokio::time::sleep(Duration::from_millis(500)).await;
    let released = Instant::now();
    held.release().await.expect("release");
    let took = waiter.await.expect("task") - released;
    assert!(took < Duration::from_millis(300), "waiter moved after {took:?}");

    // Without the CA the server's certificate is not trusted: a clear error, no hang.
    let untrusted = RedisConfig {
        tls: TlsFiles::default(),
        ..config.clone()
    };
    let err = RedisEngine::connect("tls", &untrusted)
        .await
        .err()
        .expect("untrusted certificate accepted");
    assert!(matches!(err, Error::Unavailable { .. }), "{err}");

    let plain_with_ca = RedisConfig {
        url: format!("redis://{}", server.address()),
        ..config
    };
    match RedisEngine::connect("tls", &plain_with_ca).await {
        Err(Error::Config { field, .. }) => assert_eq!(field, "engines.tls.tls_ca_file"),
        other => panic!("expected a config error, got {:?}", other.err()),
    }
    std::fs::remove_dir_all(certs).ok();
}

/// A server that checks client certificates admits a client with one
/// signed by its CA, and refuses one without.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_certificate_is_presented_when_the_server_asks() {
    let certs = certificates();
    let server = tls_server(&certs, "yes");
    let without = RedisConfig {
        tls: TlsFiles {
            tls_ca_file: Some(certs.join("ca.crt")),
            ..TlsFiles::default()
        },
        ..RedisConfig::new(format!("rediss://{}", server.address()))
    };
    let err = RedisEngine::connect("mtls", &without)
        .await
        .err()
        .expect("connected without a client certificate");
    assert!(matches!(err, Error::Unavailable { .. }), "{err}");
    let with = RedisConfig {
        tls: TlsFiles {
            tls_cert_file: Some(certs.join("client.crt")),
            tls_key_file: Some(certs.join("client.key")),
            ..without.tls.clone()
        },
        ..without.clone()
    };
    let engine = RedisEngine::connect("mtls", &with)
        .await
        .expect("connect with a client certificate");
    let registry = Registry::with_engine("mtls", Arc::new(engine), SETTINGS).expect("registry");
    let guard = registry.locks("mtls").get("x").lock().await.expect("lock");
    guard.release().await.expect("release");
    std::fs::remove_dir_all(certs).ok();
}

/// RedLock's masters over `rediss://`, each asking for the client's
/// certificate: locks work, and a plain url to a TLS-only master is a
/// clear error at startup.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redlock_masters_are_reached_over_tls() {
    use dlock::engines::redlock::{RedLockConfig, RedLockEngine};
    let certs = certificates();
    let masters: Vec<TestServer> = (0..3).map(|_| tls_server(&certs, "yes")).collect();
    let urls = |scheme: &str| {
        masters
            .iter()
            .map(|m| format!("{scheme}://{}", m.address()))
            .collect()
    };
    let config = RedLockConfig {
        tls: TlsFiles {
            tls_ca_file: Some(certs.join("ca.crt")),
            tls_cert_file: Some(certs.join("client.crt")),
            tls_key_file: Some(certs.join("client.key")),
        },
        ..RedLockConfig::new(urls("rediss"))
    };
    let engine = Arc::new(
        RedLockEngine::connect("tls", &config)
            .await
            .expect("connect over TLS"),
    );
    let registry = Registry::with_engine("tls", engine, SETTINGS).expect("registry");
    let held = registry.locks("tls").get("x").lock().await.expect("lock");
    let other = registry.locks("tls").get("x");
    let taken = tokio::spawn(async move { other.try_lock().await.expect("try").is_some() });
    assert!(!taken.await.expect("task"), "held twice");
    held.release().await.expect("release");

    let plain = RedLockConfig {
        tls: TlsFiles::default(),
        ..RedLockConfig::new(urls("redis"))
    };
    let err = RedLockEngine::connect("tls", &plain)
        .await
        .err()
        .expect("a plain client got in");
    assert!(matches!(err, Error::Unavailable { .. }), "{err}");
}
