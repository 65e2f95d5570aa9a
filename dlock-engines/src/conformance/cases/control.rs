//! The control cases: an operator forces a lock free, or asks its holders
//! to let go, from another client: all of them, or the one it looked at.

use std::time::Duration;

use dlock_core::{Error, HolderRecord, LostReason, Mode, Only};
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

/// An operator forces out the hold it looked at, by the fence or the owner
/// digest its record showed, and no other: a holder that came in between
/// the look and the act keeps its lock, and is not asked to let go either;
/// forced out by its own, it learns it was released by force. Of two
/// readers, the one named goes and the other stays. A fence, on an engine
/// whose records show none, is a typed error.
pub async fn force_release_only_ends_the_hold_looked_at(h: &Harness) {
    let peer = h.peer_lock("aimed");
    let first = h.lock("aimed").lock().await.expect("lock");
    let seen = holder(h, "aimed").await;
    assert_eq!(seen.owner, Some(first.owner_digest()));
    first.release().await.expect("release");
    let next = h.lock("aimed").lock().await.expect("the next holder's lock");
    let now = holder(h, "aimed").await;
    assert_eq!(now.owner, Some(next.owner_digest()));

    let mut stale = vec![Only::owner(seen.owner.clone().expect("a dlock hold's owner"))];
    stale.extend(seen.fence.map(Only::fence));
    for only in &stale {
        assert_eq!(
            peer.force_release_only(only).await.expect("force release"),
            0,
            "{only}"
        );
        assert_eq!(peer.revoke_only(only).await.expect("revoke"), 0, "{only}");
    }
    if !h.capabilities().fence_in_records {
        let refused = peer.force_release_only(&Only::fence(next.fence())).await;
        assert!(matches!(refused, Err(Error::Unsupported { .. })), "{refused:?}");
    }
    // Kept: renewed past a third of its lease, neither lost nor asked.
    tokio::time::sleep(SETTINGS.lease * 2 / 3).await;
    assert!(
        !next.is_lost() && !next.is_revoked(),
        "the next holder was touched"
    );
    assert_eq!(holder(h, "aimed").await.owner, now.owner);

    let mine = Only {
        fence: now.fence,
        owner: now.owner,
    };
    assert_eq!(peer.force_release_only(&mine).await.expect("force release"), 1);
    let reason = within(SETTINGS.lease * 2, "the holder's loss", next.lost()).await;
    assert_eq!(reason, LostReason::ForceReleased);
    assert!(next.release().await.is_err(), "released after it was forced out");

    if h.capabilities().read {
        let other = h.peer_lock("aimed");
        let named = h.lock("aimed").read().await.expect("read");
        let kept = in_a_task_of_its_own(async move { other.read().await }).await;
        let view = peer.inspect().await.expect("inspect");
        assert_eq!(view.holders.len(), 2, "{view:?}");
        let only = Only::owner(named.owner_digest());
        assert_eq!(peer.force_release_only(&only).await.expect("force release"), 1);
        let reason = within(SETTINGS.lease * 2, "the named reader's loss", named.lost()).await;
        assert_eq!(reason, LostReason::ForceReleased);
        assert!(!kept.is_lost(), "the other reader lost its hold");
        let view = peer.inspect().await.expect("inspect");
        let owners: Vec<_> = view.holders.iter().map(|r| r.owner.clone()).collect();
        assert_eq!(owners, [Some(kept.owner_digest())]);
        kept.release().await.expect("the other reader's release");
        let _ = named.release().await;
    }
}

/// The one holder of `name`, as an operator sees it.
async fn holder(h: &Harness, name: &str) -> HolderRecord {
    let view = h.peer_lock(name).inspect().await.expect("inspect");
    let [holder] = <[HolderRecord; 1]>::try_from(view.holders).expect("one holder");
    holder
}

/// Of two permits' holders, the operator asks the one named by its owner
/// digest to let go, then forces it out: that one hears it was asked, then
/// that it was released by force; the other is neither asked nor touched;
/// a waiter gets the freed permit, with a greater fence; aimed again at
/// the permit gone, nothing is done.
pub async fn a_permits_holder_is_asked_and_forced_out_by_its_digest(h: &Harness) {
    let operator = h.peer_semaphore("aimed-pool", 2);
    let named = h.semaphore("aimed-pool", 2).acquire().await.expect("a permit");
    let peer = h.peer_semaphore("aimed-pool", 2);
    let other = in_a_task_of_its_own(async move { peer.acquire().await }).await;
    let only = Only::owner(named.owner_digest());

    assert_eq!(operator.revoke_only(&only).await.expect("revoke"), 1);
    within(
        SETTINGS.lease,
        "the named holder hearing it was asked",
        named.revoked(),
    )
    .await;
    assert!(!other.is_revoked(), "the other holder was asked too");

    let waiter = h.peer_semaphore("aimed-pool", 2);
    let waiting = tokio::spawn(async move { waiter.acquire().await.expect("the waiter's permit") });
    tokio::time::sleep(SETTLE).await;
    assert_eq!(
        operator.force_release_only(&only).await.expect("force release"),
        1
    );
    let next = within(Duration::from_secs(10), "the waiter's permit", waiting)
        .await
        .expect("waiter task");
    if h.fenced() {
        assert!(
            next.fence() > named.fence(),
            "{} is not above {}",
            next.fence(),
            named.fence()
        );
    }
    let reason = within(SETTINGS.lease * 2, "the named holder's loss", named.lost()).await;
    assert_eq!(reason, LostReason::ForceReleased);
    assert!(
        !other.is_lost() && !other.is_revoked(),
        "the other holder was touched"
    );
    assert_eq!(
        operator.force_release_only(&only).await.expect("force release"),
        0
    );
    for guard in [other, next] {
        guard.release().await.expect("release");
    }
}
