//! PostgreSQL over TLS, against a server that takes TLS connections only
//! (`hostssl`, and `hostnossl ... reject`), each with a client certificate
//! its CA signed: what works, and each way it fails, with an error that
//! names the engine, the address and the reason, and never a password.

#![cfg(feature = "postgres")]

use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::Duration;

use dlock::engines::postgres::{PostgresConfig, PostgresEngine};
use dlock::kit::{ClientSettings, TlsFiles, TlsMode};
use dlock::{Error, Registry, Settings};
use dlock_testkit::assert_unreachable_is_a_clear_error;
use dlock_testkit::certificates::{certificates, tls_files};
use dlock_testkit::fixtures::postgres::{PASSWORD, PgServer, USER};

/// The server the tests share, and its certificates.
fn server() -> &'static (PgServer, PathBuf) {
    static SERVER: OnceLock<(PgServer, PathBuf)> = OnceLock::new();
    SERVER.get_or_init(|| {
        let certs = certificates();
        (PgServer::start_tls(&certs, "server"), certs)
    })
}

/// TLS as `mode`, trusting `ca` (a file of `certs`), with the client's
/// certificate or not.
fn config(url: String, mode: TlsMode, ca: &str, client_cert: bool) -> PostgresConfig {
    let certs = &server().1;
    PostgresConfig {
        tls_mode: Some(mode),
        tls: tls_files(certs, Some(ca), client_cert),
        client: ClientSettings::with_timeout(Duration::from_secs(5)),
        ..PostgresConfig::new(url)
    }
}

/// The message of the error connecting with `config` gives, checked to be
/// `Unavailable`, naming the engine and `address`, in time.
async fn refusal(config: &PostgresConfig, address: &str) -> String {
    let connect = PostgresEngine::connect("pg", config);
    assert_unreachable_is_a_clear_error(connect, "pg", address, Duration::from_secs(10)).await
}

fn address(server: &PgServer) -> String {
    format!("127.0.0.1:{}", server.port)
}

#[tokio::test]
async fn a_plaintext_client_is_refused_by_the_server() {
    let (server, _) = server();
    let plain = config(server.url(), TlsMode::Disable, "ca.crt", true);
    let message = refusal(&plain, &address(server)).await;
    assert!(message.contains("no encryption"), "{message}");
}

#[tokio::test]
async fn a_lock_a_semaphore_and_an_election_run_over_tls() {
    let (server, _) = server();
    let url = format!("{}?application_name=tls-proof", server.url());
    let engine = PostgresEngine::connect("pg", &config(url, TlsMode::VerifyFull, "ca.crt", true))
        .await
        .expect("connect over TLS");
    let registry =
        Registry::with_engine("pg", std::sync::Arc::new(engine), Settings::default()).expect("registry");
    let locks = registry.locks("tls");
    let guard = locks.get("order").lock().await.expect("lock");
    let permit = locks.semaphore("pool", 2).acquire().await.expect("permit");
    let term = locks.election("leader").campaign().await.expect("campaign");
    let encrypted = server.psql(
        "SELECT count(*) FROM pg_stat_ssl JOIN pg_stat_activity USING (pid) \
         WHERE application_name = 'tls-proof' AND ssl AND client_dn = '/CN=dlock'",
    );
    let plain = server.psql(
        "SELECT count(*) FROM pg_stat_ssl JOIN pg_stat_activity USING (pid) \
         WHERE application_name = 'tls-proof' AND NOT ssl",
    );
    assert!(encrypted.parse::<u32>().expect("count") >= 1, "no TLS session");
    assert_eq!(plain, "0", "a session went in plain");
    term.resign().await.expect("resign");
    permit.release().await.expect("release permit");
    guard.release().await.expect("release");
}

#[tokio::test]
async fn without_a_client_certificate_the_server_refuses() {
    let (server, _) = server();
    let bare = config(server.url(), TlsMode::VerifyFull, "ca.crt", false);
    let message = refusal(&bare, &address(server)).await;
    assert!(message.contains("certificate"), "{message}");
}

#[tokio::test]
async fn a_server_certificate_from_another_ca_is_refused() {
    let (server, _) = server();
    let wrong = config(server.url(), TlsMode::VerifyCa, "other-ca.crt", true);
    let message = refusal(&wrong, &address(server)).await;
    assert!(message.contains("UnknownIssuer"), "{message}");
}

#[tokio::test]
async fn a_name_the_certificate_is_not_for_is_refused_by_verify_full_alone() {
    let (server, _) = server();
    // TLS checks the name `db.example`; TCP goes to 127.0.0.1.
    let url = format!(
        "host=db.example hostaddr=127.0.0.1 port={} user={USER} password={PASSWORD} dbname=postgres",
        server.port
    );
    let full = config(url.clone(), TlsMode::VerifyFull, "ca.crt", true);
    let message = refusal(&full, &format!("db.example:{}", server.port)).await;
    assert!(message.contains("not valid for name"), "{message}");
    let chain_only = config(url, TlsMode::VerifyCa, "ca.crt", true);
    PostgresEngine::connect("pg", &chain_only)
        .await
        .expect("verify-ca checks the chain, not the name");
}

