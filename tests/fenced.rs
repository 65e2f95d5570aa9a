//! `dlock::fenced` against real servers: a holder paused past its lease,
//! then resumed, writes through each adapter and the storage itself
//! refuses it as stale, while the next holder's write is what it keeps
//! (`dlock_testkit::held_writes::paused_holder_scenario`). Beside it: a
//! stale token told apart from a missing row, a permit's two slots fenced
//! apart, and a garbled header refused. Locks are on the Redis engine.
//!
//! `cargo test --features redis,fenced-postgres,fenced-sqlx,fenced-redis,fenced-http --test fenced`

#![cfg(all(
    feature = "redis",
    any(
        feature = "fenced-postgres",
        feature = "fenced-sqlx",
        feature = "fenced-redis",
        feature = "fenced-http"
    )
))]

#[cfg(feature = "fenced-http")]
mod service;

use std::fmt::Debug;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, OnceLock};

use dlock::Guard;
use dlock::kit::async_trait;
use dlock_testkit::Fixture;
#[cfg(any(feature = "fenced-postgres", feature = "fenced-sqlx", feature = "fenced-http"))]
use dlock_testkit::fixtures::postgres::Postgres;
use dlock_testkit::fixtures::redis::Redis;
use dlock_testkit::held_writes::{HeldStore, paused_holder_scenario};

/// The locks' server, shared by the file's tests.
fn redis() -> &'static Redis {
    static REDIS: OnceLock<Redis> = OnceLock::new();
    REDIS.get_or_init(Redis::start)
}

/// The storage's PostgreSQL, shared by the file's tests.
#[cfg(any(feature = "fenced-postgres", feature = "fenced-sqlx", feature = "fenced-http"))]
fn postgres() -> &'static Postgres {
    static POSTGRES: OnceLock<Postgres> = OnceLock::new();
    POSTGRES.get_or_init(Postgres::start)
}

/// A name no other test of this process uses (the servers are its own).
fn unique(prefix: &str) -> String {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    format!("{prefix}-{}", NEXT.fetch_add(1, Ordering::Relaxed))
}

/// Runs the scenario with locks on Redis, expecting `store` to refuse the
/// stale write as `stale` says, and prints its figures.
fn paused_holder_is_refused<E: Debug + Send + 'static>(
    what: &str,
    store: impl HeldStore<E>,
    stale: impl FnOnce(&E) -> Option<(u64, u64)>,
) {
    let report = paused_holder_scenario(redis(), Arc::new(store), |answer| {
        let error = answer.expect_err("the paused holder's write after its lease is refused");
        let (token, seen) = stale(&error).unwrap_or_else(|| panic!("expected a stale fence, got {error:?}"));
        assert!(seen > token, "{error:?}: the storage saw a greater token");
        format!("{error:?}")
    });
    eprintln!(
        "{what}: taken over {:?} after the pause; the stale write: {}",
        report.taken_over_after, report.stale_write
    );
}

/// PostgreSQL, for the tokio-postgres and sqlx adapters.
#[cfg(any(feature = "fenced-postgres", feature = "fenced-sqlx"))]
mod table {
    use dlock::fenced::FenceError;
    use dlock::fenced::postgres::FencedTable;

    use super::*;

    /// A fenced table with awkward names (quoted as identifiers), keyed by
    /// text, with one row, `held`.
    pub struct Table {
        pub fenced: FencedTable,
        /// Its name, quoted, for the test's own statements.
        quoted: String,
    }

    impl Table {
        pub async fn made() -> Table {
            let name = unique("Fenced \"rows\"");
            let table = Table {
                fenced: FencedTable::new(&name, "row key"),
                quoted: format!("\"{}\"", name.replace('"', "\"\"")),
            };
            let client = client().await;
            client
                .batch_execute(&format!(
                    "CREATE TABLE {} (\"row key\" text PRIMARY KEY, v text); \
                     INSERT INTO {0} VALUES ('held', NULL)",
                    table.quoted
                ))
                .await
                .expect("the table");
            for _ in 0..2 {
                // Twice: the migration is safe to run again.
                let migration = table.fenced.migration();
                client.batch_execute(&migration).await.expect("the migration");
            }
            table
        }

