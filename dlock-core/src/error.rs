//! The one error type users see.

use std::time::Duration;

use crate::LockKey;

/// Boxed source error from an engine's client library.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Everything that can go wrong with a lock. Each variant names the lock or the
/// engine involved, so the message alone is enough to act on.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), dlock::Error> {
/// use std::time::Duration;
///
/// let lock = dlock::lock("order", "42");
/// let guard = lock.lock().await?;
/// let other = lock.clone();
/// let waited = tokio::spawn(async move { other.lock_for(Duration::from_millis(20)).await });
/// match waited.await.expect("task") {
///     Err(dlock::Error::Timeout { key, .. }) => assert_eq!(key.to_string(), "order/42"),
///     other => panic!("expected a timeout, got {other:?}"),
/// }
/// guard.release().await
/// # }
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The wait timeout ran out before the lock was granted; `tried_once`:
    /// a wait of zero found it busy.
    #[error("{}", timeout_message(key, waited, *tried_once))]
    Timeout {
        /// The lock asked for.
        key: LockKey,
        /// How long the request waited.
        waited: Duration,
        /// The request asked for no wait at all (`try_lock`, `wait = "0s"`).
        tried_once: bool,
    },

    /// The lock was held but is known lost; see [`LostReason`].
    #[error("lock {key} was lost: {reason}")]
    Lost {
        /// The lock that was lost.
        key: LockKey,
        /// How the loss became known.
        reason: LostReason,
    },

    /// The lock's holder was asked to let go (`Lock::revoke`, `dlock
    /// revoke`), and the annotated function's body was cancelled for it
    /// (`on_revoke = "cancel"`). The lock was released.
    #[error("lock {key} was revoked: an operator asked its holder to let go")]
    Revoked {
        /// The lock revoked.
        key: LockKey,
    },

    /// A share of a hold was asked for after the hold had ended: a share
    /// never starts a new acquisition.
    #[error("lock {key}: its hold has ended; a share of it cannot take it again")]
    Released {
        /// The lock whose hold had ended.
        key: LockKey,
    },

    /// A task holding the read lock asked for the write lock.
    #[error(
        "lock {key}: this task holds it for read and asked for write; \
         upgrading would deadlock, release the read lock first"
    )]
    Upgrade {
        /// The lock held for read.
        key: LockKey,
    },

    /// Waiting for the lock closed a cycle of waits between tasks, of this
    /// process or others, each holding a lock the next one waits for. Each
    /// member picks the same one to give up, the youngest wait: this one.
    /// Its request was withdrawn; once it lets go of what it holds, the
    /// others go on. The cycle names each lock and its holder's label.
    #[error(
        "lock {key}: waiting for it closes a cycle of waits ({cycle}); this task's wait is the \
         youngest in it, so it gives up and the others go on"
    )]
    Deadlock {
        /// The lock this task waited for.
        key: LockKey,
        /// The cycle, from this task's link on.
        cycle: crate::Cycle,
    },

    /// A semaphore was asked for with another number of permits than its
    /// current holders and waiters use. Every client of a semaphore must give
    /// the same count; a new count takes over once the semaphore is idle.
    #[error(
        "semaphore {key} is in use with {in_use} permits; this client asked for {asked}: \
         every client of a semaphore must give the same count"
    )]
    PermitCount {
        /// The semaphore asked for.
        key: LockKey,
        /// The count this client gave.
        asked: u32,
        /// The count its holders and waiters use.
        in_use: u32,
    },

    /// The engine cannot offer what was asked (read mode on memcached, a
    /// lease shorter than its unit); see `Engine::guarantees` and `Engine::facets`.
    #[error("engine `{engine}` ({kind}) does not support {feature}")]
    Unsupported {
        /// The engine's configured name.
        engine: String,
        /// The engine's kind (`"memcached"`, ...).
        kind: &'static str,
        /// What was asked for: read mode, semaphores, or a lease shorter than the engine's unit.
        feature: String,
    },

    /// The engine's server could not be reached or answered with a failure.
    #[error("engine `{engine}` ({kind} at {address}) failed on lock {key}: {source}")]
    Engine {
        /// The engine's configured name.
        engine: String,
        /// The engine's kind.
        kind: &'static str,
        /// Where its server is ([`Engine::address`](crate::kit::Engine::address)).
        address: String,
        /// The lock the failed call was for.
        key: LockKey,
        /// The client library's error.
        source: BoxError,
    },

    /// Listing a group's locks failed on the engine's server.
    #[error("engine `{engine}` ({kind} at {address}) failed listing group `{group}`: {source}")]
    Listing {
        /// The engine's configured name.
        engine: String,
        /// The engine's kind.
        kind: &'static str,
        /// Where its server is.
        address: String,
        /// The group being listed.
        group: String,
        /// The client library's error.
        source: BoxError,
    },

    /// An engine could not be built or connected at startup.
    #[error("engine `{engine}` ({kind} at {address}) is unavailable: {source}")]
    Unavailable {
        /// The engine's configured name.
        engine: String,
        /// The engine's kind.
        kind: &'static str,
        /// Where its server is.
        address: String,
        /// Why it could not be reached or built.
        source: BoxError,
    },

    /// The group or name cannot form a lock key.
    #[error("invalid lock key {key:?}: {reason}")]
    InvalidKey {
        /// `group/name` as given, long parts shortened.
        key: String,
        /// What is wrong: an empty or over-long part.
        reason: &'static str,
    },

    /// The configuration is wrong; `field` is its dotted path (e.g. `engines.main.url`).
    #[error("config: {field}: {message}")]
    Config {
        /// The dotted path of the field at fault.
        field: String,
        /// What is wrong with it.
        message: String,
    },
}

/// Why a held lock is known lost.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum LostReason {
    /// The engine refused a renewal or release: the lease was gone or had a new owner.
    Rejected,
    /// No renewal succeeded for a whole lease, so the engine may have let it go.
    LeaseElapsed,
    /// The engine reported it, e.g. a ZooKeeper session expired.
    Engine,
    /// An operator released it by force (`Lock::force_release`, `dlock
    /// release --force`): the next holder's fencing token is greater.
    ForceReleased,
    /// It was held for as long as its `hold_at_most` allows.
    TimeLimit,
}

impl std::fmt::Display for LostReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            LostReason::Rejected => "the engine no longer has this holder (lease expired or taken over)",
            LostReason::LeaseElapsed => "no renewal succeeded within the lease",
            LostReason::Engine => "the engine reported the session lost",
            LostReason::ForceReleased => "an operator released it by force",
            LostReason::TimeLimit => "held for its whole hold_at_most",
        })
    }
}

fn timeout_message(key: &LockKey, waited: &Duration, tried_once: bool) -> String {
    if tried_once {
        format!("lock {key} is busy (tried once, as asked: no wait)")
    } else {
        format!("lock {key}: not acquired within {waited:?}")
    }
}

impl Error {
    /// A config error at `field`.
    pub fn config(field: impl Into<String>, message: impl Into<String>) -> Self {
        Error::Config {
            field: field.into(),
            message: message.into(),
        }
    }
}
