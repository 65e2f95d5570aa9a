//! The lock's fault scenarios: holders killed and paused, servers
//! restarted, gone or silent, and many processes buying and transferring.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use dlock_core::kit::{Fencing, Records};

use crate::store::{FencedStore, Report};
use crate::{Breakable, Fixture};

use super::harness::{Paths, Setup, Summary, Worker, finish_all};
use super::{CALM_LEASE, LONG, crashes, fencing, offers, outage};

/// A holder SIGKILLed mid-hold: a waiter gets in once the lease (or the
/// session) runs out, and no sooner than the engine allows.
pub fn holder_killed_frees_the_lock_in_time<F: Breakable>(paths: &Paths) {
    let setup = Setup::<F>::start(paths, "killed");
    let (path, store) = setup.store("killed");
    let holder = setup.worker(&path, &["--hold-ms", "60000"]);
    holder.entered(LONG);
    let waiter = setup.worker(&path, &[]);
    waiter.ready(LONG);
    std::thread::sleep(Duration::from_millis(300));
    let killed_at = Instant::now();
    holder.signal("-KILL");
    waiter.entered(LONG);
    let recovered = killed_at.elapsed();
    let summary = waiter.finish(LONG);
    assert_eq!(summary.bought, 1, "{summary:?}");
    let (bound, what) = setup.fixture.frees_dead_holder_within();
    assert!(recovered < bound, "free again only after {recovered:?}");
    assert_eq!(store.value(), 1);
    setup.figure(format!(
        "holder SIGKILLed → lock free again after {recovered:.2?} ({what})"
    ));
}

/// A holder SIGSTOPped past its lease, with either `on_lost` policy: the
/// next holder gets in, and the paused one is cancelled or its late write
/// refused by the fence.
pub fn holder_paused_past_its_lease_is_cancelled_or_fenced<F: Breakable>(paths: &Paths) {
    holder_paused::<F>(paths, "cancel");
    let report = holder_paused::<F>(paths, "ignore");
    assert!(report.stale_refused >= 1, "{report:?}");
}

fn holder_paused<F: Breakable>(paths: &Paths, on_lost: &str) -> Report {
    let setup = Setup::<F>::start(paths, &format!("paused-{on_lost}"));
    let (path, store) = setup.store("paused");
    let holder = setup.worker(&path, &["--hold-ms", "5000", "--on-lost", on_lost]);
    let stale_fence = holder.entered(LONG);
    let waiter = setup.worker(&path, &[]);
    waiter.ready(LONG);
    std::thread::sleep(Duration::from_millis(300));
    let stopped_at = Instant::now();
    holder.signal("-STOP");
    let fresh_fence = waiter.entered(LONG);
    let recovered = stopped_at.elapsed();
    let waiter = waiter.finish(LONG);
    let (bound, what) = setup.fixture.frees_dead_holder_within();
    assert!(
        recovered < bound,
        "the waiter got in only {recovered:?} after the pause ({what})"
    );
    assert_eq!(waiter.bought, 1, "the waiter's write was refused: {waiter:?}");
    assert!(
        fresh_fence > stale_fence,
        "fences {stale_fence} then {fresh_fence}"
    );
    holder.signal("-CONT");
    let holder = holder.finish(LONG);
    match on_lost {
        // The body is dropped on lost, before its late write.
        "cancel" => assert_eq!(
            (holder.lost, holder.bought, holder.refused),
            (1, 0, 0),
            "{holder:?}"
        ),
        // The body runs on; the store refuses its stale write.
        _ => assert_eq!((holder.bought, holder.refused), (0, 1), "{holder:?}"),
    }
    assert_eq!(store.value(), 1, "only the fresh holder's write counts");
    let report = store.report();
    assert!(
        report.overlaps >= 1,
        "the paused holder's section overlapped the next: {report:?}"
    );
    setup.figure(format!(
        "holder SIGSTOPped past its lease, on_lost = {on_lost}: next holder in after {recovered:.2?} ({what}), \
         overlaps {}, stale writes refused {}, writes accepted {}",
        report.overlaps, report.stale_refused, report.writes
    ));
    report
}

