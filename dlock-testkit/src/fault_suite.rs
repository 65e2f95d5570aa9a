//! The fault suite: real worker processes (the `fault_worker` binary) lock
//! through real servers and write through a fenced store, while the test
//! kills, pauses and restarts things. Each scenario runs on any engine with a
//! [`Breakable`] fixture (`fault_suite!` makes the tests) and appends its
//! figures (recovery times, overlaps, stale writes refused) to
//! `fault-figures.txt` in the test's target tmp dir, which `scripts/test`
//! prints at the end.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use dlock_core::kit::Fencing;

use crate::printed::Printed;
use crate::store::{FencedStore, Report};
use crate::visits::Visits;
use crate::{Breakable, Fixture};

/// Expands to one `#[test]` per fault scenario for the engine of
/// `$fixture` (a [`Breakable`] fixture type); put it in a module named
/// after the engine.
#[macro_export]
macro_rules! fault_suite {
    ($fixture:ty) => {
        $crate::fault_suite! { @tests $fixture;
            holder_killed_frees_the_lock_in_time,
            holder_paused_past_its_lease_is_cancelled_or_fenced,
            server_restarted_with_a_holder_and_waiters,
            server_gone_mid_wait_fails_within_the_wait,
            servers_gone_silent_bound_every_call,
            flash_sale_across_four_processes,
            transfers_across_four_processes,
            permits_in_a_flash_sale_across_four_processes,
            permit_holder_killed_returns_its_permit_in_time,
            permit_holder_paused_past_its_lease_learns_it_lost,
            permit_holders_and_waiters_across_a_server_restart,
        }
    };
    (@tests $fixture:ty; $($scenario:ident,)*) => {
        $(
            #[test]
            fn $scenario() {
                $crate::fault_suite::$scenario::<$fixture>(&$crate::paths!());
            }
        )*
    };
}

/// Where a fault test keeps its files, and the worker binary it runs, both
/// as Cargo gives them to a test of this crate: made by [`paths!`](crate::paths).
#[derive(Clone)]
pub struct Paths {
    /// The test's target tmp dir.
    pub tmp: PathBuf,
    /// The `fault_worker` binary.
    pub worker: PathBuf,
    /// The `transfer_worker` binary.
    pub transfer_worker: PathBuf,
    /// The `permit_worker` binary.
    pub permit_worker: PathBuf,
    /// The `job_worker` binary.
    pub job_worker: PathBuf,
    /// The `leader_worker` binary.
    pub leader_worker: PathBuf,
}

impl Paths {
    /// Prints a measured figure and keeps it in `fault-figures.txt`, which
    /// `scripts/test` prints at the end.
    pub fn figure(&self, line: &str) {
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.tmp.join("fault-figures.txt"))
            .expect("figures");
        writeln!(file, "{line}").expect("write figure");
        println!("{line}");
    }
}

/// The [`Paths`] of the test that expands it (a test of this crate, where
/// Cargo builds the `fault_worker` binary first and names it).
#[macro_export]
macro_rules! paths {
    () => {
        $crate::fault_suite::Paths {
            tmp: env!("CARGO_TARGET_TMPDIR").into(),
            worker: env!("CARGO_BIN_EXE_fault_worker").into(),
            transfer_worker: env!("CARGO_BIN_EXE_transfer_worker").into(),
            permit_worker: env!("CARGO_BIN_EXE_permit_worker").into(),
            job_worker: env!("CARGO_BIN_EXE_job_worker").into(),
            leader_worker: env!("CARGO_BIN_EXE_leader_worker").into(),
        }
    };
}

/// A fresh fixture of `F`, a directory for its files, and config files
/// pointing workers at it.
pub struct Setup<F> {
    /// The engine's servers, for the scenario to kill, pause or restart.
    pub fixture: F,
    dir: PathBuf,
    paths: Paths,
}

impl<F: Fixture> Setup<F> {
    /// Starts `F` for scenario `test`; files go under `paths.tmp`.
    pub fn start(paths: &Paths, test: &str) -> Self {
        let dir = paths
            .tmp
            .join(format!("faults-{}-{test}-{}", F::NAME, std::process::id()));
        std::fs::create_dir_all(&dir).expect("test dir");
        Setup {
            fixture: F::start(),
            dir,
            paths: paths.clone(),
        }
    }

    /// Config with a 1 s lease and this wait, written once (workers start
    /// at once and read it).
    pub fn config(&self, wait: &str) -> PathBuf {
        self.config_leased("1s", wait, "engine")
    }