        /// Row `key`'s value and fence, read straight from the table.
        pub async fn row(&self, key: &str) -> Option<(Option<String>, i64)> {
            let sql = format!(
                "SELECT v, dlock_fence FROM {} WHERE \"row key\" = $1",
                self.quoted
            );
            let row = client().await.query_opt(&sql, &[&key]).await.expect("read");
            row.map(|row| (row.get(0), row.get(1)))
        }
    }

    /// A connection on the current runtime.
    pub async fn client() -> tokio_postgres::Client {
        let (client, connection) = tokio_postgres::connect(&postgres().server.url(), tokio_postgres::NoTls)
            .await
            .expect("postgres");
        tokio::spawn(connection);
        client
    }

    pub fn stale<E: Debug + std::fmt::Display>(error: &FenceError<E>) -> Option<(u64, u64)> {
        match error {
            FenceError::Stale { token, seen } => Some((*token, *seen)),
            _ => None,
        }
    }
}

#[cfg(feature = "fenced-postgres")]
mod tokio_postgres_adapter {
    use dlock::fenced::{FenceError, Token};

    use super::table::{Table, client, stale};
    use super::*;

    #[async_trait]
    impl HeldStore<FenceError<tokio_postgres::Error>> for Table {
        async fn write(&self, guard: &Guard, value: &str) -> Result<(), FenceError<tokio_postgres::Error>> {
            let client = client().await;
            self.fenced
                .update(&client, "v = $1", &[&value], &"held", Token::of(guard))
                .await
        }

        async fn read(&self) -> Option<String> {
            self.row("held").await.and_then(|(value, _)| value)
        }
    }

    #[test]
    fn paused_holder_is_refused_by_a_fenced_table() {
        let table = runtime().block_on(Table::made());
        paused_holder_is_refused("tokio-postgres", table, stale);
    }

    /// A stale token, a missing row and a token too large for `bigint` are
    /// three answers; none writes.
    #[tokio::test]
    async fn stale_is_told_apart_from_no_such_row() {
        let table = Table::made().await;
        let client = client().await;
        let token = |fence| Token { fence, slot: None };
        let update = |value: &'static str, key: &'static str, fence| {
            let (table, client) = (&table, &client);
            async move {
                table
                    .fenced
                    .update(client, "v = $1", &[&value], &key, token(fence))
                    .await
            }
        };
        update("five", "held", 5).await.expect("a first token");
        update("five again", "held", 5)
            .await
            .expect("the same token again");
        match update("three", "held", 3).await {
            Err(FenceError::Stale { token: 3, seen: 5 }) => {}
            other => panic!("expected Stale {{ 3, 5 }}, got {other:?}"),
        }
        match update("nowhere", "missing", 3).await {
            Err(FenceError::NoSuchRow) => {}
            other => panic!("expected NoSuchRow, got {other:?}"),
        }
        match update("huge", "held", u64::MAX).await {
            Err(FenceError::TooLarge(u64::MAX)) => {}
            other => panic!("expected TooLarge, got {other:?}"),
        }
        assert_eq!(table.row("held").await, Some((Some("five again".into()), 5)));
        assert_eq!(table.row("missing").await, None, "nothing inserted");
        match table
            .fenced
            .update(&client, "nonsense", &[], &"held", token(6))
            .await
        {
            Err(FenceError::Storage(error)) => assert!(error.as_db_error().is_some(), "{error}"),
            other => panic!("expected the server's error, got {other:?}"),
        }
    }

