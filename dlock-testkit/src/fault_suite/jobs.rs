//! The run-once job suite: real `job_worker` processes fire one job
//! (`if_held = "skip"`, `hold_at_least = "4s"`) against a real server, on
//! clocks skewed with libfaketime, while the test kills them or lets them
//! exit. An engine whose servers cannot keep a hold past its release (no
//! [`HoldAtLeast`](dlock_core::kit::HoldAtLeast) facet) skips them.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use super::{Paths, Setup, finish_all, offers};
use crate::Breakable;

/// Whether `F`'s engine keeps a hold past its release; says so if not.
fn keeps_holds<F: Breakable>(fixture: &F, scenario: &str) -> bool {
    offers(fixture, scenario, "no hold at least", |c| c.hold_at_least)
}

/// The worker's `hold_at_least`.
const HOLD_AT_LEAST: Duration = Duration::from_secs(4);

/// A worker's whole life, or a wait for one line of it.
const LONG: Duration = Duration::from_secs(60);

/// Each worker's clock offset, for libfaketime: up to 3 s apart.
const SKEWS: [&str; 3] = ["-1.5", "+0", "+1.5"];

/// Three workers, their clocks 1.5 s behind, right and 1.5 s ahead, fire
/// the job at the start of each of two 6 s periods, each by its own
/// clock. Each period runs exactly once: the first to fire holds for at
/// least 4 s from its start, past the others' firing, and lets go before
/// the next period's first firing.
pub fn skewed_schedules_run_each_period_exactly_once<F: Breakable>(paths: &Paths) {
    let setup = Setup::<F>::start(paths, "job-schedule");
    if !keeps_holds(&setup.fixture, "skewed_schedules_run_each_period_exactly_once") {
        return;
    }
    let (config, runs) = (setup.config("30s"), setup.log("runs"));
    let (period_ms, periods) = (6_000, 2);
    let now = SystemTime::now().duration_since(UNIX_EPOCH).expect("clock");
    // Far enough ahead for every worker to be connected, the fastest clock
    // (1.5 s ahead) too: it fires 4.5 s from now.
    let start = now.as_millis() as u64 + 6_000;
    let (start_arg, period_arg, periods_arg) =
        (start.to_string(), period_ms.to_string(), periods.to_string());
    let args = [
        "--start-ms",
        &start_arg,
        "--periods",
        &periods_arg,
        "--period-ms",
        &period_arg,
    ];
    let workers = SKEWS
        .iter()
        .map(|skew| setup.job_worker(skew, &config, &runs, &args))
        .collect();
    let printed = finish_all(workers, LONG, false);
    let log = std::fs::read_to_string(&runs).unwrap_or_default();
    let mut wrong = Vec::new();
    for period in 0..periods {
        let ran = log
            .lines()
            .filter(|l| l.starts_with(&format!("run {period} ")))
            .count();
        if ran != 1 {
            wrong.push(format!("period {period} ran {ran} times"));
        }
        for (lines, skew) in printed.iter().zip(SKEWS) {
            let fired = [format!("ran {period}"), format!("skipped {period}")];
            if !lines.iter().any(|l| fired.contains(l)) {
                wrong.push(format!("the worker at {skew} s did not fire period {period}"));
            }
        }
    }
    assert!(wrong.is_empty(), "{wrong:?}; runs:\n{log}");
    paths.figure(&format!(
        "{}: job on 3 clocks {SKEWS:?} s apart, 2 periods of 6 s: each ran once, 4 firings skipped",
        F::NAME
    ));
}

/// A worker killed in the middle of a run frees the job's lock within
/// its lease, as any holder's: the 4 s `hold_at_least` comes from a
/// release, and a killed process makes none. Another worker, firing
/// every 50 ms and skipping, then runs it.
pub fn a_job_killed_mid_run_frees_the_lock_within_its_lease<F: Breakable>(paths: &Paths) {
    let setup = Setup::<F>::start(paths, "job-killed");
    if !keeps_holds(
        &setup.fixture,
        "a_job_killed_mid_run_frees_the_lock_within_its_lease",
    ) {
        return;
    }
    let (config, runs) = (setup.config("30s"), setup.log("runs"));
    let running = setup.job_worker("+0", &config, &runs, &["--job-ms", "60000"]);
    running.line("entered", LONG);
    let next = setup.job_worker("+0", &config, &runs, &["--tries", "1000", "--every-ms", "50"]);
    next.line("skipped", LONG);
    let killed = Instant::now();
    running.signal("-KILL");
    let (_, entered) = next.line("entered", LONG);
    let freed = entered - killed;
    let (bound, lease) = setup.fixture.frees_dead_holder_within();
    assert!(
        freed < bound,
        "the killed job's lock was free after {freed:?}, {lease}"
    );
    assert!(
        freed < HOLD_AT_LEAST,
        "a killed job held its lock for its hold_at_least"
    );
    paths.figure(&format!(
        "{}: job killed mid-run: lock free after {freed:.1?} ({lease})",
        F::NAME
    ));
}

/// A worker whose run takes 50 ms exits right after it; another, firing
/// every 50 ms, skips until 4 s after that run started, then runs.
pub fn a_job_exiting_right_after_its_run_keeps_others_out_until_hold_at_least<F: Breakable>(paths: &Paths) {
    let setup = Setup::<F>::start(paths, "job-exited");
    if !keeps_holds(
        &setup.fixture,
        "a_job_exiting_right_after_its_run_keeps_others_out_until_hold_at_least",
    ) {
        return;
    }
    let (config, runs) = (setup.config("30s"), setup.log("runs"));
    let short = setup.job_worker("+0", &config, &runs, &["--job-ms", "50"]);
    let (_, started) = short.line("entered", LONG);
    finish_all(vec![short], LONG, false);
    let exited = started.elapsed();
    let next = setup.job_worker("+0", &config, &runs, &["--tries", "1000", "--every-ms", "50"]);
    next.line("skipped", LONG);
    let (_, entered) = next.line("entered", LONG);
    let kept = entered - started;
    assert!(
        exited < HOLD_AT_LEAST / 2,
        "the short job took {exited:?} to exit"
    );
    // The run started before its `entered` line reached this test.
    let early = Duration::from_millis(100);
    assert!(
        kept >= HOLD_AT_LEAST - early,
        "another ran {kept:?} after the run started"
    );
    let unit = Duration::from_secs(1); // whole seconds on the coarsest engine
    assert!(
        kept < HOLD_AT_LEAST + unit + Duration::from_secs(2),
        "the lock was kept {kept:?} after the run started"
    );
    paths.figure(&format!(
        "{}: job exited {exited:.1?} after its run started; the next ran {kept:.1?} after (hold_at_least 4 s)",
        F::NAME
    ));
}
