//! The engine interface: the trait, a request and what answers it.

use std::any::Any;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use async_trait::async_trait;

use crate::run_on::RunOn;
use crate::{BoxError, LockKey, LockView, Mode};

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

/// One acquisition as an engine sees it. Cheap to clone: clones share the
/// engine's [state](Request::state).
#[derive(Clone)]
pub struct Request {
    /// The lock asked for.
    pub key: LockKey,
    /// This acquisition's id: the engine checks it on renew and release.
    pub owner: OwnerId,
    /// Read or write; a permit is always `Write`.
    pub mode: Mode,
    /// `Some(n)`: one permit of the semaphore `key`, which admits `n` holders
    /// at once; `None`: the lock `key`. A semaphore and a lock with the same
    /// key are two things: an engine keeps them apart on its server.
    pub permits: Option<u32>,
    /// How long the engine keeps the hold without a renewal.
    pub lease: Duration,
    /// Never join the queue: answer held or busy at once.
    pub try_once: bool,
    /// The fencing token this request was granted; 0 until then. The core
    /// sets it before it asks the engine to renew, downgrade or release.
    pub fence: u64,
    /// A campaign in an [`Election`](crate::Election): a write lock whose
    /// holder leads. An engine with an election layout of its own (etcd's
    /// `concurrency.Election`) lays the request's key out that way; the
    /// others take it as the write lock it is.
    pub election: bool,
    /// What a campaign proposes, if not the process's label
    /// ([`Capabilities::election_values`]).
    pub proposal: Option<Arc<str>>,
    state: Arc<OnceLock<Box<dyn Any + Send + Sync>>>,
}

impl Request {
    /// A waiting request with a fresh owner id.
    pub fn new(key: LockKey, mode: Mode, lease: Duration) -> Self {
        Request {
            key,
            owner: OwnerId::random(),
            mode,
            permits: None,
            lease,
            try_once: false,
            fence: 0,
            election: false,
            proposal: None,
            state: Arc::default(),
        }
    }

    /// What a campaign proposes: its own value, else `label`, the
    /// process's.
    pub fn proposal_or<'a>(&'a self, label: &'a str) -> &'a str {
        self.proposal.as_deref().unwrap_or(label)
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
            .field("permits", &self.permits)
            .field("lease", &self.lease)
            .field("try_once", &self.try_once)
            .field("fence", &self.fence)
            .field("election", &self.election)
            .field("proposal", &self.proposal)
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
    /// ([`Engine::revoke`]); the lease runs on all the same.
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

/// What an engine can promise, declared once per engine. The core refuses
/// what an engine lacks with a typed error, the conformance suite runs or
/// skips its cases by these, and the guarantee table (`docs/guarantees.md`)
/// uses the same words ([`Capabilities::words`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Capabilities {
    /// Read (shared) mode; without it read requests get `Error::Unsupported`.
    pub read: bool,
    /// Whether the server keeps a queue; see [`Fairness`].
    pub fairness: Fairness,
    /// How far the fencing token can be trusted; see [`Fencing`].
    pub fencing: Fencing,
    /// What ends a hold nobody renews; see [`Expiry`].
    pub expiry: Expiry,
    /// Leases count whole units of this (1 s on servers whose TTLs are in
    /// seconds); a shorter lease gets `Error::Unsupported`.
    pub lease_unit: Duration,
    /// A queued request that does not poll within this is dropped as dead;
    /// the core then checks at startup that waiters poll often enough. It is
    /// the engine's `waiter_ttl` setting.
    pub waiter_ttl: Option<Duration>,
    /// Semaphores ([`Request::permits`]), with the same fairness, fencing and
    /// expiry as its locks; without them a semaphore gets `Error::Unsupported`.
    pub semaphore: bool,
    /// What [`Engine::inspect`] and [`Engine::list`] can tell; see [`Records`].
    pub records: Records,
    /// Whether a record shows the hold's fence: not where the token is
    /// taken after the hold is written, in the same round trip (memcached).
    pub fence_in_records: bool,
    /// An operator can end a hold from outside ([`Engine::force_release`]),
    /// and its holder learns why ([`Engine::forced_out`]).
    pub force_release: bool,
    /// An operator can ask holders to let go ([`Engine::revoke`]); they
    /// learn it at their next renewal.
    pub revoke: bool,
    /// A hold can be let go while the server keeps others out a while
    /// longer ([`Engine::release_after`]): a run-once job's `hold_at_least`.
    pub hold_at_least: bool,
    /// A campaign can propose a value of its own ([`Request::proposal`]),
    /// which the records show as the leader's label; without, a leader
    /// shows its process's label.
    pub election_values: bool,
}

impl Capabilities {
    /// Everything: read mode, FIFO, strict fencing, millisecond leases,
    /// semaphores; all but election values, which an engine that keeps them
    /// declares itself.
    pub const FULL: Capabilities = Capabilities {
        read: true,
        fairness: Fairness::Fifo,
        fencing: Fencing::Strict,
        expiry: Expiry::Lease,
        lease_unit: Duration::from_millis(1),
        waiter_ttl: None,
        semaphore: true,
        records: Records::Listed,
        fence_in_records: true,
        force_release: true,
        revoke: true,
        hold_at_least: true,
        // Only an engine that writes `Request::proposal` where its records
        // read it says so.
        election_values: false,
    };

