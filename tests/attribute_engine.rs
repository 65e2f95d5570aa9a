//! `#[distributed_lock]` cases that need the engine to themselves: counting
//! its calls, cutting it off, reading metrics. They run one at a time.

mod common;

use std::time::Duration;

use common::AppError;
use dlock::engines::conformance::Faults;
use dlock::{Error, LostReason, Settings, distributed_lock};
use metrics_util::debugging::{DebugValue, DebuggingRecorder};
use tokio::sync::{MutexGuard, oneshot};

async fn engine() -> (&'static Faults, MutexGuard<'static, ()>) {
    common::engine(Settings::default()).await
}

#[distributed_lock(group = "nested", key = "<id>")]
async fn outer(engine: &Faults, id: u32) -> Result<u64, AppError> {
    let before = engine.calls();
    let inner_fence = inner(id).await?;
    assert_eq!(engine.calls(), before, "the nested call reached the engine");
    assert_eq!(Some(inner_fence), dlock::fence(), "same hold inside and out");
    Ok(inner_fence)
}

#[distributed_lock(group = "nested", key = "<id>")]
async fn inner(id: u32) -> Result<u64, AppError> {
    let _ = id;
    Ok(dlock::fence().expect("fence"))
}

#[tokio::test(flavor = "current_thread")]
async fn nested_calls_reenter_with_no_engine_call_and_one_hold_span() {
    let (engine, _turn) = engine().await;
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let _local = metrics::set_default_local_recorder(&recorder);

    outer(engine, 1).await.expect("outer");
    tokio::time::sleep(Duration::from_millis(20)).await;

    let mut holds = 0;
    let mut reentered = 0;
    for (key, _, _, value) in snapshotter.snapshot().into_vec() {
        let key = key.key();
        match (key.name(), value) {
            ("dlock_hold_seconds", DebugValue::Histogram(v)) => holds += v.len(),
            ("dlock_events_total", DebugValue::Counter(n))
                if key.labels().any(|l| l.value() == "reentered") =>
            {
                reentered += n
            }
            _ => {}
        }
    }
    assert_eq!(holds, 1, "one hold span for the outer and nested call");
    assert_eq!(reentered, 1);
}

#[distributed_lock(group = "lost", key = "cancel", lease = "300ms")]
async fn cancelled_when_lost(engine: &Faults) -> Result<(), AppError> {
    engine.set_cut(true);
    tokio::time::sleep(Duration::from_secs(30)).await;
    unreachable!("the body must be dropped when the lock is lost");
}

#[distributed_lock(group = "lost", key = "ignore", lease = "300ms", on_lost = "ignore")]
async fn finishes_when_lost(engine: &Faults) -> Result<bool, AppError> {
    engine.set_cut(true);
    let reason = dlock::current().expect("held").lost().await;
    assert_eq!(reason, LostReason::LeaseElapsed);
    tokio::time::sleep(Duration::from_millis(50)).await;
    Ok(true)
}

#[tokio::test]
async fn on_lost_cancel_drops_the_body_and_ignore_lets_it_finish() {
    let (engine, _turn) = engine().await;
    let started = std::time::Instant::now();
    let result = cancelled_when_lost(engine).await;
    engine.set_cut(false);
    match result {
        Err(AppError::Lock(Error::Lost { reason, .. })) => assert_eq!(reason, LostReason::LeaseElapsed),
        other => panic!("expected Lost, got {other:?}"),
    }
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "cancelled late: {:?}",
        started.elapsed()
    );

    let finished = finishes_when_lost(engine).await;
    engine.set_cut(false);
    assert!(finished.expect("ignore lets the body finish"));
}

#[distributed_lock(group = "revoked", key = "cancel", lease = "300ms", on_revoke = "cancel")]
async fn cancelled_when_revoked(held: oneshot::Sender<()>) -> Result<(), AppError> {
    let _ = held.send(());
    tokio::time::sleep(Duration::from_secs(30)).await;
    unreachable!("the body must be dropped when its holder is revoked");
}

#[distributed_lock(group = "revoked", key = "notify", lease = "300ms")]
async fn told_when_revoked(held: oneshot::Sender<()>) -> Result<bool, AppError> {
    let _ = held.send(());
    let current = dlock::current().expect("held");
    current.revoked().await;
    Ok(current.is_revoked() && !current.is_lost())
}

#[tokio::test]
async fn on_revoke_cancel_drops_the_body_and_notify_tells_it() {
    let (_engine, _turn) = engine().await;
    // Told at the next renewal: a third of the 300 ms lease.
    let bound = Duration::from_secs(3);
    let (held, holding) = oneshot::channel();
    let run = tokio::spawn(cancelled_when_revoked(held));
    holding.await.expect("held");
    let lock = dlock::lock("revoked", "cancel");
    assert_eq!(lock.revoke().await.expect("revoke"), 1);
    match tokio::time::timeout(bound, run).await.expect("cancelled in time") {
        Ok(Err(AppError::Lock(Error::Revoked { key }))) => assert_eq!(key.name(), "cancel"),
        other => panic!("expected Revoked, got {other:?}"),
    }
    assert!(lock.inspect().await.expect("inspect").is_free(), "released");

    let (held, holding) = oneshot::channel();
    let run = tokio::spawn(told_when_revoked(held));
    holding.await.expect("held");
    assert_eq!(
        dlock::lock("revoked", "notify").revoke().await.expect("revoke"),
        1
    );
    let told = tokio::time::timeout(bound, run).await.expect("told in time");
    assert!(told.expect("task").expect("notify lets the body finish"));
}

// `set-b` is lost first (its lease is shorter), but only `set-a`'s site cancels.
#[distributed_lock(group = "lost", key = "set-b", lease = "100ms", mode = "read")]
#[distributed_lock(group = "lost", key = "set-a", lease = "600ms")]
async fn a_set_cancelled_when_lost(engine: &Faults) -> Result<(), AppError> {
    engine.set_cut(true);
    tokio::time::sleep(Duration::from_secs(30)).await;
    unreachable!("the body must be dropped when a lock whose site cancels is lost");
}

#[distributed_lock(group = "lost", keys = ["set-c", "set-d"], lease = "300ms", on_lost = "ignore")]
async fn a_set_finishing_when_lost(engine: &Faults) -> Result<bool, AppError> {
    engine.set_cut(true);
    for name in ["set-c", "set-d"] {
        let reason = dlock::held_lock("lost", name).expect("held").lost().await;
        assert_eq!(reason, LostReason::LeaseElapsed);
    }
    tokio::time::sleep(Duration::from_millis(50)).await;
    Ok(true)
}

#[tokio::test]
async fn a_set_is_cancelled_when_a_lock_whose_site_cancels_is_lost() {
    let (engine, _turn) = engine().await;
    let started = std::time::Instant::now();
    let result = a_set_cancelled_when_lost(engine).await;
    engine.set_cut(false);
    match result {
        Err(AppError::Lock(Error::Lost { key, reason })) => {
            assert_eq!(
                (key.name(), reason),
                ("set-a", LostReason::LeaseElapsed),
                "the write lock's site cancels"
            )
        }
        other => panic!("expected Lost, got {other:?}"),
    }
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "cancelled late: {:?}",
        started.elapsed()
    );

    let finished = a_set_finishing_when_lost(engine).await;
    engine.set_cut(false);
    assert!(finished.expect("ignore lets the body finish"));
}
