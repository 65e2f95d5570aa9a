//! The engine interface: the trait, a request and what answers it.

use std::any::Any;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use async_trait::async_trait;

use super::{Capabilities, Facets, Guarantees};
use crate::run_on::RunOn;
use crate::{BoxError, LockKey, Mode};

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

/// Unique id of one acquisition (one outermost hold), 128 random bits.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct OwnerId(u128);

impl OwnerId {
    /// A fresh id from a cryptographically secure generator: never guessable,
    /// so no other client can renew or release this hold.
    pub fn random() -> Self {
        OwnerId(rand::random())
    }

    /// The id's 128 bits, e.g. to store in a server's own format.
    pub fn as_u128(self) -> u128 {
        self.0
    }

    /// The id [`as_u128`](Self::as_u128) gave, read back from a server's
    /// records: to [`digest`](Self::digest) it, never to show it.
    pub fn from_u128(bits: u128) -> Self {
        OwnerId(bits)
    }
}

impl std::fmt::Display for OwnerId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:032x}", self.0)
    }
}

impl std::fmt::Debug for OwnerId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "OwnerId({self})")
    }
}

/// What a request asks for. A semaphore and a lock with the same key are
/// two things: an engine keeps them apart on its server.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Kind {
    /// The lock `key`, in the request's mode.
    Lock,
    /// One permit of the semaphore `key`, which admits this many holders at
    /// once ([`Semaphores`](super::Semaphores)).
    Semaphore(u32),
    /// A campaign in an [`Election`](crate::Election): a write lock whose
    /// holder leads, proposing this value, or the process's label
    /// ([`ElectionValues`](super::ElectionValues)). An engine with an
    /// election layout of its own (etcd's `concurrency.Election`) lays the
    /// key out that way; the others take it as the write lock it is.
    Election(Option<Arc<str>>),
}

impl Kind {
    /// A semaphore's count; `None` for a lock or a campaign.
    pub fn permits(&self) -> Option<u32> {
        match self {
            Kind::Semaphore(n) => Some(*n),
            Kind::Lock | Kind::Election(_) => None,
        }
    }
}

/// One acquisition as an engine sees it. Cheap to clone: clones share the
/// engine's [state](Request::state).
#[derive(Clone)]
pub struct Request {
    /// The lock asked for.
    pub key: LockKey,
    /// This acquisition's id: the engine checks it on renew and release.
    pub owner: OwnerId,
    /// Read or write; a permit and a campaign are always `Write`.
    pub mode: Mode,
    /// What is asked for: the lock `key`, a permit of the semaphore `key`,
    /// or a campaign for the election `key`.
    pub kind: Kind,
    /// How long the engine keeps the hold without a renewal.
    pub lease: Duration,
    /// Never join the queue: answer held or busy at once.
    pub try_once: bool,
    /// The fencing token this request was granted; 0 until then. The core
    /// sets it before it asks the engine to renew, downgrade or release.
    pub fence: u64,
    state: Arc<OnceLock<Box<dyn Any + Send + Sync>>>,
}

impl Request {
    /// A waiting request with a fresh owner id.
    pub fn new(key: LockKey, mode: Mode, lease: Duration) -> Self {
        Request {
            key,
            owner: OwnerId::random(),
            mode,
            kind: Kind::Lock,
            lease,
            try_once: false,
            fence: 0,
            state: Arc::default(),
        }
    }

    /// With a permit of a semaphore, its count; `None` for a lock or a
    /// campaign.
    pub fn permits(&self) -> Option<u32> {
        self.kind.permits()
    }

    /// Whether this is a campaign in an election.
    pub fn is_campaign(&self) -> bool {
        matches!(self.kind, Kind::Election(_))
    }

    /// What a campaign proposes: its own value, else `label`, the
    /// process's.
    pub fn proposal_or<'a>(&'a self, label: &'a str) -> &'a str {
        match &self.kind {
            Kind::Election(Some(value)) => value,
            _ => label,
        }
    }

    /// What the engine keeps for this request, if it stored any.
    pub fn state<T: Any + Send + Sync>(&self) -> Option<&T> {
        self.state.get()?.downcast_ref()
    }

    /// What the engine keeps for this request, made by `init` on first use.
    /// The core carries it from acquire to release; it goes with the request.
    /// Use interior mutability (a `Mutex`) for state that changes.
    ///
    /// # Panics
    /// If the request already holds state of another type: one engine, one type.
    pub fn state_or_init<T: Any + Send + Sync>(&self, init: impl FnOnce() -> T) -> &T {
        self.state
            .get_or_init(|| Box::new(init()))
            .downcast_ref()
            .expect("an engine keeps one type of state per request")
    }
}

