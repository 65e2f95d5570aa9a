//! The engine interface: the traits, and what answers a request.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use async_trait::async_trait;

use super::{Capabilities, Facets, Guarantees, Kind, Request};
use crate::BoxError;
use crate::run_on::RunOn;

/// A future that resolves when a waiting request should be polled again, or
/// was granted. Spurious wakes are harmless; the core also polls on its own
/// schedule.
pub type Wake = Pin<Box<dyn Future<Output = Woken> + Send + 'static>>;

/// A future that resolves when the engine learns, on its own, that a hold is gone.
pub type LostSignal = Pin<Box<dyn Future<Output = ()> + Send + 'static>>;

/// A future that resolves when the engine hears, on its own, that a hold
/// may have been asked to let go.
pub type RevokedSignal = Pin<Box<dyn Future<Output = ()> + Send + 'static>>;

/// What a [`Wake`] says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Woken {
    /// Try again: poll.
    Retry,
    /// Another client handed the lock to this request while it waited (a
    /// direct handoff): it holds with `fence`, for `valid_for` counted from
    /// its last call to the engine. The core renews it before then.
    Granted {
        /// The hold's fencing token.
        fence: u64,
        /// How long the engine keeps the hold unrenewed, from the request's
        /// last call.
        valid_for: Duration,
    },
}

/// Answer to [`Lifecycle::acquire`] and [`Lifecycle::poll`].
pub enum Poll {
    /// Granted, with this hold's fencing token (strictly increasing per lock).
    Held(u64),
    /// Not yet; try again once this resolves.
    Waiting(Wake),
}

impl std::fmt::Debug for Poll {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Poll::Held(fence) => write!(f, "Held({fence})"),
            Poll::Waiting(_) => f.write_str("Waiting"),
        }
    }
}

/// Answer to [`Lifecycle::renew`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Renewal {
    /// Still held: the lease runs on.
    Held,
    /// Still held, and someone asked this holder to let go
    /// ([`Control::revoke`](super::Control::revoke)); the lease runs on all the same.
    Revoked,
    /// Not held any more: the lease ran out, or another owner has it.
    Gone,
}

impl From<bool> for Renewal {
    /// For engines that cannot be asked to let go: held or gone.
    fn from(held: bool) -> Self {
        if held { Renewal::Held } else { Renewal::Gone }
    }
}

/// What went wrong inside an engine; the core adds the engine's and lock's names.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// Connection refused, server error, protocol surprise, no answer in time.
    #[error(transparent)]
    Failed(BoxError),
    /// The semaphore is in use with another number of permits: its live
    /// holders and waiters agreed on `in_use`.
    #[error("the semaphore is in use with {in_use} permits")]
    PermitsDiffer {
        /// The count the semaphore's current holders and waiters use.
        in_use: u32,
    },
}

impl EngineError {
    /// Wraps any client error as [`EngineError::Failed`].
    pub fn failed(err: impl Into<BoxError>) -> Self {
        EngineError::Failed(err.into())
    }
}

/// A hold's life at the engine, from the first try to the release: what
/// the core asks for every request of one [`Kind`]. An [`Engine`] is the
/// lifecycle of its locks and campaigns; its [`Semaphores`](super::Semaphores)
/// facet hands out the lifecycle of a permit. So an engine never asks a
/// request what it is: the core picks the lifecycle once
/// ([`serving`](Engine#method.serving)), and so does anyone else who calls
/// an engine straight (a test, a wrapper).
#[async_trait]
pub trait Lifecycle: Send + Sync {
    /// First attempt: join the queue unless `req.try_once`, and try.
    async fn acquire(&self, req: &Request) -> Result<Poll, EngineError>;

    /// Later attempts for a request that `acquire` queued; also tells the engine
    /// that the waiter is still alive.
    async fn poll(&self, req: &Request) -> Result<Poll, EngineError>;

    /// Withdraws a request: leave the queue, and if it was granted meanwhile, let go.
    async fn cancel(&self, req: &Request) -> Result<(), EngineError>;

    /// Extends the lease, and says whether this owner still holds and
    /// whether it was asked to let go.
    async fn renew(&self, req: &Request) -> Result<Renewal, EngineError>;

    /// Lets go. `Ok(false)`: this owner no longer held.
    async fn release(&self, req: &Request) -> Result<bool, EngineError>;

