//! The record table's rows: what a request's says of it.

use dlock_core::LockKey;
use dlock_core::kit::Request;

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
    pub fn of(req: &Request) -> Tag {
        Tag {
            key: req.key.clone(),
            permits: req.permits,
            owner: req.owner.digest(),
        }
    }
}
