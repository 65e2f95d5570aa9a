//! What an acquisition hands back: proof of holding, released on drop.

use std::future::{Future, poll_fn};
use std::pin::pin;
use std::sync::Arc;
use std::task::Poll;

use crate::hold::{Exit, Hold, held_by_this_task};
use crate::run_on::RunOn;
use crate::{Error, LockKey, LostReason, Mode};

/// A held lock (write or read). Dropping it releases the hold in the
/// background; [`release`](Guard::release) does so in place and reports errors.
/// Nested guards of the same task share one engine-level hold.
///
/// ```
/// # use std::time::Duration;
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), dlock::Error> {
/// let guard = dlock::lock("order", "42").lock().await?;
/// let fence = guard.fence(); // hand it to storage with every write
/// tokio::select! {
///     reason = guard.lost() => panic!("lost the lock: {reason}"),
///     _ = tokio::time::sleep(Duration::from_millis(10)) => { /* the work, done */ }
/// }
/// guard.release().await?; // Err(Lost) had the lock been lost meanwhile
/// # let _ = fence;
/// # Ok(())
/// # }
/// ```
///
/// Releasing consumes the guard, so a lock cannot be released twice:
///
/// ```compile_fail
/// # async fn demo(lock: dlock_core::Lock) {
/// let guard = lock.lock().await.unwrap();
/// guard.release().await.unwrap();
/// guard.release().await.unwrap(); // error: use of moved value
/// # }
/// ```
#[must_use = "the lock is released as soon as the guard is dropped"]
pub struct Guard {
    held: HeldLock,
    mode: Mode,
    /// False once `release` has run, so `Drop` does nothing.
    armed: bool,
}

/// A view of a held lock that does not keep it held: its key, fence and
/// lost signal. Cheap to clone; what `dlock::current()` returns.
#[derive(Clone)]
pub struct HeldLock(Arc<Hold>);

impl HeldLock {
    pub(crate) fn hold(&self) -> &Hold {
        &self.0
    }

    /// The lock's group and name.
    pub fn key(&self) -> &LockKey {
        &self.0.req.key
    }

    /// `Some(n)`: a permit of a semaphore of `n` permits; `None`: a lock.
    pub fn permits(&self) -> Option<u32> {
        self.0.req.permits()
    }

    /// A share of this hold for a task this one spawns: see [`Share`].
    /// `Err(Released)` once the hold has ended.
    pub fn share(&self) -> Result<Share, Error> {
        let mode = self.0.share()?;
        Ok(Share(Arc::new(Guard::new(self.0.clone(), mode))))
    }

    /// The fencing token of this hold: strictly greater than every earlier
    /// holder's. Hand it to storage so it can reject writes from a stale holder.
    pub fn fence(&self) -> u64 {
        self.0.req.fence
    }

    /// A permit's slot, `0..permits`: held by this holder alone, and what a
    /// store fencing a pool of resources keys on, with [`fence`](Self::fence)
    /// as that slot's token. `None` for a lock, or on an engine whose
    /// permits have no slots ([`Capabilities::slots`](crate::kit::Capabilities::slots)).
    pub fn slot(&self) -> Option<u32> {
        self.0.req.slot
    }

    /// What a [`LockView`](crate::LockView) shows for this hold in place of
    /// its owner id: see [`OwnerId::digest`](crate::kit::OwnerId::digest).
    pub fn owner_digest(&self) -> String {
        self.0.req.owner.digest()
    }

    /// The hold's `tracing` span (target `dlock`, name `hold`, with its
    /// fence): the attribute runs the function's body in it; with the Lock
    /// API, `work.instrument(guard.held().span().clone())` does the same.
    pub fn span(&self) -> &tracing::Span {
        &self.0.span
    }

    /// Whether the lock is already known lost.
    pub fn is_lost(&self) -> bool {
        self.lost_reason().is_some()
    }

    /// Why the lock is known lost, judged now (a lease past its end counts
    /// even before the watchdog wakes); `None` while sound.
    pub fn lost_reason(&self) -> Option<LostReason> {
        self.0.lost_reason()
    }

    /// Resolves when the lock is known lost (renewal rejected, lease elapsed
    /// unrenewed, engine session gone); never resolves while the hold is
    /// sound, nor after it was released. Every poll judges the lease anew, so
    /// a task resumed after a long pause sees the loss before it acts.
    pub fn lost(&self) -> impl Future<Output = LostReason> + Send + 'static {
        let hold = self.0.clone();
        async move {
            let mut rx = hold.subscribe_lost();
            // Wakes this future on every change; the watchdog marks the
            // loss when the lease runs out, so no timer is needed here.
            let mut changes = pin!(async {
                while rx.changed().await.is_ok() {}
                std::future::pending::<()>().await
            });
            poll_fn(|cx| match hold.lost_reason() {
                Some(reason) => Poll::Ready(reason),
                None => changes
                    .as_mut()
                    .poll(cx)
                    .map(|_| unreachable!("changes never end")),
            })
            .await
        }
    }

    /// Whether the holder was asked to let go ([`Lock::revoke`](crate::Lock::revoke)).
    /// The hold stays sound: letting go is the holder's choice.
    pub fn is_revoked(&self) -> bool {
        self.0.is_revoked()
    }

    /// Resolves when the holder is asked to let go: at its next renewal,
    /// or at once where the engine watches. Never resolves otherwise.
    pub fn revoked(&self) -> impl Future<Output = ()> + Send + 'static {
        let mut rx = self.0.subscribe_revoked();
        async move {
            if rx.wait_for(|revoked| *revoked).await.is_err() {
                std::future::pending::<()>().await
            }
        }
    }
}

