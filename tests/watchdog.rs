//! The watchdog costs a hold no task until its first renewal is due, and
//! renews every hold once it is.

use std::sync::Arc;
use std::time::Duration;

use dlock::engines::memory::MemoryEngine;
use dlock::{Registry, Settings};
use tokio::runtime::Handle;

const HOLDS: usize = 50;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hold_gets_a_renewal_task_only_once_its_first_renewal_is_due() {
    let memory = Arc::new(MemoryEngine::new());
    let registry = Registry::with_engine("memory", memory.clone(), Settings::default()).expect("registry");
    let other = Registry::with_engine("memory", memory, Settings::default()).expect("registry");
    let lease = Duration::from_millis(600);
    let locks = registry.locks("watchdog");
    // The runtime's timer task is made with the first hold.
    let first = locks.get("first").with_lease(lease).lock().await.expect("lock");
    first.release().await.expect("release");
    let tasks = || Handle::current().metrics().num_alive_tasks();
    let before = tasks();

    let mut guards = Vec::new();
    for i in 0..HOLDS {
        guards.push(
            locks
                .get(i.to_string())
                .with_lease(lease)
                .lock()
                .await
                .expect("lock"),
        );
    }
    assert_eq!(
        tasks(),
        before,
        "a hold spawned a task before its first renewal was due"
    );

    // Past the lease: every hold was renewed, each by a task of its own.
    tokio::time::sleep(lease + lease / 2).await;
    assert_eq!(tasks(), before + HOLDS, "not every hold got its renewal task");
    for (i, guard) in guards.iter().enumerate() {
        assert_eq!(guard.held().lost_reason(), None, "hold {i} was not renewed");
        // From another task: this one would reenter its own hold.
        let lock = other.locks("watchdog").get(i.to_string());
        let taken = tokio::spawn(async move { lock.try_lock().await.expect("try").is_some() });
        assert!(!taken.await.expect("task"), "hold {i} expired while held");
    }

    for guard in guards {
        guard.release().await.expect("release");
    }
    let deadline = tokio::time::Instant::now() + Duration::from_secs(2);
    while tasks() != before {
        assert!(
            tokio::time::Instant::now() < deadline,
            "renewal tasks outlived their holds"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Holds released before their first renewal leave the timer empty: a
/// hold taken afterwards is still renewed on time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn short_holds_leave_nothing_behind_and_a_long_one_is_still_renewed() {
    let memory = Arc::new(MemoryEngine::new());
    let registry = Registry::with_engine("memory", memory.clone(), Settings::default()).expect("registry");
    let lease = Duration::from_millis(300);
    let lock = registry.locks("watchdog").get("short").with_lease(lease);
    for _ in 0..1000 {
        lock.lock().await.expect("lock").release().await.expect("release");
    }
    let long = lock.lock().await.expect("lock");
    tokio::time::sleep(lease * 3).await;
    assert_eq!(long.held().lost_reason(), None, "the long hold was not renewed");
    long.release().await.expect("release");
    assert_eq!(memory.active_locks(), 0);
}