    /// The interleaving a fenced write alone lets through: holder 5 reads,
    /// holder 6 takes over and reads the same value, holder 5 writes, then
    /// holder 6: both would be accepted and 5's update lost. With each
    /// read fenced first (an empty `set`), 5's write comes after token 6
    /// and is refused.
    #[tokio::test]
    async fn a_fenced_read_keeps_a_stale_write_from_losing_an_update() {
        let table = Table::made().await;
        let client = client().await;
        let token = |fence| Token { fence, slot: None };
        let fenced_read = |fence| {
            let (table, client) = (&table, &client);
            async move {
                table
                    .fenced
                    .update(client, "", &[], &"held", token(fence))
                    .await?;
                Ok::<_, FenceError<tokio_postgres::Error>>(table.row("held").await.and_then(|(v, _)| v))
            }
        };
        let write = |value: String, fence| {
            let (table, client) = (&table, &client);
            async move {
                table
                    .fenced
                    .update(client, "v = $1", &[&value], &"held", token(fence))
                    .await
            }
        };
        let stale_read = fenced_read(5).await.expect("holder 5 reads");
        let taker_read = fenced_read(6).await.expect("holder 6 reads");
        assert_eq!(stale_read, taker_read);
        match write(format!("{stale_read:?} + 5"), 5).await {
            Err(FenceError::Stale { token: 5, seen: 6 }) => {}
            other => panic!("expected holder 5's write refused, got {other:?}"),
        }
        write(format!("{taker_read:?} + 6"), 6)
            .await
            .expect("holder 6 writes");
        assert_eq!(table.row("held").await, Some((Some("None + 6".into()), 6)));
        match fenced_read(5).await {
            Err(FenceError::Stale { token: 5, seen: 6 }) => {}
            other => panic!("expected a stale read refused, got {other:?}"),
        }
    }
}

#[cfg(feature = "fenced-sqlx")]
mod sqlx_adapter {
    use dlock::fenced::{FenceError, Token};
    use sqlx::Connection;

    use super::table::{Table, stale};
    use super::*;

    /// Through sqlx: the same table, a connection of sqlx's own per write.
    struct Sqlx(Table);

    #[async_trait]
    impl HeldStore<FenceError<sqlx::Error>> for Sqlx {
        async fn write(&self, guard: &Guard, value: &str) -> Result<(), FenceError<sqlx::Error>> {
            let mut connection = sqlx::PgConnection::connect(&postgres().server.url())
                .await
                .expect("sqlx connects");
            let mut params = sqlx::postgres::PgArguments::default();
            sqlx::Arguments::add(&mut params, value.to_owned()).expect("encode");
            self.0
                .fenced
                .update_sqlx(&mut connection, "v = $1", params, "held", Token::of(guard))
                .await
        }

        async fn read(&self) -> Option<String> {
            self.0.row("held").await.and_then(|(value, _)| value)
        }
    }

    #[test]
    fn paused_holder_is_refused_by_a_fenced_table_through_sqlx() {
        let table = runtime().block_on(Table::made());
        paused_holder_is_refused("sqlx", Sqlx(table), stale);
    }
}

#[cfg(feature = "fenced-redis")]
mod redis_adapter {
    use dlock::fenced::{FenceError, Token, redis as fenced};
    use redis::AsyncCommands;

    use super::*;

    async fn connection() -> redis::aio::MultiplexedConnection {
        redis::Client::open(format!("redis://{}", redis().server.address()))
            .expect("url")
            .get_multiplexed_async_connection()
            .await
            .expect("redis")
    }

    fn stale(error: &FenceError<redis::RedisError>) -> Option<(u64, u64)> {
        match error {
            FenceError::Stale { token, seen } => Some((*token, *seen)),
            _ => None,
        }
    }

    /// A string key, written by the fenced `SET`.
    struct Set(String);

    #[async_trait]
    impl HeldStore<FenceError<redis::RedisError>> for Set {
        async fn write(&self, guard: &Guard, value: &str) -> Result<(), FenceError<redis::RedisError>> {
            fenced::set(&mut connection().await, &self.0, value, Token::of(guard)).await
        }

