//! A request as an engine sees it: what it asks for, whose it is, and
//! what the engine keeps for it from acquire to release.

use std::any::Any;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use crate::{LockKey, Mode};

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
    /// The slot a granted permit holds, `0..count` (see
    /// [`Lifecycle::slot`](super::Lifecycle::slot)); `None` for a lock, a
    /// campaign, or an engine without slots. The core sets it with `fence`.
    pub slot: Option<u32>,
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
            slot: None,
            state: Arc::default(),
        }
    }

    /// With a permit of a semaphore, its count; `None` for a lock or a
    /// campaign. The core's: an engine learns the count with the permit's
    /// lifecycle ([`Semaphores::permits`](super::Semaphores::permits)).
    pub(crate) fn permits(&self) -> Option<u32> {
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
            .field("slot", &self.slot)
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
