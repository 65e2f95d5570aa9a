//! The conformance cases, one file a capability, and the helpers they
//! share. Each case takes a fresh [`Harness`] and panics with a message
//! saying what broke. Timing bounds are generous: they separate "notified"
//! from "waited for a lease or a kick", not fast from slow.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use dlock_core::kit::{Expiry, Poll, Request, Serving, Woken};
use dlock_core::{Error, Guard, Lock, LockKey, LostReason, Mode};
use tokio::time::{Instant, sleep, timeout};

use super::Harness;

mod control;
mod deadlocks;
mod election;
mod jobs;
mod locks;
mod records;
mod semaphore;
pub use control::*;
pub use deadlocks::*;
pub use election::*;
pub use jobs::*;
pub use locks::*;
pub use records::*;
pub use semaphore::*;

/// Long enough that no renewal happens during a short case.
const LONG_LEASE: Duration = Duration::from_secs(30);
/// Time for a spawned waiter to reach the engine's queue.
const SETTLE: Duration = Duration::from_millis(200);

/// Whether another task could take `lock` in `mode` right now (and let it go).
async fn available(lock: &Lock, mode: Mode) -> bool {
    let lock = lock.clone();
    free_now(async move {
        match mode {
            Mode::Write => lock.try_lock().await,
            Mode::Read => lock.try_read().await,
        }
    })
    .await
}

/// Whether `trying`, in a task of its own, gets what it tries for (and lets
/// it go).
async fn free_now(trying: impl Future<Output = Result<Option<Guard>, Error>> + Send + 'static) -> bool {
    tokio::spawn(async move {
        match trying.await.expect("try-acquire failed") {
            Some(guard) => {
                guard.release().await.expect("release failed");
                true
            }
            None => false,
        }
    })
    .await
    .expect("task panicked")
}

/// The guard `acquiring` gets in a task of its own: a hold that is not
/// this task's reentry, as another holder in this process would have it.
async fn in_a_task_of_its_own(
    acquiring: impl Future<Output = Result<Guard, Error>> + Send + 'static,
) -> Guard {
    tokio::spawn(acquiring)
        .await
        .expect("task panicked")
        .expect("acquire")
}

async fn within<T>(limit: Duration, what: &str, fut: impl Future<Output = T>) -> T {
    timeout(limit, fut)
        .await
        .unwrap_or_else(|_| panic!("{what}: not done within {limit:?}"))
}

/// Asserts that `lock` is taken within `limit`, and lets it go.
async fn served_within(limit: Duration, what: &str, lock: Lock) {
    let next = within(limit, what, lock.lock()).await;
    next.expect("lock").release().await.expect("release");
}

/// `holders` are granted and `queued` queues behind them; the first holder
/// lets go, and a `newcomer` asking at that instant must wait: `queued` is
/// granted. Everything is let go at the end.
async fn a_waiter_keeps_its_turn(h: &Harness, holders: &[Request], queued: Request, newcomer: Request) {
    for holder in holders {
        let answer = serving(h, holder).acquire(holder).await.expect("acquire");
        assert!(matches!(answer, Poll::Held(_)), "free {} refused", holder.key);
    }
    let answer = serving(h, &queued).acquire(&queued).await.expect("acquire");
    assert!(matches!(answer, Poll::Waiting(_)), "busy {} granted", queued.key);
    assert!(
        serving(h, &holders[0])
            .release(&holders[0])
            .await
            .expect("release"),
        "holder not recorded"
    );
    let barged = serving(h, &newcomer).acquire(&newcomer).await.expect("newcomer");
    assert!(matches!(barged, Poll::Waiting(_)), "a newcomer jumped the queue");
    assert!(granted(h, &queued).await, "queued waiter not granted");
    for holder in holders[1..].iter().chain([&queued]) {
        assert!(serving(h, holder).release(holder).await.expect("release"));
    }
}

/// One acquisition, asked for in a task of its own.
type Asking = std::pin::Pin<Box<dyn Future<Output = Result<Guard, Error>> + Send>>;

/// Waiters that each joined the queue once the one before had its place.
struct Queue {
    tasks: Vec<tokio::task::JoinHandle<()>>,
    order: Arc<Mutex<Vec<usize>>>,
}

impl Queue {
    /// Starts each of `waiters` in turn, each letting go as soon as it is
    /// served.
    async fn join(h: &Harness, waiters: Vec<Asking>) -> Queue {
        let order = Arc::new(Mutex::new(Vec::new()));
        let mut tasks = Vec::new();
        let queued = h.queued();
        for (i, asking) in waiters.into_iter().enumerate() {
            let order = order.clone();
            tasks.push(tokio::spawn(async move {
                let guard = asking.await.expect("acquire");
                order.lock().unwrap().push(i);
                guard.release().await.expect("release");
            }));
            until_queued(h, queued + 1 + i as u64).await;
        }
        Queue { tasks, order }
    }

