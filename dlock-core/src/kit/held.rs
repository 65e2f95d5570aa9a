//! A hold as an engine's held-writes extension sees it: the engine's part
//! that writes, the request as granted, and the errors a user gets.

use std::any::Any;
use std::future::Future;

use tokio::time::Instant;

use super::{EngineError, Request, within};
use crate::guard::HeldLock;
use crate::hold::Hold;
use crate::{Error, LostReason};

/// A hold whose engine offers [`HeldWrites`](super::HeldWrites) through
/// `T`: what an engine's typed extension (`etcd::HeldTxn`, say) is made of.
pub struct HeldBy<'a, T> {
    hold: &'a Hold,
    store: &'a T,
}

/// The hold `held`, for an extension that writes through `T`, or
/// `Unsupported` naming `extension` where the hold's engine offers no
/// [`HeldWrites`](super::HeldWrites) of that type (another engine's).
pub fn held_by<'a, T: Any>(held: &'a HeldLock, extension: &str) -> Result<HeldBy<'a, T>, Error> {
    let hold = held.hold();
    let store = hold
        .group
        .engine
        .facets()
        .held_writes
        .and_then(|facet| facet.store().downcast_ref::<T>());
    match store {
        Some(store) => Ok(HeldBy { hold, store }),
        None => Err(hold.group.unsupported(format!("held writes through {extension}"))),
    }
}

impl<'a, T> HeldBy<'a, T> {
    /// The engine's part that writes.
    pub fn store(&self) -> &'a T {
        self.store
    }

    /// Whether the hold is a semaphore's permit, whose records an engine
    /// keeps apart from its lock's: the core reads the request's kind, so
    /// no engine asks it.
    pub fn is_permit(&self) -> bool {
        self.hold.req.permits().is_some()
    }

    /// The request as granted: its key, owner, fence and slot, and what the
    /// engine keeps for it.
    pub fn request(&self) -> &'a Request {
        &self.hold.req
    }

    /// Runs `write`, which answers `Ok(None)` where the server refused it
    /// because the hold is no longer current. It is bounded by the group's
    /// `call_timeout`, whose passing leaves the write's outcome unknown and
    /// says so. A refusal marks the hold lost and answers `Error::Lost`, for
    /// `ForceReleased` where an operator forced it out, else `Rejected`:
    /// never a reason judged here, as nothing here checks the hold before
    /// the server does. A failure names the engine and its address.
    pub async fn write<R>(
        &self,
        write: impl Future<Output = Result<Option<R>, EngineError>>,
    ) -> Result<R, Error> {
        let until = Instant::now() + self.hold.group.settings.call_timeout;
        match within(until, write).await {
            Ok(Some(answer)) => Ok(answer),
            Ok(None) => {
                self.hold.mark_gone(LostReason::Rejected).await;
                // The server's refusal is the reason, whatever this process
                // had judged before: unless an operator forced the hold out.
                let reason = match self.hold.lost_reason() {
                    Some(LostReason::ForceReleased) => LostReason::ForceReleased,
                    _ => LostReason::Rejected,
                };
                Err(Error::Lost {
                    key: self.hold.req.key.clone(),
                    reason,
                })
            }
            Err(e) => Err(self.hold.group.engine_error(&self.hold.req, e)),
        }
    }
}
