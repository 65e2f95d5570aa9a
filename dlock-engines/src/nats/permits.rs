//! A semaphore: its line admits the first N keys; each holder then takes
//! one of N slot keys `p.<group>.<name>.<slot>`, created only if absent,
//! and renewed with its key. The slot key's first revision is the permit's
//! fence: it rises for each slot, across its holders.

use std::time::Duration;

use dlock_core::kit::{
    EngineError, Lifecycle, LostSignal, Poll, Renewal, Request, RevokedSignal, async_trait,
};

use super::keys::Stake;
use super::write::Wrote;
use super::{NatsEngine, Queued, Rule, queued};

/// A permit's slot key, as its holder last wrote it.
#[derive(Clone)]
pub(crate) struct Slot {
    pub number: u32,
    pub key: String,
    pub revision: u64,
    pub created: u64,
}

pub(super) struct Permits<'a> {
    pub engine: &'a NatsEngine,
    pub count: u32,
}

impl NatsEngine {
    /// Takes a free slot of `count` for `current`'s request; `None` if
    /// each is still held (a holder gone but not yet expired).
    pub(super) async fn take_slot(
        &self,
        req: &Request,
        current: &Queued,
        count: u32,
    ) -> Result<Option<Slot>, EngineError> {
        if let Some(slot) = &current.slot {
            return Ok(Some(slot.clone()));
        }
        for number in 0..count {
            let key = current.line.slot(number);
            if self
                .mirror
                .get(&key)
                .is_some_and(|f| f.stake.owner() != Some(req.owner))
            {
                continue;
            }
            let stake = Stake {
                c: None,
                ..current.stake.clone()
            };
            let mut wrote = self.put(&key, &stake, 0, req.lease).await?;
            if let Wrote::Refused = wrote {
                // A slot let go leaves its marker: write over it.
                match self.last_message(&key).await? {
                    Some(last) if last.found.is_none() => {
                        wrote = self.put(&key, &stake, last.revision, req.lease).await?;
                    }
                    _ => continue,
                }
            }
            if let Wrote::Done(revision) = wrote {
                return Ok(Some(Slot {
                    number,
                    key,
                    revision,
                    created: revision,
                }));
            }
        }
        Ok(None)
    }

    /// Writes the slot key again for `lease`; false if it was taken from
    /// its holder.
    pub(super) async fn renew_slot(
        &self,
        slot: &mut Slot,
        stake: &Stake,
        lease: Duration,
    ) -> Result<bool, EngineError> {
        let stake = stake.again(slot.created, lease);
        match self.put(&slot.key, &stake, slot.revision, lease).await? {
            Wrote::Done(revision) => {
                slot.revision = revision;
                Ok(true)
            }
            Wrote::Refused => Ok(false),
        }
    }
}

#[async_trait]
impl Lifecycle for Permits<'_> {
    async fn acquire(&self, req: &Request) -> Result<Poll, EngineError> {
        self.engine.first_try(req, Rule::Permits(self.count)).await
    }

    async fn poll(&self, req: &Request) -> Result<Poll, EngineError> {
        self.engine.attempt(req, Rule::Permits(self.count)).await
    }

    async fn cancel(&self, req: &Request) -> Result<(), EngineError> {
        self.engine.let_go(req).await.map(drop)
    }

    async fn renew(&self, req: &Request) -> Result<Renewal, EngineError> {
        self.engine.renew_hold(req).await
    }

    async fn release(&self, req: &Request) -> Result<bool, EngineError> {
        self.engine.let_go(req).await
    }

    fn lost(&self, _req: &Request) -> Option<LostSignal> {
        None
    }

    fn revoked(&self, req: &Request) -> Option<RevokedSignal> {
        self.engine.marked(req)
    }

    fn slot(&self, req: &Request) -> Option<u32> {
        queued(req)?.slot.map(|slot| slot.number)
    }
}
