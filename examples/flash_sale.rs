//! Flash sale: 10 items, 10,000 concurrent buyers, each buying
//! under the lock `flash-sale/item-1`, taken by `#[distributed_lock]`. With no arguments it runs on the embedded memory engine;
//! `--config dlock.toml` uses the engine configured for group `flash-sale`.
//!
//! Prints `sold=10 oversold=0 buyers=10000` and a metrics summary; exits
//! non-zero if anything was oversold.
//!
//! ```text
//! cargo run --release -p dlock-examples --example flash_sale [-- --config dlock.toml] [--buyers N]
//! ```

use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use dlock::distributed_lock;
use metrics_util::debugging::{DebugValue, DebuggingRecorder};

const STOCK: u64 = 10;

struct Shop {
    /// Read and written in two steps, with a pause between, like a remote
    /// store: only the lock keeps two buyers from selling the same item.
    stock: AtomicU64,
    sold: AtomicU64,
}

/// One buyer: takes the item's lock (waiting as configured), buys if any
/// is left, and lets go on return.
#[distributed_lock(group = "flash-sale", key = "item-<item>")]
async fn buy(shop: Arc<Shop>, item: u32) -> Result<(), dlock::Error> {
    let left = shop.stock.load(Ordering::SeqCst);
    tokio::task::yield_now().await;
    if left > 0 {
        shop.stock.store(left - 1, Ordering::SeqCst);
        shop.sold.fetch_add(1, Ordering::SeqCst);
    }
    Ok(())
}

#[tokio::main]
async fn main() -> ExitCode {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    recorder.install().expect("first recorder");

    let mut args = std::env::args().skip(1);
    let mut buyers = 10_000u64;
    while let Some(arg) = args.next() {
        match (arg.as_str(), args.next()) {
            ("--config", Some(path)) => {
                if let Err(e) = dlock::init_from_file(&path).await {
                    eprintln!("flash_sale: {e}");
                    return ExitCode::from(2);
                }
            }
            ("--buyers", Some(n)) => buyers = n.parse().expect("--buyers takes a number"),
            _ => {
                eprintln!("usage: flash_sale [--config FILE] [--buyers N]");
                return ExitCode::from(2);
            }
        }
    }

    let shop = Arc::new(Shop {
        stock: AtomicU64::new(STOCK),
        sold: AtomicU64::new(0),
    });
    let tasks: Vec<_> = (0..buyers).map(|_| tokio::spawn(buy(shop.clone(), 1))).collect();
    let mut failed = 0;
    for task in tasks {
        if let Err(e) = task.await.expect("buyer panicked") {
            failed += 1;
            eprintln!("flash_sale: buyer failed: {e}");
        }
    }

    let sold = shop.sold.load(Ordering::SeqCst);
    let oversold = sold.saturating_sub(STOCK);
    println!("sold={sold} oversold={oversold} buyers={buyers}");
    summarise(snapshotter.snapshot().into_vec());
    if oversold > 0 || failed > 0 {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

fn summarise(
    rows: Vec<(
        metrics_util::CompositeKey,
        Option<metrics::Unit>,
        Option<metrics::SharedString>,
        DebugValue,
    )>,
) {
    let mut acquired = 0;
    let (mut waits, mut holds) = (Vec::new(), Vec::new());
    for (key, _, _, value) in rows {
        let key = key.key();
        match (key.name(), value) {
            ("dlock_events_total", DebugValue::Counter(n))
                if key.labels().any(|l| l.value() == "acquired") =>
            {
                acquired += n
            }
            ("dlock_wait_seconds", DebugValue::Histogram(v)) => {
                waits.extend(v.into_iter().map(|x| x.into_inner()))
            }
            ("dlock_hold_seconds", DebugValue::Histogram(v)) => {
                holds.extend(v.into_iter().map(|x| x.into_inner()))
            }
            _ => {}
        }
    }
    println!(
        "metrics: acquisitions={acquired} wait_p50={} wait_p99={} hold_p50={}",
        quantile(&mut waits, 0.50),
        quantile(&mut waits, 0.99),
        quantile(&mut holds, 0.50),
    );
}

fn quantile(values: &mut [f64], q: f64) -> String {
    if values.is_empty() {
        return "-".into();
    }
    values.sort_by(f64::total_cmp);
    let at = ((values.len() - 1) as f64 * q).round() as usize;
    format!("{:.3}ms", values[at] * 1e3)
}
