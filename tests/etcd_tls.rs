//! `https://` endpoints: an etcd member serving TLS only, with certificates
//! made at test time.

#![cfg(feature = "etcd-tls")]

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use dlock::engines::etcd::{EtcdConfig, EtcdEngine};
use dlock::kit::{ClientSettings, TlsFiles};
use dlock::{Error, Registry, Settings};
use dlock_testkit::certificates::certificates;
use dlock_testkit::fixtures::etcd::etcd_args;
use dlock_testkit::server::{TestServer, free_port};

/// A member whose client port speaks TLS only.
/// A one-member cluster serving https; with `client_auth` it admits only
/// clients with a certificate its CA signed.
fn tls_member(certs: &Path, client_auth: bool) -> TestServer {
    let peer = free_port();
    TestServer::start("etcd", |port| {
        let plain = format!("http://127.0.0.1:{port}");
        let mut args: Vec<String> = etcd_args(port, &[(port, peer)], 0)
            .into_iter()
            .map(|arg| {
                if arg == plain {
                    format!("https://127.0.0.1:{port}")
                } else {
                    arg
                }
            })
            .collect();
        for (flag, file) in [("--cert-file", "server.crt"), ("--key-file", "server.key")] {
            args.push(flag.to_owned());
            args.push(certs.join(file).display().to_string());
        }
        if client_auth {
            args.push("--client-cert-auth".to_owned());
            args.push("--trusted-ca-file".to_owned());
            args.push(certs.join("ca.crt").display().to_string());
        }
        args
    })
}

fn config(endpoint: String, ca: Option<&Path>) -> EtcdConfig {
    EtcdConfig {
        client: ClientSettings::with_timeout(Duration::from_secs(2)),
        session_ttl: Duration::from_secs(2),
        tls: TlsFiles {
            tls_ca_file: ca.map(Path::to_path_buf),
            ..TlsFiles::default()
        },
        ..EtcdConfig::new(&[endpoint])
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn locks_work_over_tls_and_an_untrusted_server_is_a_clear_error() {
    let certs = certificates();
    let member = tls_member(&certs, false);
    let endpoint = format!("https://{}", member.address());
    let ca = certs.join("ca.crt");

    // The member serves once it has elected itself.
    let started = Instant::now();
    let engine = loop {
        match EtcdEngine::connect("etcd-tls", &config(endpoint.clone(), Some(&ca))).await {
            Ok(engine) => break engine,
            Err(e) => assert!(started.elapsed() < Duration::from_secs(30), "{e}"),
        }
    };
    let dlock = Registry::with_engine("etcd-tls", Arc::new(engine), Settings::default()).expect("registry");
    let lock = dlock.locks("tls").get("x");
    let write = lock.lock().await.expect("lock over TLS");
    let other = tokio::spawn({
        let lock = lock.clone();
        async move { lock.try_lock().await.expect("try").is_none() }
    });
    assert!(other.await.expect("task"), "another task wrote under the write");
    write.release().await.expect("release");
    let read = lock.read().await.expect("read over TLS");
    read.release().await.expect("release");

    // Without the CA the member's certificate is not trusted: a clear
    // error, within the connect timeout.
    let started = Instant::now();
    let untrusted = EtcdEngine::connect("etcd-tls", &config(endpoint.clone(), None)).await;
    let err = untrusted.err().expect("an untrusted certificate was accepted");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "took {:?}",
        started.elapsed()
    );
    assert!(matches!(err, Error::Unavailable { .. }), "{err}");
    let message = err.to_string();
    assert!(
        message.contains("etcd-tls") && message.contains(&endpoint),
        "{message}"
    );

    // TLS settings with a plain endpoint: a config error naming the field.
    let plain = config(format!("http://{}", member.address()), Some(&ca));
    let message = EtcdEngine::connect("e", &plain)
        .await
        .err()
        .expect("refused")
        .to_string();
    assert!(message.contains("engines.e.endpoints"), "{message}");
    std::fs::remove_dir_all(certs).ok();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_client_certificate_is_presented_when_the_member_asks() {
    let certs = certificates();
    let member = tls_member(&certs, true);
    let endpoint = format!("https://{}", member.address());
    let with = EtcdConfig {
        tls: TlsFiles {
            tls_ca_file: Some(certs.join("ca.crt")),
            tls_cert_file: Some(certs.join("client.crt")),
            tls_key_file: Some(certs.join("client.key")),
        },
        ..config(endpoint.clone(), None)
    };
    // The member serves once it has elected itself.
    let started = Instant::now();
    let engine = loop {
        match EtcdEngine::connect("mtls", &with).await {
            Ok(engine) => break engine,
            Err(e) => assert!(started.elapsed() < Duration::from_secs(30), "{e}"),
        }
    };
    let dlock = Registry::with_engine("mtls", Arc::new(engine), Settings::default()).expect("registry");
    let guard = dlock
        .locks("mtls")
        .get("x")
        .lock()
        .await
        .expect("lock with a client certificate");
    guard.release().await.expect("release");
    let without = config(endpoint, Some(&certs.join("ca.crt")));
    let err = EtcdEngine::connect("mtls", &without)
        .await
        .err()
        .expect("admitted without a client certificate");
    assert!(matches!(err, Error::Unavailable { .. }), "{err}");
    std::fs::remove_dir_all(certs).ok();
}
