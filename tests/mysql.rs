//! mysql-specific behaviour against a real MariaDB on loopback: the gate is
//! taken before the table is read, writers on the gate and readers in the
//! table never overlap, a dead waiter
//! never blocks the line, `queue = "local"` sends one waiter per lock, odd
//! keys stay apart, the table is empty once leases have run out, a table
//! made by an older dlock gets the columns for records, records carry the
//! configured label, a record left under a session id that a restart
//! gave out again is not the new hold's, force release deletes a lock's rows and ends its
//! gate's own session and nothing else, and bad settings, a failed login,
//! a missing privilege and an unreachable server are clear errors.

#![cfg(feature = "mysql")]

use std::sync::Arc;
use std::time::{Duration, Instant};

use dlock::config::Queue;
use dlock::engines::conformance;
use dlock::engines::mysql::{MysqlConfig, MysqlEngine};
use dlock::kit::ClientSettings;
use dlock::kit::{Engine, Lifecycle, Poll, Request};
use dlock::{Error, LockKey, LostReason, Mode, Registry, Settings};
use dlock_testkit::fixtures::mysql::{DATABASE, MariaDb, Mysql};
use dlock_testkit::{Fixture, assert_unreachable_is_a_clear_error, server::free_port};

fn config(server: &MariaDb) -> MysqlConfig {
    MysqlConfig {
        client: ClientSettings::with_timeout(Duration::from_secs(2)),
        ..MysqlConfig::new(server.url())
    }
}

/// An engine on `server`, with the table made.
async fn engine(server: &MariaDb) -> Arc<dyn Engine> {
    Arc::new(
        MysqlEngine::connect("my", &config(server))
            .await
            .expect("connect"),
    )
}

fn rows(server: &MariaDb, filter: &str) -> usize {
    let sql = format!("SELECT COUNT(*) FROM {DATABASE}.dlock_queue {filter}");
    server.sql(&sql).parse().expect("count")
}

fn request(name: &str) -> Request {
    Request::new(
        LockKey::new("my", name).expect("key"),
        Mode::Write,
        Duration::from_secs(30),
    )
}

/// Force release of a lock held through the table (two readers) deletes
/// their rows; of a lock held by its gate, it ends the gate's session,
/// which holds nothing else. Each holder learns at its next renewal that
/// it was forced out, and the locks are free; another lock, its own gate
/// session held by the same process all along, is untouched.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn force_release_ends_that_locks_rows_and_gate_session_only() {
    let fixture = Mysql::start();
    let server = &fixture.server;
    let lease = Duration::from_secs(2);
    let settings = Settings {
        lease,
        ..Settings::default()
    };
    let connect = || async {
        let engine = MysqlEngine::connect("my", &config(server))
            .await
            .expect("connect");
        Registry::with_engine("my", Arc::new(engine), settings).expect("registry")
    };
    let (registry, operator) = (connect().await, connect().await);
    let locks = registry.locks("g");
    let read = locks.get("read");
    let mut guards = vec![read.read().await.expect("read")];
    let read = read.clone();
    guards.push(
        tokio::spawn(async move { read.read().await.expect("read") })
            .await
            .expect("task"),
    );
    guards.push(locks.get("gated").lock().await.expect("lock"));
    let other = locks.get("other").lock().await.expect("lock");
    assert_eq!(
        rows(server, "WHERE held = 1"),
        2,
        "the readers hold rows, the writers gates"
    );

    let ops = operator.locks("g");
    assert_eq!(ops.get("read").force_release().await.expect("force release"), 2);
    assert_eq!(ops.get("gated").force_release().await.expect("force release"), 1);
    assert_eq!(rows(server, "WHERE held = 1"), 0);
    for guard in &guards {
        let reason = tokio::time::timeout(lease, guard.lost())
            .await
            .expect("each holder learns by its next renewal");
        assert_eq!(reason, LostReason::ForceReleased);
    }
    for name in ["read", "gated"] {
        let next = ops.get(name).try_lock().await.expect("try");
        next.expect("the lock forced free is free")
            .release()
            .await
            .expect("release");
    }
    assert!(!other.is_lost() && !other.is_revoked());
    let view = ops.get("other").inspect().await.expect("inspect");
    assert_eq!(view.holders.len(), 1, "the other lock is still held: {view:?}");
    other.release().await.expect("the other lock's release");
}

