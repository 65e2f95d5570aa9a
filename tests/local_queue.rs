//! `queue = "local"`: a process lines its waiters up before the engine sees
//! them. Checked on the memory engine, counting engine calls through the
//! conformance fault wrapper.

use std::sync::Arc;
use std::time::Duration;

use dlock::config::Queue;
use dlock::engines::conformance::{Faults, GuardedCounter};
use dlock::engines::memory::MemoryEngine;
use dlock::{Error, Registry, Settings, Wait};

fn local(faults: Arc<Faults>, wait: Wait) -> Registry {
    let settings = Settings {
        queue: Queue::Local,
        wait,
        ..Settings::default()
    };
    Registry::with_engine("memory", faults, settings).expect("registry")
}

fn faults() -> Arc<Faults> {
    Arc::new(Faults::new(Arc::new(MemoryEngine::new())))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn many_local_waiters_stay_exclusive_and_barely_touch_the_engine() {
    let faults = faults();
    let registry = Arc::new(local(faults.clone(), Wait::Forever));
    let counter = Arc::new(GuardedCounter::default());
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..200 {
        let (registry, counter) = (registry.clone(), counter.clone());
        tasks.spawn(async move {
            for _ in 0..10 {
                let guard = registry.locks("local").get("k").lock().await.expect("lock");
                counter.increment().await;
                guard.release().await.expect("release");
            }
        });
    }
    while let Some(done) = tasks.join_next().await {
        done.expect("task");
    }
    assert_eq!(counter.overlaps(), 0);
    assert_eq!(counter.count(), 2_000);
    // Each acquisition reaches the engine once to ask and once to let go:
    // nobody polls, because only the head of the line is at the engine.
    assert_eq!(faults.calls(), 4_000, "engine calls");
}

// One thread: each spawned task joins the line before the next is spawned.
#[tokio::test]
async fn a_downgrade_lets_local_readers_in_and_writers_keep_waiting() {
    let registry = Arc::new(local(faults(), Wait::For(Duration::from_secs(5))));
    let lock = registry.locks("local").get("down");
    let write = lock.lock().await.expect("write");
    let read = lock.read().await.expect("nested read");
    let reader = tokio::spawn({
        let registry = registry.clone();
        async move { registry.locks("local").get("down").read().await.map(drop) }
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    let writer = tokio::spawn({
        let registry = registry.clone();
        async move { registry.locks("local").get("down").lock().await.map(drop) }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!reader.is_finished(), "a local reader got in beside a writer");
    write.release().await.expect("downgrade");
    tokio::time::timeout(Duration::from_secs(2), reader)
        .await
        .expect("the local reader waited past the downgrade")
        .expect("task")
        .expect("read");
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!writer.is_finished(), "a local writer got in beside a reader");
    read.release().await.expect("release");
    writer.await.expect("task").expect("write");
}

#[tokio::test]
async fn the_local_line_counts_against_the_wait_and_try_lock_never_joins_it() {
    let registry = local(faults(), Wait::For(Duration::from_millis(200)));
    let lock = registry.locks("local").get("timeout");
    let held = lock.lock().await.expect("lock");
    let held_task = tokio::task::spawn({
        let lock = lock.clone();
        async move {
            assert!(lock.try_lock().await.expect("try").is_none());
            lock.lock().await.map(drop)
        }
    });
    let err = held_task.await.expect("task").expect_err("waited past the wait");
    assert!(matches!(err, Error::Timeout { .. }), "{err}");
    held.release().await.expect("release");
    let again = tokio::spawn(async move { lock.try_lock().await.map(|g| g.is_some()) });
    assert!(
        again.await.expect("task").expect("try"),
        "the timed-out waiter left the line"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_forced_out_lets_the_next_local_waiter_in_while_it_still_runs() {
    let registry = Arc::new(local(faults(), Wait::For(Duration::from_secs(10))));
    let lock = registry
        .locks("local")
        .get("forced")
        .with_lease(Duration::from_millis(300));
    let wedged = lock.lock().await.expect("lock");
    let waiter = tokio::spawn({
        let lock = lock.clone();
        async move { lock.lock().await }
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(lock.force_release().await.expect("force release"), 1);
    // The wedged holder keeps its guard; it hears at its next renewal.
    let next = tokio::time::timeout(Duration::from_secs(5), waiter)
        .await
        .expect("the local waiter got in")
        .expect("task")
        .expect("lock");
    assert!(wedged.is_lost() && next.fence() > wedged.fence());
    next.release().await.expect("release");
}
