//! MySQL over TLS, against a MariaDB that takes TLS connections only
//! (`require_secure_transport`), from a user that must give a client
//! certificate (`REQUIRE X509`): what works, and each way it fails, with an
//! error that names the engine, the address and the reason, and never a
//! password.

#![cfg(feature = "mysql")]

use std::path::PathBuf;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use dlock::engines::mysql::{MysqlConfig, MysqlEngine};
use dlock::kit::{ClientSettings, TlsMode};
use dlock::{Error, Registry, Settings};
use dlock_testkit::assert_unreachable_is_a_clear_error;
use dlock_testkit::certificates::{certificates, tls_files};
use dlock_testkit::fixtures::mysql::{DATABASE, MariaDb, PASSWORD, USER};

/// The server the tests share, and its certificates.
fn server() -> &'static (MariaDb, PathBuf) {
    static SERVER: OnceLock<(MariaDb, PathBuf)> = OnceLock::new();
    SERVER.get_or_init(|| {
        let certs = certificates();
        (MariaDb::start_tls(&certs, "server"), certs)
    })
}

/// TLS as `mode`, trusting `ca` (a file of the certificates), with the
/// client's certificate or not.
fn config(url: String, mode: TlsMode, ca: Option<&str>, client_cert: bool) -> MysqlConfig {
    let certs = &server().1;
    MysqlConfig {
        tls_mode: Some(mode),
        tls: tls_files(certs, ca, client_cert),
        client: ClientSettings::with_timeout(Duration::from_secs(5)),
        ..MysqlConfig::new(url)
    }
}

/// The message of the error connecting with `config` gives, checked to be
/// `Unavailable`, naming the engine and `address`, in time.
async fn refusal(config: &MysqlConfig, address: &str) -> String {
    let connect = MysqlEngine::connect("my", config);
    assert_unreachable_is_a_clear_error(connect, "my", address, Duration::from_secs(10)).await
}

fn address(server: &MariaDb) -> String {
    format!("127.0.0.1:{}", server.port)
}

#[tokio::test]
async fn a_plaintext_client_is_refused_by_the_server() {
    let (server, _) = server();
    let message = refusal(
        &config(server.url(), TlsMode::Disable, None, true),
        &address(server),
    )
    .await;
    // MariaDB refuses insecure transport as a failed login.
    assert!(message.contains("Access denied"), "{message}");
}

#[tokio::test]
async fn a_lock_a_semaphore_and_an_election_run_over_tls() {
    let (server, _) = server();
    let engine = MysqlEngine::connect(
        "my",
        &config(server.url(), TlsMode::VerifyFull, Some("ca.crt"), true),
    )
    .await
    .expect("connect over TLS");
    let registry = Registry::with_engine("my", Arc::new(engine), Settings::default()).expect("registry");
    let locks = registry.locks("tls");
    let guard = locks.get("order").lock().await.expect("lock");
    let permit = locks.semaphore("pool", 2).acquire().await.expect("permit");
    let term = locks.election("leader").campaign().await.expect("campaign");
    // Every session of the user came in over TLS: the server takes no other.
    let sessions = server.sql(&format!(
        "SELECT count(*) FROM information_schema.PROCESSLIST WHERE USER = '{USER}'"
    ));
    assert!(
        sessions.parse::<u32>().expect("count") >= 1,
        "no session of {USER}"
    );
    term.resign().await.expect("resign");
    permit.release().await.expect("release permit");
    guard.release().await.expect("release");
}

#[tokio::test]
async fn without_a_client_certificate_the_server_refuses() {
    let (server, _) = server();
    let bare = config(server.url(), TlsMode::VerifyFull, Some("ca.crt"), false);
    let message = refusal(&bare, &address(server)).await;
    assert!(message.contains("Access denied"), "{message}");
}