/// The server crashes with a holder and 3 waiters, and is back 1.5 s later
/// (longer than half a ZooKeeper session): the holder hears it lost the
/// lock, and every waiter is served.
pub fn server_restarted_with_a_holder_and_waiters<F: Breakable>(paths: &Paths) {
    if !crashes::<F>("server_restarted_with_a_holder_and_waiters") {
        return;
    }
    let mut setup = Setup::<F>::start(paths, "restart");
    let (path, store) = setup.store("restart");
    // Held far longer than the outage takes to begin, however slowly the
    // waiters start on a busy machine (with 3 s, a holder done before the
    // crash wrote and kept nothing to lose); the hold ends at the loss.
    let holder = setup.worker(&path, &["--hold-ms", "30000"]);
    holder.entered(LONG);
    let waiters: Vec<Worker> = (0..3)
        .map(|_| setup.worker(&path, &["--hold-ms", "100"]))
        .collect();
    let restarted_at = outage(&mut setup, &waiters);
    let holder = holder.finish(LONG);
    assert_eq!(
        holder.lost, 1,
        "the holder kept a lock across the outage: {holder:?}"
    );
    let (mut bought, mut refused, mut lost) = (0, 0, 0);
    let mut summaries = Vec::new();
    for waiter in waiters {
        let summary = waiter.finish(LONG);
        assert_eq!(summary.failed, 0, "a waiter gave up: {summary:?}");
        bought += summary.bought;
        refused += summary.refused;
        lost += summary.lost;
        summaries.push(summary);
    }
    // Each waiter is granted its turn. A server just started again may
    // answer a renewal later than the 1 s lease on a busy machine
    // (DynamoDB Local's JVM, with another restarting beside it): that
    // waiter hears it lost and writes nothing, as it must. A best-effort
    // fence starts again after a restart: the store then refuses the
    // waiters' writes, and nothing stale gets through.
    match fencing(&setup.fixture) {
        Fencing::Strict => {
            assert_eq!(refused, 0, "a fence handed out twice: {summaries:?}");
            assert_eq!(bought + lost, 3, "every waiter got its turn: {summaries:?}");
        }
        _ => assert_eq!(
            bought + refused + lost,
            3,
            "every waiter got its turn: {summaries:?}"
        ),
    }
    let report = store.report();
    setup.figure(format!(
        "server down 1.5 s with 1 holder and 3 waiters: holder lost, all 3 waiters done {:.2?} after the crash; writes accepted {bought}, refused by the fence {refused}, waiters that lost their turn's hold {lost}; overlaps {}",
        restarted_at.elapsed(),
        report.overlaps,
    ));
}

/// The server goes away for good while a worker waits 3 s: it fails with
/// an engine error within its wait, never hangs; the holder hears it lost.
pub fn server_gone_mid_wait_fails_within_the_wait<F: Breakable>(paths: &Paths) {
    if !crashes::<F>("server_gone_mid_wait_fails_within_the_wait") {
        return;
    }
    if F::FAILS_OVER {
        println!(
            "faults: SKIPPED server_gone_mid_wait_fails_within_the_wait on {}: its crash is a failover, never gone",
            F::NAME
        );
        return;
    }
    let mut setup = Setup::<F>::start(paths, "gone");
    let (path, _register) = setup.store("gone");
    let holder = setup.worker(&path, &["--hold-ms", "60000"]);
    holder.entered(LONG);
    let waiter = setup.worker_on(&setup.config("3s"), &path, &[]);
    waiter.ready(LONG);
    std::thread::sleep(Duration::from_millis(500));
    let gone_at = Instant::now();
    setup.fixture.kill();
    let summary = waiter.finish(Duration::from_secs(10));
    let waited = gone_at.elapsed();
    assert_eq!(summary.failed, 1, "{summary:?}");
    assert!(
        waited < Duration::from_secs(5),
        "the waiter hung {waited:?} past a 3 s wait"
    );
    let holder = holder.finish(Duration::from_secs(70));
    assert_eq!(holder.lost, 1, "{holder:?}");
    setup.figure(format!(
        "server gone mid-wait (wait 3 s): waiter failed with an engine error {waited:.2?} after, holder lost"
    ));
}

/// The servers go silent mid-run, every socket left open (SIGSTOP: the
/// kernel still accepts, nothing answers), on every setup, clusters and
/// Sentinel included: each call ends within its bound, a holder hears it
/// lost within its lease, and once they answer again (SIGCONT) the engine
/// serves again. In this process, on the engine its config builds.
pub fn servers_gone_silent_bound_every_call<F: Breakable>(paths: &Paths) {
    let setup = Setup::<F>::start(paths, "silent");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async {
        // The same config, `connect_timeout` as in the other silence checks.
        let (config, _) = crate::silence::config_via(&setup.fixture.engine_config(), |a| a);
        let engine = crate::silence::build(&config).await.expect("the engine connects");
        let servers = setup.fixture.servers();
        let silence = || crate::server::signal_trees(&servers, "STOP");
        let heal = || crate::server::signal_trees(&servers, "CONT");
        crate::silence::assert_calls_end_in_time_while_silent(F::NAME, engine, silence, heal).await;
    });
}