    /// Config with this lease, wait and `queue` (`"engine"` or `"local"`),
    /// written once.
    pub fn config_leased(&self, lease: &str, wait: &str, queue: &str) -> PathBuf {
        let path = self.dir.join(format!("dlock-{lease}-{wait}-{queue}.toml"));
        if path.exists() {
            return path;
        }
        let text = format!(
            "[defaults]\nlease = \"{lease}\"\nwait = \"{wait}\"\nqueue = \"{queue}\"\n\n[engines.main]\n{}\n",
            self.fixture.engine_config()
        );
        std::fs::write(&path, text).expect("config");
        path
    }

    /// A fresh [`FencedStore`] named `name` in the scenario's directory,
    /// and its path for workers.
    pub fn store(&self, name: &str) -> (PathBuf, FencedStore) {
        let path = self.dir.join(name);
        let store = FencedStore::create(&path);
        (path, store)
    }

    /// A fresh, empty log named `name` in the scenario's directory: permit
    /// workers stamp their visits there, job workers their runs.
    pub fn log(&self, name: &str) -> PathBuf {
        let path = self.dir.join(name);
        let _ = std::fs::remove_file(&path);
        path
    }

    /// Starts a permit worker with `config`, stamping `visits`, and more
    /// arguments (`--permits 3`, `--stay-ms 20`, ...).
    pub fn permit_worker(&self, config: &Path, visits: &Path, args: &[&str]) -> Worker {
        Worker::start(&self.paths.permit_worker, config, visits, args)
    }

    /// Starts a worker with the 30 s wait config.
    pub fn worker(&self, store: &Path, args: &[&str]) -> Worker {
        self.worker_on(&self.config("30s"), store, args)
    }

    /// Starts a worker with `config` and `store`, and more arguments
    /// (`--tasks 4`, `--hold-ms 100`, ...).
    pub fn worker_on(&self, config: &Path, store: &Path, args: &[&str]) -> Worker {
        Worker::start(&self.paths.worker, config, store, args)
    }

    /// A worker whose clock is off by `offset` (`"+2h"`, `"-2h"`), through
    /// libfaketime preloaded (Debian `libfaketime`): its wall and monotonic
    /// clocks both.
    pub fn worker_with_clock(&self, offset: &str, config: &Path, store: &Path, args: &[&str]) -> Worker {
        Worker::launch(
            crate::server::with_clock(&self.paths.worker, offset),
            config,
            store,
            args,
        )
    }

    /// A `job_worker` whose clock is off by `offset` (`"+1.5"`: seconds),
    /// appending its runs to `runs`.
    pub fn job_worker(&self, offset: &str, config: &Path, runs: &Path, args: &[&str]) -> Worker {
        Worker::launch(
            crate::server::with_clock(&self.paths.job_worker, offset),
            config,
            runs,
            args,
        )
    }

    /// A `leader_worker` with `config` and `store`, and more arguments
    /// (`--observe 1`).
    pub fn leader_worker(&self, config: &Path, store: &Path, args: &[&str]) -> Worker {
        Worker::start(&self.paths.leader_worker, config, store, args)
    }

    /// Prints a measured figure and keeps it for `scripts/test` to print.
    pub fn figure(&self, line: String) {
        self.paths.figure(&format!("{}: {line}", F::NAME));
    }
}

/// A worker process and its output: a [`Printed`] that also reads the
/// workers' lines.
pub struct Worker(Printed);

impl std::ops::Deref for Worker {
    type Target = Printed;
    fn deref(&self) -> &Printed {
        &self.0
    }
}

impl std::ops::DerefMut for Worker {
    fn deref_mut(&mut self) -> &mut Printed {
        &mut self.0
    }
}

impl Worker {
    /// Starts the worker `binary` with `config` and `store`, and more
    /// arguments.
    pub fn start(binary: &Path, config: &Path, store: &Path, args: &[&str]) -> Self {
        Self::launch(Command::new(binary), config, store, args)
    }

    fn launch(mut command: Command, config: &Path, store: &Path, args: &[&str]) -> Self {
        command
            .arg("--config")
            .arg(config)
            .arg("--store")
            .arg(store)
            .args(args);
        Worker(Printed::spawn(&mut command))
    }

    /// The fences of the critical sections it entered since the last look,
    /// without waiting.
    pub fn entries(&self) -> Vec<u64> {
        self.printed()
            .iter()
            .filter_map(|line| line.strip_prefix("entered ")?.parse().ok())
            .collect()
    }

