//! Semaphores: one item per semaphore, an entry `p:<slot>` per permit
//! held, and the count `c` its holders agree on. A permit is taken with a
//! consistent read, to find a free slot, then the same conditional grant
//! as a lock's entry, which also checks the count; renewed and let go as a
//! lock's entry is. Each slot's fence comes from the item's one counter,
//! so it rises for every slot.

use dlock_core::kit::{EngineError, Lifecycle, LostSignal, Poll, Renewal, Request, async_trait};

use super::item::{self, entries};
use super::update::{Update, number, number_of};
use super::{DynamoDbEngine, Place, taken, waiting};

/// The semaphore's count.
const COUNT: &str = "c";

/// The lifecycle of a permit of a semaphore of `count` permits.
pub(super) struct Permits<'a> {
    pub(super) engine: &'a DynamoDbEngine,
    pub(super) count: u32,
}

#[async_trait]
impl Lifecycle for Permits<'_> {
    async fn acquire(&self, req: &Request) -> Result<Poll, EngineError> {
        self.engine.take_permit(req, self.count).await
    }

    async fn poll(&self, req: &Request) -> Result<Poll, EngineError> {
        self.engine.take_permit(req, self.count).await
    }

    async fn cancel(&self, req: &Request) -> Result<(), EngineError> {
        self.engine.let_go(req).await.map(drop)
    }

    async fn renew(&self, req: &Request) -> Result<Renewal, EngineError> {
        match taken(req) {
            Some(taken) => self.engine.renew_entry(req, &taken).await,
            None => Ok(Renewal::Gone),
        }
    }

    async fn release(&self, req: &Request) -> Result<bool, EngineError> {
        self.engine.let_go(req).await
    }

    /// No signal of its own: a failed renewal tells the core.
    fn lost(&self, _req: &Request) -> Option<LostSignal> {
        None
    }

    fn slot(&self, req: &Request) -> Option<u32> {
        taken(req)?.entry.strip_prefix("p:")?.parse().ok()
    }
}

impl DynamoDbEngine {
    /// Reads the semaphore's item, then takes a free slot, picked by the
    /// request's random owner id so that clients spread out.
    async fn take_permit(&self, req: &Request, n: u32) -> Result<Poll, EngineError> {
        let place = Place::semaphore(&req.key);
        let found = self.read(&place).await?;
        let holds = entries(&found);
        let live: Vec<u32> = holds
            .iter()
            .filter(|hold| !self.seen.lapsed(&place, hold))
            .filter_map(|hold| hold.slot())
            .collect();
        let in_use = number_of(found.get(COUNT)).map(|c| c as u32);
        let recount = in_use.filter(|in_use| *in_use != n);
        if let Some(in_use) = recount
            && !live.is_empty()
        {
            return Err(EngineError::PermitsDiffer { in_use });
        }
        let free: Vec<u32> = (0..n).filter(|slot| !live.contains(slot)).collect();
        if free.is_empty() {
            return Ok(waiting());
        }
        let slot = free[(req.owner.as_u128() % free.len() as u128) as usize];
        // Another count gives way only while no slot of it is held.
        let held_before: Vec<String> = match recount {
            Some(old) => (0..old).map(item::permit).collect(),
            None => Vec::new(),
        };
        let counted = |update: &mut Update| {
            let (c, count) = (update.name(COUNT), update.value(number(i64::from(n))));
            update.set(format!("{c} = {count}"));
            match recount {
                None => {
                    let count = update.value(number(i64::from(n)));
                    update.only_if(format!("(attribute_not_exists({c}) OR {c} = {count})"))
                }
                Some(old) => update.equals(c, number(i64::from(old))),
            };
            for entry in &held_before {
                let e = update.name(entry);
                update.only_if(format!("attribute_not_exists({e})"));
            }
        };
        let granted = self.grant(req, &place, &item::permit(slot), &counted).await?;
        Ok(granted.map_or_else(waiting, Poll::Held))
    }
}
