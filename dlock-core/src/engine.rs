//! The interface every lock engine implements.
//!
//! An engine only keeps the shared state of a lock on its server. Waiting,
//! timeouts, reentrancy, the renewal schedule, the lost signal and metrics all
//! live once in dlock-core and drive an engine through this small protocol:
//!
//! 1. [`acquire`](Engine::acquire) joins the lock's queue (or takes the lock at
//!    once) and answers [`Poll::Held`] with a fencing token, or [`Poll::Waiting`]
//!    with a *wake* future that resolves when trying again is worthwhile.
//! 2. The core awaits the wake (or its safety-net poll interval) and calls
//!    [`poll`](Engine::poll), until held or the wait timeout; then
//!    [`cancel`](Engine::cancel) withdraws the request.
//! 3. While held, the core's watchdog calls [`renew`](Engine::renew) every
//!    lease/3; `Ok(false)` or a whole lease without success means lost.
//! 4. [`release`](Engine::release) lets go; [`downgrade`](Engine::downgrade)
//!    turns a write hold into a read hold without letting go.
//!
//! Each request carries a fresh random [`OwnerId`]; engines that must remember
//! something per request (a node path, a connection) key it by that id.
//!
//! How the engines map onto it:
//!
//! | engine | acquire / poll | wake | renew | loss pushed by `lost` |
//! |---|---|---|---|---|
//! | memory | a FIFO queue per key in process | a `Notify` per waiter, lease timers | extend the lease | — |
//! | redis | one Lua script each (enqueue, try, kick dead head) | sharded pub/sub on release, polling as safety net | Lua: extend owner's PX if still owner | — |
//! | zookeeper | create `EPHEMERAL_SEQUENTIAL` child, then sort siblings | a watch on the one node ahead | check the node still exists | session ended |
//! | etcd | put a key under a lease, compare create revisions | watch the key ahead for delete | lease keep-alive | lease revoked |
//! | postgres | `pg_try_advisory_lock` on a dedicated connection | polling | ping the connection | connection closed |
//! | mysql | upsert the lock row in a transaction | polling | bump the expiry if still owner | — |
//! | memcached | `add` with TTL and owner value | polling | `cas` the TTL if still owner | — |

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use async_trait::async_trait;

use crate::{BoxError, LockKey, Mode};

/// A future that resolves when a waiting request should be polled again.
/// Spurious wakes are harmless; the core also polls on its own schedule.
pub type Wake = Pin<Box<dyn Future<Output = ()> + Send + 'static>>;

/// Unique id of one acquisition (one outermost hold), 128 random bits.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct OwnerId(u128);

impl OwnerId {
    /// A fresh id from a cryptographically secure generator: never guessable,
    /// so no other client can renew or release this hold.
    pub fn random() -> Self {
        OwnerId(rand::random())
    }

    pub fn as_u128(self) -> u128 {
        self.0
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

/// One acquisition as an engine sees it.
#[derive(Clone, Debug)]
pub struct Request {
    pub key: LockKey,
    pub owner: OwnerId,
    pub mode: Mode,
    /// How long the engine keeps the hold without a renewal.
    pub lease: Duration,
    /// How long a queued request stays alive without a poll; engines that keep
    /// waiters on the server use it to drop waiters whose process died.
    pub waiter_ttl: Duration,
    /// False for a try-once request: never join the queue.
    pub queue: bool,
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

/// What ends a hold whose holder stops renewing it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Expiry {
    /// The server forgets the hold once its lease runs out unrenewed.
    Lease,
    /// The hold lives as long as the client's session with the server: a
    /// crashed or cut-off client loses it after the session timeout, a live
    /// one keeps it until it lets go (ZooKeeper).
    Session,
}

/// What went wrong inside an engine; the core adds the engine's and lock's names.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// The engine lacks a capability, e.g. read mode.
    #[error("{0}")]
    Unsupported(&'static str),
    /// Anything else: connection refused, server error, protocol surprise.
    #[error(transparent)]
    Failed(BoxError),
}

impl EngineError {
    pub fn failed(err: impl Into<BoxError>) -> Self {
        EngineError::Failed(err.into())
    }
}

/// A lock engine. See the [module docs](self) for the protocol.
#[async_trait]
pub trait Engine: Send + Sync + 'static {
    /// The kind, as written in config: `"memory"`, `"redis"`, ...
    fn kind(&self) -> &'static str;

    /// Where the server is, for error messages (`"127.0.0.1:6379"`).
    fn address(&self) -> String;

    /// What ends an abandoned hold; see [`Expiry`].
    fn expiry(&self) -> Expiry {
        Expiry::Lease
    }

    /// Whether read (shared) mode is offered. The core answers
    /// [`Error::Unsupported`](crate::Error::Unsupported) for read requests otherwise.
    fn supports_read(&self) -> bool {
        true
    }

    /// First attempt: join the queue unless `req.queue` is false, and try.
    async fn acquire(&self, req: &Request) -> Result<Poll, EngineError>;

    /// Later attempts for a request that `acquire` queued; also tells the engine
    /// that the waiter is still alive.
    async fn poll(&self, req: &Request) -> Result<Poll, EngineError>;

    /// Withdraws a request: leave the queue, and if it was granted meanwhile, let go.
    async fn cancel(&self, req: &Request) -> Result<(), EngineError>;

    /// Extends the lease. `Ok(false)`: this owner no longer holds the lock.
    async fn renew(&self, req: &Request) -> Result<bool, EngineError>;

    /// Turns this owner's write hold into a read hold, admitting queued readers.
    /// `Ok(false)`: this owner no longer holds the lock.
    async fn downgrade(&self, req: &Request) -> Result<bool, EngineError>;

    /// Lets go. `Ok(false)`: this owner no longer held the lock.
    async fn release(&self, req: &Request) -> Result<bool, EngineError>;

    /// A future that resolves if the engine learns, on its own, that this hold is
    /// gone (e.g. a ZooKeeper session expired). `None`: renewal alone tells.
    fn lost(&self, _req: &Request) -> Option<Wake> {
        None
    }
}