    /// Waits until the worker's engine is connected (its `ready` line): a
    /// scenario that breaks the server breaks it for a worker that waits,
    /// not for one still starting up.
    pub fn ready(&self, within: Duration) {
        self.line("ready", within);
    }

    /// Waits for the next `entered <fence>` line; returns the fence.
    pub fn entered(&self, within: Duration) -> u64 {
        let (line, _) = self.line("entered ", within);
        line["entered ".len()..].parse().expect("fence")
    }

    /// Waits for the worker to exit and returns its summary counts.
    pub fn finish(self, within: Duration) -> Summary {
        let printed = finish_all(vec![self], within, false);
        Summary::from_lines(&printed[0])
    }
}

/// Waits for every worker to exit, within `within`, or, if
/// `progress_resets`, for as long as one of them prints a line within it;
/// returns the lines each printed.
pub(crate) fn finish_all(
    mut workers: Vec<Worker>,
    within: Duration,
    progress_resets: bool,
) -> Vec<Vec<String>> {
    let mut printed = vec![Vec::new(); workers.len()];
    let mut last = Instant::now();
    loop {
        let mut running = false;
        for (worker, lines) in workers.iter_mut().zip(&mut printed) {
            let new = worker.printed();
            if progress_resets && !new.is_empty() {
                last = Instant::now();
            }
            lines.extend(new);
            running |= worker.exited().is_none();
        }
        if !running {
            break;
        }
        if last.elapsed() > within {
            for worker in &mut workers {
                worker.kill();
            }
            let counts: Vec<usize> = printed.iter().map(Vec::len).collect();
            panic!("a worker hung: no line for {within:?}; lines printed by each: {counts:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    for (worker, lines) in workers.iter_mut().zip(&mut printed) {
        lines.extend(worker.rest());
        let status = worker.exited().expect("exited");
        let last = &lines[lines.len().saturating_sub(5)..];
        assert!(
            status.success(),
            "a worker ended with {status}; its last lines: {last:?}"
        );
    }
    printed
}

/// A worker's closing counts, one per critical section it tried.
#[derive(Debug, Default)]
pub struct Summary {
    /// Wrote the store one higher.
    pub bought: u64,
    /// Found the store at the limit and wrote nothing.
    pub sold_out: u64,
    /// The store refused its token as stale.
    pub refused: u64,
    /// Ended with `Error::Lost`.
    pub lost: u64,
    /// Ended with any other error.
    pub failed: u64,
}

impl Summary {
    fn from_lines(lines: &[String]) -> Self {
        let line = lines
            .iter()
            .find(|l| l.starts_with("bought="))
            .expect("worker summary");
        let mut s = Summary::default();
        for pair in line.split_whitespace() {
            let (name, n) = pair.split_once('=').expect("name=value");
            let n = n.parse().expect("count");
            match name {
                "bought" => s.bought = n,
                "sold_out" => s.sold_out = n,
                "refused" => s.refused = n,
                "lost" => s.lost = n,
                "failed" => s.failed = n,
                _ => {}
            }
        }
        s
    }
}

const LONG: Duration = Duration::from_secs(60);

/// The lease of the scenarios where no holder fails: long enough that no
/// pause of a busy machine outlasts it.
const CALM_LEASE: &str = "10s";

/// How far the engine of `fixture` trusts its fences.
fn fencing(fixture: &impl Fixture) -> Fencing {
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    runtime.block_on(crate::engine(fixture)).capabilities().fencing
}

/// Whether `F`'s setup can be crashed as a whole; says so if not.
fn crashes<F: Breakable>(scenario: &str) -> bool {
    if !F::CRASHES {
        println!(
            "faults: SKIPPED {scenario} on {}: no single server to crash",
            F::NAME
        );
    }
    F::CRASHES
}

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
    let (mut bought, mut refused) = (0, 0);
    let mut summaries = Vec::new();
    for waiter in waiters {
        let summary = waiter.finish(LONG);
        assert_eq!(summary.failed, 0, "a waiter gave up: {summary:?}");
        bought += summary.bought;
        refused += summary.refused;
        summaries.push(summary);
    }
    // A best-effort fence starts again after a restart: the store then
    // refuses the waiters' writes, and nothing stale gets through.
    match fencing(&setup.fixture) {
        Fencing::Strict => assert_eq!(bought, 3, "every waiter got its turn and wrote: {summaries:?}"),
        _ => assert_eq!(bought + refused, 3, "every waiter got its turn: {summaries:?}"),
    }
    let report = store.report();
    setup.figure(format!(
        "server down 1.5 s with 1 holder and 3 waiters: holder lost, all 3 waiters done {:.2?} after the crash; writes accepted {bought}, refused by the fence {refused}; overlaps {}",
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
            timed_out: 0
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

/// Whether `F`'s engine has semaphores; says so if not.
fn semaphores<F: Breakable>(fixture: &F, scenario: &str) -> bool {
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let has = runtime.block_on(crate::engine(fixture)).capabilities().semaphore;
    if !has {
        println!("faults: SKIPPED {scenario} on {}: no semaphores", F::NAME);
    }
    has
}

/// Four processes, each with 8 holders of 5 visits of 20 ms, on a
/// semaphore of 3: never more than 3 valid holders at once, counted from
/// the stays the processes stamped; 3 at once at some point (the permits
/// run in parallel); every visit made.
pub fn permits_in_a_flash_sale_across_four_processes<F: Breakable>(paths: &Paths) {
    const PERMITS: usize = 3;
    let setup = Setup::<F>::start(paths, "permit-sale");
    if !semaphores(&setup.fixture, "permits_in_a_flash_sale_across_four_processes") {
        return;
    }
    let config = setup.config_leased(CALM_LEASE, "60s", "engine");
    let visits = setup.log("permit-sale");
    let args = [
        "--permits",
        "3",
        "--tasks",
        "8",
        "--cycles",
        "5",
        "--stay-ms",
        "20",
    ];
    let started = Instant::now();
    let workers: Vec<Worker> = (0..4)
        .map(|_| setup.permit_worker(&config, &visits, &args))
        .collect();
    let printed = finish_all(workers, LONG, true);
    let took = started.elapsed();
    let summaries: Vec<Summary> = printed.iter().map(|lines| Summary::from_lines(lines)).collect();
    let bought: u64 = summaries.iter().map(|s| s.bought).sum();
    assert_eq!(bought, 4 * 8 * 5, "every visit made whole: {summaries:?}");
    let stays = Visits::stays(&visits);
    assert_eq!(stays.len(), 4 * 8 * 5, "a stay per visit");
    let most = Visits::most_at_once(&stays);
    assert!(
        most <= PERMITS,
        "{most} valid holders at once, of {PERMITS} permits"
    );
    assert_eq!(most, PERMITS, "the permits never ran together");
    setup.figure(format!(
        "semaphore of 3, 4 processes × 8 holders × 5 visits of 20 ms: at most {most} inside at once, {bought} visits in {took:.2?}"
    ));
}

/// One of two permit holders SIGKILLed: a waiter gets its permit once the
/// lease (or the session) runs out, while the other holder keeps its own.
pub fn permit_holder_killed_returns_its_permit_in_time<F: Breakable>(paths: &Paths) {
    let setup = Setup::<F>::start(paths, "permit-killed");
    if !semaphores(&setup.fixture, "permit_holder_killed_returns_its_permit_in_time") {
        return;
    }
    let config = setup.config("30s");
    let visits = setup.log("permit-killed");
    let permit = |stay: &str| setup.permit_worker(&config, &visits, &["--permits", "2", "--stay-ms", stay]);
    let killed = permit("60000");
    killed.entered(LONG);
    let kept = permit("20000");
    kept.entered(LONG);
    let waiter = permit("0");
    waiter.ready(LONG);
    std::thread::sleep(Duration::from_millis(300));
    let killed_at = Instant::now();
    killed.signal("-KILL");
    let fresh = waiter.entered(LONG);
    let recovered = killed_at.elapsed();
    assert_eq!(waiter.finish(LONG).bought, 1);
    let kept = kept.finish(LONG);
    assert_eq!(
        (kept.bought, kept.lost),
        (1, 0),
        "the other holder kept its permit: {kept:?}"
    );
    let (bound, what) = setup.fixture.frees_dead_holder_within();
    assert!(recovered < bound, "the permit came back only after {recovered:?}");
    let stays = Visits::stays(&visits);
    let waited = stays
        .iter()
        .find(|s| s.fence == fresh)
        .expect("the waiter's stay");
    assert!(
        stays
            .iter()
            .any(|s| s.fence != fresh && s.from < waited.from && s.to > waited.from),
        "the waiter got in while the other holder was still inside, so by the killed one's permit"
    );
    assert!(Visits::most_at_once(&stays) <= 2, "more than 2 inside at once");
    setup.figure(format!(
        "permit holder SIGKILLed → its permit back after {recovered:.2?} ({what})"
    ));
}

/// A permit holder SIGSTOPped past its lease: the next waiter gets in; on
/// resuming, the paused holder finds its permit lost and stamps no more, so
/// no two valid holders ever overlap on one permit.
pub fn permit_holder_paused_past_its_lease_learns_it_lost<F: Breakable>(paths: &Paths) {
    let setup = Setup::<F>::start(paths, "permit-paused");
    if !semaphores(
        &setup.fixture,
        "permit_holder_paused_past_its_lease_learns_it_lost",
    ) {
        return;
    }
    let config = setup.config("30s");
    let visits = setup.log("permit-paused");
    let holder = setup.permit_worker(&config, &visits, &["--permits", "1", "--stay-ms", "5000"]);
    holder.entered(LONG);
    let waiter = setup.permit_worker(&config, &visits, &["--permits", "1"]);
    waiter.ready(LONG);
    std::thread::sleep(Duration::from_millis(300));
    let stopped_at = Instant::now();
    holder.signal("-STOP");
    waiter.entered(LONG);
    let recovered = stopped_at.elapsed();
    assert_eq!(waiter.finish(LONG).bought, 1);
    holder.signal("-CONT");
    let holder = holder.finish(LONG);
    assert_eq!(
        (holder.bought, holder.lost),
        (0, 1),
        "the paused holder learned it lost: {holder:?}"
    );
    let (bound, what) = setup.fixture.frees_dead_holder_within();
    assert!(
        recovered < bound,
        "the waiter got in only {recovered:?} after the pause"
    );
    let most = Visits::most_at_once(&Visits::stays(&visits));
    assert_eq!(most, 1, "a paused holder stamped past its lease, beside the next");
    setup.figure(format!(
        "permit holder SIGSTOPped past its lease: next holder in after {recovered:.2?} ({what}), the paused one lost"
    ));
}

/// Once `waiters` are connected and queued, crashes the server and starts
/// it again 1.5 s later; when it crashed.
fn outage<F: Breakable>(setup: &mut Setup<F>, waiters: &[Worker]) -> Instant {
    waiters.iter().for_each(|waiter| waiter.ready(LONG));
    std::thread::sleep(Duration::from_millis(500));
    let crashed_at = Instant::now();
    setup.fixture.kill();
    std::thread::sleep(Duration::from_millis(1500));
    setup.fixture.restart();
    crashed_at
}

/// The server crashes with both permits of two held and two waiters, and
/// is back 1.5 s later: each holder hears it lost its permit, and both
/// waiters are served.
pub fn permit_holders_and_waiters_across_a_server_restart<F: Breakable>(paths: &Paths) {
    let scenario = "permit_holders_and_waiters_across_a_server_restart";
    if !crashes::<F>(scenario) {
        return;
    }
    let mut setup = Setup::<F>::start(paths, "permit-restart");
    if !semaphores(&setup.fixture, scenario) {
        return;
    }
    let config = setup.config("30s");
    let visits = setup.log("permit-restart");
    // Held far past the outage; each stay ends at its loss (see
    // `server_restarted_with_a_holder_and_waiters`).
    let holders: Vec<Worker> = (0..2)
        .map(|_| setup.permit_worker(&config, &visits, &["--permits", "2", "--stay-ms", "30000"]))
        .collect();
    holders.iter().for_each(|holder| {
        holder.entered(LONG);
    });
    let waiters: Vec<Worker> = (0..2)
        .map(|_| setup.permit_worker(&config, &visits, &["--permits", "2", "--stay-ms", "100"]))
        .collect();
    let restarted_at = outage(&mut setup, &waiters);
    for holder in holders {
        let summary = holder.finish(LONG);
        assert_eq!(
            (summary.lost, summary.bought),
            (1, 0),
            "a holder kept its permit across the outage: {summary:?}"
        );
    }
    for waiter in waiters {
        let summary = waiter.finish(LONG);
        assert_eq!(
            (summary.bought, summary.failed),
            (1, 0),
            "a waiter was not served: {summary:?}"
        );
    }
    let most = Visits::most_at_once(&Visits::stays(&visits));
    assert!(most <= 2, "{most} valid holders at once on 2 permits");
    setup.figure(format!(
        "server down 1.5 s with 2 permit holders and 2 waiters: both holders lost, both waiters done {:.2?} after the crash",
        restarted_at.elapsed()
    ));
}