/// A waiter that queued and then never polled again (its process froze)
/// is skipped once its liveness runs out: the waiter behind it gets the
/// lock within the waiter ttl, not never.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_dead_waiter_never_blocks_the_line() {
    let fixture = Mysql::start();
    let engine: Arc<dyn Engine> = Arc::new(
        MysqlEngine::connect("my", &config(&fixture.server))
            .await
            .expect("connect"),
    );
    let holder = request("line");
    assert!(matches!(engine.acquire(&holder).await, Ok(Poll::Held(_))));
    let dead = request("line");
    assert!(matches!(engine.acquire(&dead).await, Ok(Poll::Waiting(_))));
    let registry = Registry::with_engine("my", engine.clone(), Settings::default()).expect("registry");
    let behind = tokio::spawn(async move {
        registry
            .locks("my")
            .get("line")
            .lock_for(Duration::from_secs(20))
            .await
            .map(|g| g.fence())
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let released = Instant::now();
    assert!(engine.release(&holder).await.expect("release"));
    let fence = behind
        .await
        .expect("task")
        .expect("the waiter behind the dead one");
    let took = released.elapsed();
    assert!(
        took < Duration::from_secs(3) + Duration::from_millis(700),
        "blocked {took:?} by a dead waiter"
    );
    // The dead waiter, polling again, finds itself dropped and queues at the back.
    assert!(matches!(engine.poll(&dead).await, Ok(Poll::Waiting(_))));
    assert!(fence > 0);
    engine.cancel(&dead).await.expect("cancel");
}

/// What a write hold taken at once relies on: in the one statement that
/// takes the gate and reads the table, MariaDB reads only once the gate is
/// taken, and sees the rows a grant committed before letting it go. Here
/// the taker waits in `GET_LOCK` while another session inserts a row and
/// lets the gate go: the taker must see that row (answer 0), not hold.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_table_is_read_only_once_the_gate_is_taken() {
    use mysql_async::prelude::Queryable;
    let fixture = Mysql::start();
    MysqlEngine::connect("my", &config(&fixture.server))
        .await
        .expect("connect: makes the table");
    let pool = mysql_async::Pool::new(fixture.server.url().as_str());
    let (mut granter, mut taker) = (
        pool.get_conn().await.expect("conn"),
        pool.get_conn().await.expect("conn"),
    );
    let took: Option<i64> = granter
        .query_first("SELECT GET_LOCK('dlock:order', 0)")
        .await
        .expect("gate");
    assert_eq!(took, Some(1));
    let taking = tokio::spawn(async move {
        let answer: Option<Option<u64>> = taker
            .query_first(
                "SELECT IF(GET_LOCK('dlock:order', 10) = 1, \
                   IF(EXISTS(SELECT 1 FROM dlock_queue WHERE lock_key = 'order' AND expires > UTC_TIMESTAMP(6)), 0, UUID_SHORT()), \
                   NULL)",
            )
            .await
            .expect("take");
        answer.flatten()
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    granter
        .query_drop(
            "INSERT INTO dlock_queue (lock_key, owner, mode, held, expires) \
             VALUES ('order', REPEAT('x', 16), 1, 1, UTC_TIMESTAMP(6) + INTERVAL 1 MINUTE)",
        )
        .await
        .expect("a read hold's row");
    granter
        .query_drop("DO RELEASE_LOCK('dlock:order')")
        .await
        .expect("release");
    assert_eq!(
        taking.await.expect("task"),
        Some(0),
        "the taker held the gate without seeing the row committed before it"
    );
}

/// One engine writes (taken at once: the gate, no row), another reads
/// (rows), both straight to the server and often meeting a holder of the
/// other kind: no writer ever shares the lock, and every write lands. (A
/// reader that ignored the gate overlapped a writer in 2 runs of 3.)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn gate_writers_and_table_readers_never_overlap() {
    use std::sync::atomic::{AtomicU64, Ordering};
    let fixture = Mysql::start();
    let (readers, writers, violations, writes) = (
        Arc::new(AtomicU64::new(0)),
        Arc::new(AtomicU64::new(0)),
        Arc::new(AtomicU64::new(0)),
        Arc::new(AtomicU64::new(0)),
    );
    let mut tasks = Vec::new();
    // One engine writes, the other reads, as two processes would.
    for reads in [false, true] {
        let engine = Arc::new(
            MysqlEngine::connect("my", &config(&fixture.server))
                .await
                .expect("connect"),
        );
        // Every request goes to the server, none waits its turn in the process.
        let settings = Settings {
            queue: Queue::Engine,
            ..Settings::default()
        };
        let registry = Registry::with_engine("my", engine, settings).expect("registry");
        for task in 0..2u64 {
            let lock = registry.locks("my").get("race");
            let (readers, writers, violations, writes) = (
                readers.clone(),
                writers.clone(),
                violations.clone(),
                writes.clone(),
            );
            tasks.push(tokio::spawn(async move {
                for round in 0..150u64 {
                    // Often free, often held: newcomers meet holders of both kinds.
                    tokio::time::sleep(Duration::from_millis(1 + (task + round) % 4)).await;
                    if reads {
                        let guard = lock.read().await.expect("read");
                        readers.fetch_add(1, Ordering::SeqCst);
                        if writers.load(Ordering::SeqCst) > 0 {
                            violations.fetch_add(1, Ordering::SeqCst);
                        }
                        tokio::time::sleep(Duration::from_millis(1)).await;
                        readers.fetch_sub(1, Ordering::SeqCst);
                        guard.release().await.expect("release");
                    } else {
                        let guard = lock.lock().await.expect("lock");
                        if writers.fetch_add(1, Ordering::SeqCst) > 0 || readers.load(Ordering::SeqCst) > 0 {
                            violations.fetch_add(1, Ordering::SeqCst);
                        }
                        let seen = writes.load(Ordering::SeqCst);
                        tokio::time::sleep(Duration::from_millis(1)).await;
                        writes.store(seen + 1, Ordering::SeqCst);
                        writers.fetch_sub(1, Ordering::SeqCst);
                        guard.release().await.expect("release");
                    }
                }
            }));
        }
    }
    for task in tasks {
        task.await.expect("task");
    }
    // Two writing tasks, 150 writes each.
    let expected = 2 * 150;
    assert_eq!(violations.load(Ordering::SeqCst), 0, "overlaps");
    assert_eq!(writes.load(Ordering::SeqCst), expected, "lost writes");
}

/// With `queue = "local"`, twenty tasks waiting in one process are one
/// row in the queue.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_local_queue_sends_one_waiter_per_lock() {
    let fixture = Mysql::start();
    let server = &fixture.server;
    let engine = engine(server).await;
    let settings = Settings {
        queue: Queue::Local,
        ..Settings::default()
    };
    let registry = Registry::with_engine("my", engine.clone(), settings).expect("registry");
    let holder = request("local");
    assert!(matches!(engine.acquire(&holder).await, Ok(Poll::Held(_))));
    let tasks: Vec<_> = (0..20)
        .map(|_| {
            let lock = registry.locks("my").get("local");
            tokio::spawn(async move { lock.lock().await.expect("lock").release().await.expect("release") })
        })
        .collect();
    let deadline = Instant::now() + Duration::from_secs(10);
    while rows(server, "WHERE held = 0") == 0 {
        assert!(Instant::now() < deadline, "no waiter reached the queue");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        rows(server, "WHERE held = 0"),
        1,
        "waiter rows for 20 local waiters"
    );
    assert!(engine.release(&holder).await.expect("release"));
    for task in tasks {
        task.await.expect("task");
    }
}

