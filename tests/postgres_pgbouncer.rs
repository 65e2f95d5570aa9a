//! PostgreSQL through a real PgBouncer. Session pooling gives each client
//! a server session of its own, so the locks work through it; transaction
//! and statement pooling serve idle clients from one session in turn, so
//! a session's advisory lock would pass from client to client: startup
//! refuses them, saying why and what to change.

#![cfg(feature = "postgres")]

use std::sync::Arc;
use std::time::Duration;

use dlock::engines::postgres::{PostgresConfig, PostgresEngine};
use dlock::kit::{ClientSettings, Engine};
use dlock::{Error, Registry, Settings};
use dlock_testkit::fixtures::postgres::{PgBouncer, PgServer};

fn config(bouncer: &PgBouncer) -> PostgresConfig {
    PostgresConfig {
        client: ClientSettings::with_timeout(Duration::from_secs(5)),
        ..PostgresConfig::new(bouncer.url())
    }
}

async fn registry(bouncer: &PgBouncer) -> Registry {
    let engine = PostgresEngine::connect("pg", &config(bouncer))
        .await
        .expect("connect through session pooling");
    Registry::with_engine("pg", Arc::new(engine) as Arc<dyn Engine>, Settings::default()).expect("registry")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn session_pooling_serves_locks_that_exclude() {
    let server = PgServer::start();
    let bouncer = PgBouncer::start(&server, "session");
    let (one, two) = (registry(&bouncer).await, registry(&bouncer).await);
    let held = one.locks("bouncer").get("k").lock().await.expect("lock");
    let other = two.locks("bouncer").get("k");
    assert!(
        other.try_lock().await.expect("try").is_none(),
        "held twice through the pooler"
    );
    let waiting = tokio::spawn(async move { other.lock_for(Duration::from_secs(10)).await });
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        !waiting.is_finished(),
        "the waiter got in while the lock was held"
    );
    let fence = held.fence();
    held.release().await.expect("release");
    let next = waiting.await.expect("task").expect("the waiter gets the lock");
    assert!(next.fence() > fence, "the fence went back");
    next.release().await.expect("release");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn transaction_and_statement_pooling_are_refused_at_startup() {
    let server = PgServer::start();
    for mode in ["transaction", "statement"] {
        let bouncer = PgBouncer::start(&server, mode);
        match PostgresEngine::connect("pg", &config(&bouncer)).await {
            Err(Error::Config { field, message }) => {
                assert_eq!(field, "engines.pg.url", "{mode}");
                assert!(
                    message.contains("transaction or statement mode")
                        && message.contains("pool_mode = session"),
                    "{mode}: {message}"
                );
            }
            other => panic!("{mode} pooling was not refused: {:?}", other.err()),
        }
    }
}