impl std::fmt::Debug for Request {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Request")
            .field("key", &self.key)
            .field("owner", &self.owner)
            .field("mode", &self.mode)
            .field("kind", &self.kind)
            .field("lease", &self.lease)
            .field("try_once", &self.try_once)
            .field("fence", &self.fence)
            .finish()
    }
}

/// Request state that comes and goes over a request's life (its node, its
/// key): empty until the engine fills it, emptied when the engine lets go.
pub struct RequestState<T>(std::sync::Mutex<Option<T>>);

impl<T> Default for RequestState<T> {
    fn default() -> Self {
        RequestState(std::sync::Mutex::new(None))
    }
}

impl<T: Send + 'static> RequestState<T> {
    /// `req`'s slot, made empty on first use.
    pub fn of(req: &Request) -> &RequestState<T> {
        req.state_or_init(RequestState::default)
    }

    /// The slot's content, locked (a poisoned lock is taken as is).
    pub fn lock(&self) -> std::sync::MutexGuard<'_, Option<T>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Answer to [`Engine::acquire`] and [`Engine::poll`].
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

/// Answer to [`Engine::renew`].
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

/// A lock engine. See the [kit](crate::kit) for the protocol.
///
/// Behaviour around any engine is added by wrapping it in another engine;
/// this one counts the acquisitions that reach the engine it wraps. A
/// wrapper forwards every method, those with a default too, or it drops
/// what the wrapped engine does there (`#[deny(clippy::missing_trait_methods)]`
/// on the `impl` catches a missed one). Handing on the wrapped engine's
/// [`facets`](Engine::facets) sends their calls straight to it; a wrapper
/// that acts on them too implements each facet itself:
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), dlock::Error> {
/// use std::sync::Arc;
/// use std::sync::atomic::{AtomicU64, Ordering};
/// use dlock::kit::{
///     Engine, EngineError, Facets, Guarantees, LostSignal, Poll, Renewal, Request, RevokedSignal, async_trait,
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
///     async fn acquire(&self, req: &Request) -> Result<Poll, EngineError> {
///         self.acquires.fetch_add(1, Ordering::Relaxed);
///         self.inner.acquire(req).await
///     }
///     async fn poll(&self, req: &Request) -> Result<Poll, EngineError> { self.inner.poll(req).await }
///     async fn cancel(&self, req: &Request) -> Result<(), EngineError> { self.inner.cancel(req).await }
///     async fn renew(&self, req: &Request) -> Result<Renewal, EngineError> { self.inner.renew(req).await }
///     async fn downgrade(&self, req: &Request) -> Result<bool, EngineError> { self.inner.downgrade(req).await }
///     async fn release(&self, req: &Request) -> Result<bool, EngineError> { self.inner.release(req).await }
///     fn lost(&self, req: &Request) -> Option<LostSignal> { self.inner.lost(req) }
///     fn revoked(&self, req: &Request) -> Option<RevokedSignal> { self.inner.revoked(req) }
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
pub trait Engine: Send + Sync + 'static {
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

    /// First attempt: join the queue unless `req.try_once`, and try.
    async fn acquire(&self, req: &Request) -> Result<Poll, EngineError>;

    /// Later attempts for a request that `acquire` queued; also tells the engine
    /// that the waiter is still alive.
    async fn poll(&self, req: &Request) -> Result<Poll, EngineError>;

    /// Withdraws a request: leave the queue, and if it was granted meanwhile, let go.
    async fn cancel(&self, req: &Request) -> Result<(), EngineError>;

    /// Extends the lease, and says whether this owner still holds the lock
    /// and whether it was asked to let go.
    async fn renew(&self, req: &Request) -> Result<Renewal, EngineError>;

    /// Turns this owner's write hold into a read hold, admitting queued readers.
    /// `Ok(false)`: this owner no longer holds the lock.
    async fn downgrade(&self, req: &Request) -> Result<bool, EngineError>;

    /// Lets go. `Ok(false)`: this owner no longer held the lock.
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
}

impl dyn Engine {
    /// All this engine offers, derived from its guarantees and facets.
    pub fn capabilities(&self) -> Capabilities {
        Capabilities::of(self)
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
