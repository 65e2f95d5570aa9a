//! Memory-engine costs: an uncontended write cycle, a contended handoff
//! among 16 tasks, and a nested reentrant acquire (target: under 1 µs and
//! zero engine calls, which this bench also counts).
//!
//! ```text
//! cargo bench --bench memory
//! ```

use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use dlock::engines::conformance::Faults;
use dlock::engines::memory::MemoryEngine;
use dlock::kit::Engine;
use dlock::{Registry, Settings};

fn registry() -> (Registry, Arc<Faults>) {
    let faults = Arc::new(Faults::new(Arc::new(MemoryEngine::new()) as Arc<dyn Engine>));
    (
        Registry::with_engine("memory", faults.clone(), Settings::default()).expect("registry"),
        faults,
    )
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
}

fn uncontended(c: &mut Criterion) {
    let rt = runtime();
    let (registry, _) = registry();
    let lock = registry.locks("bench").get("uncontended");
    c.bench_function("memory/uncontended_write_cycle", |b| {
        b.to_async(&rt).iter(|| async {
            lock.lock().await.expect("lock").release().await.expect("release");
        })
    });
}

fn contended(c: &mut Criterion) {
    const TASKS: u64 = 16;
    let rt = runtime();
    let (registry, _) = registry();
    let lock = registry.locks("bench").get("contended");
    c.bench_function("memory/contended_handoff_16_tasks", |b| {
        // One iteration = one acquisition; the 16 tasks share them.
        b.to_async(&rt).iter_custom(|iters| {
            let lock = lock.clone();
            async move {
                let per_task = iters.div_ceil(TASKS);
                let started = Instant::now();
                let tasks: Vec<_> = (0..TASKS)
                    .map(|_| {
                        let lock = lock.clone();
                        tokio::spawn(async move {
                            for _ in 0..per_task {
                                lock.lock().await.expect("lock").release().await.expect("release");
                            }
                        })
                    })
                    .collect();
                for task in tasks {
                    task.await.expect("task");
                }
                started
                    .elapsed()
                    .mul_f64(iters as f64 / (per_task * TASKS) as f64)
            }
        })
    });
}

fn reentrant(c: &mut Criterion) {
    let rt = runtime();
    let (registry, faults) = registry();
    // A lease long enough that no renewal falls inside the measurement.
    let lock = registry
        .locks("bench")
        .get("reentrant")
        .with_lease(Duration::from_secs(3600));
    let outer = rt.block_on(lock.lock()).expect("lock");
    let calls_before = faults.calls();
    c.bench_function("memory/nested_reentrant_acquire", |b| {
        b.to_async(&rt).iter(|| async {
            lock.lock()
                .await
                .expect("nested")
                .release()
                .await
                .expect("release");
        })
    });
    let calls = faults.calls() - calls_before;
    println!("memory/nested_reentrant_acquire: engine calls during the bench: {calls}");
    rt.block_on(outer.release()).expect("release");
}

criterion_group! {
    name = benches;
    config = Criterion::default().measurement_time(Duration::from_secs(3)).warm_up_time(Duration::from_secs(1));
    targets = uncontended, contended, reentrant
}
criterion_main!(benches);