/// The flash sale: 10,000 buyers of one item in 4 processes, stock
/// 10: exactly 10 sold, no overlap.
pub fn flash_sale_across_four_processes<F: Breakable>(paths: &Paths) {
    let setup = Setup::<F>::start(paths, "flash");
    let (path, store) = setup.store("stock");
    let started = Instant::now();
    // Each process lines its buyers up locally. The last of 10,000 in line
    // waits for the whole sale, which on a busy 2-core machine took from
    // 23 s to over 5 min (each handoff wakes three processes): the buyers
    // wait as long as it takes. A hang is a sale where no one enters for a
    // minute. No holder fails here, so the lease only has to outlast what
    // a busy machine may pause a process for (over 1 s at a load of 20).
    let config = setup.config_leased(CALM_LEASE, "forever", "local");
    let shops: Vec<Worker> = (0..4)
        .map(|_| {
            setup.worker_on(
                &config,
                &path,
                &["--key", "item-1", "--tasks", "2500", "--limit", "10"],
            )
        })
        .collect();
    let (mut sold, mut sold_out) = (0, 0);
    for printed in finish_all(shops, Duration::from_secs(60), true) {
        let summary = Summary::from_lines(&printed);
        assert_eq!(
            (summary.failed, summary.refused, summary.lost),
            (0, 0, 0),
            "{summary:?}"
        );
        sold += summary.bought;
        sold_out += summary.sold_out;
    }
    assert_eq!((sold, sold_out), (10, 9_990));
    assert_eq!(store.value(), 10);
    let report = store.report();
    assert_eq!(report.overlaps, 0, "{report:?}");
    setup.figure(format!(
        "flash sale, 4 processes × 2,500 buyers, stock 10: sold={sold} oversold=0 in {:.2?}",
        started.elapsed()
    ));
}

/// What the transfer processes of a run did, all told.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Transfers {
    /// Transfers made.
    pub done: u64,
    /// Transfers given up when a lock's wait ran out.
    pub timed_out: u64,
    /// Transfers given up as the youngest wait of a cycle.
    pub deadlocks: u64,
}

/// 4 processes × 500 transfers between 10 accounts in random directions,
/// each under the two accounts' locks taken as one set: no deadlock (a
/// wait that ran out would show one), every balance exact, no overlap.
pub fn transfers_across_four_processes<F: Breakable>(paths: &Paths) {
    let setup = Setup::<F>::start(paths, "transfers");
    let started = Instant::now();
    let made = transfers(&setup, "set", 500, "10s", 1);
    assert_eq!(
        made,
        Transfers {
            done: 2_000,
            timed_out: 0,
            deadlocks: 0,
        }
    );
    setup.figure(format!(
        "transfers, 4 processes × 500 between 10 accounts, two locks as one set: all made, balances exact, in {:.2?}",
        started.elapsed()
    ));
}

