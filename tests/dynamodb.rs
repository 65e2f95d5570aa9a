//! DynamoDB-specific behaviour against Amazon's DynamoDB Local on loopback:
//! throttled requests are retried and lose no hold, a missing table is
//! made when allowed and otherwise a clear error naming it, and bad
//! settings and an unreachable endpoint are clear errors that never show
//! the secret.

#![cfg(feature = "dynamodb")]

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use dlock::engines::dynamodb::{DynamoDbConfig, DynamoDbEngine};
use dlock::kit::ClientSettings;
use dlock::{Error, Registry, Settings};
use dlock_testkit::fixtures::dynamodb::{DynamoDb, Throttler};
use dlock_testkit::server::free_port;
use dlock_testkit::{Fixture, assert_unreachable_is_a_clear_error};

/// The server this file's tests share.
fn fixture() -> &'static DynamoDb {
    static FIXTURE: std::sync::OnceLock<DynamoDb> = std::sync::OnceLock::new();
    FIXTURE.get_or_init(DynamoDb::start)
}

const SECRET: &str = "dlock-test-secret";

fn config(endpoint: String, table: &str) -> DynamoDbConfig {
    DynamoDbConfig {
        endpoint: Some(endpoint),
        create_table: true,
        access_key_id: Some("dlock".to_owned()),
        secret_access_key: Some(SECRET.to_owned()),
        client: ClientSettings::with_timeout(Duration::from_secs(5)),
        ..DynamoDbConfig::new("us-east-1", table)
    }
}

fn endpoint() -> String {
    format!("http://{}", fixture().server.address())
}

fn registry(engine: DynamoDbEngine) -> Registry {
    let settings = Settings {
        wait: dlock::Wait::For(Duration::from_secs(60)),
        ..Settings::default()
    };
    Registry::with_engine("ddb", Arc::new(engine), settings).expect("registry")
}

/// A third of all requests answered with `ProvisionedThroughputExceededException`
/// by a proxy: 4 tasks × 25 increments of a counter read and written apart
/// under the lock come out exact, with no overlap and no hold lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn throttled_requests_are_retried_and_no_hold_is_lost() {
    let throttler = Throttler::start(fixture().server.port, 3);
    let engine = DynamoDbEngine::connect("ddb", &config(throttler.endpoint(), "dlock"))
        .await
        .expect("connect through the throttler");
    let dlock = Arc::new(registry(engine));
    let (counter, inside, overlaps) = (
        Arc::new(AtomicU64::new(0)),
        Arc::new(AtomicU64::new(0)),
        Arc::new(AtomicU64::new(0)),
    );
    let tasks: Vec<_> = (0..4)
        .map(|_| {
            let (dlock, counter, inside, overlaps) =
                (dlock.clone(), counter.clone(), inside.clone(), overlaps.clone());
            tokio::spawn(async move {
                for _ in 0..25 {
                    let guard = dlock
                        .locks("throttled")
                        .get("counter")
                        .lock()
                        .await
                        .expect("lock");
                    if inside.fetch_add(1, Ordering::SeqCst) > 0 {
                        overlaps.fetch_add(1, Ordering::SeqCst);
                    }
                    let seen = counter.load(Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(2)).await;
                    counter.store(seen + 1, Ordering::SeqCst);
                    inside.fetch_sub(1, Ordering::SeqCst);
                    guard.release().await.expect("release: the hold was not lost");
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.expect("task");
    }
    assert_eq!(counter.load(Ordering::SeqCst), 100);
    assert_eq!(overlaps.load(Ordering::SeqCst), 0);
    assert!(throttler.throttled() > 30, "throttled {}", throttler.throttled());
}

/// A table that is not there is made when `create_table` allows it;
/// without, startup fails naming the table and the permission.
#[tokio::test]
async fn a_missing_table_is_made_when_allowed_else_a_clear_error() {
    let table = format!("missing-{}", std::process::id());
    let refused = DynamoDbConfig {
        create_table: false,
        ..config(endpoint(), &table)
    };
    match DynamoDbEngine::connect("ddb", &refused).await {
        Err(Error::Config { field, message }) => {
            assert_eq!(field, "engines.ddb.table");
            assert!(
                message.contains(&table) && message.contains("dynamodb:CreateTable"),
                "{message}"
            );
        }
        other => panic!("expected a config error, got {:?}", other.err()),
    }
    let engine = DynamoDbEngine::connect("ddb", &config(endpoint(), &table))
        .await
        .expect("made the table");
    let dlock = registry(engine);
    let guard = dlock.locks("made").get("x").lock().await.expect("lock");
    guard.release().await.expect("release");
    // Made once: a second engine finds it.
    DynamoDbEngine::connect("ddb", &refused)
        .await
        .expect("found the table");
}

#[tokio::test]
async fn bad_settings_and_an_unreachable_endpoint_are_clear_errors() {
    let port = free_port();
    let nowhere = DynamoDbConfig {
        client: ClientSettings::with_timeout(Duration::from_secs(1)),
        ..config(format!("http://127.0.0.1:{port}"), "dlock")
    };
    let message = assert_unreachable_is_a_clear_error(
        DynamoDbEngine::connect("ddb", &nowhere),
        "ddb",
        &port.to_string(),
        Duration::from_secs(3),
    )
    .await;
    assert!(!message.contains(SECRET), "{message}");
    assert!(!format!("{nowhere:?}").contains(SECRET));

    let cases = [
        (
            DynamoDbConfig {
                secret_access_key: None,
                ..config(endpoint(), "dlock")
            },
            "engines.ddb.secret_access_key",
        ),
        (
            DynamoDbConfig {
                secret_access_key_file: Some("/nonexistent/secret".into()),
                ..config(endpoint(), "dlock")
            },
            "engines.ddb.secret_access_key_file",
        ),
        (
            DynamoDbConfig {
                access_key_id: None,
                ..config(endpoint(), "dlock")
            },
            "engines.ddb.access_key_id",
        ),
        (config(endpoint(), "x"), "engines.ddb.table"),
        (
            DynamoDbConfig {
                region: " ".to_owned(),
                ..config(endpoint(), "dlock")
            },
            "engines.ddb.region",
        ),
    ];
    for (bad, named) in cases {
        match DynamoDbEngine::connect("ddb", &bad).await {
            Err(Error::Config { field, message }) => {
                assert_eq!(field, named);
                assert!(!message.contains(SECRET), "{message}");
            }
            other => panic!("expected a config error naming {named}, got {:?}", other.err()),
        }
    }
}
