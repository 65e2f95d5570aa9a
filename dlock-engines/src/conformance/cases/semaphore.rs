//! The semaphore cases: at most its permits inside, all of them together,
//! in order, one count among its clients, and each permit with its own
//! lease.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use dlock_core::kit::{Expiry, Kind, Records, Request};
use dlock_core::{Error, Guard, Mode, Semaphore};
use tokio::sync::Barrier;

use super::{
    Asking, LONG_LEASE, Queue, a_waiter_keeps_its_turn, cut_off_holder_learns_it_lost, free_now,
    in_a_task_of_its_own, raw_request, released_lost, served_after_abandoned, within,
};
use crate::conformance::{FencedRegister, Harness, Occupancy};

/// Whether another task could take a permit of `semaphore` right now (and
/// let it go).
async fn permit_available(semaphore: &Semaphore) -> bool {
    let semaphore = semaphore.clone();
    free_now(async move { semaphore.try_acquire().await }).await
}

/// A permit taken in a task of its own, so that it is not this task's
/// reentry: what another holder in this process looks like.
pub(super) async fn held_elsewhere(semaphore: &Semaphore) -> Guard {
    let semaphore = semaphore.clone();
    in_a_task_of_its_own(async move { semaphore.acquire().await }).await
}

/// A raw request for a permit of `name`, as a peer process would make it.
fn raw_permit(h: &Harness, name: &str, permits: u32, queue: bool) -> Request {
    let mut req = raw_request(h, name, Mode::Write, queue);
    req.kind = Kind::Semaphore(permits);
    req
}