    /// Whether leader election works here: it needs terms that only grow
    /// and that the records show, for observers to tell leaders apart.
    pub fn election(&self) -> bool {
        self.fencing == Fencing::Strict && self.fence_in_records && self.records != Records::None
    }

    /// The shortest lease this engine accepts.
    pub fn min_lease(&self) -> Duration {
        self.lease_unit.max(crate::config::MIN_LEASE)
    }

    /// `read write, fifo, fence strict, ends with lease, lease unit 1ms,
    /// semaphores, records listed, force release, revoke, hold at least`:
    /// the words the guarantee table uses.
    pub fn words(&self) -> String {
        format!(
            "{}, {}, fence {}, ends with {}, lease unit {:?}, {}, {}{}, {}, {}, {}, {}",
            if self.read { "read write" } else { "write only" },
            self.fairness.as_str(),
            self.fencing.as_str(),
            self.expiry.as_str(),
            self.lease_unit,
            if self.semaphore {
                "semaphores"
            } else {
                "no semaphores"
            },
            self.records.as_str(),
            match self.records != Records::None && !self.fence_in_records {
                true => " without fences",
                false => "",
            },
            if self.force_release {
                "force release"
            } else {
                "no force release"
            },
            if self.revoke { "revoke" } else { "no revoke" },
            if self.hold_at_least {
                "hold at least"
            } else {
                "no hold at least"
            },
            match (self.election(), self.election_values) {
                (true, true) => "election with values",
                (true, false) => "election",
                (false, _) => "no election",
            },
        )
    }
}

/// What an engine can tell about who holds and who waits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Records {
    /// Nothing: inspecting gets `Error::Unsupported`.
    None,
    /// One lock or semaphore by name ([`Engine::inspect`]).
    ByName,
    /// That, and a group's locks and semaphores ([`Engine::list`]).
    Listed,
}

impl Records {
    /// The guarantee table's words.
    pub fn as_str(self) -> &'static str {
        match self {
            Records::None => "no records",
            Records::ByName => "records by name",
            Records::Listed => "records listed",
        }
    }
}

/// Who gets the lock next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fairness {
    /// The server keeps a queue: first come, first served across clients,
    /// queued readers admitted together.
    Fifo,
    /// No queue on the server: whoever tries first after a release. With
    /// `queue = "local"` a process still serves its own waiters in order.
    None,
}

impl Fairness {
    /// The word the guarantee table uses: `fifo`, `no queue`.
    pub fn as_str(self) -> &'static str {
        match self {
            Fairness::Fifo => "fifo",
            Fairness::None => "no queue",
        }
    }
}

/// How far the fencing token can be trusted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fencing {
    /// Strictly increasing per lock, across holders and server restarts.
    Strict,
    /// Strictly increasing while the server keeps its memory; a restart or
    /// eviction may repeat a token (the engine's docs say exactly when).
    BestEffort,
    /// No ordering: the token only tells holds apart.
    None,
}

impl Fencing {
    /// The word the guarantee table uses: `strict`, `best effort`, `none`.
    pub fn as_str(self) -> &'static str {
        match self {
            Fencing::Strict => "strict",
            Fencing::BestEffort => "best effort",
            Fencing::None => "none",
        }
    }
}

/// What ends a hold whose holder stops renewing it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Expiry {
    /// The server forgets the hold once its lease runs out unrenewed.
    Lease,
    /// The hold lives as long as the client's session with the server: a
    /// crashed or cut-off client loses it after the session timeout, a live
    /// one keeps it until it lets go (ZooKeeper, etcd).
    Session,
    /// The hold lives as long as the client's connection. No built-in
    /// engine declares it: the postgres engine's sessions end one lease
    /// after their last statement, so it declares [`Expiry::Lease`].
    Connection,
}

