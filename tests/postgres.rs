//! postgres-specific behaviour against a real PostgreSQL on loopback: the
//! pool bound with 1,000 holds and with more waiters than connections, a
//! cancelled wait leaves the server's queue, a dropped connection fires
//! `lost` for every hold on it, records name the client and drop a session
//! gone, the fence survives a crash, force release ends a holder's session
//! only when it holds nothing else, a revocation dies with its hold,
//! nothing is left in `pg_locks` or the
//! record table after the conformance suite, and bad settings, a failed
//! login, a missing privilege and an unreachable server are clear errors.

#![cfg(feature = "postgres")]

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use dlock::config::Queue;
use dlock::engines::conformance;
use dlock::engines::postgres::{PostgresConfig, PostgresEngine};
use dlock::kit::ClientSettings;
use dlock::kit::{Control, Engine, Inspect, Lifecycle, List, Poll, Request};
use dlock::{Error, LockKey, LostReason, Mode, Registry, Settings};
use dlock_testkit::fixtures::postgres::{PgServer, Postgres};
use dlock_testkit::{Fixture, assert_unreachable_is_a_clear_error, server::free_port};

fn config(server: &PgServer, application: &str, max_connections: usize) -> PostgresConfig {
    PostgresConfig {
        max_connections,
        client: ClientSettings::with_timeout(Duration::from_secs(2)),
        ..PostgresConfig::new(format!("{}?application_name={application}", server.url()))
    }
}

async fn engine(server: &PgServer, application: &str, max_connections: usize) -> Arc<dyn Engine> {
    Arc::new(
        PostgresEngine::connect("pg", &config(server, application, max_connections))
            .await
            .expect("connect"),
    )
}

/// Sessions open under `application`'s name.
fn sessions(server: &PgServer, application: &str) -> usize {
    let sql = format!("SELECT count(*) FROM pg_stat_activity WHERE application_name = '{application}'");
    server.psql(&sql).parse().expect("count")
}

fn advisory_locks(server: &PgServer, granted: bool) -> usize {
    let sql = format!("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted = {granted}");
    server.psql(&sql).parse().expect("count")
}

fn request(name: &str) -> Request {
    Request::new(
        LockKey::new("pg", name).expect("key"),
        Mode::Write,
        Duration::from_secs(30),
    )
}

/// The engine's control facet, which this engine offers.
fn control(engine: &dyn Engine) -> &dyn Control {
    engine.facets().control.expect("control")
}

/// The engine's records facet, which this engine offers.
fn records(engine: &dyn Engine) -> &dyn Inspect {
    engine.facets().inspect.expect("records")
}

