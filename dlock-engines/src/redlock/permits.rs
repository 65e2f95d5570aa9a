//! Semaphores over RedLock. A permit is one of N slot keys,
//! `<record>:<i>`, each taken on a majority like a lock, by one script per
//! master (`scripts/permits.lua`) that also keeps the count in use,
//! `<record>:n` (alive while a permit is taken or renewed; it gives way
//! once no slot of it is held), and the fence counter, `<record>:f`. A
//! request tries the slots from one its owner id picks on, so that
//! requests spread; no queue, as for locks.

use dlock_core::LockKey;
use dlock_core::kit::{
    EngineError, Lifecycle, LostSignal, Poll, Renewal, Request, RequestState, async_trait,
};
use tokio::time::Instant;

use super::{Answer, Call, RedLockEngine, px};
use crate::redis::keys;

/// A permit's token: the quorum's token, made unique by the slot. Holders
/// of a lock never hold at once, so the quorum's maximum is never handed
/// out twice; holders of two slots may each read the same maximum from
/// majorities that overlap on a master where they came in opposite order.
pub(super) fn per_slot(token: u64, slot: u32, count: u32) -> u64 {
    let unique = u128::from(token) * u128::from(count) + u128::from(slot);
    u64::try_from(unique).unwrap_or(u64::MAX)
}

/// The slot a request holds, or last tried.
type SlotState = RequestState<u32>;

/// The lifecycle of a permit of a semaphore of `count` permits: a slot
/// taken on a majority, renewed and let go as a lock is.
pub(super) struct Permits<'a> {
    pub(super) engine: &'a RedLockEngine,
    pub(super) count: u32,
}

#[async_trait]
impl Lifecycle for Permits<'_> {
    async fn acquire(&self, req: &Request) -> Result<Poll, EngineError> {
        self.engine.attempt_permit(req, self.count).await
    }

    async fn poll(&self, req: &Request) -> Result<Poll, EngineError> {
        self.engine.attempt_permit(req, self.count).await
    }

    async fn cancel(&self, req: &Request) -> Result<(), EngineError> {
        self.engine
            .permit_call(req, self.count, "release")
            .await
            .map(drop)
    }

    /// Revoked if any master of the majority that renewed has the note.
    async fn renew(&self, req: &Request) -> Result<Renewal, EngineError> {
        let Some(slot) = *SlotState::of(req).lock() else {
            return Ok(Renewal::Gone);
        };
        let keys = Keys::of(&req.key);
        let answers = self
            .engine
            .permit_script(req, self.count, "renew", &keys, slot)
            .await;
        let asked = answers.iter().any(|a| matches!(a, Ok(2)));
        Ok(match self.engine.agreed(answers)? {
            true if asked => Renewal::Revoked,
            held => Renewal::from(held),
        })
    }

    async fn release(&self, req: &Request) -> Result<bool, EngineError> {
        self.engine.permit_call(req, self.count, "release").await
    }

    /// No signal of its own: a failed renewal tells the core.
    fn lost(&self, _req: &Request) -> Option<LostSignal> {
        None
    }

    /// Asked after the grant, when the slot last tried is the one held.
    fn slot(&self, req: &Request) -> Option<u32> {
        *SlotState::of(req).lock()
    }
}

/// A semaphore's keys, the same on every master.
pub(super) struct Keys {
    pub count: String,
    counter: String,
    /// The slots' keys are the stem and their number.
    pub stem: String,
}

impl Keys {
    pub fn of(key: &LockKey) -> Self {
        let record = keys::record(key, true);
        Keys {
            count: format!("{record}:n"),
            counter: format!("{record}:f"),
            stem: format!("{record}:"),
        }
    }

    pub fn slot(&self, slot: u32) -> String {
        format!("{}{slot}", self.stem)
    }
}

impl RedLockEngine {
    /// Tries each slot in turn until a majority grants one.
    async fn attempt_permit(&self, req: &Request, count: u32) -> Result<Poll, EngineError> {
        let keys = Keys::of(&req.key);
        let first = (req.owner.as_u128() % u128::from(count)) as u32;
        for slot in (0..count).map(|k| (first + k) % count) {
            *SlotState::of(req).lock() = Some(slot);
            let started = Instant::now();
            let answers = self.permit_script(req, count, "acquire", &keys, slot).await;
            if self.majority(&answers) && started.elapsed() < req.lease {
                let token = self.token(req, &keys.slot(slot), &keys.counter, &answers).await?;
                if let Some(token) = token.filter(|_| started.elapsed() < req.lease) {
                    return Ok(Poll::Held(per_slot(token, slot, count)));
                }
            }
            self.permit_script(req, count, "release", &keys, slot).await;
            let differs: Vec<i64> = answers
                .iter()
                .filter_map(|a| a.as_ref().ok())
                .filter(|&&n| n < 0)
                .map(|&n| -n)
                .collect();
            if differs.len() >= self.quorum {
                let in_use = differs.into_iter().max().unwrap_or_default();
                return Err(EngineError::PermitsDiffer {
                    in_use: in_use as u32,
                });
            }
            if let Some(error) = self.unreachable(answers) {
                return Err(error);
            }
        }
        // No queue and no notification: the core's polling retries.
        Ok(Poll::Waiting(Box::pin(std::future::pending())))
    }

    /// Renews or releases (`op`) the slot this request holds.
    async fn permit_call(&self, req: &Request, count: u32, op: &str) -> Result<bool, EngineError> {
        let Some(slot) = *SlotState::of(req).lock() else {
            return Ok(false);
        };
        let answers = self
            .permit_script(req, count, op, &Keys::of(&req.key), slot)
            .await;
        self.agreed(answers)
    }

    async fn permit_script(
        &self,
        req: &Request,
        count: u32,
        op: &str,
        keys: &Keys,
        slot: u32,
    ) -> Vec<Answer> {
        let (owner, count) = (req.owner.to_string(), count.to_string());
        let px = px(req.lease).as_millis().to_string();
        let retention = self.fence_retention.as_millis().to_string();
        self.on_all(
            Call::Script(&self.scripts.permits),
            &[&keys.count, &keys.slot(slot), &keys.counter],
            &[
                op,
                &owner,
                &count,
                &px,
                &retention,
                &keys.stem,
                &self.record_tail(),
            ],
        )
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn two_slots_with_one_quorum_token_get_two_rising_tokens() {
        assert_ne!(per_slot(6, 0, 3), per_slot(6, 1, 3));
        assert!(per_slot(7, 0, 3) > per_slot(6, 2, 3));
    }
}
