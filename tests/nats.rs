//! NATS-specific behaviour against real nats-server processes on
//! loopback: a missing bucket is made when allowed and otherwise a clear
//! error, a bucket without per-key TTLs and a server without JetStream
//! are refused naming what is missing, keys' TTLs outlive a server restart
//! and expire by its clock, a wrong password and bad settings are clear
//! errors that never show the secret, and TLS with a private CA and a
//! client certificate against a server that requires both.

#![cfg(feature = "nats")]

use std::time::{Duration, Instant};

use dlock::engines::nats::async_nats;
use dlock::engines::nats::{NatsConfig, NatsEngine};
use dlock::kit::{ClientSettings, Credentials, Lifecycle, Poll, Request};
use dlock::{Error, LockKey, Mode};
use dlock_testkit::certificates::{certificates, tls_files};
use dlock_testkit::fixtures::nats::{Nats, SERVER, nats_args, wait_serving};
use dlock_testkit::server::{TestServer, free_port};
use dlock_testkit::{Breakable, Fixture, assert_unreachable_is_a_clear_error};

const SECRET: &str = "dlock-test-secret";

fn config(server: &TestServer) -> NatsConfig {
    NatsConfig {
        client: ClientSettings::with_timeout(Duration::from_secs(5)),
        ..NatsConfig::new(&[format!("nats://{}", server.address())])
    }
}

/// The error the engine's startup against `server` ends in.
async fn refusal(server: &TestServer) -> String {
    NatsEngine::connect("n", &config(server))
        .await
        .err()
        .expect("refused")
        .to_string()
}

/// One try at `name`, which leaves nothing behind: whether it was held
/// (and then let go).
async fn free(engine: &NatsEngine, name: &str) -> bool {
    let mut req = Request::new(
        LockKey::new("ttl", name).unwrap(),
        Mode::Write,
        Duration::from_secs(1),
    );
    req.try_once = true;
    match engine.acquire(&req).await.expect("try") {
        Poll::Held(_) => {
            engine.release(&req).await.expect("release");
            true
        }
        Poll::Waiting(_) => false,
    }
}