/// The engine's listing facet, which this engine offers.
fn listing(engine: &dyn Engine) -> &dyn List {
    engine.facets().list.expect("listing")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_thousand_holds_share_the_pool() {
    let fixture = Postgres::start();
    let server = &fixture.server;
    let engine = engine(server, "thousand", 4).await;
    let requests: Vec<Request> = (0..1000).map(|i| request(&format!("k{i}"))).collect();
    for req in &requests {
        assert!(
            matches!(engine.acquire(req).await, Ok(Poll::Held(_))),
            "a free lock was refused"
        );
    }
    assert_eq!(advisory_locks(server, true), 1000);
    let open = sessions(server, "thousand");
    assert!((1..=4).contains(&open), "{open} sessions for 4 allowed");
    for req in &requests {
        assert!(engine.release(req).await.expect("release"));
    }
    assert_eq!(advisory_locks(server, true), 0);
}

/// Twelve waiters from one process on a pool of three: two wait in the
/// server's queue, the rest line up in the process; the counter comes out
/// exact and the pool never grows.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn more_waiters_than_connections_line_up_in_the_process() {
    let fixture = Postgres::start();
    let server = &fixture.server;
    // Every waiter asks the server, not only this process's first.
    let settings = Settings {
        queue: Queue::Engine,
        ..Settings::default()
    };
    let registry = Registry::with_engine("pg", engine(server, "lined", 3).await, settings).expect("registry");
    let holder = registry.locks("g").get("k").lock().await.expect("lock");
    let counter = Arc::new(AtomicU64::new(0));
    let tasks: Vec<_> = (0..12)
        .map(|_| {
            let (lock, counter) = (registry.locks("g").get("k"), counter.clone());
            tokio::spawn(async move {
                for _ in 0..5 {
                    let guard = lock.lock().await.expect("lock");
                    let seen = counter.load(Ordering::SeqCst);
                    tokio::task::yield_now().await;
                    counter.store(seen + 1, Ordering::SeqCst);
                    guard.release().await.expect("release");
                }
            })
        })
        .collect();
    let deadline = Instant::now() + Duration::from_secs(10);
    while advisory_locks(server, false) < 2 {
        assert!(
            Instant::now() < deadline,
            "the waiters never reached the server's queue"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(advisory_locks(server, false), 2, "waiters in the server's queue");
    assert!(sessions(server, "lined") <= 3);
    holder.release().await.expect("release");
    for task in tasks {
        task.await.expect("task");
    }
    assert_eq!(counter.load(Ordering::SeqCst), 60, "lost updates");
    assert!(sessions(server, "lined") <= 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_cancelled_wait_leaves_the_servers_queue() {
    let fixture = Postgres::start();
    let server = &fixture.server;
    let registry = Registry::with_engine("pg", engine(server, "cancel", 4).await, Settings::default())
        .expect("registry");
    let lock = registry.locks("g").get("k");
    let holder = lock.lock().await.expect("lock");
    let waiter = registry.locks("g").get("k");
    let timed_out = tokio::spawn(async move { waiter.lock_for(Duration::from_millis(300)).await.map(drop) })
        .await
        .expect("task");
    assert!(matches!(timed_out, Err(Error::Timeout { .. })), "{timed_out:?}");
    let dropped = tokio::spawn({
        let waiter = registry.locks("g").get("k");
        async move { waiter.lock().await.map(drop) }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    dropped.abort();
    let _ = dropped.await;
    // A bound, not a speed check: the cancel opens a connection of its own,
    // slow when the whole suite loads the machine.
    let deadline = Instant::now() + Duration::from_secs(10);
    while advisory_locks(server, false) > 0 {
        assert!(
            Instant::now() < deadline,
            "a withdrawn wait still sleeps in the server's queue"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    holder.release().await.expect("release");
}

/// A wait withdrawn just as the lock is released: the server may act on
/// the cancel after the grant, in the middle of the grant's statement or
/// on the session's next one. Either way no lock may stay behind that the
/// engine does not book; one would be held as long as its session lives.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn waits_withdrawn_as_the_lock_frees_leave_nothing_behind() {
    let fixture = Postgres::start();
    let server = &fixture.server;
    let registry = |application| async move {
        Registry::with_engine("pg", engine(server, application, 4).await, Settings::default())
            .expect("registry")
    };
    let (holders, waiters) = (registry("holders").await, registry("waiters").await);
    for round in 0..60 {
        let holder = holders.locks("g").get("k").lock().await.expect("lock");
        let waiter = waiters.locks("g").get("k");
        // The release comes from 3 ms before the waiter gives up to 3 ms after.
        let wait = Duration::from_millis(30);
        let release_at = Duration::from_micros(27_000 + round % 13 * 500);
        let waited = tokio::spawn(async move {
            match waiter.lock_for(wait).await {
                Ok(guard) => guard.release().await.map(drop),
                Err(Error::Timeout { .. }) => Ok(()),
                Err(e) => Err(e),
            }
        });
        tokio::time::sleep(release_at).await;
        holder.release().await.expect("release");
        waited.await.expect("task").expect("the waiter failed");
        let again = holders.locks("g").get("k").lock_for(Duration::from_secs(2)).await;
        assert!(
            again.is_ok(),
            "round {round}: the lock stayed taken after its waiter left: {again:?}"
        );
        again.expect("lock").release().await.expect("release");
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    while advisory_locks(server, true) + advisory_locks(server, false) > 0 {
        assert!(Instant::now() < deadline, "advisory locks left on the server");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_dropped_connection_fires_lost_for_every_hold_on_it() {
    let fixture = Postgres::start();
    let server = &fixture.server;
    let registry = Registry::with_engine("pg", engine(server, "dropped", 2).await, Settings::default())
        .expect("registry");
    let mut guards = Vec::new();
    for name in ["a", "b", "c"] {
        guards.push(registry.locks("g").get(name).lock().await.expect("lock"));
    }
    let killed = server.psql(
        "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity \
         WHERE application_name = 'dropped' AND pid IN (SELECT pid FROM pg_locks WHERE locktype = 'advisory')",
    );
    assert_eq!(killed, "1", "the three holds share one session");
    for guard in &guards {
        let reason = tokio::time::timeout(Duration::from_secs(2), guard.lost())
            .await
            .expect("lost in time");
        assert_eq!(reason, LostReason::Engine);
    }
    for guard in guards {
        assert!(matches!(guard.release().await, Err(Error::Lost { .. })));
    }
    // The engine opens new sessions for what comes next.
    let again = registry
        .locks("g")
        .get("a")
        .lock()
        .await
        .expect("lock after the drop");
    again.release().await.expect("release");
}

/// The granted advisory locks' sessions, in order.
fn holding_pids(server: &PgServer) -> String {
    server.psql(
        "SELECT string_agg(DISTINCT pid::text, ',') FROM pg_locks WHERE locktype = 'advisory' AND granted",
    )
}

/// A holder alone on its session is forced out at once: its session is
/// ended, so the lock is free when force release answers, long before the
/// holder's next renewal, and the holder hears of it from the dropped
/// connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn force_release_ends_a_session_holding_nothing_else_at_once() {
    let fixture = Postgres::start();
    let server = &fixture.server;
    let lease = Duration::from_secs(30);
    let settings = Settings {
        lease,
        ..Settings::default()
    };
    let registry = Registry::with_engine("pg", engine(server, "alone", 2).await, settings).expect("registry");
    let operator =
        Registry::with_engine("pg", engine(server, "operator", 2).await, settings).expect("registry");
    let guard = registry.locks("g").get("alone").lock().await.expect("lock");
    let session = holding_pids(server);
    let lock = operator.locks("g").get("alone");
    assert_eq!(lock.force_release().await.expect("force release"), 1);
    assert!(lock.inspect().await.expect("inspect").is_free());
    let alive = format!("SELECT count(*) FROM pg_stat_activity WHERE pid = {session}");
    assert_eq!(server.psql(&alive), "0", "its session was ended");
    let reason = tokio::time::timeout(lease / 10, guard.lost())
        .await
        .expect("the holder hears it before its next renewal");
    assert_eq!(reason, LostReason::ForceReleased);
}

/// Two holds share one session: forcing one out ends no session, since
/// that would end the other too. The lock forced out is let go at its
/// holder's next renewal, which learns why, and its waiter gets in; the
/// other lock stays held, unasked.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn force_release_spares_the_other_holds_of_the_holders_session() {
    let fixture = Postgres::start();
    let server = &fixture.server;
    let lease = Duration::from_secs(2);
    let settings = Settings {
        lease,
        ..Settings::default()
    };
    let holding = engine(server, "shared", 2).await;
    let registry = Registry::with_engine("pg", holding.clone(), settings).expect("registry");
    let forced = registry.locks("g").get("forced").lock().await.expect("lock");
    let kept = registry.locks("g").get("kept").lock().await.expect("lock");
    let pids = holding_pids(server);
    assert!(!pids.contains(','), "the two holds share one session: {pids}");
    let operator =
        Registry::with_engine("pg", engine(server, "operator", 2).await, settings).expect("registry");
    let waiting = tokio::spawn({
        let lock = operator.locks("g").get("forced");
        async move { lock.lock().await.expect("the waiter's lock") }
    });
    tokio::time::sleep(lease / 10).await;

    let force = operator.locks("g").get("forced");
    assert_eq!(force.force_release().await.expect("force release"), 1);
    let next = tokio::time::timeout(lease, waiting)
        .await
        .expect("the waiter gets in by the holder's next renewal")
        .expect("waiter task");
    assert!(next.fence() > forced.fence());
    let reason = tokio::time::timeout(lease, forced.lost())
        .await
        .expect("the holder forced out learns it");
    assert_eq!(reason, LostReason::ForceReleased);
    assert!(
        holding_pids(server).split(',').any(|pid| pid == pids),
        "the holder's session lives on"
    );
    let records = records(&*holding);
    let view = records
        .inspect(&LockKey::new("g", "kept").expect("key"), None)
        .await
        .expect("inspect");
    assert_eq!(view.holders.len(), 1, "the other lock is still held: {view:?}");
    assert!(!kept.is_lost() && !kept.is_revoked());
    next.release().await.expect("release");
    kept.release().await.expect("the other lock's release");
}

/// A revocation marks the hold's row, which its release deletes: the next
/// hold of the lock on the very same session is not asked to let go.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_revocation_ends_with_the_hold_on_its_session() {
    let fixture = Postgres::start();
    let server = &fixture.server;
    let lease = Duration::from_secs(2);
    let settings = Settings {
        lease,
        ..Settings::default()
    };
    let registry =
        Registry::with_engine("pg", engine(server, "revoked", 2).await, settings).expect("registry");
    let operator =
        Registry::with_engine("pg", engine(server, "operator", 2).await, settings).expect("registry");
    let lock = registry.locks("g").get("r");
    let first = lock.lock().await.expect("lock");
    let session = holding_pids(server);
    assert_eq!(operator.locks("g").get("r").revoke().await.expect("revoke"), 1);
    tokio::time::timeout(lease, first.revoked())
        .await
        .expect("the holder hears it");
    first.release().await.expect("release");

    let second = lock.lock().await.expect("lock again");
    assert_eq!(holding_pids(server), session, "the same session holds it again");
    // Two renewals.
    tokio::time::sleep(lease * 3 / 4).await;
    assert!(!second.is_revoked(), "the next hold inherited the mark");
    second.release().await.expect("release");
}

/// A hold's record carries the configured `client_name`; once its session
/// is gone (the backend terminated) the hold no longer shows, though its
/// row stays in the table until a new connection sweeps it. The hold is
/// taken on the engine itself: a `Lock`'s watchdog would notice the loss and
/// ask, on a new connection, whether it was forced out, sweeping the row
/// before the test can see it stay.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn records_name_the_client_and_never_show_a_session_gone() {
    let fixture = Postgres::start();
    let server = &fixture.server;
    let mut named = config(server, "records", 2);
    named.client.client_name = Some("billing".to_owned());
    let holding = PostgresEngine::connect("pg", &named).await.expect("connect");
    // Its one connection is open already, so looking sweeps nothing.
    let looking = engine(server, "looking", 2).await;
    let req = request("stale");
    let Ok(Poll::Held(fence)) = holding.acquire(&req).await else {
        panic!("not granted")
    };
    let view = records(&*looking).inspect(&req.key, None).await.expect("inspect");
    let [holder] = view.holders.as_slice() else {
        panic!("one holder expected: {view:?}");
    };
    assert_eq!(holder.label.as_deref(), Some("billing"), "{view:?}");
    assert_eq!(
        (holder.fence, holder.owner.clone()),
        (Some(fence), Some(req.owner.digest()))
    );

    let killed = server.psql(
        "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = 'billing'",
    );
    assert_eq!(killed, "1");
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let view = records(&*looking).inspect(&req.key, None).await.expect("inspect");
        if view.is_free() {
            break;
        }
        assert!(Instant::now() < deadline, "the hold still shows: {view:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let listed = listing(&*looking).list("pg").await.expect("list");
    assert!(listed.is_empty(), "{listed:?}");
    let rows = "SELECT count(*) FROM dlock_holds";
    assert_eq!(server.psql(rows), "1", "the stale row is still there");
    drop(engine(server, "sweeping", 2).await);
    assert_eq!(server.psql(rows), "0", "a new connection swept it");
    drop(holding);
}

/// A record table made before revocation has no `revoked` column: the
/// engine adds it at startup, and revocation works on it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_older_record_table_gets_the_revoked_column() {
    let fixture = Postgres::start();
    let server = &fixture.server;
    server.psql(
        "CREATE UNLOGGED TABLE public.dlock_holds (key int8, pid int4, grp text NOT NULL, \
         name text NOT NULL, permits int4, fence int8, owner text NOT NULL, label text NOT NULL, \
         since timestamptz NOT NULL DEFAULT clock_timestamp(), lease int8 NOT NULL, \
         PRIMARY KEY (key, pid))",
    );
    let column = "SELECT count(*) FROM information_schema.columns \
                  WHERE table_name = 'dlock_holds' AND column_name = 'revoked'";
    assert_eq!(server.psql(column), "0");
    let engine = engine(server, "older", 2).await;
    assert_eq!(server.psql(column), "1", "the column was not added");
    let req = request("older");
    assert!(matches!(engine.acquire(&req).await, Ok(Poll::Held(_))));
    assert_eq!(
        control(&*engine)
            .revoke(&req.key, &dlock::Only::any())
            .await
            .expect("revoke"),
        1
    );
    assert_eq!(
        engine.renew(&req).await.expect("renew"),
        dlock::kit::Renewal::Revoked
    );
    assert!(engine.release(&req).await.expect("release"));
}

/// Sessions killed over and over while waiters wait, in four processes'
/// worth of engines with two connections each: a status check cut short
/// mid-connect (its wait granted or its session killed meanwhile) gives its
/// connection slot back, so once the kills stop every worker makes
/// progress again and no pool outgrows its bound. Before, each such check
/// kept a slot for good, and a pool whose slots were all kept never opened
/// a connection again.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn killed_sessions_over_and_over_leave_every_pool_whole() {
    let fixture = Postgres::start();
    let server = &fixture.server;
    let settings = Settings {
        queue: Queue::Engine,
        lease: Duration::from_secs(2),
        ..Settings::default()
    };
    let mut registries = Vec::new();
    for _ in 0..4 {
        let engine = engine(server, "killed", 2).await;
        registries.push(Registry::with_engine("pg", engine, settings).expect("registry"));
    }
    let (killer, _) = tokio_postgres::connect(&server.url(), tokio_postgres::NoTls)
        .await
        .map(|(client, connection)| (client, tokio::spawn(connection)))
        .expect("the killer's session");
    let killing = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let workers: Vec<_> = registries
        .iter()
        .map(|registry| {
            let (lock, killing) = (registry.locks("g").get("k"), killing.clone());
            tokio::spawn(async move {
                while killing.load(Ordering::SeqCst) {
                    // Errors are expected while sessions die under the calls.
                    if let Ok(guard) = lock.lock_for(Duration::from_secs(1)).await {
                        tokio::time::sleep(Duration::from_millis(5)).await;
                        let _ = guard.release().await;
                    }
                }
            })
        })
        .collect();
    // At least 5 s and 60 kills: a busy machine reconnects more slowly, so
    // fewer sessions are there to kill each time.
    let mut kills = 0;
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(5)
        || (kills < 60 && started.elapsed() < Duration::from_secs(60))
    {
        let row = killer
            .query_one(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = 'killed'",
                &[],
            )
            .await
            .expect("kill");
        kills += row.get::<_, i64>(0);
        tokio::time::sleep(Duration::from_millis(rand_ms(2, 30))).await;
    }
    killing.store(false, Ordering::SeqCst);
    for worker in workers {
        worker.await.expect("worker");
    }
    assert!(kills >= 60, "only {kills} sessions killed in a minute");
    // The kills have stopped: every worker gets its turns again, each
    // within a wait that an intact pool never comes near.
    let counter = Arc::new(AtomicU64::new(0));
    let after: Vec<_> = registries
        .iter()
        .map(|registry| {
            let (lock, counter) = (registry.locks("g").get("k"), counter.clone());
            tokio::spawn(async move {
                for _ in 0..10 {
                    let guard = lock
                        .lock_for(Duration::from_secs(20))
                        .await
                        .expect("a worker made no progress after the kills");
                    let seen = counter.load(Ordering::SeqCst);
                    tokio::task::yield_now().await;
                    counter.store(seen + 1, Ordering::SeqCst);
                    guard.release().await.expect("release");
                }
            })
        })
        .collect();
    for worker in after {
        worker.await.expect("worker");
    }
    assert_eq!(counter.load(Ordering::SeqCst), 40, "lost updates");
    assert!(sessions(server, "killed") <= 8, "a pool outgrew its bound");
}

fn rand_ms(low: u64, high: u64) -> u64 {
    low + (dlock::kit::OwnerId::random().as_u128() as u64) % (high - low)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_fence_keeps_rising_across_a_crash() {
    let mut fixture = Postgres::start();
    let engine = engine(&fixture.server, "crash", 2).await;
    let before = request("k");
    let Ok(Poll::Held(first)) = engine.acquire(&before).await else {
        panic!("not granted")
    };
    fixture.server.restart();
    let engine = self::engine(&fixture.server, "crash", 2).await;
    let after = request("k");
    let Ok(Poll::Held(second)) = engine.acquire(&after).await else {
        panic!("not granted")
    };
    assert!(second > first, "fence {second} after {first}");
}

/// The whole suite, each case on a fresh engine kept open: once it is done
/// (and the holders it abandoned on purpose have idled out) no advisory
/// lock is left on the server.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn no_advisory_lock_is_left_after_the_suite() {
    let fixture = Postgres::start();
    let server = &fixture.server;
    let engines = Arc::new(std::sync::Mutex::new(Vec::new()));
    let (kept, fixture) = (&engines, &fixture);
    conformance::run_each(|| async move {
        let engine = dlock_testkit::engine(fixture).await;
        kept.lock().unwrap().push(engine.clone());
        engine
    })
    .await;
    let deadline = Instant::now() + Duration::from_secs(5);
    while advisory_locks(server, true) + advisory_locks(server, false) > 0 {
        let left = server.psql("SELECT string_agg(pid || ' ' || mode || ' ' || granted, ', ') FROM pg_locks WHERE locktype = 'advisory'");
        assert!(Instant::now() < deadline, "left in pg_locks: {left}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let live_rows =
        server.psql("SELECT count(*) FROM dlock_holds WHERE pid IN (SELECT pid FROM pg_stat_activity)");
    assert_eq!(live_rows, "0", "a record row of a live session is left");
    drop(engines);
}

#[tokio::test]
async fn bad_settings_a_failed_login_and_an_unreachable_server_are_clear_errors() {
    let port = free_port();
    let unreachable = PostgresConfig {
        max_connections: 4,
        client: ClientSettings::with_timeout(Duration::from_secs(1)),
        ..PostgresConfig::new(format!("postgres://dlock@127.0.0.1:{port}/postgres"))
    };
    let connect = PostgresEngine::connect("pg", &unreachable);
    assert_unreachable_is_a_clear_error(
        connect,
        "pg",
        &format!("127.0.0.1:{port}"),
        Duration::from_secs(3),
    )
    .await;

    for (url, max_connections, field) in [
        ("postgres://h:notaport/db", 4, "engines.pg.url"),
        ("host=127.0.0.1 bogus=1", 4, "engines.pg.url"),
        ("host=127.0.0.1", 1, "engines.pg.max_connections"),
    ] {
        let config = PostgresConfig {
            url: url.to_owned(),
            max_connections,
            ..unreachable.clone()
        };
        match PostgresEngine::connect("pg", &config).await {
            Err(Error::Config { field: named, .. }) => assert_eq!(named, field, "{url}"),
            other => panic!("{url}: expected a config error, got {:?}", other.err()),
        }
    }

    let fixture = Postgres::start();
    let wrong = PostgresConfig {
        url: format!(
            "host=127.0.0.1 port={} user=dlock password=wrong dbname=postgres",
            fixture.server.port
        ),
        ..unreachable
    };
    let err = PostgresEngine::connect("pg", &wrong)
        .await
        .err()
        .expect("logged in with a wrong password");
    let message = err.to_string();
    assert!(matches!(err, Error::Unavailable { .. }), "{message}");
    assert!(
        message.contains(&format!("127.0.0.1:{}", fixture.server.port))
            && message.contains("password authentication failed"),
        "{message}"
    );
    assert!(!message.contains("wrong"), "the password shows: {message}");
}

#[tokio::test]
async fn a_missing_privilege_is_named_with_the_fix() {
    let fixture = Postgres::start();
    let server = &fixture.server;
    server.psql(
        "CREATE ROLE weak LOGIN PASSWORD 'weak'; CREATE SCHEMA locks; GRANT USAGE ON SCHEMA locks TO weak",
    );
    let weak = PostgresConfig {
        url: format!(
            "host=127.0.0.1 port={} user=weak password=weak dbname=postgres",
            server.port
        ),
        max_connections: 2,
        schema: "locks".to_owned(),
        ..config(server, "weak", 2)
    };
    let expect_refusal = |err: Option<Error>, fix: &str| match err {
        Some(Error::Config { field, message }) => {
            assert_eq!(field, "engines.pg.schema");
            assert!(message.contains(fix), "{message}");
        }
        other => panic!("expected a config error, got {other:?}"),
    };
    expect_refusal(
        PostgresEngine::connect("pg", &weak).await.err(),
        "grant CREATE on schema locks",
    );
    server.psql("CREATE SEQUENCE locks.dlock_fence");
    expect_refusal(
        PostgresEngine::connect("pg", &weak).await.err(),
        "grant USAGE ON SEQUENCE",
    );
    server.psql("GRANT USAGE ON SEQUENCE locks.dlock_fence TO weak");
    expect_refusal(
        PostgresEngine::connect("pg", &weak).await.err(),
        "cannot create the record table \"locks\".dlock_holds; grant CREATE on schema locks",
    );
    // A role that may create it makes it on connecting; then a grant is missing.
    let strong = PostgresConfig {
        schema: "locks".to_owned(),
        ..config(server, "strong", 2)
    };
    drop(
        PostgresEngine::connect("pg", &strong)
            .await
            .expect("connect as the owner"),
    );
    expect_refusal(
        PostgresEngine::connect("pg", &weak).await.err(),
        "may not SELECT, INSERT, UPDATE, DELETE on \"locks\".dlock_holds; grant SELECT",
    );
    server.psql("GRANT SELECT, INSERT, UPDATE, DELETE ON locks.dlock_holds TO weak");
    expect_refusal(
        PostgresEngine::connect("pg", &weak).await.err(),
        "may not SELECT, INSERT, UPDATE, DELETE on \"locks\".dlock_forced; grant SELECT",
    );
    server.psql("GRANT SELECT, INSERT, UPDATE, DELETE ON locks.dlock_forced TO weak");
    let engine = PostgresEngine::connect("pg", &weak)
        .await
        .expect("connect once granted");
    let req = request("k");
    assert!(matches!(engine.acquire(&req).await, Ok(Poll::Held(_))));
    assert!(engine.release(&req).await.expect("release"));
}
