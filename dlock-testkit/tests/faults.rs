//! The fault suite (`dlock_testkit::fault_suite`) on every setup of
//! `dlock_testkit::every_setup!`, plus the faults particular to one engine. Real worker processes (the `fault_worker` binary)
//! lock through real servers and write through a fenced store while the
//! tests kill, pause and restart things; `scripts/test` prints the figures.

#![cfg(all(feature = "redis", feature = "zookeeper"))]

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use dlock_testkit::fault_suite::{Setup, Worker, transfers};
use dlock_testkit::fixtures::redis::Redis;
use dlock_testkit::store::FencedStore;

macro_rules! fault_suites {
    ($name:ident, $fixture:ty, $feature:literal) => {
        #[cfg(feature = $feature)]
        mod $name {
            dlock_testkit::fault_suite!($fixture);
        }
    };
}

dlock_testkit::every_setup!(fault_suites);

mod redis_sentinel_failover {
    use std::time::{Duration, Instant};

    use dlock_testkit::Fixture;
    use dlock_testkit::fault_suite::{Setup, Worker};
    use dlock_testkit::fixtures::redis::RedisSentinel;

    /// Workers hold and wait on one lock across processes; the primary dies and
    /// comes back as a replica. Waiters proceed on the new primary; nothing is
    /// held twice unless the fenced store refuses the stale writer. With
    /// replicas_ack, no grant is handed out until a replica has it again.
    fn workers_through_a_failover(replicas_ack: u32) {
        let paths = dlock_testkit::paths!();
        let mut setup = Setup::<RedisSentinel>::start(&paths, &format!("failover-ack{replicas_ack}"));
        let (path, store) = setup.store("failover");
        let config = paths.tmp.join(format!(
            "sentinel-failover-{}-{replicas_ack}.toml",
            std::process::id()
        ));
        let text = format!(
            "[defaults]\nlease = \"1s\"\nwait = \"30s\"\n\n[engines.main]\n{}\nreplicas_ack = {replicas_ack}\n",
            setup.fixture.engine_config()
        );
        std::fs::write(&config, text).expect("config");
        let long = Duration::from_secs(60);
        let holder = setup.worker_on(&config, &path, &["--hold-ms", "2000"]);
        holder.entered(long);
        let waiters: Vec<Worker> = (0..3)
            .map(|_| setup.worker_on(&config, &path, &["--hold-ms", "100"]))
            .collect();
        waiters.iter().for_each(|waiter| waiter.ready(long));
        std::thread::sleep(Duration::from_millis(300));
        let killed = Instant::now();
        let failover = setup.fixture.fail_over();
        // The failed node comes back as a replica of the new primary: with
        // replicas_ack, grants wait for it.
        setup.fixture.rejoin_as_replica();
        let holder = holder.finish(long);
        let mut done = holder.bought + holder.refused + holder.lost;
        let mut refused = holder.refused;
        for waiter in waiters {
            let summary = waiter.finish(long);
            assert_eq!(summary.failed, 0, "a waiter gave up: {summary:?}");
            done += summary.bought + summary.refused;
            refused += summary.refused;
        }
        let all_done = killed.elapsed();
        assert_eq!(done, 4, "every worker finished its turn");
        assert!(
            all_done < Duration::from_secs(30),
            "waiters took {all_done:?} after the kill"
        );
        let report = store.report();
        assert!(
            report.overlaps == 0 || report.stale_refused > 0,
            "held twice and the stale writer was not refused: {report:?}"
        );
        assert_eq!(store.value(), report.writes, "a write was lost");
        setup.figure(format!(
            "primary killed with 1 holder and 3 waiters, replicas_ack = {replicas_ack}: promoted after {failover:.2?}, \
             all done {all_done:.2?} after the kill; holder lost {}; overlaps {}, stale writes refused {}",
            holder.lost, report.overlaps, refused
        ));
    }

    #[test]
    fn workers_through_a_failover_without_replicas_ack() {
        workers_through_a_failover(0);
    }

    #[test]
    fn workers_through_a_failover_with_replicas_ack() {
        workers_through_a_failover(1);
    }
}

/// A holder whose clock runs 2 h behind keeps its lock for as long as it
/// holds it; one 2 h ahead, killed, frees it within its lease. Were any
/// expiry computed from the client's clock, the first would lose its lock
/// at once and the second would keep it for 2 h.
fn clients_hours_off<F: dlock_testkit::Breakable>() {
    let setup = Setup::<F>::start(&dlock_testkit::paths!(), "clock");
    let (path, store) = setup.store("clock");
    let config = setup.config("30s");

    let behind = setup.worker_with_clock("-2h", &config, &path, &["--hold-ms", "2500"]);
    behind.entered(LONG);
    let started = Instant::now();
    let waiter = setup.worker_on(&config, &path, &[]);
    waiter.entered(LONG);
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_millis(2000),
        "the lagging holder lost its lock after {waited:?}"
    );
    assert_eq!(behind.finish(LONG).bought, 1);
    assert_eq!(waiter.finish(LONG).bought, 1);

    let ahead = setup.worker_with_clock("+2h", &config, &path, &["--hold-ms", "60000"]);
    ahead.entered(LONG);
    let waiter = setup.worker_on(&config, &path, &[]);
    waiter.ready(LONG);
    std::thread::sleep(Duration::from_millis(300));
    let killed = Instant::now();
    ahead.signal("-KILL");
    waiter.entered(LONG);
    let freed = killed.elapsed();
    let (bound, _) = setup.fixture.frees_dead_holder_within();
    assert!(
        freed < bound,
        "the killed holder whose clock ran ahead kept the lock {freed:?}"
    );
    assert_eq!(waiter.finish(LONG).bought, 1);
    assert_eq!(store.report().overlaps, 0);
}