/// Runs 4 transfer workers of `each` transfers, `--order <order>`, with
/// `wait`, holding locks `hold_ms`; checks that each account ends at its
/// opening balance plus what the workers say they moved, that no store
/// refused a fence and no critical sections overlapped.
pub fn transfers<F: Fixture>(
    setup: &Setup<F>,
    order: &str,
    each: u64,
    wait: &str,
    hold_ms: u64,
) -> Transfers {
    const ACCOUNTS: usize = 10;
    const OPENING: u64 = 1_000_000;
    let config = setup.config_leased(CALM_LEASE, wait, "engine");
    let accounts: Vec<(PathBuf, FencedStore)> = (0..ACCOUNTS)
        .map(|i| setup.store(&format!("account-{i}")))
        .collect();
    for (_, store) in &accounts {
        store.write(0, OPENING).expect("opening balance");
    }
    let prefix = accounts[0].0.with_file_name("account");
    let (each, count, hold) = (each.to_string(), ACCOUNTS.to_string(), hold_ms.to_string());
    let workers = (1..=4)
        .map(|seed| {
            let seed = seed.to_string();
            let args = [
                "--accounts",
                &count,
                "--transfers",
                &each,
                "--seed",
                &seed,
                "--order",
                order,
                "--hold-ms",
                &hold,
            ];
            Worker::start(&setup.paths.transfer_worker, &config, &prefix, &args)
        })
        .collect();
    let mut expected = [i64::try_from(OPENING).expect("fits"); ACCOUNTS];
    let mut made = Transfers::default();
    for printed in finish_all(workers, LONG, true) {
        let tally = printed
            .iter()
            .find(|l| l.starts_with("done="))
            .expect("worker summary");
        let count = |name: &str| -> u64 {
            let pair = tally
                .split_whitespace()
                .find(|p| p.starts_with(name))
                .expect(name);
            pair[name.len() + 1..].parse().expect("count")
        };
        assert_eq!((count("refused"), count("failed")), (0, 0), "{tally}");
        made.done += count("done");
        made.timed_out += count("timed_out");
        made.deadlocks += count("deadlocks");
        let net = printed
            .iter()
            .find(|l| l.starts_with("net "))
            .expect("worker's net changes");
        for change in net["net ".len()..].split_whitespace() {
            let (account, by) = change.split_once('=').expect("account=change");
            expected[account.parse::<usize>().expect("account")] += by.parse::<i64>().expect("change");
        }
    }
    for (i, (_, store)) in accounts.iter().enumerate() {
        assert_eq!(store.value() as i64, expected[i], "account {i}'s balance");
        let report = store.report();
        assert_eq!(
            (report.overlaps, report.stale_refused),
            (0, 0),
            "account {i}: {report:?}"
        );
    }
    made
}

/// Rings of 2 and 3 processes, each taking its account's lock and, inside
/// it (nested attribute calls), once every account of the ring is held,
/// the next one's: a deadlock. The cycle is found within 2 s, exactly one
/// process gives up with `Error::Deadlock`, and the others finish.
pub fn a_ring_of_processes_finds_its_deadlock<F: Breakable>(paths: &Paths) {
    let setup = Setup::<F>::start(paths, "ring");
    let scenario = "a_ring_of_processes_finds_its_deadlock";
    if !offers(&setup.fixture, scenario, "no records it can list", |c| {
        c.records == Records::Listed
    }) {
        return;
    }
    let config = setup.config_leased(CALM_LEASE, "30s", "engine");
    for n in [2, 3] {
        let stores: Vec<(PathBuf, FencedStore)> =
            (0..n).map(|i| setup.store(&format!("ring{n}-{i}"))).collect();
        for (_, store) in &stores {
            store.write(0, 100).expect("opening balance");
        }
        let prefix = stores[0].0.with_file_name(format!("ring{n}"));
        let workers = (0..n)
            .map(|i| {
                let (count, ring) = (n.to_string(), format!("{i}/{n}"));
                let args = ["--accounts", &count, "--ring", &ring];
                Worker::start(&setup.paths.transfer_worker, &config, &prefix, &args)
            })
            .collect();
        let rings: Vec<String> = finish_all(workers, LONG, true)
            .into_iter()
            .map(|printed| {
                printed
                    .into_iter()
                    .find(|l| l.starts_with("ring "))
                    .expect("the worker's outcome")
            })
            .collect();
        let gave_up: Vec<&String> = rings.iter().filter(|l| l.starts_with("ring gave-up ")).collect();
        assert_eq!(gave_up.len(), 1, "exactly one gives up: {rings:?}");
        assert_eq!(
            rings.iter().filter(|l| l.starts_with("ring done ")).count(),
            n - 1,
            "{rings:?}"
        );
        let waited = |line: &str| -> u64 {
            line.split_whitespace()
                .nth(2)
                .and_then(|ms| ms.parse().ok())
                .expect("ms")
        };
        let found = waited(gave_up[0]);
        assert!(found < 2_500, "the cycle was found after {found} ms: {rings:?}");
        let cycle = gave_up[0].splitn(4, ' ').nth(3).unwrap_or_default();
        setup.figure(format!(
            "a ring of {n} processes, nested attribute calls: the cycle found after {:.2} s, one gave up, the others done after {:.2} s at most: {cycle}",
            found as f64 / 1000.0,
            rings.iter().filter(|l| l.starts_with("ring done ")).map(|l| waited(l)).max().unwrap_or(0) as f64 / 1000.0,
        ));
        let total: u64 = stores.iter().map(|(_, store)| store.value()).sum();
        assert_eq!(total, 100 * n as u64, "money is neither made nor lost");
    }
}