#[tokio::test]
async fn an_expired_certificate_is_refused() {
    let certs = &server().1;
    let expired = PgServer::start_tls(certs, "expired");
    let message = refusal(
        &config(expired.url(), TlsMode::VerifyCa, "ca.crt", true),
        &address(&expired),
    )
    .await;
    assert!(message.contains("certificate expired"), "{message}");
}

#[tokio::test]
async fn a_wrong_password_is_an_error_that_never_shows_it() {
    let (server, _) = server();
    let secret = "not-the-password-7f3a";
    let url = format!("postgres://{USER}:{secret}@127.0.0.1:{}/postgres", server.port);
    let message = refusal(
        &config(url, TlsMode::VerifyFull, "ca.crt", true),
        &address(server),
    )
    .await;
    assert!(message.contains("password authentication failed"), "{message}");
    assert!(!message.contains(secret), "{message}");
}

#[tokio::test]
async fn libpq_url_words_stand_in_for_the_settings() {
    let (server, certs) = server();
    let file = |name: &str| certs.join(name).display().to_string();
    let url = format!(
        "{}?sslmode=verify-full&sslrootcert={}&sslcert={}&sslkey={}",
        server.url(),
        file("ca.crt"),
        file("client.crt"),
        file("client.key")
    );
    let engine = PostgresEngine::connect("pg", &PostgresConfig::new(url.clone()))
        .await
        .expect("connect with libpq's words");
    drop(engine);
    let twice = PostgresConfig {
        tls_mode: Some(TlsMode::Require),
        ..PostgresConfig::new(url)
    };
    match PostgresEngine::connect("pg", &twice).await {
        Err(Error::Config { field, .. }) => assert_eq!(field, "engines.pg.tls_mode"),
        other => panic!("expected a config error, got {:?}", other.err()),
    }
    let unknown = PostgresConfig::new(format!("{}?sslmode=always", server.url()));
    match PostgresEngine::connect("pg", &unknown).await {
        Err(Error::Config { field, message }) => {
            assert_eq!(field, "engines.pg.url");
            assert!(message.contains("verify-full"), "{message}");
        }
        other => panic!("expected a config error, got {:?}", other.err()),
    }
}

/// The files a test names exist: a typo here would pass for a refusal.
#[test]
fn the_certificates_are_there() {
    let certs: &Path = &server().1;
    for name in [
        "ca.crt",
        "other-ca.crt",
        "server.crt",
        "expired.crt",
        "client.crt",
        "client.key",
    ] {
        assert!(certs.join(name).exists(), "{name}");
    }
}

#[tokio::test]
async fn a_password_comes_from_its_file_and_never_from_two_places() {
    let (server, _) = server();
    let bare_url = format!("postgres://{USER}@127.0.0.1:{}/postgres", server.port);
    let with_file = |secret: &str| PostgresConfig {
        credentials: dlock::kit::Credentials {
            password_file: Some(dlock_testkit::server::secret_file(secret)),
            ..Default::default()
        },
        ..config(bare_url.clone(), TlsMode::VerifyFull, "ca.crt", true)
    };
    PostgresEngine::connect("pg", &with_file(PASSWORD))
        .await
        .expect("the password from its file");
    let message = refusal(&with_file("file-secret-9d2c"), &address(server)).await;
    assert!(!message.contains("file-secret-9d2c"), "{message}");
    let twice = PostgresConfig {
        url: server.url(),
        ..with_file(PASSWORD)
    };
    match PostgresEngine::connect("pg", &twice).await {
        Err(Error::Config { field, message }) => {
            assert_eq!(field, "engines.pg.password");
            assert!(!message.contains(PASSWORD), "{message}");
        }
        other => panic!("expected a config error, got {:?}", other.err()),
    }
}

/// `verify-ca` checks the chain, not the name: against the system's roots
/// any public certificate for any host would pass, so it needs the
/// server's own CA.
#[tokio::test]
async fn verify_ca_without_a_ca_file_is_refused() {
    let (server, _) = server();
    let bare = PostgresConfig {
        tls: TlsFiles::default(),
        ..config(server.url(), TlsMode::VerifyCa, "ca.crt", false)
    };
    match PostgresEngine::connect("pg", &bare).await {
        Err(Error::Config { field, .. }) => assert_eq!(field, "engines.pg.tls_ca_file"),
        other => panic!("expected a config error, got {:?}", other.err()),
    }
}

/// An `sslmode` the url's words hide from dlock (after a `?` in the
/// password) is tokio-postgres's to read, and stands: here `disable`, which
/// this server refuses, where `prefer` would have tried TLS.
#[tokio::test]
async fn a_url_sslmode_is_never_overwritten() {
    let (server, _) = server();
    let url = format!(
        "postgres://{USER}:pa?ss@127.0.0.1:{}/postgres?sslmode=disable",
        server.port
    );
    let config = PostgresConfig {
        tls_mode: None,
        ..config(url, TlsMode::VerifyFull, "ca.crt", true)
    };
    let message = refusal(&config, &address(server)).await;
    assert!(message.contains("no encryption"), "{message}");
}
