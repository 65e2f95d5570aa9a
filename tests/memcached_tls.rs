//! memcached over TLS with a login, against a server that speaks TLS only
//! (`-Z`), demands a client certificate (`ssl_verify_mode=2`) and lets in
//! one user (`-Y`): what works, and each way it fails, with an error that
//! names the engine, the address and the reason, and never a password.

#![cfg(feature = "memcached")]

use std::path::PathBuf;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use dlock::engines::memcached::{MemcachedConfig, MemcachedEngine};
use dlock::kit::{ClientSettings, Credentials, TlsFiles, TlsMode};
use dlock::{Error, Registry, Settings};
use dlock_testkit::assert_unreachable_is_a_clear_error;
use dlock_testkit::certificates::{certificates, tls_files};
use dlock_testkit::fixtures::memcached::{PASSWORD, USER, secured};
use dlock_testkit::server::{TestServer, secret_file};

/// The server the tests share, and its certificates.
fn server() -> &'static (TestServer, PathBuf) {
    static SERVER: OnceLock<(TestServer, PathBuf)> = OnceLock::new();
    SERVER.get_or_init(|| {
        let certs = certificates();
        (secured(&certs, "server"), certs)
    })
}

/// TLS as `mode`, trusting `ca`, with the client's certificate or not,
/// logging in with `password`.
fn config(
    server: &TestServer,
    mode: TlsMode,
    ca: &str,
    client_cert: bool,
    password: &str,
) -> MemcachedConfig {
    let certs = &self::server().1;
    MemcachedConfig {
        tls_mode: Some(mode),
        tls: tls_files(certs, Some(ca), client_cert),
        credentials: Credentials {
            username: Some(USER.into()),
            password: Some(password.into()),
            ..Credentials::default()
        },
        client: ClientSettings::with_timeout(Duration::from_secs(3)),
        ..MemcachedConfig::new(server.address())
    }
}

/// The message of the error `config` gives at startup, checked to be
/// `Unavailable`, naming the engine and the address, in time.
async fn refusal(config: &MemcachedConfig) -> String {
    let connect = MemcachedEngine::connect("mc", config);
    assert_unreachable_is_a_clear_error(connect, "mc", &config.address, Duration::from_secs(10)).await
}

#[tokio::test]
async fn a_plaintext_client_is_refused_by_the_server() {
    let (server, _) = server();
    let plain = MemcachedConfig {
        tls_mode: Some(TlsMode::Disable),
        tls: TlsFiles::default(),
        ..config(server, TlsMode::Disable, "ca.crt", false, PASSWORD)
    };
    refusal(&plain).await;
}

#[tokio::test]
async fn a_lock_and_a_semaphore_run_over_tls_after_a_login() {
    let (server, _) = server();
    let engine = MemcachedEngine::connect(
        "mc",
        &config(server, TlsMode::VerifyFull, "ca.crt", true, PASSWORD),
    )
    .await
    .expect("connect over TLS");
    let registry = Registry::with_engine("mc", Arc::new(engine), Settings::default()).expect("registry");
    let locks = registry.locks("tls");
    let guard = locks.get("order").lock().await.expect("lock");
    // Another task: in this one the lock is reentered.
    let other = locks.get("order");
    let taken = tokio::spawn(async move { other.try_lock().await.expect("try").is_some() });
    assert!(!taken.await.expect("task"), "held twice");
    let permit = locks.semaphore("pool", 2).acquire().await.expect("permit");
    permit.release().await.expect("release permit");
    guard.release().await.expect("release");
}

#[tokio::test]
async fn without_a_client_certificate_the_server_refuses() {
    let (server, _) = server();
    refusal(&config(server, TlsMode::VerifyFull, "ca.crt", false, PASSWORD)).await;
}

#[tokio::test]
async fn a_server_certificate_from_another_ca_is_refused() {
    let (server, _) = server();
    let message = refusal(&config(server, TlsMode::VerifyCa, "other-ca.crt", true, PASSWORD)).await;
    assert!(message.contains("UnknownIssuer"), "{message}");
}

#[tokio::test]
async fn a_certificate_for_another_name_is_refused_by_verify_full_alone() {
    let elsewhere = secured(&server().1, "elsewhere");
    let message = refusal(&config(&elsewhere, TlsMode::VerifyFull, "ca.crt", true, PASSWORD)).await;
    assert!(message.contains("not valid for name"), "{message}");
    MemcachedEngine::connect(
        "mc",
        &config(&elsewhere, TlsMode::VerifyCa, "ca.crt", true, PASSWORD),
    )
    .await
    .expect("verify-ca checks the chain, not the name");
}

#[tokio::test]
async fn an_expired_certificate_is_refused() {
    let expired = secured(&server().1, "expired");
    let message = refusal(&config(&expired, TlsMode::VerifyCa, "ca.crt", true, PASSWORD)).await;
    assert!(message.contains("certificate expired"), "{message}");
}

#[tokio::test]
async fn a_wrong_password_is_an_error_that_never_shows_it() {
    let (server, _) = server();
    let secret = "not-the-password-7f3a";
    let message = refusal(&config(server, TlsMode::VerifyFull, "ca.crt", true, secret)).await;
    assert!(message.contains("authentication failure"), "{message}");
    assert!(!message.contains(secret), "{message}");
}

#[tokio::test]
async fn a_password_comes_from_its_file() {
    let (server, _) = server();
    let from_file = MemcachedConfig {
        credentials: Credentials {
            username: Some(USER.into()),
            password_file: Some(secret_file(PASSWORD)),
            ..Credentials::default()
        },
        ..config(server, TlsMode::VerifyFull, "ca.crt", true, PASSWORD)
    };
    MemcachedEngine::connect("mc", &from_file)
        .await
        .expect("the password from its file");
}

#[tokio::test]
async fn settings_memcached_cannot_serve_are_config_errors() {
    let (server, _) = server();
    let prefer = config(server, TlsMode::Prefer, "ca.crt", true, PASSWORD);
    let files_without_mode = MemcachedConfig {
        tls_mode: None,
        ..config(server, TlsMode::VerifyFull, "ca.crt", true, PASSWORD)
    };
    for bad in [prefer, files_without_mode] {
        match MemcachedEngine::connect("mc", &bad).await {
            Err(Error::Config { field, .. }) => assert_eq!(field, "engines.mc.tls_mode"),
            other => panic!("expected a config error, got {:?}", other.err()),
        }
    }
}

/// To a server that asks for no login the password is never sent: the
/// login's `set` would store it as an item there.
#[tokio::test]
async fn a_server_that_asks_for_no_login_never_gets_the_password() {
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt};
    let open = TestServer::start("memcached", dlock_testkit::fixtures::memcached::memcached_args);
    let config = MemcachedConfig {
        credentials: Credentials {
            username: Some(USER.into()),
            password: Some("never-stored-5e1b".into()),
            ..Credentials::default()
        },
        ..MemcachedConfig::new(open.address())
    };
    let message = refusal(&config).await;
    assert!(
        message.contains("asks for no login") && !message.contains("never-stored"),
        "{message}"
    );
    let mut raw = tokio::io::BufReader::new(
        tokio::net::TcpStream::connect(open.address())
            .await
            .expect("connect"),
    );
    raw.get_mut()
        .write_all(b"mg dlock-login v\r\n")
        .await
        .expect("write");
    let mut line = String::new();
    raw.read_line(&mut line).await.expect("read");
    assert_eq!(line, "EN\r\n", "the login was stored as an item");
}