/// Twelve tasks on both clients, each taking a permit of three ten times
/// and staying inside a moment: never more than three inside, and every
/// visit made. Where permits are slots, every holder has one of the three,
/// and no two inside at once share one.
pub async fn semaphore_admits_at_most_its_permits(h: &Harness) {
    const PERMITS: u32 = 3;
    const TASKS: u64 = 12;
    const ROUNDS: u64 = 10;
    let inside = Arc::new(Occupancy::new(PERMITS));
    let slots = Arc::new(SlotUse::new(PERMITS, h.capabilities().slots));
    let tasks: Vec<_> = (0..TASKS)
        .map(|i| {
            let semaphore = if i % 2 == 0 {
                h.semaphore("at-most", PERMITS)
            } else {
                h.peer_semaphore("at-most", PERMITS)
            };
            let (inside, slots) = (inside.clone(), slots.clone());
            tokio::spawn(async move {
                for _ in 0..ROUNDS {
                    let guard = semaphore.acquire().await.expect("acquire");
                    let slot = slots.enter(guard.slot());
                    inside.visit(Duration::from_millis(5)).await;
                    slots.leave(slot);
                    guard.release().await.expect("release");
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.expect("task panicked");
    }
    assert_eq!(inside.over(), 0, "more than {PERMITS} inside at once");
    assert!(
        inside.most() <= u64::from(PERMITS),
        "{} inside at once",
        inside.most()
    );
    assert_eq!(inside.entries(), TASKS * ROUNDS, "visits lost");
    assert_eq!(
        slots.wrong.load(Ordering::SeqCst),
        0,
        "holders without a slot of {PERMITS}, or with one where none was due"
    );
    assert_eq!(
        slots.shared.load(Ordering::SeqCst),
        0,
        "holders inside at once in one slot"
    );
}

/// Who is inside each slot: holders whose slot was missing or out of
/// range, and holders that found another inside theirs.
struct SlotUse {
    inside: Vec<AtomicU32>,
    expected: bool,
    wrong: AtomicU32,
    shared: AtomicU32,
}

impl SlotUse {
    fn new(permits: u32, expected: bool) -> Self {
        SlotUse {
            inside: (0..permits).map(|_| AtomicU32::new(0)).collect(),
            expected,
            wrong: AtomicU32::new(0),
            shared: AtomicU32::new(0),
        }
    }

    fn enter(&self, slot: Option<u32>) -> Option<&AtomicU32> {
        let inside = slot.and_then(|slot| self.inside.get(slot as usize));
        if inside.is_some() != self.expected {
            self.wrong.fetch_add(1, Ordering::SeqCst);
        }
        if inside.is_some_and(|inside| inside.fetch_add(1, Ordering::SeqCst) > 0) {
            self.shared.fetch_add(1, Ordering::SeqCst);
        }
        inside
    }

    fn leave(&self, inside: Option<&AtomicU32>) {
        if let Some(inside) = inside {
            inside.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

/// Four tasks on both clients each take one of four permits and meet: all
/// inside at once. A fifth finds none free.
pub async fn semaphore_admits_its_permits_together(h: &Harness) {
    const PERMITS: u32 = 4;
    let (all_in, done) = (Arc::new(Barrier::new(5)), Arc::new(Barrier::new(5)));
    let tasks: Vec<_> = (0..PERMITS)
        .map(|i| {
            let semaphore = if i % 2 == 0 {
                h.semaphore("together", PERMITS)
            } else {
                h.peer_semaphore("together", PERMITS)
            };
            let (all_in, done) = (all_in.clone(), done.clone());
            tokio::spawn(async move {
                let guard = semaphore.acquire().await.expect("acquire");
                all_in.wait().await;
                done.wait().await;
                guard.release().await.expect("release");
            })
        })
        .collect();
    within(
        Duration::from_secs(10),
        "every permit held at once",
        all_in.wait(),
    )
    .await;
    assert!(
        !permit_available(&h.peer_semaphore("together", PERMITS)).await,
        "a fifth holder admitted"
    );
    done.wait().await;
    for task in tasks {
        task.await.expect("task panicked");
    }
    assert!(
        permit_available(&h.semaphore("together", PERMITS)).await,
        "permits not back after release"
    );
}

/// With both permits of two taken, waiters that queued one after another
/// are served in that order as one permit comes and goes; and a queued
/// waiter keeps its turn against a newcomer even at the instant a permit
/// is free.
pub async fn semaphore_serves_waiters_in_order(h: &Harness) {
    let semaphore = h.semaphore("fifo", 2);
    let first = semaphore.acquire().await.expect("acquire");
    let second = held_elsewhere(&semaphore).await;
    let waiters = (0..4)
        .map(|i| {
            let semaphore = if i % 2 == 0 {
                h.semaphore("fifo", 2)
            } else {
                h.peer_semaphore("fifo", 2)
            };
            Box::pin(async move { semaphore.acquire().await }) as Asking
        })
        .collect();
    let queue = Queue::join(h, waiters).await;
    // One permit comes free; the other stays held, so they go one by one.
    first.release().await.expect("release");
    assert_eq!(queue.served().await, [0, 1, 2, 3], "not first come, first served");
    second.release().await.expect("release");

    // Without timing: a queued waiter keeps its turn against a newcomer even
    // at the instant a permit is free.
    let holders = [
        raw_permit(h, "fifo-raw", 2, false),
        raw_permit(h, "fifo-raw", 2, false),
    ];
    let queued = raw_permit(h, "fifo-raw", 2, true);
    let newcomer = raw_permit(h, "fifo-raw", 2, false);
    a_waiter_keeps_its_turn(h, &holders, queued, newcomer).await;
}

/// Asking with another count than the semaphore's holders use is a typed
/// error naming both, from another client, another task or the holding
/// task itself, waiting or not; once nobody holds it, a new count takes over.
pub async fn semaphore_count_must_agree(h: &Harness) {
    let held = h.semaphore("count", 3).acquire().await.expect("acquire");
    let differs = |result: Result<Option<Guard>, Error>, asked: u32| match result {
        Err(Error::PermitCount {
            asked: a, in_use: 3, ..
        }) if a == asked => {}
        Err(e) => panic!("expected PermitCount asked {asked}, in use 3; got {e}"),
        Ok(_) => panic!("a semaphore of 3 permits admitted a client asking for {asked}"),
    };
    let peer = h.peer_semaphore("count", 2);
    // An answer, not a failure to retry until the wait (20 s) runs out.
    let waiting = within(
        Duration::from_secs(5),
        "a count mismatch answered at once",
        peer.acquire(),
    );
    differs(waiting.await.map(Some), 2);
    differs(peer.try_acquire().await, 2);
    let other = h.semaphore("count", 5);
    let from_another_task = tokio::spawn(async move { other.try_acquire().await })
        .await
        .expect("task panicked");
    differs(from_another_task, 5);
    differs(h.semaphore("count", 4).acquire().await.map(Some), 4);
    let message = h
        .semaphore("count", 2)
        .try_acquire()
        .await
        .err()
        .map(|e| e.to_string());
    assert!(
        message
            .as_deref()
            .is_some_and(|m| m.contains('3') && m.contains('2')),
        "the message names both counts: {message:?}"
    );
    held.release().await.expect("release");
    let recounted = h.peer_semaphore("count", 2);
    let (a, b) = (
        recounted.acquire().await.expect("a new count once idle"),
        held_elsewhere(&recounted).await,
    );
    assert!(!permit_available(&recounted).await, "2 permits admitted a third");
    a.release().await.expect("release");
    b.release().await.expect("release");
}

/// A task holding a permit takes it again with no engine call and the
/// same fence, without a second permit: of two, one is still free for
/// another task, and only one.
pub async fn semaphore_reentry_takes_no_second_permit(h: &Harness) {
    let semaphore = h.semaphore("re", 2).with_lease(LONG_LEASE);
    let outer = semaphore.acquire().await.expect("acquire");
    let calls = h.faults.calls();
    let inner = semaphore.acquire().await.expect("nested acquire");
    assert_eq!(h.faults.calls(), calls, "a nested acquisition called the engine");
    assert_eq!(inner.fence(), outer.fence(), "a nested guard is the same hold");
    assert_eq!(inner.permits(), Some(2));
    let peer = h.peer_semaphore("re", 2);
    let other = held_elsewhere(&peer).await;
    assert!(
        !permit_available(&peer).await,
        "reentry took no permit, or a third was given"
    );
    inner.release().await.expect("nested release");
    assert!(!permit_available(&peer).await, "a nested release let go");
    outer.release().await.expect("release");
    assert!(permit_available(&peer).await, "not let go by the outer release");
    other.release().await.expect("release");
}

/// A semaphore and the lock of the same name are two things: holding one
/// leaves the other free, even to the same task.
pub async fn semaphore_is_not_the_lock_of_its_name(h: &Harness) {
    let lock = h.lock("same").lock().await.expect("lock");
    let permit = h.semaphore("same", 1).try_acquire().await.expect("try");
    let permit = permit.expect("the semaphore is free while its name's lock is held");
    assert_eq!((lock.permits(), permit.permits()), (None, Some(1)));
    assert!(
        !permit_available(&h.peer_semaphore("same", 1)).await,
        "the permit does not exclude"
    );
    lock.release().await.expect("release");
    let peer_lock = h.peer_lock("same").try_lock().await.expect("try");
    let peer_lock = peer_lock.expect("the lock is free while its name's semaphore is held");
    peer_lock.release().await.expect("release");
    permit.release().await.expect("release");
}

/// Permits taken one after another, from both clients, two held at any
/// time, each let go after the next is granted: every fence is greater
/// than all granted before it, so two holders at once never share one.
pub async fn semaphore_fences_rise(h: &Harness) {
    let (ours, peers) = (h.semaphore("fence", 2), h.peer_semaphore("fence", 2));
    let mut fences = Vec::new();
    let mut held = std::collections::VecDeque::new();
    for i in 0..40 {
        let guard = held_elsewhere(if i % 2 == 0 { &ours } else { &peers }).await;
        fences.push(guard.fence());
        held.push_back(guard);
        if held.len() == 2 {
            held.pop_front()
                .expect("two held")
                .release()
                .await
                .expect("release");
        }
    }
    for guard in held {
        guard.release().await.expect("release");
    }
    assert!(
        fences.windows(2).all(|w| w[0] < w[1]),
        "fences not rising in the order granted: {fences:?}"
    );
}

/// A peer that took a permit and vanished (no renewal, no release) holds it
/// only until its lease runs out; the next holder's fence is greater.
pub async fn semaphore_permit_of_an_abandoned_holder_returns(h: &Harness) {
    let abandoned = raw_permit(h, "abandoned", 1, false);
    served_after_abandoned(h, abandoned, h.semaphore("abandoned", 1).acquire()).await;
}

/// Cut off from the engine, a permit's holder learns it lost within one
/// lease, and its permit goes to the next client (at the lease's end, or
/// where a session keeps it, when it lets go).
pub async fn semaphore_holder_cut_off_learns_it_lost(h: &Harness) {
    let semaphore = h.semaphore("lost-cut", 1).with_lease(Duration::from_secs(1));
    let held = semaphore.acquire().await.expect("acquire");
    let next = h.peer_semaphore("lost-cut", 1);
    cut_off_holder_learns_it_lost(h, held, semaphore.acquire(), next.acquire()).await;
}

/// A store fencing a pool of resources: a [`FencedRegister`] per slot.
#[derive(Default)]
struct PerSlotStore(std::sync::Mutex<std::collections::HashMap<u32, FencedRegister>>);

impl PerSlotStore {
    /// Whether a write under `slot` and `fence` lands.
    fn write(&self, (slot, fence): (Option<u32>, u64)) -> bool {
        let slot = slot.expect("a permit in a slot");
        let mut registers = self.0.lock().unwrap_or_else(|e| e.into_inner());
        registers.entry(slot).or_default().write(fence).is_ok()
    }
}

fn token(guard: &Guard) -> (Option<u32>, u64) {
    (guard.slot(), guard.fence())
}

/// Each permit is one of its semaphore's slots: three holders hold slots
/// 0, 1 and 2 (the records say so too, read by name and listed), and a
/// store that keeps the greatest token per slot takes all their writes, the
/// newest first (one keeping the greatest over all permits would refuse the
/// older two). Then
/// a permit's holder, cut off past its lease, learns it lost; the next
/// client gets its slot with a greater fence and writes, and the cut-off
/// holder's late write under its old token is refused. (The cut-off holder
/// holds alone: on an engine whose lease is its session's, the peer's holds
/// on a shared session would keep it alive.)
pub async fn semaphore_slots_fence_a_pool(h: &Harness) {
    let peers = h.peer_semaphore("slots", 3);
    let mut held = Vec::new();
    for _ in 0..3 {
        held.push(held_elsewhere(&peers).await);
    }
    let mut slots: Vec<Option<u32>> = held.iter().map(Guard::slot).collect();
    slots.sort();
    assert_eq!(slots, [Some(0), Some(1), Some(2)], "three holders, three slots");
    if h.capabilities().records != Records::None {
        let view = peers.inspect().await.expect("inspect");
        let mut shown: Vec<Option<u32>> = view.holders.iter().map(|holder| holder.slot).collect();
        shown.sort();
        assert_eq!(shown, slots, "the records' slots");
    }
    if h.capabilities().records == Records::Listed {
        let listed = h.peer.locks(&h.group).list().await.expect("list");
        let view = listed
            .iter()
            .find(|v| v.name == "slots")
            .expect("the semaphore listed");
        let mut shown: Vec<Option<u32>> = view.holders.iter().map(|holder| holder.slot).collect();
        shown.sort();
        assert_eq!(shown, slots, "the listed records' slots");
    }
    let store = PerSlotStore::default();
    held.sort_by_key(|guard| std::cmp::Reverse(guard.fence()));
    for guard in &held {
        assert!(store.write(token(guard)), "a sound holder was refused");
    }
    for guard in held {
        guard.release().await.expect("release");
    }

    let cut = h
        .semaphore("slot-cut", 1)
        .with_lease(Duration::from_secs(1))
        .acquire()
        .await
        .expect("acquire");
    let store = PerSlotStore::default();
    assert!(store.write(token(&cut)));
    let (lost, old) = (cut.lost(), token(&cut));
    h.faults.set_cut(true);
    within(Duration::from_secs(3), "lost signal", lost).await;
    let mut cut = Some(cut);
    // Where a session rather than a lease keeps the permit, it goes when
    // the lost holder lets go.
    if h.capabilities().expiry != Expiry::Lease {
        h.faults.set_cut(false);
        released_lost(cut.take()).await;
    }
    let next = within(
        Duration::from_secs(5),
        "the next client served",
        held_elsewhere(&h.peer_semaphore("slot-cut", 1)),
    )
    .await;
    assert_eq!(next.slot(), old.0, "the next holder takes the slot let go");
    assert!(next.fence() > old.1, "the slot's fence rises");
    assert!(store.write(token(&next)), "the slot's new holder was refused");
    assert!(!store.write(old), "the cut-off holder's late write landed");
    h.faults.set_cut(false);
    released_lost(cut).await;
    next.release().await.expect("release");
}
