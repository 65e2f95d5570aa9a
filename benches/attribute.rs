//! `#[distributed_lock]` against the same work written by hand with the Lock
//! API, on the memory engine (target: within 5 %).
//!
//! ```text
//! cargo bench --bench attribute
//! ```

use std::hint::black_box;
use std::sync::OnceLock;
use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
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

criterion_group! {
    name = benches;
    config = Criterion::default().measurement_time(Duration::from_secs(4)).warm_up_time(Duration::from_secs(1));
    targets = attribute
}
criterion_main!(benches);