/// Polls `free` every 50 ms until it is; how long that took.
async fn free_after(engine: &NatsEngine, name: &str, limit: Duration) -> Duration {
    let started = Instant::now();
    while !free(engine, name).await {
        assert!(started.elapsed() < limit, "{name} still held after {limit:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    started.elapsed()
}

/// A hold whose holder stopped renewing keeps its key's TTL across a
/// server restart and is removed by the server a lease after its last
/// write; one whose TTL ran out while the server was down is gone as soon
/// as the server is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ttls_outlive_a_restart_and_expire_by_the_servers_clock() {
    let mut nats = Nats::start();
    let holder = NatsEngine::connect("nats", &config(&nats.server))
        .await
        .expect("connect");
    let peer = NatsEngine::connect("nats", &config(&nats.server))
        .await
        .expect("connect");
    let lease = Duration::from_secs(3);
    let req = Request::new(LockKey::new("ttl", "restarted").unwrap(), Mode::Write, lease);
    assert!(matches!(
        holder.acquire(&req).await.expect("acquire"),
        Poll::Held(_)
    ));
    let written = Instant::now();
    // Never renewed: the holder stands for one that died.
    nats.restart();
    assert!(!free(&peer, "restarted").await, "the restart dropped a live key");
    let freed = written.elapsed() + free_after(&peer, "restarted", lease * 2).await;
    println!("nats: a key of a 3 s lease, server restarted: free {freed:?} after its last write");
    assert!(
        freed >= lease - Duration::from_millis(100),
        "freed early: {freed:?}"
    );

    let req = Request::new(
        LockKey::new("ttl", "expired-while-down").unwrap(),
        Mode::Write,
        lease,
    );
    assert!(matches!(
        holder.acquire(&req).await.expect("acquire"),
        Poll::Held(_)
    ));
    nats.kill();
    tokio::time::sleep(lease + Duration::from_millis(500)).await;
    nats.restart();
    let back = free_after(&peer, "expired-while-down", Duration::from_secs(5)).await;
    println!("nats: a key whose TTL ran out while the server was down: free {back:?} after the restart");
}

#[tokio::test]
async fn a_missing_bucket_is_made_when_allowed_else_a_clear_error() {
    let nats = Nats::start();
    let refused = NatsConfig {
        bucket: "absent".to_owned(),
        create_bucket: false,
        ..config(&nats.server)
    };
    match NatsEngine::connect("n", &refused).await {
        Err(Error::Config { field, message }) => {
            assert_eq!(field, "engines.n.bucket");
            assert!(
                message.contains("\"absent\"") && message.contains("create_bucket"),
                "{message}"
            );
        }
        other => panic!("expected a config error, got {:?}", other.err()),
    }
    let made = NatsConfig {
        bucket: "made".to_owned(),
        ..config(&nats.server)
    };
    NatsEngine::connect("n", &made).await.expect("the bucket is made");
    NatsEngine::connect("n", &made)
        .await
        .expect("and found the next time");

    // A bucket made by hand without per-key TTLs.
    let client = async_nats::connect(nats.server.address()).await.expect("client");
    async_nats::jetstream::new(client)
        .create_key_value(async_nats::jetstream::kv::Config {
            bucket: "plain".to_owned(),
            ..Default::default()
        })
        .await
        .expect("a plain bucket");
    let plain = NatsConfig {
        bucket: "plain".to_owned(),
        ..config(&nats.server)
    };
    match NatsEngine::connect("n", &plain).await {
        Err(Error::Config { field, message }) => {
            assert_eq!(field, "engines.n.bucket");
            assert!(message.contains("per-key TTLs"), "{message}");
        }
        other => panic!("expected a config error, got {:?}", other.err()),
    }
}

#[tokio::test]
async fn a_server_without_jetstream_is_refused_naming_its_version() {
    let server = TestServer::start(SERVER, |port| {
        ["-a", "127.0.0.1", "-p", &port.to_string()]
            .map(String::from)
            .into()
    });
    let message = refusal(&server).await;
    assert!(
        message.contains("without JetStream") && message.contains("2."),
        "{message}"
    );
    assert!(message.contains(&server.address()), "{message}");
}

#[tokio::test]
async fn a_wrong_password_is_refused_and_never_shown() {
    let monitor = free_port();
    let server = TestServer::start(SERVER, |port| {
        let mut args = nats_args(port, monitor);
        args.extend(["--user", "dlock", "--pass", SECRET].map(String::from));
        args
    });
    wait_serving(monitor);
    let login = |password: &str| NatsConfig {
        credentials: Credentials {
            username: Some("dlock".to_owned()),
            password: Some(password.to_owned()),
            password_file: None,
        },
        ..config(&server)
    };
    let wrong = "wrong-dlock-password";
    let message = NatsEngine::connect("n", &login(wrong))
        .await
        .err()
        .expect("refused")
        .to_string();
    assert!(
        message.contains("engine `n`") && message.contains("authorization"),
        "{message}"
    );
    assert!(!message.contains(wrong) && !message.contains(SECRET), "{message}");
    assert!(!format!("{:?}", login(wrong)).contains(wrong));
    let engine = NatsEngine::connect("n", &login(SECRET))
        .await
        .expect("the right password");
    assert!(free(&engine, "logged-in").await);
}

#[tokio::test]
async fn tls_with_a_private_ca_and_a_client_certificate() {
    let certs = certificates();
    let monitor = free_port();
    let server = TestServer::start(SERVER, |port| {
        let mut args = nats_args(port, monitor);
        for (flag, file) in [
            ("--tlscert", "server.crt"),
            ("--tlskey", "server.key"),
            ("--tlscacert", "ca.crt"),
        ] {
            args.extend([flag.to_owned(), certs.join(file).display().to_string()]);
        }
        args.extend(["--tls", "--tlsverify"].map(String::from));
        args
    });
    wait_serving(monitor);
    let tls = |ca: &str, client_cert: bool| NatsConfig {
        servers: vec![format!("tls://{}", server.address())],
        tls: tls_files(&certs, Some(ca), client_cert),
        ..config(&server)
    };
    let engine = NatsEngine::connect("n", &tls("ca.crt", true))
        .await
        .expect("TLS with a client certificate");
    assert!(free(&engine, "over-tls").await);
    for (bad, why) in [
        (tls("ca.crt", false), "no client certificate"),
        (tls("other-ca.crt", true), "a CA that signed nothing"),
    ] {
        let started = Instant::now();
        let err = NatsEngine::connect("n", &bad)
            .await
            .err()
            .unwrap_or_else(|| panic!("connected with {why}"));
        assert!(
            started.elapsed() < Duration::from_secs(6),
            "{why}: took {:?}",
            started.elapsed()
        );
        assert!(err.to_string().contains(&server.address()), "{why}: {err}");
    }
}

#[tokio::test]
async fn bad_settings_and_an_unreachable_server_are_clear_errors() {
    let port = free_port();
    let nowhere = NatsConfig {
        token: Some(SECRET.to_owned()),
        client: ClientSettings::with_timeout(Duration::from_secs(1)),
        ..NatsConfig::new(&[format!("nats://127.0.0.1:{port}")])
    };
    let message = assert_unreachable_is_a_clear_error(
        NatsEngine::connect("n", &nowhere),
        "n",
        &port.to_string(),
        Duration::from_secs(3),
    )
    .await;
    assert!(!message.contains(SECRET), "{message}");
    assert!(!format!("{nowhere:?}").contains(SECRET));

    let base = || NatsConfig::new(&[format!("nats://127.0.0.1:{port}")]);
    let cases = [
        (
            NatsConfig {
                servers: Vec::new(),
                ..base()
            },
            "engines.n.servers",
        ),
        (
            NatsConfig {
                servers: vec!["nats://[::1".to_owned()],
                ..base()
            },
            "engines.n.servers",
        ),
        (
            NatsConfig {
                bucket: "a.b".to_owned(),
                ..base()
            },
            "engines.n.bucket",
        ),
        (
            NatsConfig {
                replicas: 2,
                ..base()
            },
            "engines.n.replicas",
        ),
        (
            NatsConfig {
                token: Some(SECRET.to_owned()),
                token_file: Some("/nonexistent".into()),
                ..base()
            },
            "engines.n.token",
        ),
        (
            NatsConfig {
                token: Some(SECRET.to_owned()),
                credentials: Credentials {
                    username: Some("dlock".to_owned()),
                    password: Some(SECRET.to_owned()),
                    password_file: None,
                },
                ..base()
            },
            "engines.n.token",
        ),
        (
            NatsConfig {
                credentials: Credentials {
                    username: None,
                    password: Some(SECRET.to_owned()),
                    password_file: None,
                },
                ..base()
            },
            "engines.n.username",
        ),
        (
            NatsConfig {
                nkey_seed_file: Some("/nonexistent".into()),
                ..base()
            },
            "engines.n.nkey_seed_file",
        ),
        (
            NatsConfig {
                credentials_file: Some("/nonexistent".into()),
                ..base()
            },
            "engines.n.credentials_file",
        ),
    ];
    for (bad, named) in cases {
        match NatsEngine::connect("n", &bad).await {
            Err(Error::Config { field, message }) => {
                assert_eq!(field, named);
                assert!(!message.contains(SECRET), "{message}");
            }
            other => panic!("expected a config error naming {named}, got {:?}", other.err()),
        }
    }
}

/// Debian's nats-server 2.9, with JetStream: older than per-key TTLs.
#[tokio::test]
async fn a_server_too_old_for_per_key_ttls_is_refused_naming_its_version() {
    let store = dlock_testkit::server::server_dir("debian-nats", 0);
    let server = TestServer::start("/usr/sbin/nats-server", |port| {
        let store = store.display().to_string();
        ["-js", "-sd", &store, "-a", "127.0.0.1", "-p", &port.to_string()]
            .map(String::from)
            .into()
    });
    let message = refusal(&server).await;
    assert!(
        message.contains("nats-server 2.9.") && message.contains("2.11 or later"),
        "{message}"
    );
    assert!(message.contains("per-key TTLs"), "{message}");
}

/// On a 30 s lease, whose renewals come every 10 s: a revoke and a force
/// release reach the holder through the engine's watch within a second.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn revoke_and_force_release_are_heard_through_the_watch_at_once() {
    let nats = Nats::start();
    let settings = dlock::Settings {
        lease: Duration::from_secs(30),
        ..dlock::Settings::default()
    };
    let engine = NatsEngine::connect("nats", &config(&nats.server))
        .await
        .expect("connect");
    let registry =
        dlock::Registry::with_engine("nats", std::sync::Arc::new(engine), settings).expect("registry");
    let lock = registry.locks("control").get("heard");
    let guard = lock.lock().await.expect("lock");
    // The signal is asked for once the first renewal is due.
    tokio::time::sleep(Duration::from_secs(11)).await;
    let asked = Instant::now();
    assert_eq!(lock.revoke().await.expect("revoke"), 1);
    tokio::time::timeout(Duration::from_secs(1), guard.revoked())
        .await
        .expect("the holder did not hear it was revoked within a second");
    println!("nats: revoke heard after {:?}", asked.elapsed());
    assert!(!guard.is_lost(), "revoked, and still held");
    let forced = Instant::now();
    assert_eq!(lock.force_release().await.expect("force release"), 1);
    tokio::time::timeout(Duration::from_secs(1), guard.lost())
        .await
        .expect("the holder did not hear it was forced out within a second");
    println!("nats: force release heard after {:?}", forced.elapsed());
}
