//! `https://` endpoints: an etcd member serving TLS only, with certificates
//! made at test time.

#![cfg(feature = "etcd-tls")]

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use dlock::engines::etcd::{EtcdConfig, EtcdEngine};
use dlock::{Error, Registry, Settings};
use dlock_testkit::certificates::certificates;
use dlock_testkit::fixtures::etcd::etcd_args;
use dlock_testkit::server::{TestServer, free_port};

/// A member whose client port speaks TLS only.
fn tls_member(certs: &Path) -> TestServer {
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
        args
    })
}

fn config(endpoint: String, ca: Option<&Path>) -> EtcdConfig {
    EtcdConfig {
        connect_timeout: Duration::from_secs(2),
        session_ttl: Duration::from_secs(2),
        tls_ca_file: ca.map(Path::to_path_buf),
        ..EtcdConfig::new(&[endpoint])
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn locks_work_over_tls_and_an_untrusted_server_is_a_clear_error() {
    let certs = certificates();
    let member = tls_member(&certs);
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
