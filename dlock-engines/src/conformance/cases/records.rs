//! The record cases: who holds and who waits, as `inspect` and `list`
//! show them, and never an owner id.

use std::time::{Duration, SystemTime};

use dlock_core::kit::{Fairness, Poll};
use dlock_core::{HolderRecord, LockView, Mode};

use super::semaphore::held_elsewhere;
use super::{LONG_LEASE, in_a_task_of_its_own, raw_request, until_queued, within};
use crate::conformance::Harness;

/// Checks what a dlock holder's record must say: a label, a fence where
/// the engine's records show fences (and none where they do not), an owner
/// digest, a time granted in the last minute (clocks may differ a little),
/// a lease that has not ended, and where the records show renewals, a
/// lease and the renewal that set its end (none where they do not).
fn assert_plausible(h: &Harness, holder: &HolderRecord) {
    assert!(
        holder.label.as_ref().is_some_and(|l| !l.is_empty())
            && holder.fence.is_some() == h.capabilities().fence_in_records
            && holder.owner.is_some(),
        "a dlock holder with a field missing: {holder:?}"
    );
    let now = SystemTime::now();
    let skew = Duration::from_secs(60);
    let since = holder
        .since
        .unwrap_or_else(|| panic!("a dlock holder with no time: {holder:?}"));
    assert!(
        since <= now + skew && since + skew >= now,
        "held since {since:?}, now {now:?}"
    );
    if let Some(ends) = holder.lease_ends {
        assert!(ends + skew > now, "a live holder's lease ended at {ends:?}");
    }
    let renewal = (holder.lease, holder.renewed, holder.lease_ends);
    if !h.capabilities().renewals_in_records {
        assert_eq!((renewal.0, renewal.1), (None, None), "renewals shown: {holder:?}");
        return;
    }
    let (Some(lease), Some(renewed), Some(ends)) = renewal else {
        panic!("a dlock holder with no lease or renewal: {holder:?}")
    };
    // The renewal set the end, read in whole seconds on some servers.
    let second = Duration::from_secs(1);
    let set = renewed + lease;
    assert!(
        lease > Duration::ZERO && set <= ends + second && ends <= set + second,
        "{holder:?}"
    );
    assert!(
        renewed + skew + second >= since && renewed <= now + skew,
        "renewed at {renewed:?}, held since {since:?}, now {now:?}"
    );
}

/// A writer holds, another waits: the view shows the holder's mode, fence
/// and owner digest, and the waiter where the engine keeps a queue; once
/// the holder lets go the waiter holds, and then nobody.
pub async fn records_show_holders_and_waiters(h: &Harness) {
    let lock = h.lock("shown").with_lease(LONG_LEASE);
    let guard = lock.lock().await.expect("lock");
    let queued = h.queued();
    let waiting = tokio::spawn({
        let peer = h.peer_lock("shown");
        async move {
            let guard = peer.lock().await.expect("the waiter's lock");
            let (fence, owner) = (guard.fence(), guard.owner_digest());
            guard.release().await.expect("release");
            (fence, owner)
        }
    });
    until_queued(h, queued + 1).await;

    let view = h.peer_lock("shown").inspect().await.expect("inspect");
    assert_eq!(
        (view.group.as_str(), view.name.as_str(), view.permits),
        (h.group.as_str(), "shown", None)
    );
    let [holder] = view.holders.as_slice() else {
        panic!("one holder expected: {view:?}");
    };
    assert_plausible(h, holder);
    assert_eq!(holder.mode, Mode::Write);
    if h.capabilities().fence_in_records {
        assert_eq!(holder.fence, Some(guard.fence()));
    }
    assert_eq!(holder.owner, Some(guard.owner_digest()));
    if h.capabilities().fairness == Fairness::Fifo {
        let [waiter] = view.waiters.as_slice() else {
            panic!("one waiter expected: {view:?}");
        };
        assert_eq!(waiter.mode, Mode::Write);
        assert!(waiter.owner.is_some() && waiter.owner != holder.owner, "{view:?}");
        assert!(waiter.label.as_ref().is_some_and(|l| !l.is_empty()), "{view:?}");
        assert!(waiter.since.is_some(), "{view:?}");
    }

    guard.release().await.expect("release");
    let (fence, owner) = within(Duration::from_secs(10), "the waiter's turn", waiting)
        .await
        .expect("waiter task");
    assert_ne!(Some(owner), holder.owner, "the waiter's hold is another's");
    if let (true, Some(old)) = (h.fenced(), holder.fence) {
        assert!(fence > old, "fence {fence} after {old}");
    }
    let after = lock.inspect().await.expect("inspect");
    assert!(after.is_free(), "nobody holds or waits any more: {after:?}");
}