impl Expiry {
    /// The word the guarantee table uses: `lease`, `session`, `connection`.
    pub fn as_str(self) -> &'static str {
        match self {
            Expiry::Lease => "lease",
            Expiry::Session => "session",
            Expiry::Connection => "connection",
        }
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
/// on the `impl` catches a missed one):
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), dlock::Error> {
/// use std::sync::Arc;
/// use std::sync::atomic::{AtomicU64, Ordering};
/// use std::time::Duration;
/// use dlock::kit::{
///     Capabilities, Engine, EngineError, LostSignal, Poll, Renewal, Request, RevokedSignal, async_trait,
/// };
/// use dlock::{LockKey, LockView};
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
///     fn capabilities(&self) -> Capabilities { self.inner.capabilities() }
///     async fn acquire(&self, req: &Request) -> Result<Poll, EngineError> {
///         self.acquires.fetch_add(1, Ordering::Relaxed);
///         self.inner.acquire(req).await
///     }
///     async fn poll(&self, req: &Request) -> Result<Poll, EngineError> { self.inner.poll(req).await }
///     async fn cancel(&self, req: &Request) -> Result<(), EngineError> { self.inner.cancel(req).await }
///     async fn renew(&self, req: &Request) -> Result<Renewal, EngineError> { self.inner.renew(req).await }
///     async fn downgrade(&self, req: &Request) -> Result<bool, EngineError> { self.inner.downgrade(req).await }
///     async fn release(&self, req: &Request) -> Result<bool, EngineError> { self.inner.release(req).await }
///     async fn release_after(&self, req: &Request, keep: Duration) -> Result<bool, EngineError> {
///         self.inner.release_after(req, keep).await
///     }
///     fn lost(&self, req: &Request) -> Option<LostSignal> { self.inner.lost(req) }
///     fn revoked(&self, req: &Request) -> Option<RevokedSignal> { self.inner.revoked(req) }
///     async fn inspect(&self, key: &LockKey, permits: Option<u32>) -> Result<LockView, EngineError> {
///         self.inner.inspect(key, permits).await
///     }
///     async fn list(&self, group: &str) -> Result<Vec<LockView>, EngineError> { self.inner.list(group).await }
///     async fn forced_out(&self, req: &Request) -> Result<bool, EngineError> { self.inner.forced_out(req).await }
///     async fn force_release(&self, key: &LockKey) -> Result<u32, EngineError> { self.inner.force_release(key).await }
///     async fn revoke(&self, key: &LockKey) -> Result<u32, EngineError> { self.inner.revoke(key).await }
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

    /// What this engine can promise; see [`Capabilities`].
    fn capabilities(&self) -> Capabilities;

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

    /// Lets go, but so that the server keeps others out for `keep` more,
    /// counted on its own clock, even if this process exits then. Called
    /// only if [`Capabilities::hold_at_least`] says so. The default renews
    /// the hold for `keep` and leaves it to expire: right for an engine
    /// whose renewal sets the server's expiry to the request's lease.
    /// `Ok(false)`: this owner no longer held the lock.
    async fn release_after(&self, req: &Request, keep: Duration) -> Result<bool, EngineError> {
        let mut req = req.clone();
        req.lease = keep;
        Ok(self.renew(&req).await? != Renewal::Gone)
    }

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

    /// Who holds and who waits for the lock `key`, or with `permits`, the
    /// semaphore `key`. Called only if [`Capabilities::records`] says so.
    async fn inspect(&self, key: &LockKey, permits: Option<u32>) -> Result<LockView, EngineError> {
        let _ = (key, permits);
        Err(EngineError::failed("this engine keeps no records"))
    }

    /// Whether `req`'s hold, found gone, was ended by
    /// [`force_release`](Engine::force_release) rather than by its lease.
    /// Asked only after a hold turned out gone, so it may cost a round trip.
    async fn forced_out(&self, req: &Request) -> Result<bool, EngineError> {
        let _ = req;
        Ok(false)
    }

    /// Ends every hold of the lock `key` on the server, so that its next
    /// waiter gets in, and leaves word for each holder that it was forced
    /// out, for as long as its lease would have run. The lock's fencing
    /// token goes on from where it was: the next holder's is greater than
    /// every one given before. Answers how many holds it ended. Called
    /// only if [`Capabilities::force_release`] says so.
    async fn force_release(&self, key: &LockKey) -> Result<u32, EngineError> {
        let _ = key;
        Err(EngineError::failed("this engine cannot release by force"))
    }

    /// Asks every holder of the lock `key` to let go: each one's next
    /// [`renew`](Engine::renew) answers [`Renewal::Revoked`]. Answers how
    /// many holders were asked. Called only if [`Capabilities::revoke`]
    /// says so.
    async fn revoke(&self, key: &LockKey) -> Result<u32, EngineError> {
        let _ = key;
        Err(EngineError::failed("this engine cannot revoke"))
    }

    /// Every lock and semaphore of `group` that someone holds or waits for,
    /// in any order; free ones may be among them (the core leaves them out
    /// and sorts the rest by name). Called only if
    /// [`Capabilities::records`] is [`Records::Listed`].
    async fn list(&self, group: &str) -> Result<Vec<LockView>, EngineError> {
        let _ = group;
        Err(EngineError::failed("this engine cannot list its locks"))
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
