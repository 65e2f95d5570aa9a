//! `rediss://`: a TLS-only redis-server with certificates made at test time.
#![cfg(feature = "redis-tls")]

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use dlock::engines::conformance::SETTINGS;
use dlock::engines::redis::{RedisClusterConfig, RedisConfig, RedisEngine, RedisSentinelConfig};
use dlock::kit::{ClientSettings, Credentials, TlsFiles};
use dlock::{Error, Registry};
use dlock_testkit::certificates::certificates;
use dlock_testkit::certificates::tls_files;
use dlock_testkit::fixtures::redis::{MASTER_NAME, RedisSentinel, redis_args, redis_cluster_with, tls_args};
use dlock_testkit::server::{TestServer, secret_file};
use dlock_testkit::{assert_unreachable_is_a_clear_error, timed_writer};

fn tls_server(certs: &Path, client_certs: bool) -> TestServer {
    tls_server_showing(certs, "server", client_certs)
}

/// A TLS-only server showing the certificate `<served>.crt` of `certs`.
fn tls_server_showing(certs: &Path, served: &str, client_certs: bool) -> TestServer {
    TestServer::start("redis-server", |port| {
        let mut tls = tls_args(certs, port, client_certs);
        // Later flags override earlier ones.
        for (flag, file) in [("--tls-cert-file", "crt"), ("--tls-key-file", "key")] {
            tls.extend([
                flag.to_owned(),
                certs.join(format!("{served}.{file}")).display().to_string(),
            ]);
        }
        redis_args(port, &tls.iter().map(String::as_str).collect::<Vec<_>>())
    })
}

