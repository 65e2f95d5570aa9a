//! The fault suite's permit holder (tests/faults.rs starts several): takes a
//! permit of the semaphore `faults/<key>` of `--permits` on the engine its
//! config names, stays `--stay-ms` inside, stamping the visits log
//! (`--store`; see `visits.rs`) every few milliseconds while its permit is
//! valid, and lets go.
//!
//! ```text
//! permit_worker --config dlock.toml --store /tmp/visits --permits 3
//!               [--key k] [--tasks 1] [--cycles 1] [--stay-ms 0]
//! ```
//!
//! Prints `ready` once its engine is connected, `entered <fence>` on taking
//! each permit, and at the end `bought=B lost=L failed=F`: visits made
//! whole, permits found lost (the visit cut short), other errors.

use std::io::Write;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use dlock::Semaphore;
use dlock_testkit::visits::Visits;
use dlock_testkit::worker_flags::Flags;

/// One visit: `Ok(true)` made whole, `Ok(false)` cut short by a loss.
async fn visit(semaphore: &Semaphore, visits: &Visits, stay: Duration) -> Result<bool, dlock::Error> {
    let guard = semaphore.acquire().await?;
    println!("entered {}", guard.fence());
    let _ = std::io::stdout().flush();
    visits.stay(guard, stay).await
}

#[tokio::main]
async fn main() -> ExitCode {
    let flags = match Flags::parse("permit_worker", &["key", "permits", "tasks", "cycles", "stay-ms"]) {
        Ok(flags) => flags,
        Err(code) => return code,
    };
    if let Err(code) = flags.connect().await {
        return code;
    }
    let permits = u32::try_from(flags.number("permits", 1)).expect("--permits fits u32");
    let semaphore = dlock::semaphore("faults", flags.text("key", "k"), permits);
    let visits = Arc::new(Visits::open(&flags.store()));
    let stay = Duration::from_millis(flags.number("stay-ms", 0));
    let (tasks, cycles) = (flags.number("tasks", 1), flags.number("cycles", 1));
    let counts: Arc<[AtomicU64; 3]> = Arc::new(Default::default());
    let mut running = tokio::task::JoinSet::new();
    for _ in 0..tasks {
        let (semaphore, visits, counts) = (semaphore.clone(), visits.clone(), counts.clone());
        running.spawn(async move {
            for _ in 0..cycles {
                let slot = match visit(&semaphore, &visits, stay).await {
                    Ok(true) => 0,
                    Ok(false) => 1,
                    Err(e) => {
                        eprintln!("permit_worker: {e}");
                        2
                    }
                };
                counts[slot].fetch_add(1, Ordering::SeqCst);
            }
        });
    }
    while let Some(done) = running.join_next().await {
        done.expect("holder panicked");
    }
    let [bought, lost, failed] = counts.each_ref().map(|c| c.load(Ordering::SeqCst));
    println!("bought={bought} lost={lost} failed={failed}");
    ExitCode::SUCCESS
}
