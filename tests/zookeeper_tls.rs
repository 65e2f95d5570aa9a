//! ZooKeeper over TLS, against a server that speaks TLS alone (a
//! `secureClientPort`, no `clientPort`) and demands a client certificate:
//! what works, and each way it fails, with an error that names the
//! engine, the address and the reason.

#![cfg(feature = "zookeeper-tls")]

use std::path::PathBuf;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use dlock::engines::zookeeper::{ZooKeeperConfig, ZooKeeperEngine};
use dlock::kit::{ClientSettings, TlsFiles, TlsMode};
use dlock::{Error, Registry, Settings};
use dlock_testkit::assert_unreachable_is_a_clear_error;
use dlock_testkit::certificates::{certificates, tls_files};
use dlock_testkit::fixtures::zookeeper::{four_letter_tls, secured};
use dlock_testkit::server::TestServer;

/// The server the tests share, and its certificates.
fn server() -> &'static (TestServer, PathBuf) {
    static SERVER: OnceLock<(TestServer, PathBuf)> = OnceLock::new();
    SERVER.get_or_init(|| {
        let certs = certificates();
        (secured(&certs, "server"), certs)
    })
}

/// TLS as `mode`, trusting `ca`, with the client's certificate or not.
fn config(server: &TestServer, mode: TlsMode, ca: Option<&str>, client_cert: bool) -> ZooKeeperConfig {
    ZooKeeperConfig {
        tls_mode: Some(mode),
        tls: tls_files(&self::server().1, ca, client_cert),
        client: ClientSettings::with_timeout(Duration::from_secs(3)),
        ..ZooKeeperConfig::new(server.address())
    }
}

/// The message of the error `config` gives at startup, checked to be
/// `Unavailable`, naming the engine and the address, in time.
async fn refusal(config: &ZooKeeperConfig) -> String {
    let connect = ZooKeeperEngine::connect("zk", config);
    assert_unreachable_is_a_clear_error(connect, "zk", &config.connect, Duration::from_secs(10)).await
}

#[tokio::test]
async fn a_plaintext_client_is_refused_by_the_server() {
    let (server, _) = server();
    let plain = ZooKeeperConfig {
        tls: TlsFiles::default(),
        ..config(server, TlsMode::Disable, None, false)
    };
    refusal(&plain).await;
}

#[tokio::test]
async fn a_lock_a_semaphore_and_an_election_run_over_tls() {
    let (server, certs) = server();
    let engine = ZooKeeperEngine::connect("zk", &config(server, TlsMode::VerifyFull, Some("ca.crt"), true))
        .await
        .expect("connect over TLS");
    let registry = Registry::with_engine("zk", Arc::new(engine), Settings::default()).expect("registry");
    let locks = registry.locks("tls");
    let guard = locks.get("order").lock().await.expect("lock");
    // Another task: in this one the lock is reentered.
    let other = locks.get("order");
    let taken = tokio::spawn(async move { other.try_lock().await.expect("try").is_some() });
    assert!(!taken.await.expect("task"), "held twice");
    let permit = locks.semaphore("pool", 2).acquire().await.expect("permit");
    let term = locks.election("leader").campaign().await.expect("campaign");
    // The engine's session is among the server's (TLS-only) connections.
    let connections = four_letter_tls(certs, &server.address(), "cons");
    assert!(connections.contains("sid=0x"), "{connections}");
    term.resign().await.expect("resign");
    permit.release().await.expect("release permit");
    guard.release().await.expect("release");
}

#[tokio::test]
async fn without_a_client_certificate_the_server_refuses() {
    let (server, _) = server();
    let message = refusal(&config(server, TlsMode::VerifyFull, Some("ca.crt"), false)).await;
    assert!(message.contains("no session within"), "{message}");
}

#[tokio::test]
async fn a_server_certificate_from_another_ca_is_refused() {
    let (server, _) = server();
    let message = refusal(&config(server, TlsMode::VerifyCa, Some("other-ca.crt"), true)).await;
    assert!(message.contains("UnknownIssuer"), "{message}");
}

#[tokio::test]
async fn a_certificate_for_another_name_is_refused_by_verify_full_alone() {
    let elsewhere = secured(&server().1, "elsewhere");
    let message = refusal(&config(&elsewhere, TlsMode::VerifyFull, Some("ca.crt"), true)).await;
    assert!(message.contains("not valid for name"), "{message}");
    for chain_only in [TlsMode::VerifyCa, TlsMode::Require] {
        ZooKeeperEngine::connect("zk", &config(&elsewhere, chain_only, Some("ca.crt"), true))
            .await
            .expect("verify-ca, and require with a CA, check the chain, not the name");
    }
}

#[tokio::test]
async fn an_expired_certificate_is_refused() {
    let expired = secured(&server().1, "expired");
    let message = refusal(&config(&expired, TlsMode::VerifyCa, Some("ca.crt"), true)).await;
    assert!(message.contains("certificate expired"), "{message}");
}

#[tokio::test]
async fn settings_the_engine_cannot_serve_are_config_errors() {
    let (server, _) = server();
    let cases = [
        (config(server, TlsMode::Prefer, Some("ca.crt"), true), "tls_mode"),
        (
            ZooKeeperConfig {
                tls_mode: None,
                ..config(server, TlsMode::VerifyFull, Some("ca.crt"), true)
            },
            "tls_mode",
        ),
        (config(server, TlsMode::Require, None, true), "tls_ca_file"),
        (config(server, TlsMode::VerifyFull, None, true), "tls_ca_file"),
    ];
    for (bad, named) in cases {
        match ZooKeeperEngine::connect("zk", &bad).await {
            Err(Error::Config { field, .. }) => assert_eq!(field, format!("engines.zk.{named}")),
            other => panic!("expected a config error naming {named}, got {:?}", other.err()),
        }
    }
}
