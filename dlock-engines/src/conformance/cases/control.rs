//! The control cases: an operator forces a lock free, or asks its holders
//! to let go, from another client.

use std::time::Duration;

use dlock_core::{Error, LostReason, Mode};
use tokio::time::Instant;

use super::{SETTLE, in_a_task_of_its_own, within};
use crate::conformance::{FencedRegister, Harness, SETTINGS};

/// A holder, alive but wedged, is forced out by the peer while another
/// waits: the waiter gets in with a greater fence, and the register it
/// writes then refuses the old holder's write. The old holder learns at
/// its next renewal that it was released by force, and so does its
/// release.
pub async fn force_release_fences_out_the_old_holder(h: &Harness) {
    let register = FencedRegister::default();
    let old = h.lock("forced").lock().await.expect("lock");
    register.write(old.fence()).expect("the holder's first write");
    let waiting = tokio::spawn({
        let lock = h.peer_lock("forced");
        async move { lock.lock().await.expect("the waiter's lock") }
    });
    tokio::time::sleep(SETTLE).await;

    let forced = h
        .peer_lock("forced")
        .force_release()
        .await
        .expect("force release");
    assert_eq!(forced, 1, "one hold was forced out");
    let next = within(Duration::from_secs(10), "the waiter's turn", waiting)
        .await
        .expect("waiter task");
    if h.fenced() {
        assert!(
            next.fence() > old.fence(),
            "the next holder's fence {} is not above the old {}",
            next.fence(),
            old.fence()
        );
        register.write(next.fence()).expect("the next holder's write");
        assert!(
            register.write(old.fence()).is_err(),
            "the register took a write from the holder forced out"
        );
    }

    // It learns at its next renewal: a third of the lease, then the call.
    let lease = SETTINGS.lease;
    let reason = within(lease * 2, "the old holder's loss", old.lost()).await;
    assert_eq!(reason, LostReason::ForceReleased);
    match old.release().await {
        Err(Error::Lost { reason, .. }) => assert_eq!(reason, LostReason::ForceReleased),
        other => panic!("the forced-out holder's release: {other:?}"),
    }
    next.release().await.expect("the next holder's release");
    assert_eq!(
        h.peer_lock("forced")
            .force_release()
            .await
            .expect("force release"),
        0,
        "a free lock has nothing to force out"
    );
}

/// A holder asked by the peer to let go hears it at its next renewal and
/// keeps the lock until it lets go; every reader is asked; the next
/// holder is not.
pub async fn revoke_asks_holders_to_let_go(h: &Harness) {
    let guard = h.lock("revoked").lock().await.expect("lock");
    let asked = Instant::now();
    assert_eq!(h.peer_lock("revoked").revoke().await.expect("revoke"), 1);
    let lease = SETTINGS.lease;
    within(lease, "the holder hearing it was revoked", guard.revoked()).await;
    assert!(guard.is_revoked() && !guard.is_lost(), "revoked, and still held");
    // Still held past its lease: being asked takes nothing away.
    tokio::time::sleep_until(asked + lease + lease / 3).await;
    assert!(!guard.is_lost(), "a revoked holder lost its lock");
    guard.release().await.expect("release");

    let peer = h.peer_lock("revoked");
    let next = in_a_task_of_its_own(async move { peer.lock().await }).await;
    tokio::time::sleep(lease * 2 / 3).await;
    assert!(!next.is_revoked(), "the next holder inherited the request");
    next.release().await.expect("release");

    if h.capabilities().read {
        let peer = h.peer_lock("revoked");
        let readers = [
            h.lock("revoked").read().await.expect("read"),
            in_a_task_of_its_own(async move { peer.read().await }).await,
        ];
        assert_eq!(h.peer_lock("revoked").revoke().await.expect("revoke"), 2);
        for reader in readers {
            within(lease, "a reader hearing it was revoked", reader.revoked()).await;
            assert_eq!(reader.mode(), Mode::Read);
            reader.release().await.expect("release");
        }
    }
    assert_eq!(h.peer_lock("revoked").revoke().await.expect("revoke"), 0);
}