        async fn read(&self) -> Option<String> {
            connection().await.get(&self.0).await.expect("GET")
        }
    }

    /// A hash's field `v`, written by the fenced `HSET`.
    struct Hset(String);

    #[async_trait]
    impl HeldStore<FenceError<redis::RedisError>> for Hset {
        async fn write(&self, guard: &Guard, value: &str) -> Result<(), FenceError<redis::RedisError>> {
            let fields = [("v", value), ("by", "fenced")];
            fenced::hset(&mut connection().await, &self.0, &fields, Token::of(guard)).await
        }

        async fn read(&self) -> Option<String> {
            connection().await.hget(&self.0, "v").await.expect("HGET")
        }
    }

    #[test]
    fn paused_holder_is_refused_by_a_fenced_set() {
        paused_holder_is_refused("redis SET", Set(format!("{{{}}}", unique("set"))), stale);
    }

    #[test]
    fn paused_holder_is_refused_by_a_fenced_hset() {
        paused_holder_is_refused("redis HSET", Hset(unique("hset")), stale);
    }

    /// The highest token is kept exactly, past 2^53 where Lua's numbers
    /// round, and answered with a refusal; a refusal writes nothing.
    #[tokio::test]
    async fn a_refusal_names_the_highest_token_and_writes_nothing() {
        let mut con = connection().await;
        let (key, hash) = (format!("{{{}}}", unique("set")), unique("hset"));
        let token = |fence| Token { fence, slot: None };
        let high = (1 << 53) + 1;
        fenced::set(&mut con, &key, "high", token(high))
            .await
            .expect("SET");
        fenced::hset(&mut con, &hash, &[("v", "high")], token(high))
            .await
            .expect("HSET");
        for refused in [
            fenced::set(&mut con, &key, "low", token(high - 1)).await,
            fenced::hset(&mut con, &hash, &[("v", "low")], token(high - 1)).await,
        ] {
            match refused {
                Err(FenceError::Stale { token, seen }) => assert_eq!((token, seen), (high - 1, high)),
                other => panic!("expected Stale, got {other:?}"),
            }
        }
        let value: String = con.get(&key).await.expect("GET");
        let fields: Vec<(String, String)> = con.hgetall(&hash).await.expect("HGETALL");
        assert_eq!(value, "high");
        assert!(fields.contains(&("v".into(), "high".into())), "{fields:?}");
        assert!(
            fields.contains(&(fenced::FENCE_FIELD.into(), high.to_string())),
            "{fields:?}"
        );
        let kept: String = con.get(fenced::fence_key(&key)).await.expect("GET");
        assert_eq!(kept, high.to_string());
    }
}

#[cfg(feature = "fenced-http")]
mod http_adapter {
    use std::sync::Mutex;
    use std::time::Duration;

    use axum::Router;
    use axum::extract::{FromRef, State};
    use axum::routing::get;
    use dlock::BoxError;
    use dlock::fenced::Token;
    use dlock::fenced::http::{FENCE, Fenced, HighWater, InMemory, LOCK, Raised, SLOT, headers};

    use super::service::Http;
    use super::*;

    /// The service's state: its marks and its one value, the storage.
    #[derive(Clone)]
    struct App {
        marks: Arc<dyn HighWater>,
        value: Arc<Mutex<Option<String>>>,
    }

    impl FromRef<App> for Arc<dyn HighWater> {
        fn from_ref(app: &App) -> Self {
            app.marks.clone()
        }
    }

