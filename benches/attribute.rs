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
//!
//! dlock's `tracing` spans are measured last (see `tracing_cost`); with no
//! subscriber they cost a level check per call site, which the cases above
//! include.

use std::hint::black_box;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

mod common;

use criterion::{Criterion, criterion_group};
use dlock::{Locks, distributed_lock};
use tokio::runtime::Runtime;

use common::{Target, row};

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

#[distributed_lock(group = "bench-pair", keys = ["from-<from>", "to-<to>"])]
async fn annotated_pair(from: u64, to: u64) -> Result<u64, dlock::Error> {
    Ok(black_box(from) + to)
}

/// Two locks by hand, in the order a set would take them.
async fn pair_by_hand(from: u64, to: u64) -> Result<u64, dlock::Error> {
    static LOCKS: OnceLock<Locks> = OnceLock::new();
    let locks = LOCKS.get_or_init(|| dlock::locks("bench-pair-hand"));
    let first = locks.get(format!("from-{from}")).lock().await?;
    let second = locks.get(format!("to-{to}")).lock().await?;
    let out = black_box(from) + to;
    second.release().await?;
    first.release().await?;
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

/// Calls per timed block.
const CALLS: u32 = 5_000;

/// The time of `CALLS` calls of `call` on `rt`.
fn block<F: Future<Output = Result<u64, dlock::Error>>>(rt: &Runtime, call: impl Fn(u64) -> F) -> Duration {
    rt.block_on(async {
        let started = Instant::now();
        for _ in 0..CALLS {
            call(black_box(42)).await.expect("call");
        }
        started.elapsed()
    })
}

/// Times `a` and `b` in turns, `blocks` times, in alternating order, and
/// prints the median and spread of a ÷ b over the blocks. Answers that
/// median and the mean time of one call of each.
fn in_turns(
    what: &str,
    blocks: usize,
    mut a: impl FnMut() -> Duration,
    mut b: impl FnMut() -> Duration,
) -> (f64, Duration, Duration) {
    let (mut total_a, mut total_b) = (Duration::ZERO, Duration::ZERO);
    let mut ratios: Vec<f64> = (0..blocks)
        .map(|i| {
            let (ta, tb) = if i % 2 == 0 {
                let ta = a();
                (ta, b())
            } else {
                let tb = b();
                (a(), tb)
            };
            (total_a, total_b) = (total_a + ta, total_b + tb);
            ta.as_secs_f64() / tb.as_secs_f64()
        })
        .collect();
    ratios.sort_by(f64::total_cmp);
    let at = |q: f64| ratios[((ratios.len() - 1) as f64 * q) as usize];
    println!(
        "{what}, interleaved ({blocks} blocks of {CALLS}): median {:.3}, p10 {:.3}, p90 {:.3}",
        at(0.5),
        at(0.1),
        at(0.9)
    );
    let calls = blocks as u32 * CALLS;
    (at(0.5), total_a / calls, total_b / calls)
}

/// The annotated function against the same work by hand, in turns.
fn interleaved() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let (ratio, annotated, by_hand) = in_turns(
        "attribute ÷ by hand",
        60,
        || block(&rt, annotated),
        || block(&rt, by_hand),
    );
    row(
        "memory",
        "`#[distributed_lock]` call (median block ratio)",
        &format!("{annotated:.2?}"),
        "the same by hand (Lock API)",
        &format!("{by_hand:.2?}"),
        ratio,
        Target::AtMost(1.05),
    );
    let (ratio, annotated, by_hand) = in_turns(
        "two keys ÷ two locks by hand",
        60,
        || block(&rt, |id| annotated_pair(id, id + 1)),
        || block(&rt, |id| pair_by_hand(id, id + 1)),
    );
    row(
        "memory",
        "`#[distributed_lock(keys = [two])]` call (median block ratio)",
        &format!("{annotated:.2?}"),
        "two locks taken by hand in the same order",
        &format!("{by_hand:.2?}"),
        ratio,
        Target::AtMost(1.05),
    );
}

/// What dlock's `tracing` spans cost once a subscriber listens: the
/// annotated call under a subscriber at debug that builds every span
/// against one at info (dlock's debug spans filtered out, as in most
/// services), in turns on one thread. Run last: installing any subscriber
/// changes how `tracing` dispatches from then on in this process.
fn tracing_cost() {
    use tracing::level_filters::LevelFilter;
    use tracing_subscriber::layer::SubscriberExt;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let under = |level: LevelFilter| {
        let _on = tracing::subscriber::set_default(tracing_subscriber::registry().with(level));
        block(&rt, annotated)
    };
    let (ratio, recorded, filtered) = in_turns(
        "spans recorded ÷ filtered out",
        30,
        || under(LevelFilter::DEBUG),
        || under(LevelFilter::INFO),
    );
    row(
        "memory",
        "`#[distributed_lock]` call, tracing spans recorded (median block ratio)",
        &format!("{recorded:.2?}"),
        "spans filtered out",
        &format!("{filtered:.2?}"),
        ratio,
        Target::None,
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
    tracing_cost();
}