#[tokio::test]
async fn a_server_certificate_from_another_ca_is_refused() {
    let (server, _) = server();
    let wrong = config(server.url(), TlsMode::VerifyFull, Some("other-ca.crt"), true);
    let message = refusal(&wrong, &address(server)).await;
    assert!(message.contains("UnknownIssuer"), "{message}");
}

#[tokio::test]
async fn a_certificate_for_another_name_is_refused() {
    let elsewhere = MariaDb::start_tls(&server().1, "elsewhere");
    let full = config(elsewhere.url(), TlsMode::VerifyFull, Some("ca.crt"), true);
    let message = refusal(&full, &address(&elsewhere)).await;
    assert!(message.contains("not valid for name"), "{message}");
}

#[tokio::test]
async fn an_expired_certificate_is_refused() {
    let expired = MariaDb::start_tls(&server().1, "expired");
    let message = refusal(
        &config(expired.url(), TlsMode::VerifyFull, Some("ca.crt"), true),
        &address(&expired),
    )
    .await;
    assert!(message.contains("certificate expired"), "{message}");
}

#[tokio::test]
async fn a_wrong_password_is_an_error_that_never_shows_it() {
    let (server, _) = server();
    let secret = "not-the-password-7f3a";
    let url = format!("mysql://{USER}:{secret}@127.0.0.1:{}/{DATABASE}", server.port);
    let message = refusal(
        &config(url, TlsMode::VerifyFull, Some("ca.crt"), true),
        &address(server),
    )
    .await;
    assert!(message.contains("Access denied"), "{message}");
    assert!(!message.contains(secret), "{message}");
}

#[tokio::test]
async fn a_chain_only_check_is_refused_as_a_config_error() {
    let (server, _) = server();
    for (mode, ca) in [
        (TlsMode::VerifyCa, Some("ca.crt")),
        (TlsMode::Require, Some("ca.crt")),
    ] {
        match MysqlEngine::connect("my", &config(server.url(), mode, ca, true)).await {
            Err(Error::Config { field, message }) => {
                assert_eq!(field, "engines.my.tls_mode");
                assert!(message.contains("verify-full"), "{message}");
            }
            other => panic!("{mode:?}: expected a config error, got {:?}", other.err()),
        }
    }
    // `require` with no CA file checks nothing, and connects.
    MysqlEngine::connect("my", &config(server.url(), TlsMode::Require, None, true))
        .await
        .expect("require without a CA file");
    let url_tls = MysqlConfig::new(format!("{}?require_ssl=true", server.url()));
    match MysqlEngine::connect("my", &url_tls).await {
        Err(Error::Config { field, .. }) => assert_eq!(field, "engines.my.url"),
        other => panic!("expected a config error, got {:?}", other.err()),
    }
}

#[tokio::test]
async fn a_password_comes_from_its_file_and_never_from_two_places() {
    let (server, _) = server();
    let bare_url = format!("mysql://{USER}@127.0.0.1:{}/{DATABASE}", server.port);
    let with_file = |secret: &str| MysqlConfig {
        credentials: dlock::kit::Credentials {
            password_file: Some(dlock_testkit::server::secret_file(secret)),
            ..Default::default()
        },
        ..config(bare_url.clone(), TlsMode::VerifyFull, Some("ca.crt"), true)
    };
    MysqlEngine::connect("my", &with_file(PASSWORD))
        .await
        .expect("the password from its file");
    let message = refusal(&with_file("file-secret-9d2c"), &address(server)).await;
    assert!(!message.contains("file-secret-9d2c"), "{message}");
    let twice = MysqlConfig {
        url: server.url(),
        ..with_file(PASSWORD)
    };
    match MysqlEngine::connect("my", &twice).await {
        Err(Error::Config { field, message }) => {
            assert_eq!(field, "engines.my.password");
            assert!(!message.contains(PASSWORD), "{message}");
        }
        other => panic!("expected a config error, got {:?}", other.err()),
    }
}