#[cfg(feature = "mysql")]
mod mysql_clocks {
    /// MySQL's lock ends with its connection: the server's own expiry.
    #[test]
    fn clients_whose_clocks_are_hours_off_get_the_servers_expiry() {
        super::clients_hours_off::<dlock_testkit::fixtures::mysql::Mysql>();
    }
}

#[cfg(feature = "dynamodb")]
mod dynamodb_clocks {
    /// DynamoDB has no server clock: leases are counted on each client's
    /// monotonic clock, which the offset does not move.
    #[test]
    fn clients_whose_clocks_are_hours_off_count_the_same_leases() {
        super::clients_hours_off::<dlock_testkit::fixtures::dynamodb::DynamoDb>();
    }
}

const LONG: Duration = Duration::from_secs(60);

/// The fault suite's transfers with the two locks taken by hand, payer's
/// first, held 20 ms before asking for the payee's: two transfers in
/// opposite directions deadlock until a wait runs out: what the set's
/// order prevents in `transfers_across_four_processes`.
#[test]
fn transfers_taking_locks_in_the_written_order_deadlock() {
    let setup = Setup::<Redis>::start(&dlock_testkit::paths!(), "written-order");
    let made = transfers(&setup, "written", 100, "500ms", 20);
    assert!(made.timed_out > 0, "no wait ran out: {made:?}");
    setup.figure(format!(
        "transfers in the written order: {} of 400 made, {} waits ran out (deadlocks)",
        made.done, made.timed_out
    ));
}

#[test]
fn redis_script_flush_and_killed_connections_mid_run_lose_nothing() {
    let setup = Setup::<Redis>::start(&dlock_testkit::paths!(), "flush-kill");
    let (path, store) = setup.store("flush-kill");
    let workers: Vec<Worker> = (0..3)
        .map(|_| setup.worker(&path, &["--cycles", "30", "--hold-ms", "20"]))
        .collect();
    workers[0].entered(LONG);
    let redis = |args: &[&str]| {
        let status = Command::new("redis-cli")
            .args(["-p", &setup.fixture.server.port.to_string()])
            .args(args)
            .stdout(Stdio::null())
            .status()
            .expect("redis-cli");
        assert!(status.success());
    };
    std::thread::sleep(Duration::from_millis(300));
    redis(&["SCRIPT", "FLUSH"]);
    std::thread::sleep(Duration::from_millis(300));
    // Every client connection, waiters' and subscribers' included.
    redis(&["CLIENT", "KILL", "TYPE", "normal"]);
    redis(&["CLIENT", "KILL", "TYPE", "pubsub"]);
    let mut bought = 0;
    for worker in workers {
        let summary = worker.finish(LONG);
        assert_eq!((summary.failed, summary.refused), (0, 0), "{summary:?}");
        bought += summary.bought + summary.lost;
    }
    let report = store.report();
    assert_eq!(store.value(), report.writes, "a write was lost");
    assert_eq!(bought, 90, "every cycle ended");
    setup.figure(format!(
        "SCRIPT FLUSH and CLIENT KILL under 3 workers × 30 cycles: none failed, {} writes, overlaps {}, stale refused {}",
        report.writes, report.overlaps, report.stale_refused
    ));
}

/// The in-process variant for the memory engine: a holder whose renewals
/// stop (a task stalled past its lease) is lost, its late write refused.
#[cfg(feature = "memory")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_holder_stalled_past_its_lease_is_fenced() {
    use std::sync::Arc;

    use dlock::engines::conformance::Faults;
    use dlock::engines::memory::MemoryEngine;
    use dlock::{LostReason, Registry, Settings};

    let engine: Arc<dyn dlock::kit::Engine> = Arc::new(MemoryEngine::new());
    let stalled_path = Faults::new(engine.clone());
    let stalled_path = Arc::new(stalled_path);
    let holder =
        Registry::with_engine("memory", stalled_path.clone(), Settings::default()).expect("registry");
    let peer = Registry::with_engine("memory", engine, Settings::default()).expect("registry");
    let paths = dlock_testkit::paths!();
    let dir = paths.tmp.join(format!("faults-memory-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let store = FencedStore::create(&dir.join("stalled"));

    let lock = holder
        .locks("faults")
        .get("k")
        .with_lease(Duration::from_millis(300));
    let stale = lock.lock().await.expect("lock");
    store.mark(stale.fence(), "enter");
    let value = store.read(stale.fence()).expect("read");
    stalled_path.set_cut(true); // renewals stop reaching the engine
    let started = Instant::now();
    assert_eq!(stale.lost().await, LostReason::LeaseElapsed);
    let fresh = peer.locks("faults").get("k").lock().await.expect("lock");
    let freed_after = started.elapsed();
    store.mark(fresh.fence(), "enter");
    let fresh_value = store.read(fresh.fence()).expect("read");
    store.write(fresh.fence(), fresh_value + 1).expect("fresh write");
    store.mark(fresh.fence(), "exit");
    assert!(
        store.write(stale.fence(), value + 1).is_err(),
        "the stale write went through"
    );
    store.mark(stale.fence(), "exit");
    fresh.release().await.expect("release");
    let report = store.report();
    assert_eq!(
        (report.overlaps, report.stale_refused, store.value()),
        (1, 1, 1),
        "{report:?}"
    );
    paths.figure(&format!(
        "memory: holder stalled past its 300 ms lease: lost, lock free after {freed_after:.2?}; overlaps 1, stale writes refused 1"
    ));
}