    async fn put(_: Fenced, State(app): State<App>, body: String) -> &'static str {
        *app.value.lock().expect("value") = Some(body);
        "stored"
    }

    /// A service on 127.0.0.1:0, on a runtime of its own thread (no
    /// holder's pause stops it): its URL and its storage.
    fn serve(marks: Arc<dyn HighWater>) -> (String, Arc<Mutex<Option<String>>>) {
        let value = Arc::new(Mutex::new(None));
        let app = Router::new()
            .route(
                "/value",
                get(|State(app): State<App>| async move {
                    app.value.lock().expect("value").clone().unwrap_or_default()
                })
                .put(put),
            )
            .with_state(App {
                marks,
                value: value.clone(),
            });
        let (url_tx, url_rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            runtime().block_on(async move {
                let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
                let url = format!("http://{}/value", listener.local_addr().expect("address"));
                url_tx.send(url).expect("the test listens");
                axum::serve(listener, app).await.expect("serve");
            });
        });
        let url = url_rx
            .recv_timeout(Duration::from_secs(10))
            .expect("the service listens");
        (url, value)
    }

    /// `PUT` with `headers`; the status and body.
    async fn send(url: &str, headers: &[(String, String)], body: &str) -> (u16, String) {
        let headers: Vec<(&str, &str)> = headers.iter().map(|(n, v)| (n.as_str(), v.as_str())).collect();
        // A client per request: its connections live on the caller's runtime.
        Http::default()
            .send(http::Method::PUT, url, &headers, body.to_owned())
            .await
    }

    fn text(guard: &Guard) -> Vec<(String, String)> {
        headers(guard)
            .iter()
            .map(|(name, value)| (name.to_string(), value.to_str().expect("ASCII").to_owned()))
            .collect()
    }

    struct Service {
        url: String,
        value: Arc<Mutex<Option<String>>>,
    }

    #[async_trait]
    impl HeldStore<(u16, String)> for Service {
        async fn write(&self, guard: &Guard, value: &str) -> Result<(), (u16, String)> {
            match send(&self.url, &text(guard), value).await {
                (200, _) => Ok(()),
                refused => Err(refused),
            }
        }

        async fn read(&self) -> Option<String> {
            self.value.lock().expect("value").clone()
        }
    }

    fn conflict(refused: &(u16, String)) -> Option<(u64, u64)> {
        // "stale fence: token T is below S, which this service has seen"
        let words: Vec<&str> = refused.1.split(' ').collect();
        match (refused.0, words.as_slice()) {
            (409, [_, _, _, token, _, _, seen, ..]) => Some((
                token.parse().expect("token"),
                seen.trim_end_matches(',').parse().expect("seen"),
            )),
            _ => None,
        }
    }

    /// The marks in a PostgreSQL table, raised by one statement.
    struct PgMarks {
        table: String,
    }

    #[async_trait]
    impl HighWater for PgMarks {
        async fn raise(&self, resource: &str, token: u64) -> Result<Raised, BoxError> {
            let (client, connection) =
                tokio_postgres::connect(&postgres().server.url(), tokio_postgres::NoTls).await?;
            tokio::spawn(connection);
            let sql = format!(
                "INSERT INTO {0} (resource, fence) VALUES ($1, $2) ON CONFLICT (resource) \
                 DO UPDATE SET fence = GREATEST({0}.fence, excluded.fence) RETURNING fence",
                self.table
            );
            let token = i64::try_from(token)?;
            let mark: i64 = client.query_one(&sql, &[&resource, &token]).await?.get(0);
            Ok(match mark == token {
                true => Raised::Accepted,
                false => Raised::Stale {
                    seen: u64::try_from(mark)?,
                },
            })
        }
    }

    #[test]
    fn paused_holder_is_refused_by_a_fenced_service() {
        let (url, value) = serve(Arc::new(InMemory::default()));
        paused_holder_is_refused("http, marks in memory", Service { url, value }, conflict);
    }

    #[test]
    fn paused_holder_is_refused_by_a_fenced_service_with_marks_in_postgres() {
        let table = unique("marks").replace('-', "_");
        runtime().block_on(async {
            let (client, connection) =
                tokio_postgres::connect(&postgres().server.url(), tokio_postgres::NoTls)
                    .await
                    .expect("postgres");
            tokio::spawn(connection);
            client
                .batch_execute(&format!(
                    "CREATE TABLE {table} (resource text PRIMARY KEY, fence bigint NOT NULL)"
                ))
                .await
                .expect("the marks' table");
        });
        let (url, value) = serve(Arc::new(PgMarks { table }));
        paused_holder_is_refused("http, marks in postgres", Service { url, value }, conflict);
    }

    /// Two permits' slots keep marks apart: the lower token of the other
    /// slot passes after the higher one, and only a token below its own
    /// slot's mark is refused.
    #[tokio::test]
    async fn a_permits_two_slots_fence_independently() {
        let (url, _) = serve(Arc::new(InMemory::default()));
        // Two registries, as two processes: one task's permits reenter.
        let group = unique("pool");
        let mut pools = Vec::new();
        for name in ["one", "two"] {
            let engine = dlock_testkit::engine(redis()).await;
            let registry = dlock::Registry::with_engine(name, engine, dlock::engines::conformance::SETTINGS)
                .expect("registry");
            pools.push(registry.locks(&group).semaphore("replicas", 2));
        }
        let first = pools[0].acquire().await.expect("a permit");
        // The other slot's fence rises past the first's.
        for _ in 0..3 {
            let other = pools[1].acquire().await.expect("the other permit");
            other.release().await.expect("release");
        }
        let second = pools[1].acquire().await.expect("the other permit");
        assert_ne!(first.slot(), second.slot(), "two permits, two slots");
        let (low, high) = (Token::of(&first), Token::of(&second));
        assert!(high.fence > low.fence, "{high:?} above {low:?}");
        assert_eq!(send(&url, &text(&second), "high").await.0, 200);
        assert_eq!(
            send(&url, &text(&first), "low").await.0,
            200,
            "the other slot's mark is its own"
        );
        let mut older = text(&first);
        let fence = older
            .iter_mut()
            .find(|(name, _)| name == FENCE.as_str())
            .expect("fence");
        fence.1 = (low.fence - 1).to_string();
        let (status, body) = send(&url, &older, "older").await;
        assert_eq!(
            (status, conflict(&(status, body.clone()))),
            (409, Some((low.fence - 1, low.fence))),
            "{body}"
        );
        first.release().await.expect("release");
        second.release().await.expect("release");
    }

    /// A missing or garbled header is a 400 naming it, and the handler
    /// does not run.
    #[tokio::test]
    async fn a_garbled_header_is_a_bad_request() {
        let (url, value) = serve(Arc::new(InMemory::default()));
        let good = [(LOCK, "locks/one"), (FENCE, "7"), (SLOT, "1")];
        for (name, garbled) in [
            (LOCK, None),
            (FENCE, None),
            (FENCE, Some("seven")),
            (FENCE, Some("-1")),
            (SLOT, Some("x")),
            (SLOT, Some("4294967296")),
        ] {
            let headers: Vec<(String, String)> = good
                .iter()
                .filter_map(|(n, v)| match *n == name {
                    true => garbled.map(|g| (n.to_string(), g.to_owned())),
                    false => Some((n.to_string(), (*v).to_owned())),
                })
                .collect();
            let (status, body) = send(&url, &headers, "garbled").await;
            assert_eq!(status, 400, "{name} {garbled:?}: {body}");
            assert!(body.contains(name.as_str()), "{body}");
        }
        assert_eq!(*value.lock().expect("value"), None, "no handler ran");
        let good: Vec<(String, String)> = good
            .iter()
            .map(|(n, v)| (n.to_string(), (*v).to_owned()))
            .collect();
        assert_eq!(send(&url, &good, "good").await.0, 200);
    }
}

/// A runtime for a test's setup, or a service's thread.
fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Runtime::new().expect("runtime")
}
