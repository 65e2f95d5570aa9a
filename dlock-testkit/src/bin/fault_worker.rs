//! The fault suite's worker process (tests/faults.rs starts several): takes
//! lock `faults/<key>` on the engine its config names, reads a fenced
//! store, works, and writes the store back plus one, the whole
//! critical section under `#[distributed_lock]`.
//!
//! ```text
//! fault_worker --config dlock.toml --store /tmp/r [--key k] [--tasks 1]
//!              [--cycles 1] [--limit N] [--hold-ms 0] [--on-lost cancel|ignore]
//! ```
//!
//! `--tasks` buyers run at once, each `--cycles` times; a buyer only writes
//! while the store is below `--limit` (a flash sale's stock). Prints
//! `ready` once its engine is connected, `entered <fence>` on entering each
//! critical section, and at the end `bought=B sold_out=S refused=R lost=L
//! failed=F`.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use dlock::distributed_lock;
use dlock_testkit::store::FencedStore;

struct Work {
    store: FencedStore,
    limit: u64,
    hold: Duration,
}

enum Outcome {
    Bought,
    SoldOut,
    Refused,
}

/// Marks the critical section's exit however the body ends, cancelled included.
struct Inside<'a>(&'a FencedStore, u64);

impl Drop for Inside<'_> {
    fn drop(&mut self) {
        self.0.mark(self.1, "exit");
    }
}

async fn body(work: &Work) -> Result<Outcome, dlock::Error> {
    let fence = dlock::fence().expect("inside the lock");
    work.store.mark(fence, "enter");
    let _inside = Inside(&work.store, fence);
    println!("entered {fence}");
    let _ = std::io::stdout().flush();
    let Ok(value) = work.store.read(fence) else {
        return Ok(Outcome::Refused);
    };
    if value >= work.limit {
        return Ok(Outcome::SoldOut);
    }
    tokio::time::sleep(work.hold).await;
    Ok(match work.store.write(fence, value + 1) {
        Ok(()) => Outcome::Bought,
        Err(_) => Outcome::Refused,
    })
}

#[distributed_lock(group = "faults", key = "<key>", on_lost = "cancel")]
async fn cancelling(key: &str, work: &Work) -> Result<Outcome, dlock::Error> {
    body(work).await
}

#[distributed_lock(group = "faults", key = "<key>", on_lost = "ignore")]
async fn ignoring(key: &str, work: &Work) -> Result<Outcome, dlock::Error> {
    body(work).await
}

#[derive(Default)]
struct Tally {
    bought: AtomicU64,
    sold_out: AtomicU64,
    refused: AtomicU64,
    lost: AtomicU64,
    failed: AtomicU64,
}

#[tokio::main]
async fn main() -> ExitCode {
    let (mut config, mut store, mut key) = (None, None, "k".to_owned());
    let (mut tasks, mut cycles, mut limit, mut hold_ms, mut cancel) = (1u64, 1u64, u64::MAX, 0u64, true);
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let value = args.next().unwrap_or_default();
        let number = || {
            value
                .parse::<u64>()
                .unwrap_or_else(|_| panic!("{flag} takes a number"))
        };
        match flag.as_str() {
            "--config" => config = Some(PathBuf::from(&value)),
            "--store" => store = Some(PathBuf::from(&value)),
            "--key" => key = value.clone(),
            "--tasks" => tasks = number(),
            "--cycles" => cycles = number(),
            "--limit" => limit = number(),
            "--hold-ms" => hold_ms = number(),
            "--on-lost" => cancel = value == "cancel",
            _ => {
                eprintln!("fault_worker: unknown flag {flag}");
                return ExitCode::from(2);
            }
        }
    }
    if let Some(config) = config
        && let Err(e) = dlock::init_from_file(&config).await
    {
        eprintln!("fault_worker: {e}");
        return ExitCode::from(2);
    }
    println!("ready");
    let _ = std::io::stdout().flush();
    let work = Arc::new(Work {
        store: FencedStore::open(&store.expect("--store is required")),
        limit,
        hold: Duration::from_millis(hold_ms),
    });
    let tally = Arc::new(Tally::default());
    let mut running = tokio::task::JoinSet::new();
    for _ in 0..tasks {
        let (work, tally, key) = (work.clone(), tally.clone(), key.clone());
        running.spawn(async move {
            for _ in 0..cycles {
                let outcome = if cancel {
                    cancelling(&key, &work).await
                } else {
                    ignoring(&key, &work).await
                };
                let counter = match outcome {
                    Ok(Outcome::Bought) => &tally.bought,
                    Ok(Outcome::SoldOut) => &tally.sold_out,
                    Ok(Outcome::Refused) => &tally.refused,
                    Err(dlock::Error::Lost { .. }) => &tally.lost,
                    Err(e) => {
                        eprintln!("fault_worker: {e}");
                        &tally.failed
                    }
                };
                counter.fetch_add(1, Ordering::SeqCst);
            }
        });
    }
    while let Some(done) = running.join_next().await {
        done.expect("buyer panicked");
    }
    let n = |c: &AtomicU64| c.load(Ordering::SeqCst);
    println!(
        "bought={} sold_out={} refused={} lost={} failed={}",
        n(&tally.bought),
        n(&tally.sold_out),
        n(&tally.refused),
        n(&tally.lost),
        n(&tally.failed)
    );
    ExitCode::SUCCESS
}