/// Readers and a semaphore's permits each show as a holder of their own.
pub async fn records_show_every_sharing_holder(h: &Harness) {
    let capabilities = h.capabilities();
    if capabilities.read {
        let lock = h.lock("read").with_lease(LONG_LEASE);
        let other = lock.clone();
        let (first, second) = (
            lock.read().await.expect("read"),
            in_a_task_of_its_own(async move { other.read().await }).await,
        );
        let view = h.peer_lock("read").inspect().await.expect("inspect");
        let mut fences: Vec<Option<u64>> = view.holders.iter().map(|r| r.fence).collect();
        fences.sort_unstable();
        let mut expected = vec![Some(first.fence()), Some(second.fence())];
        expected.sort_unstable();
        assert_eq!(fences, expected, "both readers: {view:?}");
        assert!(view.holders.iter().all(|r| r.mode == Mode::Read), "{view:?}");
        view.holders.iter().for_each(|holder| assert_plausible(h, holder));
        first.release().await.expect("release");
        second.release().await.expect("release");
    }
    if capabilities.semaphore {
        let semaphore = h.semaphore("permits", 3).with_lease(LONG_LEASE);
        let (first, second) = (held_elsewhere(&semaphore).await, held_elsewhere(&semaphore).await);
        let view = h.peer_semaphore("permits", 3).inspect().await.expect("inspect");
        assert_eq!(view.permits, Some(3), "{view:?}");
        let mut owners: Vec<Option<String>> = view.holders.iter().map(|r| r.owner.clone()).collect();
        owners.sort_unstable();
        let mut expected = vec![Some(first.owner_digest()), Some(second.owner_digest())];
        expected.sort_unstable();
        assert_eq!(owners, expected, "both permits: {view:?}");
        view.holders.iter().for_each(|holder| assert_plausible(h, holder));
        let lock_view = h.lock("permits").inspect().await.expect("inspect");
        assert!(
            lock_view.is_free(),
            "the lock of the semaphore's name is another: {lock_view:?}"
        );
        first.release().await.expect("release");
        second.release().await.expect("release");
    }
}

/// A hold made by a raw request, whose owner id the case knows: neither
/// the view nor its debug form carries the id; the digest stands for it.
pub async fn records_never_show_an_owner_id(h: &Harness) {
    let req = raw_request(h, "secret", Mode::Write, false);
    assert!(
        matches!(h.engine.acquire(&req).await, Ok(Poll::Held(_))),
        "the raw hold"
    );
    let view = h.lock("secret").inspect().await.expect("inspect");
    let id = req.owner.to_string();
    assert!(!format!("{view:?}").contains(&id), "the owner id shows: {view:?}");
    assert_eq!(view.holders.len(), 1, "{view:?}");
    assert_eq!(view.holders[0].owner, Some(req.owner.digest()));
    h.engine.release(&req).await.expect("release");
}

/// A watch on the group, armed before each step, hears a hold begin, a
/// waiter join, the hold end and the next begin; one on another group
/// hears none of them. (A watch may also resolve when its engine can tell
/// no longer, a leader lost, say: another group's watch that resolved is
/// armed again, and must keep quiet through the next hold.)
pub async fn a_watch_hears_each_hold_begin_and_end(h: &Harness) {
    let (locks, peer) = (h.registry.locks(&h.group), h.peer.locks(&h.group));
    let lock = locks.get("watched").with_lease(LONG_LEASE);
    let heard = async || peer.watch().await.expect("a watch");
    let armed = heard().await;
    let guard = lock.lock().await.expect("lock");
    within(LONG_LEASE, "the hold heard", armed).await;
    let queued = h.queued();
    let armed = heard().await;
    let waiting = tokio::spawn({
        let lock = h.peer_lock("watched").with_lease(LONG_LEASE);
        async move { lock.lock().await.expect("the waiter's lock") }
    });
    until_queued(h, queued + 1).await;
    within(LONG_LEASE, "the waiter heard", armed).await;
    let armed = heard().await;
    guard.release().await.expect("release");
    within(LONG_LEASE, "the release heard", armed).await;
    let next = waiting.await.expect("the waiter");
    let armed = heard().await;
    next.release().await.expect("release");
    within(LONG_LEASE, "the last release heard", armed).await;

    let elsewhere = h.peer.locks(&format!("{}-other", h.group));
    for attempt in 1.. {
        let quiet = elsewhere.watch().await.expect("a watch on another group");
        let guard = lock.lock().await.expect("lock");
        guard.release().await.expect("release");
        let heard_elsewhere = tokio::time::timeout(Duration::from_millis(200), quiet).await;
        if heard_elsewhere.is_err() {
            break;
        }
        assert!(
            attempt < 3,
            "another group's watch heard this group, {attempt} times"
        );
    }
}

/// A group's listing shows the locks and semaphores held in it, each once,
/// and none once they are let go.
pub async fn list_shows_a_groups_held_locks(h: &Harness) {
    let locks = h.registry.locks(&h.group);
    let (a, b) = (
        locks.get("a").with_lease(LONG_LEASE),
        locks.get("b").with_lease(LONG_LEASE),
    );
    let (a, b) = (a.lock().await.expect("a"), b.lock().await.expect("b"));
    let permit = if h.capabilities().semaphore {
        Some(held_elsewhere(&h.semaphore("s", 2).with_lease(LONG_LEASE)).await)
    } else {
        None
    };
    let listed = h.peer.locks(&h.group).list().await.expect("list");
    let mut names: Vec<(&str, Option<u32>)> = listed.iter().map(|v| (v.name.as_str(), v.permits)).collect();
    names.sort_unstable();
    let mut expected = vec![("a", None), ("b", None)];
    if permit.is_some() {
        expected.push(("s", Some(2)));
    }
    assert_eq!(names, expected, "{listed:?}");
    assert!(
        listed.iter().all(|v| v.group == h.group && v.holders.len() == 1),
        "{listed:?}"
    );
    let fence_of = |name: &str| holder_of(&listed, name).fence;
    assert_eq!((fence_of("a"), fence_of("b")), (Some(a.fence()), Some(b.fence())));

    a.release().await.expect("release");
    b.release().await.expect("release");
    if let Some(permit) = permit {
        permit.release().await.expect("release");
    }
    let after = h.peer.locks(&h.group).list().await.expect("list");
    assert!(after.is_empty(), "nothing held any more: {after:?}");
}

fn holder_of<'v>(listed: &'v [LockView], name: &str) -> &'v HolderRecord {
    &listed
        .iter()
        .find(|v| v.name == name && v.permits.is_none())
        .unwrap_or_else(|| panic!("{name} not listed: {listed:?}"))
        .holders[0]
}
