//! A held lock handed to spawned tasks (`dlock::spawn`, `HeldLock::share`),
//! instead of the tasks queueing behind their own parent; and the warning
//! when a task does wait for a lock its own process holds.

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::AppError;
use dlock::engines::conformance::Faults;
use dlock::{Error, Settings, distributed_lock};
use tokio::sync::MutexGuard;
use tokio::task::JoinSet;

async fn engine() -> (&'static Faults, MutexGuard<'static, ()>) {
    let settings = Settings {
        deadlock_warning: Duration::from_millis(100),
        ..Settings::default()
    };
    common::engine(settings).await
}

/// Whether another task could take `order/<id>` for write right now.
async fn is_free(id: u32) -> bool {
    tokio::spawn(async move {
        match dlock::lock("order", &id.to_string())
            .try_lock()
            .await
            .expect("try")
        {
            Some(guard) => guard.release().await.is_ok(),
            None => false,
        }
    })
    .await
    .expect("task")
}

#[distributed_lock(group = "order", key = "<id>")]
async fn pay_part(id: u32) -> Result<u64, AppError> {
    Ok(dlock::fence().expect("inside the lock"))
}

#[distributed_lock(group = "order", key = "<id>")]
async fn pay(engine: &Faults, id: u32) -> Result<(), AppError> {
    let parent = dlock::fence().expect("inside the lock");
    let calls = engine.calls();
    // Five with dlock::spawn, five through a JoinSet with an explicit share.
    let mut parts: Vec<_> = (0..5).map(|_| dlock::spawn(pay_part(id))).collect();
    let share = dlock::current().expect("held").share()?;
    let mut set = JoinSet::new();
    for _ in 0..5 {
        set.spawn(share.scope(pay_part(id)));
    }
    drop(share);
    let mut fences = Vec::new();
    for part in parts.drain(..) {
        fences.push(part.await.expect("task")?);
    }
    while let Some(part) = set.join_next().await {
        fences.push(part.expect("task")?);
    }
    assert_eq!(fences, [parent; 10], "every part ran inside the parent's hold");
    assert_eq!(engine.calls(), calls, "a spawned part reached the engine");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn spawned_tasks_reenter_their_parents_hold_with_no_engine_call() {
    let (engine, _turn) = engine().await;
    let before = engine.calls();
    tokio::time::timeout(Duration::from_secs(5), pay(engine, 1))
        .await
        .expect("the parent and its spawned tasks deadlocked")
        .expect("pay");
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(
        engine.calls() - before,
        2,
        "one acquisition and one release in all"
    );
    assert!(is_free(1).await, "not released at the end");
}

#[tokio::test]
async fn a_share_keeps_the_hold_and_cannot_revive_it_once_ended() {
    let (_engine, _turn) = engine().await;
    let guard = dlock::lock("order", "2").lock().await.expect("lock");
    let held = guard.held().clone();
    let share = held.share().expect("share");
    guard.release().await.expect("release");
    assert!(!is_free(2).await, "released while a share lived");
    drop(share);
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(is_free(2).await, "not released when the last share went");
    let err = held.share().expect_err("a share of an ended hold");
    assert!(matches!(err, Error::Released { .. }), "{err}");
}

#[tokio::test]
async fn a_read_share_asking_for_write_is_an_upgrade() {
    let (engine, _turn) = engine().await;
    let lock = dlock::lock("order", "3");
    let reader = lock.read().await.expect("read");
    let share = reader.held().share().expect("share");
    let calls = engine.calls();
    let child = tokio::spawn(share.scope(async move {
        let nested = lock.read().await.expect("a read share reenters for read");
        let write = lock.lock().await.expect_err("a read share asked for write");
        drop(nested);
        write
    }));
    let err = child.await.expect("task");
    assert!(matches!(err, Error::Upgrade { .. }), "{err}");
    assert_eq!(engine.calls(), calls, "the child reached the engine");
    reader.release().await.expect("release");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_parent_releases_once_when_the_last_child_ends() {
    let (engine, _turn) = engine().await;
    let (started, children_started) = tokio::sync::oneshot::channel();
    let parent = tokio::spawn(async move {
        let _guard = dlock::lock("order", "4").lock().await.expect("lock");
        let children: Vec<_> = [200, 400, 600]
            .map(|ms| dlock::spawn(tokio::time::sleep(Duration::from_millis(ms))))
            .into();
        started.send(()).expect("send");
        for child in children {
            child.await.expect("child");
        }
        std::future::pending::<()>().await;
    });
    children_started.await.expect("parent started");
    let calls = engine.calls();
    parent.abort();
    let _ = parent.await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(engine.calls(), calls, "released before the last child ended");
    assert!(!is_free(4).await, "released while children still held shares");
    let calls = engine.calls(); // the failed try
    tokio::time::sleep(Duration::from_millis(450)).await;
    assert_eq!(engine.calls() - calls, 1, "released exactly once");
    assert!(is_free(4).await, "not released when the last child ended");
}

/// Collects what `tracing` prints.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Captured {
    /// Collects what `tracing` prints on this thread until the guard drops.
    fn install() -> (Captured, tracing::subscriber::DefaultGuard) {
        let captured = Captured::default();
        let writer = captured.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(move || writer.clone())
            .with_ansi(false)
            .finish();
        (captured, tracing::subscriber::set_default(subscriber))
    }
}

impl std::io::Write for Captured {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[tokio::test]
async fn a_task_waiting_behind_its_own_process_is_warned_about() {
    let (_engine, _turn) = engine().await;
    let (captured, _default) = Captured::install();
    let guard = dlock::lock("order", "5").lock().await.expect("lock");
    // The trap: a plain spawn is another task, queued behind its parent.
    let child = tokio::spawn(async {
        dlock::lock("order", "5")
            .lock_for(Duration::from_millis(400))
            .await
    });
    let err = child
        .await
        .expect("task")
        .expect_err("the child got its parent's lock");
    assert!(matches!(err, Error::Timeout { .. }), "{err}");
    guard.release().await.expect("release");
    let log = String::from_utf8(captured.0.lock().unwrap().clone()).expect("utf-8");
    assert!(
        log.contains("WARN")
            && log.contains("order/5")
            && log.contains("held_for")
            && log.contains("dlock::spawn"),
        "no warning naming the lock: {log:?}"
    );
}

/// A semaphore's waiter is warned about only when other tasks of its own
/// process hold every permit; with one held elsewhere it is merely busy.
/// (One thread: the subscriber is this thread's.)
#[tokio::test]
async fn a_semaphore_waiter_is_warned_about_only_when_its_process_holds_every_permit() {
    let (engine, _turn) = engine().await;
    let (captured, _default) = Captured::install();
    let exports = || dlock::semaphore("export", "warned", 2);
    let waits_in_vain = || {
        tokio::spawn(async move {
            let err = exports()
                .acquire_for(Duration::from_millis(400))
                .await
                .expect_err("a third permit");
            assert!(matches!(err, Error::Timeout { .. }), "{err}");
        })
    };
    let warnings = || {
        let log = String::from_utf8(captured.0.lock().unwrap().clone()).expect("utf-8");
        log.matches("WARN").count()
    };
    let mine = exports().acquire().await.expect("permit");

    // The other permit held by another process (straight at the engine).
    let key = dlock::LockKey::new("export", "warned").expect("key");
    use dlock::kit::Semaphores as _;
    let mut elsewhere = dlock::kit::Request::new(key, dlock::Mode::Write, Duration::from_secs(30));
    elsewhere.kind = dlock::kit::Kind::Semaphore(2);
    let permits = engine.permits(2);
    let granted = permits.acquire(&elsewhere).await.expect("engine");
    assert!(matches!(granted, dlock::kit::Poll::Held(_)), "the second permit");
    waits_in_vain().await.expect("task");
    assert_eq!(
        warnings(),
        0,
        "warned though a permit was held by another process"
    );
    assert!(permits.release(&elsewhere).await.expect("release"));

    // Both permits held by other tasks of this process.
    let other = tokio::spawn(async move { exports().acquire().await.expect("permit") })
        .await
        .expect("task");
    waits_in_vain().await.expect("task");
    assert_eq!(warnings(), 1, "not warned though this process held every permit");
    other.release().await.expect("release");
    mine.release().await.expect("release");
}

#[distributed_lock(group = "order", key = "<id>")]
async fn inside_two_locks(id: u32) -> Result<Vec<String>, AppError> {
    let mut held: Vec<String> = dlock::held_locks().iter().map(|h| h.key().to_string()).collect();
    held.sort();
    Ok(held)
}

#[tokio::test]
async fn held_locks_lists_every_lock_the_task_holds_however_taken() {
    let (_engine, _turn) = engine().await;
    let by_hand = dlock::lock("catalog", "sku-1").read().await.expect("read");
    let held = inside_two_locks(6).await.expect("annotated");
    assert_eq!(held, ["catalog/sku-1", "order/6"]);
    by_hand.release().await.expect("release");
    assert!(dlock::held_locks().is_empty(), "{:?}", dlock::held_locks());
}

#[distributed_lock(group = "order", keys = ["<a>", "<b>"])]
async fn pay_both(engine: &Faults, a: u32, b: u32) -> Result<(), AppError> {
    let fences = [a, b].map(|id| dlock::held_lock("order", &id.to_string()).expect("held").fence());
    let calls = engine.calls();
    // Each part reenters one of the set's locks, with no engine call.
    let parts = [dlock::spawn(pay_part(a)), dlock::spawn(pay_part(b))];
    let mut got = Vec::new();
    for part in parts {
        got.push(part.await.expect("task")?);
    }
    assert_eq!(got, fences, "each part ran under the set's own lock");
    assert_eq!(engine.calls(), calls, "a spawned part reached the engine");
    assert_eq!(dlock::fence(), None, "a set has no one fence");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_function_with_several_locks_shares_each_with_what_it_spawns() {
    let (engine, _turn) = engine().await;
    pay_both(engine, 31, 30).await.expect("pay both");
    assert!(is_free(30).await && is_free(31).await);
}

#[distributed_lock(group = "export", key = "<tenant>", permits = 1, wait = "5s")]
async fn export_part(tenant: u32) -> Result<u64, AppError> {
    Ok(dlock::fence().expect("inside the permit"))
}

#[distributed_lock(group = "export", key = "<tenant>", permits = 1, wait = "5s")]
async fn export(engine: &Faults, tenant: u32) -> Result<(), AppError> {
    let parent = dlock::fence().expect("inside the permit");
    let calls = engine.calls();
    // With one permit, a child asking for another would wait for ever.
    let parts: Vec<_> = (0..3).map(|_| dlock::spawn(export_part(tenant))).collect();
    for part in parts {
        assert_eq!(part.await.expect("task")?, parent, "the parent's permit");
    }
    assert_eq!(engine.calls(), calls, "a share asked the engine");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_permit_is_shared_with_what_its_holder_spawns() {
    let (engine, _turn) = engine().await;
    export(engine, 40).await.expect("export");
    let again = dlock::semaphore("export", "40", 1)
        .try_acquire()
        .await
        .expect("try");
    again
        .expect("the permit is back")
        .release()
        .await
        .expect("release");
}
