//! The fault suite's worker process (tests/faults.rs starts several): takes
//! lock `faults/<key>` on the engine its config names, reads a fenced
//! store, works, and writes the store back plus one, the whole
//! critical section under `#[distributed_lock]`.
//!
//! ```text
//! fault_worker --config dlock.toml --store /tmp/r [--key k] [--tasks 1]
//!              [--cycles 1] [--limit N] [--hold-ms 0] [--on-lost cancel|ignore]
//!              [--table-url postgres://... --table NAME]
//! ```
//!
//! `--tasks` buyers run at once, each `--cycles` times; a buyer only writes
//! while the store is below `--limit` (a flash sale's stock). Prints
//! `ready` once its engine is connected, `entered <fence>` on entering each
//! critical section, and at the end `bought=B sold_out=S refused=R lost=L
//! failed=F`. With `--table`, each critical section also reads and writes
//! back plus one a PostgreSQL row through `dlock::fenced`
//! ([`FencedRow`]), whatever the file store answered.

use std::io::Write;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use dlock::distributed_lock;
use dlock_testkit::fenced_row::FencedRow;
use dlock_testkit::store::FencedStore;
use dlock_testkit::worker_flags::Flags;

struct Work {
    store: FencedStore,
    row: Option<FencedRow>,
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
    let row_value = match &work.row {
        Some(row) => row.read(fence).await,
        None => None,
    };
    tokio::time::sleep(work.hold).await;
    let wrote = work.store.write(fence, value + 1);
    if let (Some(row), Some(read)) = (&work.row, row_value) {
        row.write(read + 1, fence).await;
    }
    Ok(match wrote {
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
    let flags = match Flags::parse(
        "fault_worker",
        &[
            "key",
            "tasks",
            "cycles",
            "limit",
            "hold-ms",
            "on-lost",
            "table-url",
            "table",
        ],
    ) {
        Ok(flags) => flags,
        Err(code) => return code,
    };
    if let Err(code) = flags.connect().await {
        return code;
    }
    let key = flags.text("key", "k").to_owned();
    let (tasks, cycles) = (flags.number("tasks", 1), flags.number("cycles", 1));
    let cancel = flags.text("on-lost", "cancel") == "cancel";
    let row = match (flags.text("table-url", ""), flags.text("table", "")) {
        ("", _) | (_, "") => None,
        (url, name) => Some(FencedRow::open(url, name).await),
    };
    let work = Arc::new(Work {
        store: FencedStore::open(&flags.store()),
        row,
        limit: flags.number("limit", u64::MAX),
        hold: Duration::from_millis(flags.number("hold-ms", 0)),
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
