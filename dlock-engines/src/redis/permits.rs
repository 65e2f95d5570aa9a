//! A semaphore's permits: their own lifecycle, beside the lock of their
//! name, one script (`scripts/semaphore.lua`) for every call.

use dlock_core::kit::{
    EngineError, Lifecycle, LostSignal, Poll, Renewal, Request, RequestState, async_trait,
};

use super::{RedisEngine, keys, millis};

/// The slot the script granted a permit (`s:<owner>` in the record).
pub(super) type Slot = RequestState<u32>;

/// The lifecycle of a permit of a semaphore of `count` permits.
pub(super) struct Permits<'a> {
    pub(super) engine: &'a RedisEngine,
    pub(super) count: u32,
}

#[async_trait]
impl Lifecycle for Permits<'_> {
    async fn acquire(&self, req: &Request) -> Result<Poll, EngineError> {
        self.engine.attempt(req, Some(self.count), !req.try_once).await
    }

    async fn poll(&self, req: &Request) -> Result<Poll, EngineError> {
        self.engine.attempt(req, Some(self.count), true).await
    }

    async fn cancel(&self, req: &Request) -> Result<(), EngineError> {
        self.engine
            .let_go(req, Some(self.count), "cancel")
            .await
            .map(drop)
    }

    /// Held, held and asked to let go (an operator's `r:` note), or gone.
    async fn renew(&self, req: &Request) -> Result<Renewal, EngineError> {
        let record = keys::record(&req.key, true);
        let args = (req.owner.to_string(), "renew", millis(req.lease));
        let engine = self.engine;
        let answer: u8 = engine
            .eval(&engine.scripts.semaphore, &record, args)
            .await
            .map_err(EngineError::failed)?;
        Ok(match answer {
            0 => Renewal::Gone,
            1 => Renewal::Held,
            _ => Renewal::Revoked,
        })
    }

    async fn release(&self, req: &Request) -> Result<bool, EngineError> {
        self.engine.let_go(req, Some(self.count), "release").await
    }

    /// No signal of its own: a failed renewal tells the core, and a
    /// renewal that it was revoked.
    fn lost(&self, _req: &Request) -> Option<LostSignal> {
        None
    }

    fn slot(&self, req: &Request) -> Option<u32> {
        *Slot::of(req).lock()
    }
}