/// A hold handed to other tasks. A spawned task is another task: without a
/// share, its acquisition of a lock its parent holds waits behind the
/// parent, and a parent awaiting that task waits forever. With one, the
/// task's nested acquisitions of the lock reenter the parent's hold, in the
/// hold's mode (a read hold's share asking for write gets `Upgrade`), with
/// no engine call. The hold ends when the parent's outermost guard and the
/// last clone of every share are gone.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), dlock::Error> {
/// let lock = dlock::lock("order", "42");
/// let guard = lock.lock().await?;
/// let share = guard.held().share()?;
/// let child = tokio::spawn(async move {
///     // Reenters the parent's hold; without the share it would wait behind it.
///     share.scope(async { lock.try_lock().await.map(|nested| nested.is_some()) }).await
/// });
/// assert!(child.await.expect("child")?);
/// guard.release().await
/// # }
/// ```
#[derive(Clone)]
pub struct Share(Arc<Guard>);

impl Share {
    /// Runs `fut` in the task that polls it with this hold filed for that
    /// task. The returned future owns a clone of the share, so it can be
    /// handed to `tokio::spawn` or a `JoinSet`.
    pub fn scope<F: Future>(&self, fut: F) -> impl Future<Output = F::Output> + use<F> {
        with_shares(vec![self.clone()], fut)
    }

    /// The shared hold's key, fence and lost signal.
    pub fn held(&self) -> &HeldLock {
        self.0.held()
    }
}

impl std::fmt::Debug for Share {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Share").field(&*self.0).finish()
    }
}

impl AsRef<HeldLock> for Guard {
    fn as_ref(&self) -> &HeldLock {
        &self.held
    }
}

impl AsRef<HeldLock> for HeldLock {
    fn as_ref(&self) -> &HeldLock {
        self
    }
}

/// Runs `fut` with every hold of `shares` filed for the task that polls it.
pub async fn with_shares<F: Future>(shares: Vec<Share>, fut: F) -> F::Output {
    let _filed: Vec<_> = shares.iter().map(|s| s.0.held.0.file_for_this_task()).collect();
    fut.await
}

/// Every lock the current task holds, through `#[distributed_lock]`, the
/// Lock API or a [`Share`], in no particular order.
pub fn held_locks() -> Vec<HeldLock> {
    held_by_this_task().into_iter().map(HeldLock).collect()
}

impl Guard {
    pub(crate) fn new(hold: Arc<Hold>, mode: Mode) -> Self {
        Guard {
            held: HeldLock(hold),
            mode,
            armed: true,
        }
    }

    /// The mode this guard was taken in (`Write` for a semaphore's permit).
    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// See [`HeldLock::permits`].
    pub fn permits(&self) -> Option<u32> {
        self.held.permits()
    }

    /// The key, fence and lost signal, as a handle that outlives the guard.
    pub fn held(&self) -> &HeldLock {
        &self.held
    }

    /// The lock's group and name.
    pub fn key(&self) -> &LockKey {
        self.held.key()
    }

    /// See [`HeldLock::fence`].
    pub fn fence(&self) -> u64 {
        self.held.fence()
    }

    /// See [`HeldLock::slot`].
    pub fn slot(&self) -> Option<u32> {
        self.held.slot()
    }

    /// See [`HeldLock::owner_digest`].
    pub fn owner_digest(&self) -> String {
        self.held.owner_digest()
    }

    /// See [`HeldLock::is_lost`].
    pub fn is_lost(&self) -> bool {
        self.held.is_lost()
    }

    /// See [`HeldLock::lost`].
    pub fn lost(&self) -> impl Future<Output = LostReason> + Send + 'static {
        self.held.lost()
    }

    /// See [`HeldLock::is_revoked`].
    pub fn is_revoked(&self) -> bool {
        self.held.is_revoked()
    }

    /// See [`HeldLock::revoked`].
    pub fn revoked(&self) -> impl Future<Output = ()> + Send + 'static {
        self.held.revoked()
    }

    /// Releases now. `Err(Lost)` if the lock had been lost meanwhile, so the
    /// caller learns that its critical section was not protected to the end.
    pub async fn release(mut self) -> Result<(), Error> {
        self.armed = false;
        let hold = self.held.0.clone();
        match hold.exit(self.mode) {
            Exit::Nested => match hold.lost_reason() {
                Some(reason) => Err(Error::Lost {
                    key: hold.req.key.clone(),
                    reason,
                }),
                None => Ok(()),
            },
            // Past `exit` the guard is gone: should the caller stop waiting,
            // the engine call must still happen.
            Exit::Downgrade => to_the_end(async move { hold.downgrade().await }).await,
            Exit::Release => to_the_end(async move { hold.release().await }).await,
        }
    }
}

/// Awaits `work`; if the caller stops waiting first, `work` goes on in a
/// task of its own (without a runtime, the lease frees the lock).
async fn to_the_end<T: Send + 'static>(work: impl Future<Output = T> + Send + 'static) -> T {
    RunOn::new(work, None).await
}

impl Drop for Guard {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let hold = self.held.0.clone();
        let exit = hold.exit(self.mode);
        if matches!(exit, Exit::Nested) {
            return;
        }
        // Without a runtime (it is shutting down) the lease frees the lock.
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                let _ = match exit {
                    Exit::Downgrade => hold.downgrade().await,
                    _ => hold.release().await,
                };
            });
        }
    }
}

impl std::fmt::Debug for Guard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Guard")
            .field("key", self.key())
            .field("mode", &self.mode)
            .field("fence", &self.fence())
            .field("slot", &self.slot())
            .finish()
    }
}

impl std::fmt::Debug for HeldLock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HeldLock")
            .field("key", self.key())
            .field("fence", &self.fence())
            .field("slot", &self.slot())
            .finish()
    }
}
