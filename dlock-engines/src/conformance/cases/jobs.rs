//! The run-once job cases: a hold kept on the server past its release
//! (`hold_at_least`), and a hold ended at its limit (`hold_at_most`).

use std::time::Duration;

use dlock_core::{Error, LostReason, Mode};
use tokio::time::Instant;

use super::{SETTLE, available, within};
use crate::conformance::{Harness, SETTINGS};

/// Released at once, a hold with `hold_at_least` still keeps the peer out
/// until that long after its grant, counted by the server, and then lets
/// it in, with a greater fence: first a peer that tries every 100 ms (each
/// try before then finds it taken), then one queued behind it.
pub async fn hold_at_least_keeps_others_out_after_the_release(h: &Harness) {
    let at_least = Duration::from_millis(1500);
    // The engine may round up to its lease unit (whole seconds on some).
    let bound = at_least + h.capabilities().lease_unit + Duration::from_secs(2);

    let asked = Instant::now();
    let guard = h
        .lock("at-least")
        .with_hold_at_least(at_least)
        .lock()
        .await
        .expect("lock");
    let fence = guard.fence();
    guard.release().await.expect("release");
    let mut early_tries = 0;
    let free_at = loop {
        let sent = Instant::now();
        assert!(
            sent < asked + bound,
            "still held {:?} after it was asked for",
            sent - asked
        );
        if available(&h.peer_lock("at-least"), Mode::Write).await {
            break sent;
        }
        if sent < asked + at_least {
            early_tries += 1;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(
        free_at >= asked + at_least,
        "free {:?} after it was asked for, before its hold_at_least",
        free_at - asked
    );
    assert!(early_tries > 0, "no try came before the hold_at_least ran out");
    let next = h.peer_lock("at-least").lock().await.expect("the next holder");
    if h.fenced() {
        assert!(next.fence() > fence, "fence {} not above {fence}", next.fence());
    }
    next.release().await.expect("release");

    let asked = Instant::now();
    let lock = h.lock("at-least-queued").with_hold_at_least(at_least);
    let guard = lock.lock().await.expect("lock");
    let waiter = tokio::spawn({
        let lock = h.peer_lock("at-least-queued");
        async move {
            let guard = lock
                .lock_for(Duration::from_secs(10))
                .await
                .expect("the waiter's turn");
            let granted = Instant::now();
            guard.release().await.expect("release");
            granted
        }
    });
    tokio::time::sleep(SETTLE).await;
    guard.release().await.expect("release");
    let granted = waiter.await.expect("waiter task");
    assert!(
        granted >= asked + at_least && granted < asked + bound,
        "the waiter got in {:?} after the hold was asked for",
        granted - asked
    );
}

/// A hold with `hold_at_most` is lost at its limit, for that reason, not
/// before; its release says so, and the peer gets the lock at once.
pub async fn hold_at_most_ends_the_hold_and_frees_the_lock(h: &Harness) {
    let at_most = Duration::from_millis(600);
    // The limit counts from the grant, which comes before lock() returns:
    // only a clock read before asking is sure to come before it.
    let asked = Instant::now();
    let guard = h
        .lock("at-most")
        .with_hold_at_most(at_most)
        .lock()
        .await
        .expect("lock");
    let reason = within(SETTINGS.lease, "the loss at the limit", guard.lost()).await;
    assert_eq!(reason, LostReason::TimeLimit);
    assert!(
        asked.elapsed() >= at_most,
        "lost {:?} after it was asked for",
        asked.elapsed()
    );
    match guard.release().await {
        Err(Error::Lost { reason, .. }) => assert_eq!(reason, LostReason::TimeLimit),
        other => panic!("a release past the limit: {other:?}"),
    }
    let next = h.peer_lock("at-most").lock_for(SETTINGS.lease).await;
    next.expect("the peer, once the hold ended")
        .release()
        .await
        .expect("release");
}
