//! Fences that your own storage checks.
//!
//! Every acquisition hands out a fencing token ([`Guard::fence`]), greater
//! than every earlier holder's. It protects nothing until the storage a
//! holder writes to refuses a token below the greatest it has seen: a
//! holder paused past its lease (a GC pause, a stopped VM) wakes up still
//! believing it holds the lock, and only the storage can tell. These
//! adapters make that check, each behind its own cargo feature:
//!
//! | feature | storage | what it checks |
//! |---|---|---|
//! | `fenced-postgres`, `fenced-sqlx` | a PostgreSQL table, through `tokio-postgres` or `sqlx` | the row's fence column is not above the token; the update raises it to the token ([`postgres::FencedTable`]) |
//! | `fenced-redis` | Redis `SET` and `HSET` ([`redis`]) | the key's highest token (a companion key, or a field of the hash) is not above the token |
//! | `fenced-http` | a service of your own behind axum ([`http`]) | the highest token the service has seen for the lock (and slot) is not above the request's |
//!
//! A token equal to the highest seen is accepted: it is the same holder
//! writing again.
//!
//! **Read, then write.** A fence refuses a stale holder's write only once
//! a later holder's token has reached the storage. A later holder that
//! reads before the stale holder's write lands, and writes after it,
//! loses that write, though both were accepted. So where a write depends
//! on a value read before it, fence the read too: with a PostgreSQL table,
//! a fenced update with an empty `set` before the `SELECT`; over HTTP,
//! the token's headers on the read as well. The stale holder's write then
//! comes after the later token and is refused. A write computed by the
//! storage itself (`balance = balance - $1`) needs no fenced read.
//!
//! **Permits.** A semaphore's fence rises per slot ([`Guard::slot`]), so
//! each adapter fences on (slot, token): key a PostgreSQL row or a Redis
//! key by the slot as well, and the HTTP headers carry the slot, which the
//! service keeps a high-water mark for apart. A store fenced with the
//! tokens of all `n` slots at once would refuse sound holders.

#[cfg(any(
    feature = "fenced-postgres",
    feature = "fenced-sqlx",
    feature = "fenced-redis"
))]
use std::fmt;

use crate::Guard;

#[cfg(feature = "fenced-http")]
pub mod http;
#[cfg(any(feature = "fenced-postgres", feature = "fenced-sqlx"))]
pub mod postgres;
#[cfg(feature = "fenced-redis")]
pub mod redis;

/// What a holder sends with each write: its fence and, for a permit, its
/// slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Token {
    /// [`Guard::fence`].
    pub fence: u64,
    /// [`Guard::slot`]: `Some` for a permit on an engine with slots.
    pub slot: Option<u32>,
}

impl Token {
    /// The token of `guard`'s hold.
    pub fn of(guard: &Guard) -> Self {
        Token {
            fence: guard.fence(),
            slot: guard.slot(),
        }
    }
}

/// Why a fenced write was not applied. `E` is the storage client's own
/// error.
#[cfg(any(
    feature = "fenced-postgres",
    feature = "fenced-sqlx",
    feature = "fenced-redis"
))]
#[derive(Debug, thiserror::Error)]
pub enum FenceError<E: fmt::Debug + fmt::Display> {
    /// The storage has seen a greater token, `seen`: a later holder has
    /// written, so this one's hold ended. Nothing was written.
    #[error("stale fence: token {token} is below {seen}, which the storage has seen")]
    Stale {
        /// The token the write carried.
        token: u64,
        /// The greatest token the storage has seen.
        seen: u64,
    },
    /// No row has the key (PostgreSQL only: a fenced update never inserts).
    #[error("no row has the key")]
    NoSuchRow,
    /// The token does not fit the storage's integer (PostgreSQL's `bigint`).
    #[error("token {0} is above the storage's greatest integer")]
    TooLarge(u64),
    /// The storage's own error.
    #[error(transparent)]
    Storage(E),
}