    /// The order the waiters were served in, once all were.
    async fn served(self) -> Vec<usize> {
        for task in self.tasks {
            task.await.expect("task panicked");
        }
        self.order.lock().unwrap().clone()
    }
}

/// Waits until the clients have had `count` requests queued in all: the
/// waiter just started has its place, whatever a failover made it wait.
async fn until_queued(h: &Harness, count: u64) {
    within(
        Duration::from_secs(20),
        "a waiter taking its place in the queue",
        async {
            while h.queued() < count {
                sleep(Duration::from_millis(5)).await;
            }
        },
    )
    .await;
}

/// Whether `req` is granted within `SETTLE`, polled as the core polls: again
/// when its wake-up fires or a short pause passes (an engine whose news
/// comes on another stream than its answers may say "not yet" once).
async fn granted(h: &Harness, req: &Request) -> bool {
    let deadline = Instant::now() + SETTLE;
    while Instant::now() < deadline {
        match serving(h, req).poll(req).await.expect("poll") {
            Poll::Held(_) => return true,
            Poll::Waiting(wake) => {
                if let Ok(Woken::Granted { .. }) = timeout(Duration::from_millis(20), wake).await {
                    return true;
                }
            }
        }
    }
    false
}

/// What serves `req` at the engine, picked as the core picks it.
fn serving<'a>(h: &'a Harness, req: &Request) -> Serving<'a> {
    h.engine
        .serving(req)
        .expect("a case asks only for what the engine serves")
}

/// A request straight to the engine, as a peer process would make it.
fn raw_request(h: &Harness, name: &str, mode: Mode, queue: bool) -> Request {
    let key = LockKey::new(h.group.as_str(), name).expect("key");
    let mut req = Request::new(key, mode, Duration::from_secs(5));
    req.try_once = !queue;
    req
}

/// `abandoned`, taken straight from the engine and then neither renewed
/// nor released, is given a 1 s lease; `next` is served only after it ran
/// out, with a greater fence.
async fn served_after_abandoned(
    h: &Harness,
    mut abandoned: Request,
    next: impl Future<Output = Result<Guard, Error>>,
) {
    abandoned.lease = Duration::from_secs(1);
    // The lease counts from the request's sending, as the core counts it:
    // a client slow to hear the grant must not make the wait look short.
    let sent = Instant::now();
    let Poll::Held(abandoned_fence) = serving(h, &abandoned)
        .acquire(&abandoned)
        .await
        .expect("raw acquire")
    else {
        panic!("a free {} was not granted", abandoned.key);
    };
    let guard = within(Duration::from_secs(10), "served after the lease ran out", next)
        .await
        .expect("acquire");
    assert!(
        sent.elapsed() >= abandoned.lease,
        "granted {:?} after the abandoned holder's request, within its lease of {:?}",
        sent.elapsed(),
        abandoned.lease
    );
    if h.fenced() {
        assert!(guard.fence() > abandoned_fence, "fence did not increase");
    }
    guard.release().await.expect("release");
}

/// Cut off from the engine, the holder of `held` learns it lost within one
/// lease, and taking it `again` is `Lost`. `next` is served then: once the
/// lease ran out, or, where a session rather than the cut path keeps the
/// hold, once the lost holder let go; its fence is greater. Releasing the
/// lost hold reports the loss.
async fn cut_off_holder_learns_it_lost(
    h: &Harness,
    held: Guard,
    again: impl Future<Output = Result<Guard, Error>>,
    next: impl Future<Output = Result<Guard, Error>>,
) {
    let (lost, lost_fence) = (held.lost(), held.fence());
    h.faults.set_cut(true);
    let reason = within(Duration::from_secs(3), "lost signal", lost).await;
    assert_eq!(reason, LostReason::LeaseElapsed);
    assert!(held.is_lost());
    let nested = again.await.expect_err("reentering a lost hold");
    assert!(matches!(nested, Error::Lost { .. }), "{nested}");
    let mut held = Some(held);
    if h.capabilities().expiry != Expiry::Lease {
        h.faults.set_cut(false);
        released_lost(held.take()).await;
    }
    let next = within(Duration::from_secs(5), "the next client served", next)
        .await
        .expect("acquire");
    if h.fenced() {
        assert!(next.fence() > lost_fence, "new holder's fence must be greater");
    }
    h.faults.set_cut(false);
    released_lost(held).await;
    next.release().await.expect("release");
}

/// Releases a lost hold's guard, if not released yet: that reports the loss.
async fn released_lost(guard: Option<Guard>) {
    if let Some(guard) = guard {
        let err = guard
            .release()
            .await
            .expect_err("release of a lost hold must report it");
        assert!(matches!(err, Error::Lost { .. }), "{err}");
    }
}
