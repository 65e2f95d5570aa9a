//! The job suite's worker process (`fault_suite/jobs.rs` starts several): a
//! run-once job under `#[distributed_lock(if_held = "skip")]`, fired on a
//! schedule by its own wall clock (skewed with libfaketime by the suite),
//! or tried until it runs once.
//!
//! ```text
//! job_worker --config dlock.toml --store runs.log [--job-ms 100]
//!            [--start-ms T --periods N --period-ms P]
//!            [--tries N --every-ms M]
//! ```
//!
//! On a schedule it fires at the start of periods 0..N of P ms each, the
//! first starting at T ms since the Unix epoch, by its own clock; otherwise it fires now, and again after a skip, up to
//! `--tries` times. A run appends `run <period> <pid>` to the store and
//! prints `entered <period>`; each firing then prints `ran <period>` or
//! `skipped <period>`.

use std::io::Write;
use std::process::ExitCode;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use dlock::{Ran, distributed_lock};
use dlock_testkit::worker_flags::Flags;

/// Others skip until 4 s after a run started (the suite's clocks differ by
/// up to 3 s); a hung run is cut off after 30 s.
#[distributed_lock(
    group = "jobs",
    key = "report",
    if_held = "skip",
    hold_at_least = "4s",
    hold_at_most = "30s"
)]
async fn report(period: u64, runs: &std::path::Path, job: Duration) -> Result<Ran<()>, dlock::Error> {
    let line = format!("run {period} {}\n", std::process::id());
    let mut log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(runs)
        .expect("open the runs log");
    log.write_all(line.as_bytes()).expect("log the run");
    say(&format!("entered {period}"));
    tokio::time::sleep(job).await;
    Ok(())
}

fn say(line: &str) {
    println!("{line}");
    let _ = std::io::stdout().flush();
}

/// Fires the job for `period`; says whether it ran.
async fn fire(period: u64, runs: &std::path::Path, job: Duration) -> Result<bool, dlock::Error> {
    let ran = report(period, runs, job).await?;
    say(&format!(
        "{} {period}",
        if ran.is_skipped() { "skipped" } else { "ran" }
    ));
    Ok(!ran.is_skipped())
}

/// This process's wall clock, as libfaketime may have skewed it.
fn wall() -> Duration {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default()
}

#[tokio::main]
async fn main() -> ExitCode {
    let flags = match Flags::parse(
        "job_worker",
        &["job-ms", "start-ms", "periods", "period-ms", "tries", "every-ms"],
    ) {
        Ok(flags) => flags,
        Err(code) => return code,
    };
    if let Err(code) = flags.connect().await {
        return code;
    }
    let (runs, job) = (flags.store(), Duration::from_millis(flags.number("job-ms", 100)));
    let fired = match flags.number("periods", 0) {
        0 => {
            let every = Duration::from_millis(flags.number("every-ms", 100));
            let mut left = flags.number("tries", 1);
            loop {
                match fire(0, &runs, job).await {
                    Ok(false) if left > 1 => left -= 1,
                    Ok(_) => break Ok(()),
                    Err(e) => break Err(e),
                }
                tokio::time::sleep(every).await;
            }
        }
        periods => {
            let length = flags.number("period-ms", 6000);
            let first = flags.number("start-ms", 0);
            let mut result = Ok(());
            for period in 0..periods {
                let start = Duration::from_millis(first + length * period);
                tokio::time::sleep(start.saturating_sub(wall())).await;
                if let Err(e) = fire(period, &runs, job).await {
                    result = Err(e);
                    break;
                }
            }
            result
        }
    };
    match fired {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("job_worker: {e}");
            ExitCode::FAILURE
        }
    }
}