/// Quotes, backslashes, NUL, unicode and 10 KB names are each their own
/// lock; parameters carry them, so no name can change a statement.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn odd_keys_are_distinct_locks() {
    let fixture = Mysql::start();
    let engine: Arc<dyn Engine> = Arc::new(
        MysqlEngine::connect("my", &config(&fixture.server))
            .await
            .expect("connect"),
    );
    let long = "é".repeat(5 * 1024);
    let names = [
        "'",
        "''",
        "\\",
        "\\'",
        "\0",
        "a\0b",
        "a\0c",
        "'; DROP TABLE dlock_queue; --",
        "锁 ✓",
        long.as_str(),
    ];
    let requests: Vec<Request> = names.iter().map(|n| request(n)).collect();
    for (req, name) in requests.iter().zip(names) {
        assert!(
            matches!(engine.acquire(req).await, Ok(Poll::Held(_))),
            "{name:?} collided"
        );
    }
    for name in names {
        let mut again = request(name);
        again.try_once = true;
        assert!(
            matches!(engine.acquire(&again).await, Ok(Poll::Waiting(_))),
            "{name:?} held twice"
        );
    }
    for req in &requests {
        assert!(engine.release(req).await.expect("release"));
    }
    assert_eq!(rows(&fixture.server, ""), 0);
}

