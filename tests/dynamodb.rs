//! DynamoDB-specific behaviour against Amazon's DynamoDB Local on loopback:
//! throttled requests are retried and lose no hold, a missing table is
//! made when allowed and otherwise a clear error naming it, the capacity
//! DynamoDB reports is counted as a metric, a table in
//! another lock library's layout is refused, and bad settings and an
//! unreachable endpoint are clear errors that never show the secret.

#![cfg(feature = "dynamodb")]

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use dlock::engines::dynamodb::{DynamoDbConfig, DynamoDbEngine};
use dlock::kit::ClientSettings;
use dlock::{Error, Registry, Settings};
use dlock_testkit::fixtures::dynamodb::{Connection, DynamoDb, Throttler};
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

/// Each request asks for the capacity it consumed, and the engine counts
/// it: an uncontended lock and release are two write units, a consistent
/// read of the lock's record one read unit.
#[tokio::test]
async fn each_request_counts_the_capacity_dynamodb_reports() {
    use dlock::engines::dynamodb::CAPACITY_UNITS;
    use metrics_util::debugging::{DebugValue, DebuggingRecorder};

    let recorder = DebuggingRecorder::new();
    let snapshots = recorder.snapshotter();
    let engine = {
        // The engine makes its counters as it connects, with this recorder.
        let _counting = metrics::set_default_local_recorder(&recorder);
        DynamoDbEngine::connect("ddb", &config(endpoint(), "dlock"))
            .await
            .expect("connect")
    };
    let dlock = registry(engine);
    let lock = dlock.locks("units").get("x");
    for _ in 0..10 {
        lock.lock().await.expect("lock").release().await.expect("release");
    }
    lock.inspect().await.expect("inspect");
    let mut spent = std::collections::BTreeMap::new();
    for (key, _, _, value) in snapshots.snapshot().into_vec() {
        let key = key.key();
        assert_eq!(key.name(), CAPACITY_UNITS);
        let kind = key
            .labels()
            .find(|l| l.key() == "kind")
            .expect("kind")
            .value()
            .to_owned();
        let DebugValue::Counter(units) = value else {
            panic!("a counter")
        };
        spent.insert(kind, units);
    }
    assert_eq!(spent, [("read".to_owned(), 1), ("write".to_owned(), 20)].into());
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

/// `dynamodb-lease`, `dynamodb_lock` (delta-rs's) and AWS's Java lock client
/// key their table by one string attribute, `key`; dlock keys its own by
/// `pk` and `sk`, so that one `Query` lists a group. A table has one key
/// schema, so they cannot share one: pointed at such a table, dlock
/// refuses it at startup, naming the keys it needs, rather than write
/// items the other library would misread.
#[tokio::test]
async fn a_table_in_another_lock_librarys_layout_is_refused() {
    let table = format!("leases-{}", std::process::id());
    let mut connection = Connection::open(&fixture().server.address()).expect("connect");
    let (status, answer) = connection
        .call(
            "CreateTable",
            &format!(
                r#"{{"TableName":"{table}","KeySchema":[{{"AttributeName":"key","KeyType":"HASH"}}],"AttributeDefinitions":[{{"AttributeName":"key","AttributeType":"S"}}],"BillingMode":"PAY_PER_REQUEST"}}"#
            ),
        )
        .expect("create the table");
    assert_eq!(status, 200, "{answer}");
    match DynamoDbEngine::connect("ddb", &config(endpoint(), &table)).await {
        Err(Error::Config { field, message }) => {
            assert_eq!(field, "engines.ddb.table");
            assert!(
                message.contains(&table) && message.contains("pk") && message.contains("sk"),
                "{message}"
            );
        }
        other => panic!("expected a config error, got {:?}", other.err()),
    }
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