/// A certificate from another CA, for another name, or expired: each a
/// clear error at startup naming the engine, the address and the reason.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_server_certificate_is_a_clear_error_with_its_reason() {
    let certs = certificates();
    let cases = [
        ("server", "other-ca.crt", "UnknownIssuer"),
        ("elsewhere", "ca.crt", "not valid for name"),
        ("expired", "ca.crt", "certificate expired"),
    ];
    for (served, ca, reason) in cases {
        let server = tls_server_showing(&certs, served, false);
        let config = RedisConfig {
            tls: tls_files(&certs, Some(ca), false),
            client: ClientSettings::with_timeout(Duration::from_secs(3)),
            ..RedisConfig::new(format!("rediss://{}", server.address()))
        };
        let connect = RedisEngine::connect("tls", &config);
        let message =
            assert_unreachable_is_a_clear_error(connect, "tls", &server.address(), Duration::from_secs(10))
                .await;
        assert!(message.contains(reason), "{served}: {message}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn locks_and_notifications_work_over_tls() {
    let certs = certificates();
    let server = tls_server(&certs, false);
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
    a_waiter_is_woken_over_tls(&registry).await;

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
    let server = tls_server(&certs, true);
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
    let masters: Vec<TestServer> = (0..3).map(|_| tls_server(&certs, true)).collect();
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

/// Takes `x` and checks that a waiter for it is woken by the release's
/// notification: the poll alone would take longer.
async fn a_waiter_is_woken_over_tls(registry: &Registry) {
    let held = registry.locks("tls").get("x").lock().await.expect("lock");
    let waiter = timed_writer(registry.locks("tls").get("x"));
    tokio::time::sleep(Duration::from_millis(500)).await;
    let released = Instant::now();
    held.release().await.expect("release");
    let took = waiter.await.expect("task") - released;
    assert!(took < Duration::from_millis(300), "waiter moved after {took:?}");
}

/// A cluster whose nodes speak TLS alone, to clients and to each other,
/// ask for the client's certificate and require a password: locks on
/// every node's slots with the password from its file, and a sharded
/// notification through the TLS subscriber.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_nodes_are_reached_over_tls() {
    const PASSWORD: &str = "cluster-pass-3c1d";
    let certs = certificates();
    let nodes = redis_cluster_with(3, Some(&certs), Some(PASSWORD));
    let urls = |scheme: &str| {
        nodes
            .iter()
            .map(|n| format!("{scheme}://{}", n.address()))
            .collect()
    };
    let config = RedisClusterConfig {
        nodes: urls("rediss"),
        fence_retention: Duration::from_secs(1),
        waiter_ttl: Duration::from_secs(1),
        client: ClientSettings::with_timeout(Duration::from_secs(5)),
        credentials: Credentials {
            password_file: Some(secret_file(PASSWORD)),
            ..Credentials::default()
        },
        tls: tls_files(&certs, Some("ca.crt"), true),
    };
    let engine = RedisEngine::connect_cluster("tls", &config)
        .await
        .expect("connect over TLS");
    let registry = Registry::with_engine("tls", Arc::new(engine), SETTINGS).expect("registry");
    // 48 names fall in the slots of all three nodes.
    for n in 0..48 {
        let guard = registry
            .locks("tls")
            .get(format!("k{n}"))
            .lock()
            .await
            .expect("lock");
        guard.release().await.expect("release");
    }
    a_waiter_is_woken_over_tls(&registry).await;

    let without_client_certificate = RedisClusterConfig {
        tls: tls_files(&certs, Some("ca.crt"), false),
        ..config.clone()
    };
    let plain = RedisClusterConfig {
        nodes: urls("redis"),
        tls: TlsFiles::default(),
        ..config.clone()
    };
    let wrong_password = RedisClusterConfig {
        credentials: Credentials {
            password: Some("not-the-password-51e0".into()),
            ..Credentials::default()
        },
        ..config.clone()
    };
    for refused in [without_client_certificate, plain, wrong_password] {
        let err = RedisEngine::connect_cluster("tls", &refused)
            .await
            .err()
            .expect("connected without TLS, a client certificate or the password");
        assert!(matches!(err, Error::Unavailable { .. }), "{err}");
        assert!(!err.to_string().contains("not-the-password"), "{err}");
    }
    let mixed = RedisClusterConfig {
        nodes: vec![config.nodes[0].clone(), format!("redis://{}", nodes[1].address())],
        ..config
    };
    match RedisEngine::connect_cluster("tls", &mixed).await {
        Err(Error::Config { field, .. }) => assert_eq!(field, "engines.tls.nodes"),
        other => panic!("expected a config error, got {:?}", other.err()),
    }
}

/// Sentinels and data nodes that speak TLS alone and ask for the client's
/// certificate: locks and notifications on the primary, and after a
/// failover on the replica the sentinels name, all over TLS.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinels_and_their_primary_are_reached_over_tls() {
    let certs = certificates();
    let mut fixture = RedisSentinel::start_with(None, Some(&certs));
    let config = RedisSentinelConfig {
        sentinels: fixture.sentinel_urls(),
        master_name: MASTER_NAME.to_owned(),
        replicas_ack: 0,
        replicas_ack_timeout: Duration::from_millis(50),
        fence_retention: Duration::from_secs(1),
        waiter_ttl: Duration::from_secs(1),
        client: ClientSettings::with_timeout(Duration::from_secs(5)),
        credentials: Credentials::default(),
        tls: tls_files(&certs, Some("ca.crt"), true),
    };
    assert!(config.sentinels.iter().all(|url| url.starts_with("rediss://")));
    let engine = RedisEngine::connect_sentinel("tls", &config)
        .await
        .expect("connect over TLS");
    let registry = Registry::with_engine("tls", Arc::new(engine), SETTINGS).expect("registry");
    a_waiter_is_woken_over_tls(&registry).await;

    fixture.fail_over();
    let started = Instant::now();
    let guard = loop {
        match registry.locks("tls").get("after").try_lock().await {
            Ok(Some(guard)) => break guard,
            _ if started.elapsed() < Duration::from_secs(20) => {
                tokio::time::sleep(Duration::from_millis(100)).await
            }
            other => panic!("no lock on the new primary within 20 s: {:?}", other.err()),
        }
    };
    guard.release().await.expect("release");

    let plain = RedisSentinelConfig {
        sentinels: config
            .sentinels
            .iter()
            .map(|url| url.replacen("rediss://", "redis://", 1))
            .collect(),
        tls: TlsFiles::default(),
        ..config.clone()
    };
    let err = RedisEngine::connect_sentinel("tls", &plain)
        .await
        .err()
        .expect("a plain client got in");
    assert!(matches!(err, Error::Unavailable { .. }), "{err}");
}