/// The whole suite, each case on a fresh engine kept open: once it is done
/// and the leases it left have run out, the sweep leaves the table empty.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_table_is_empty_once_leases_have_run_out() {
    let fixture = Mysql::start();
    let engines = std::sync::Mutex::new(Vec::new());
    let (kept, fixture_ref) = (&engines, &fixture);
    conformance::run_each(|| async move {
        let engine = dlock_testkit::engine(fixture_ref).await;
        kept.lock().unwrap().push(engine.clone());
        engine
    })
    .await;
    let deadline = Instant::now() + Duration::from_secs(20);
    while rows(&fixture.server, "") > 0 {
        let left = fixture.server.sql(&format!(
            "SELECT ticket, held, expires, UTC_TIMESTAMP(6) FROM {DATABASE}.dlock_queue"
        ));
        assert!(Instant::now() < deadline, "left in the table: {left}");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

#[tokio::test]
async fn bad_settings_a_failed_login_and_an_unreachable_server_are_clear_errors() {
    let port = free_port();
    let unreachable = MysqlConfig {
        max_connections: 4,
        client: ClientSettings::with_timeout(Duration::from_secs(1)),
        ..MysqlConfig::new(format!("mysql://dlock@127.0.0.1:{port}/dlock"))
    };
    let connect = MysqlEngine::connect("my", &unreachable);
    assert_unreachable_is_a_clear_error(
        connect,
        "my",
        &format!("127.0.0.1:{port}"),
        Duration::from_secs(3),
    )
    .await;

    for (url, field) in [
        ("postgres://h/db", "engines.my.url"),
        ("mysql://127.0.0.1:3306", "engines.my.url"),
        ("mysql://127.0.0.1:notaport/db", "engines.my.url"),
    ] {
        let config = MysqlConfig {
            url: url.to_owned(),
            ..unreachable.clone()
        };
        match MysqlEngine::connect("my", &config).await {
            Err(Error::Config { field: named, .. }) => assert_eq!(named, field, "{url}"),
            other => panic!("{url}: expected a config error, got {:?}", other.err()),
        }
    }

    let fixture = Mysql::start();
    let wrong = MysqlConfig {
        url: format!("mysql://dlock:wrong@127.0.0.1:{}/{DATABASE}", fixture.server.port),
        ..unreachable
    };
    let err = MysqlEngine::connect("my", &wrong)
        .await
        .err()
        .expect("logged in with a wrong password");
    let message = err.to_string();
    assert!(
        message.contains(&format!("127.0.0.1:{}", fixture.server.port)) && message.contains("Access denied"),
        "{message}"
    );
    assert!(!message.contains("wrong"), "the password shows: {message}");
}

#[tokio::test]
async fn a_missing_privilege_is_named_with_the_fix() {
    let fixture = Mysql::start();
    let server = &fixture.server;
    server.sql(&format!(
        "CREATE USER 'weak'@'127.0.0.1' IDENTIFIED BY 'weak'; GRANT SELECT ON {DATABASE}.* TO 'weak'@'127.0.0.1'"
    ));
    let weak = MysqlConfig {
        url: format!("mysql://weak:weak@127.0.0.1:{}/{DATABASE}", server.port),
        ..config(server)
    };
    let expect_refusal = |err: Option<Error>, fix: &str| match err {
        Some(Error::Config { field, message }) => {
            assert_eq!(field, "engines.my.url");
            assert!(message.contains(fix), "{message}");
        }
        other => panic!("expected a config error, got {other:?}"),
    };
    expect_refusal(MysqlEngine::connect("my", &weak).await.err(), "grant CREATE");
    // The owner makes the table; the weak user still may not write to it.
    MysqlEngine::connect("my", &config(server))
        .await
        .expect("the owner connects");
    expect_refusal(
        MysqlEngine::connect("my", &weak).await.err(),
        "(INSERT and SELECT)",
    );
    server.sql(&format!(
        "GRANT INSERT, UPDATE, DELETE ON {DATABASE}.* TO 'weak'@'127.0.0.1'"
    ));
    let engine = MysqlEngine::connect("my", &weak)
        .await
        .expect("connect once granted");
    let req = request("k");
    assert!(matches!(engine.acquire(&req).await, Ok(Poll::Held(_))));
    assert!(engine.release(&req).await.expect("release"));
}

/// A table made by an older dlock, without the columns for records, gets
/// them at startup; its rows still count (an old client's read hold keeps
/// a writer out, and shows as a holder with what it stored), and new holds
/// carry the configured `client_name`, a write hold taken at once too.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_older_table_gets_the_record_columns_and_records_carry_the_label() {
    let fixture = Mysql::start();
    let server = &fixture.server;
    server.sql(&format!(
        "CREATE TABLE {DATABASE}.dlock_queue (
            ticket BIGINT UNSIGNED NOT NULL AUTO_INCREMENT,
            lock_key VARBINARY(255) NOT NULL,
            name LONGBLOB NULL,
            owner BINARY(16) NOT NULL,
            mode TINYINT UNSIGNED NOT NULL,
            held TINYINT UNSIGNED NOT NULL,
            expires DATETIME(6) NOT NULL,
            PRIMARY KEY (ticket),
            UNIQUE KEY by_owner (owner),
            KEY by_lock (lock_key, ticket),
            KEY by_expiry (expires)
        ) ENGINE = InnoDB;
        INSERT INTO {DATABASE}.dlock_queue (lock_key, owner, mode, held, expires)
        VALUES (CONCAT(0x01, 0x02, 'my', 'old'), REPEAT(0x07, 16), 1, 1, UTC_TIMESTAMP(6) + INTERVAL 1 MINUTE)"
    ));
    let labelled = MysqlConfig {
        client: ClientSettings {
            client_name: Some("billing-7".to_owned()),
            ..ClientSettings::with_timeout(Duration::from_secs(2))
        },
        ..config(server)
    };
    let engine: Arc<dyn Engine> = Arc::new(
        MysqlEngine::connect("my", &labelled)
            .await
            .expect("connect: adds the columns"),
    );
    let columns = server.sql(&format!(
        "SELECT GROUP_CONCAT(column_name ORDER BY column_name) FROM information_schema.columns \
         WHERE table_schema = '{DATABASE}' AND table_name = 'dlock_queue' \
         AND column_name IN ('fence', 'since', 'label', 'revoked')"
    ));
    assert_eq!(columns, "fence,label,revoked,since");

    let mut writer = request("old");
    writer.try_once = true;
    assert!(
        matches!(engine.acquire(&writer).await, Ok(Poll::Waiting(_))),
        "the old client's read hold keeps a writer out"
    );
    let reader = Request::new(
        LockKey::new("my", "old").expect("key"),
        Mode::Read,
        Duration::from_secs(30),
    );
    let Ok(Poll::Held(fence)) = engine.acquire(&reader).await else {
        panic!("a reader shares the old client's read hold");
    };
    let records = engine.facets().inspect.expect("records");
    let view = records
        .inspect(&LockKey::new("my", "old").expect("key"), None)
        .await
        .expect("inspect");
    let old_owner = dlock::kit::OwnerId::from_u128(u128::from_be_bytes([7; 16])).digest();
    let [old, new] = view.holders.as_slice() else {
        panic!("two readers expected: {view:?}");
    };
    assert_eq!((old.mode, old.owner.as_ref()), (Mode::Read, Some(&old_owner)));
    assert_eq!(
        (old.label.as_ref(), old.fence, old.since),
        (None, None, None),
        "{view:?}"
    );
    assert_eq!(new.label.as_deref(), Some("billing-7"));
    assert_eq!(
        (new.fence, new.owner.clone()),
        (Some(fence), Some(reader.owner.digest()))
    );
    assert!(engine.release(&reader).await.expect("release"));

    // A write hold taken at once: the gate, and its record once it lasts.
    let gated = request("gated");
    let Ok(Poll::Held(fence)) = engine.acquire(&gated).await else {
        panic!("the gate hold");
    };
    assert_eq!(
        rows(server, "WHERE lock_key LIKE '%gated'"),
        0,
        "a gate hold has no row"
    );
    let view = records.inspect(&gated.key, None).await.expect("inspect");
    let [holder] = view.holders.as_slice() else {
        panic!("one holder expected: {view:?}");
    };
    assert_eq!(holder.label.as_deref(), Some("billing-7"));
    assert_eq!(
        (holder.fence, holder.owner.clone()),
        (Some(fence), Some(gated.owner.digest()))
    );
    assert!(engine.release(&gated).await.expect("release"));
    let left = server.sql(&format!("SELECT COUNT(*) FROM {DATABASE}.dlock_gates"));
    assert_eq!(left, "0", "a released hold's record is gone");
}

