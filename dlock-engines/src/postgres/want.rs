//! What a request asks of a connection: the advisory key, the mode and
//! the lease, and what its row in the record table says.

use dlock_core::kit::Request;
use dlock_core::{LockKey, Mode};

/// A request as a connection takes it.
pub(super) struct Want {
    pub key: i64,
    pub mode: Mode,
    pub lease_ms: u64,
    /// What its row in the record table says.
    pub tag: Tag,
}

/// What a request's row says besides its key and session.
#[derive(Clone)]
pub(super) struct Tag {
    pub key: LockKey,
    /// A semaphore's count; `None` for a lock.
    pub permits: Option<u32>,
    /// The owner id's digest: the id never reaches the server.
    pub owner: String,
}

impl Tag {
    /// The tag of `req`, a permit's of a semaphore of `permits`.
    pub fn of(req: &Request, permits: Option<u32>) -> Tag {
        Tag {
            key: req.key.clone(),
            permits,
            owner: req.owner.digest(),
        }
    }
}