    /// A future that resolves if the engine learns, on its own, that this hold is
    /// gone (e.g. a ZooKeeper session expired). `None`: renewal alone tells.
    /// No default: a wrapper engine that forgot to pass it on would drop
    /// the signal without a word.
    fn lost(&self, req: &Request) -> Option<LostSignal>;

    /// A future that resolves when the engine hears, on its own (a watch),
    /// that this hold may have been asked to let go or forced out: the core
    /// then renews at once, the renewal's answer says which, and it asks
    /// for the signal again. Asked for once the hold's first renewal is
    /// due, not on the hot path. `None`, the default: renewals alone tell,
    /// within a third of the lease.
    fn revoked(&self, req: &Request) -> Option<RevokedSignal> {
        let _ = req;
        None
    }

    /// The slot a granted permit holds, `0..count`: no other holder has it
    /// meanwhile, and its holders' fences rise, so a store that keeps the
    /// greatest token per (resource, slot) refuses a holder whose slot was
    /// given to another. Asked once, after the grant; the engine keeps it
    /// in the request's state. `None`, the default: a lock's lifecycle, or
    /// permits without slots ([`Semaphores::slots`](super::Semaphores::slots)).
    fn slot(&self, req: &Request) -> Option<u32> {
        let _ = req;
        None
    }
}

/// A lifecycle borrowed is the same lifecycle: a wrapper hands out
/// `Box::new(self)` where it serves permits as it serves locks.
#[async_trait]
impl<T: Lifecycle + ?Sized> Lifecycle for &T {
    async fn acquire(&self, req: &Request) -> Result<Poll, EngineError> {
        (**self).acquire(req).await
    }

    async fn poll(&self, req: &Request) -> Result<Poll, EngineError> {
        (**self).poll(req).await
    }

    async fn cancel(&self, req: &Request) -> Result<(), EngineError> {
        (**self).cancel(req).await
    }

    async fn renew(&self, req: &Request) -> Result<Renewal, EngineError> {
        (**self).renew(req).await
    }

    async fn release(&self, req: &Request) -> Result<bool, EngineError> {
        (**self).release(req).await
    }

    fn lost(&self, req: &Request) -> Option<LostSignal> {
        (**self).lost(req)
    }

    fn revoked(&self, req: &Request) -> Option<RevokedSignal> {
        (**self).revoked(req)
    }

    fn slot(&self, req: &Request) -> Option<u32> {
        (**self).slot(req)
    }
}

