//! `#[distributed_lock]` against the same work written by hand with the Lock
//! API, on the memory engine (target: within 5 %).
//!
//! ```text
//! cargo bench --bench attribute
//! ```
//!
//! Criterion times each case on its own; this machine drifts by 10 % between
//! such runs, more than the target. So the ratio is measured apart too: the
//! two cases take turns in blocks, in alternating order, and the median
//! block ratio is printed.

use std::hint::black_box;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group};
use dlock::{Locks, distributed_lock};

#[distributed_lock(group = "bench-attr", key = "order-<order_id>")]
async fn annotated(order_id: u64) -> Result<u64, dlock::Error> {
    Ok(black_box(order_id) * 2)
}

/// What a careful user writes without the attribute: locks looked up once,
/// key rendered, guard released with its error reported.
async fn by_hand(order_id: u64) -> Result<u64, dlock::Error> {
    static LOCKS: OnceLock<Locks> = OnceLock::new();
    let locks = LOCKS.get_or_init(|| dlock::locks("bench-hand"));
    let guard = locks.get(format!("order-{order_id}")).lock().await?;
    let out = black_box(order_id) * 2;
    guard.release().await?;
    Ok(out)
}

fn attribute(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let mut group = c.benchmark_group("attribute");
    group.bench_function("annotated_fn", |b| {
        b.to_async(&rt)
            .iter(|| async { annotated(black_box(42)).await.expect("annotated") })
    });
    group.bench_function("by_hand", |b| {
        b.to_async(&rt)
            .iter(|| async { by_hand(black_box(42)).await.expect("by hand") })
    });
    group.finish();
}

/// The two cases in turns of `CALLS` calls, `BLOCKS` times; prints the
/// median and spread of (annotated ÷ by hand) over the blocks.
fn interleaved() {
    const BLOCKS: usize = 60;
    const CALLS: u32 = 5_000;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let mut ratios: Vec<f64> = rt.block_on(async {
        let annotated_block = || async {
            let started = Instant::now();
            for _ in 0..CALLS {
                annotated(black_box(42)).await.expect("annotated");
            }
            started.elapsed()
        };
        let by_hand_block = || async {
            let started = Instant::now();
            for _ in 0..CALLS {
                by_hand(black_box(42)).await.expect("by hand");
            }
            started.elapsed()
        };
        let mut ratios = Vec::new();
        for block in 0..BLOCKS {
            let (a, h) = if block % 2 == 0 {
                let a = annotated_block().await;
                (a, by_hand_block().await)
            } else {
                let h = by_hand_block().await;
                (annotated_block().await, h)
            };
            ratios.push(a.as_secs_f64() / h.as_secs_f64());
        }
        ratios
    });
    ratios.sort_by(f64::total_cmp);
    let at = |q: f64| ratios[((ratios.len() - 1) as f64 * q) as usize];
    println!(
        "attribute ÷ by hand, interleaved ({BLOCKS} blocks of {CALLS}): median {:.3}, p10 {:.3}, p90 {:.3}",
        at(0.5),
        at(0.1),
        at(0.9)
    );
}

criterion_group! {
    name = benches;
    config = Criterion::default().measurement_time(Duration::from_secs(4)).warm_up_time(Duration::from_secs(1));
    targets = attribute
}

fn main() {
    interleaved();
    benches();
    Criterion::default().configure_from_args().final_summary();
}