/// Session ids start again at a server restart, so a new gate session can
/// get the id of one that held the same gate before the restart, whose
/// record is still in the table. That record must not pass for the new
/// hold's: not its revoke mark to the holder, not its owner and fence to
/// readers. (It did: after a restart, an observer reported a deposed
/// leader's term again.) Here the earlier record is written with the id
/// the next session will get; an attempt counts when the engine's session
/// got it and was read before its own record would replace that one.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_record_left_under_a_reused_session_id_is_not_the_new_holds() {
    use dlock::kit::{RECORD_AFTER, Renewal};
    use mysql_async::prelude::Queryable;
    let fixture = Mysql::start();
    let server = &fixture.server;
    let engine = engine(server).await;
    let records = engine.facets().inspect.expect("records");
    let mut reader = mysql_async::Conn::new(mysql_async::Opts::from_url(server.url().as_str()).expect("url"))
        .await
        .expect("conn");

    // The gate's name and the key's bytes, from a record of a hold that lasted.
    let first = request("reused");
    assert!(matches!(engine.acquire(&first).await, Ok(Poll::Held(_))));
    let record = loop {
        let found: Option<(String, String)> = reader
            .query_first("SELECT gate, HEX(lock_key) FROM dlock_gates")
            .await
            .expect("read");
        if let Some(found) = found {
            break found;
        }
        tokio::time::sleep(RECORD_AFTER).await;
    };
    assert!(engine.release(&first).await.expect("release"));
    let (gate, key) = record;

    let mut counted = 0;
    for attempt in 1..=8 {
        let earlier = server.sql(&format!(
            "REPLACE INTO {DATABASE}.dlock_gates (gate, conn, lock_key, owner, fence, since, label, lease, revoked) \
             VALUES ('{gate}', CONNECTION_ID() + 1, UNHEX('{key}'), 'earlier0', 1, UTC_TIMESTAMP(6), 'earlier', 30000000, 1); \
             SELECT CONNECTION_ID() + 1"
        ));
        // A lease of its own: a new gate session, never an idle one.
        let req = Request::new(
            LockKey::new("my", "reused").expect("key"),
            Mode::Write,
            Duration::from_secs(30 + attempt),
        );
        let Ok(Poll::Held(fence)) = engine.acquire(&req).await else {
            panic!("the gate is free");
        };
        let taken = Instant::now();
        let renewal = engine.renew(&req).await.expect("renew");
        // Inspect reads at once, and waits only if it finds no record.
        let early = taken.elapsed() < RECORD_AFTER / 2;
        let view = records.inspect(&req.key, None).await.expect("inspect");
        let holder: Option<Option<u64>> = reader
            .exec_first("SELECT IS_USED_LOCK(?)", (&gate,))
            .await
            .expect("holder");
        assert!(engine.release(&req).await.expect("release"));
        if holder.flatten().map(|id| id.to_string()) != Some(earlier) || !early {
            continue;
        }
        counted += 1;
        assert_eq!(renewal, Renewal::Held, "the earlier session's revoke mark");
        let [shown] = view.holders.as_slice() else {
            panic!("one holder expected: {view:?}");
        };
        assert_eq!(
            (shown.fence, shown.owner.clone()),
            (Some(fence), Some(req.owner.digest())),
            "the earlier session's record was shown"
        );
    }
    assert!(counted > 0, "no session got the earlier one's id in time");
}

/// A grant takes the lowest slot no live holder has, through the slots'
/// bits up to 64 permits and through reads of its own past them: three
/// holders take 0, 1 and 2, and once 1 lets go the next takes 1.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_takes_the_lowest_free_slot_below_and_above_64_permits() {
    let fixture = Mysql::start();
    let registry =
        Registry::with_engine("main", engine(&fixture.server).await, Settings::default()).expect("registry");
    for permits in [4, 100] {
        let semaphore = registry
            .locks("my")
            .semaphore(format!("slots-{permits}"), permits);
        let mut held = dlock_testkit::permits_held(&semaphore, 3).await;
        let slots: Vec<Option<u32>> = held.iter().map(|g| g.slot()).collect();
        assert_eq!(slots, [Some(0), Some(1), Some(2)], "{permits} permits");
        held.remove(1).release().await.expect("release");
        let next = dlock_testkit::permits_held(&semaphore, 1).await.remove(0);
        assert_eq!(next.slot(), Some(1), "{permits} permits: the slot let go");
        for guard in held.into_iter().chain([next]) {
            guard.release().await.expect("release");
        }
    }
}