/// A lock engine: the [`Lifecycle`] of its locks, and what it is. See the
/// [kit](crate::kit) for the protocol.
///
/// Behaviour around any engine is added by wrapping it in another engine;
/// this one counts the acquisitions that reach the engine it wraps. A
/// wrapper forwards every method, those with a default too, or it drops
/// what the wrapped engine does there (`#[deny(clippy::missing_trait_methods)]`
/// on the `impl` catches a missed one). Handing on the wrapped engine's
/// [`facets`](Engine::facets) sends their calls straight to it, a permit's
/// lifecycle among them; a wrapper that acts on them too implements each
/// facet itself:
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), dlock::Error> {
/// use std::sync::Arc;
/// use std::sync::atomic::{AtomicU64, Ordering};
/// use dlock::kit::{
///     Engine, EngineError, Facets, Guarantees, Lifecycle, LostSignal, Poll, Renewal, Request, RevokedSignal,
///     async_trait,
/// };
///
/// struct Counted {
///     inner: Arc<dyn Engine>,
///     acquires: AtomicU64,
/// }
///
/// #[async_trait]
/// impl Engine for Counted {
///     fn kind(&self) -> &'static str { "counted" }
///     fn address(&self) -> String { self.inner.address() }
///     fn guarantees(&self) -> Guarantees { self.inner.guarantees() }
///     fn facets(&self) -> Facets<'_> { self.inner.facets() }
///     async fn downgrade(&self, req: &Request) -> Result<bool, EngineError> { self.inner.downgrade(req).await }
/// }
///
/// #[async_trait]
/// impl Lifecycle for Counted {
///     async fn acquire(&self, req: &Request) -> Result<Poll, EngineError> {
///         self.acquires.fetch_add(1, Ordering::Relaxed);
///         self.inner.acquire(req).await
///     }
///     async fn poll(&self, req: &Request) -> Result<Poll, EngineError> { self.inner.poll(req).await }
///     async fn cancel(&self, req: &Request) -> Result<(), EngineError> { self.inner.cancel(req).await }
///     async fn renew(&self, req: &Request) -> Result<Renewal, EngineError> { self.inner.renew(req).await }
///     async fn release(&self, req: &Request) -> Result<bool, EngineError> { self.inner.release(req).await }
///     fn lost(&self, req: &Request) -> Option<LostSignal> { self.inner.lost(req) }
///     fn revoked(&self, req: &Request) -> Option<RevokedSignal> { self.inner.revoked(req) }
///     fn slot(&self, req: &Request) -> Option<u32> { self.inner.slot(req) }
/// }
///
/// let counted = Arc::new(Counted {
///     inner: Arc::new(dlock::engines::memory::MemoryEngine::new()),
///     acquires: AtomicU64::new(0),
/// });
/// let registry = dlock::Registry::with_engine("main", counted.clone(), Default::default())?;
/// let lock = registry.locks("order").get("42");
/// let outer = lock.lock().await?;
/// let inner = lock.read().await?; // reentered: no engine call
/// inner.release().await?;
/// outer.release().await?;
/// assert_eq!(counted.acquires.load(Ordering::Relaxed), 1);
/// # Ok(())
/// # }
/// ```
///
/// An engine's test file runs the conformance suite on it
/// (`dlock-engines`' feature `conformance`).
#[async_trait]
pub trait Engine: Lifecycle + 'static {
    /// The kind, as written in config: `"memory"`, `"redis"`, ...
    fn kind(&self) -> &'static str;

    /// Where the server is, for error messages (`"127.0.0.1:6379"`).
    fn address(&self) -> String;

    /// What this engine promises about its locks; see [`Guarantees`].
    fn guarantees(&self) -> Guarantees;

    /// What this engine offers beyond the lock's lifecycle; see [`Facets`].
    /// None by default.
    fn facets(&self) -> Facets<'_> {
        Facets::default()
    }

    /// Turns this owner's write hold on a lock into a read hold, admitting
    /// queued readers. `Ok(false)`: this owner no longer holds the lock.
    async fn downgrade(&self, req: &Request) -> Result<bool, EngineError>;
}

impl dyn Engine {
    /// All this engine offers, derived from its guarantees and facets.
    pub fn capabilities(&self) -> Capabilities {
        Capabilities::of(self)
    }

    /// The lifecycle that serves `req`, by its kind: the engine itself for
    /// a lock or a campaign, its [`Semaphores`](super::Semaphores) facet's
    /// for a permit. A permit of an engine with no semaphores (which the
    /// core refuses before it asks) fails.
    #[inline]
    pub fn serving(&self, req: &Request) -> Result<Serving<'_>, EngineError> {
        match req.kind {
            Kind::Lock | Kind::Election(_) => Ok(Serving::Engine(self)),
            Kind::Semaphore(count) => match self.facets().semaphores {
                Some(semaphores) => Ok(Serving::Permits(semaphores.permits(count))),
                None => Err(EngineError::failed("the engine offers no semaphores")),
            },
        }
    }
}

/// The [`Lifecycle`] [`serving`](Engine#method.serving) picked: an engine's own, or
/// a permit's that its semaphores facet made for the call.
pub enum Serving<'a> {
    /// The engine's, for a lock or a campaign.
    Engine(&'a dyn Lifecycle),
    /// A permit's.
    Permits(Box<dyn Lifecycle + 'a>),
}

impl<'a> std::ops::Deref for Serving<'a> {
    type Target = dyn Lifecycle + 'a;

    #[inline]
    fn deref(&self) -> &Self::Target {
        match self {
            Serving::Engine(engine) => *engine,
            Serving::Permits(permits) => permits.as_ref(),
        }
    }
}

/// Awaits one engine call until `until`: a call that has not answered by
/// then is a failure, never a hang. Given a [`Call`], the call itself is not
/// cut there: it runs on to its end.
pub(crate) async fn within<T>(
    until: tokio::time::Instant,
    call: impl Future<Output = Result<T, EngineError>>,
) -> Result<T, EngineError> {
    match tokio::time::timeout_at(until, call).await {
        Ok(answer) => answer,
        Err(_) => Err(EngineError::failed("no answer in time")),
    }
}

/// One engine call as work of its own (owning the engine and the request),
/// so that it can outlive whoever awaits it: by `call_timeout` at most.
pub(crate) type Call<T> = RunOn<Result<T, EngineError>>;
