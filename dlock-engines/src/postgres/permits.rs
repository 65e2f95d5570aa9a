//! Semaphores on advisory locks. A semaphore of N is a turnstile lock and N
//! slot locks, their keys derived from its name apart from its lock's. A
//! request queues for the turnstile in the server's queue, like a writer,
//! so the line is FIFO; the turnstile's holder takes the first free slot
//! and lets the turnstile go, or keeps it, trying the slots again at each
//! poll, until one frees. A permit is its slot's lock: the same lease (the
//! session's `idle_session_timeout`), renewal, fence and loss as a lock's.
//!
//! The count: beside its slot, each permit holds a share of the
//! two-number advisory lock (semaphore number, N). The turnstile's holder
//! first looks in `pg_locks` for a share with another N; none can appear
//! meanwhile, since only the turnstile's holder takes a slot. The number is
//! 32 bits of the name's hash: two semaphores that share it with different
//! counts refuse each other (odds about n²/2³³), never over-admit.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use dlock_core::kit::{EngineError, Lifecycle, LostSignal, Poll, Renewal, Request, Woken, async_trait};
use dlock_core::{LockKey, Mode};

use super::conn::Conn;
use super::pool::Pool;
use super::waiter::{Stage, Waiter};
use super::want::{Tag, Want};
use super::{Hold, Place, PostgresEngine, acquire, advisory_key, answer, renewal};

/// The lifecycle of a permit of a semaphore of `count` permits.
pub(super) struct Permits<'a> {
    pub(super) engine: &'a PostgresEngine,
    pub(super) count: u32,
}

#[async_trait]
impl Lifecycle for Permits<'_> {
    async fn acquire(&self, req: &Request) -> Result<Poll, EngineError> {
        let permit = Permit::of(req);
        let _turn = permit.turnstile().turn.lock().await;
        step(self.engine.pool.clone(), &permit, req, self.count).await
    }

    async fn poll(&self, req: &Request) -> Result<Poll, EngineError> {
        let (pool, req, count) = (self.engine.pool.clone(), req.clone(), self.count);
        Permit::of(&req)
            .in_turn(move |permit| async move { step(pool, &permit, &req, count).await })
            .await
    }

    async fn cancel(&self, req: &Request) -> Result<(), EngineError> {
        let (req, count) = (req.clone(), self.count);
        Permit::of(&req)
            .in_turn(move |permit| async move { release(&permit, &req, count).await.map(drop) })
            .await
    }

    async fn renew(&self, req: &Request) -> Result<Renewal, EngineError> {
        renewal(Permit::of(req).held_on(), || self.release(req)).await
    }

    async fn release(&self, req: &Request) -> Result<bool, EngineError> {
        let permit = Permit::of(req);
        let _turn = permit.turnstile().turn.lock().await;
        release(&permit, req, self.count).await
    }

    fn lost(&self, req: &Request) -> Option<LostSignal> {
        Some(Box::pin(Permit::of(req).held_on()?.0.dropped()))
    }

    fn slot(&self, req: &Request) -> Option<u32> {
        Permit::of(req).slot().as_ref().map(|slot| slot.number)
    }
}

/// A permit request: the turnstile's hold while it queues, then its slot.
#[derive(Default)]
pub(super) struct Permit {
    turnstile: Arc<Hold>,
    /// The count was checked while holding the turnstile this time.
    checked: AtomicBool,
    slot: Mutex<Option<Slot>>,
}

struct Slot {
    conn: Arc<Conn>,
    /// Which of the semaphore's slots, `0..count`.
    number: u32,
    key: i64,
    fence: u64,
}

impl Permit {
    pub fn of(req: &Request) -> Arc<Permit> {
        req.state_or_init(|| Arc::new(Permit::default())).clone()
    }

    fn slot(&self) -> MutexGuard<'_, Option<Slot>> {
        self.slot.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn turnstile(&self) -> &Hold {
        &self.turnstile
    }

    /// The session its permit lives on, and its slot's key.
    pub fn held_on(&self) -> Option<(Arc<Conn>, i64)> {
        self.slot().as_ref().map(|s| (s.conn.clone(), s.key))
    }

    /// Runs `work` after any earlier call on this request, on a task of its
    /// own (see [`Hold::in_turn`]).
    pub async fn in_turn<T: Send + 'static, F>(
        self: Arc<Self>,
        work: impl FnOnce(Arc<Permit>) -> F + Send,
    ) -> Result<T, EngineError>
    where
        F: Future<Output = Result<T, EngineError>> + Send + 'static,
    {
        let permit = self.clone();
        self.turnstile.clone().in_turn(move |_| work(permit)).await
    }
}

/// A semaphore's advisory keys.
pub(super) struct Keys {
    pub turnstile: i64,
    /// The first number of the count's two-number lock.
    number: i32,
    base: i64,
}

impl Keys {
    pub fn of(key: &LockKey) -> Self {
        let base = advisory_key(key);
        Keys {
            turnstile: mix(base, 0),
            number: (base ^ (base >> 32)) as i32,
            base,
        }
    }

    pub fn slot(&self, slot: u32) -> i64 {
        mix(self.base, u64::from(slot) + 1)
    }
}

/// A key derived from a lock's: SplitMix64's finalizer over it, a tag and
/// `n`, so that a semaphore's keys fall apart from every lock's.
fn mix(base: i64, n: u64) -> i64 {
    const PERMITS: u64 = u64::from_be_bytes(*b"permits\0");
    let mut z = (base as u64) ^ PERMITS ^ n.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    (z ^ (z >> 31)) as i64
}

/// One step of a permit request: through the turnstile, then a slot.
async fn step(pool: Arc<Pool>, permit: &Permit, req: &Request, count: u32) -> Result<Poll, EngineError> {
    if let Some(slot) = &*permit.slot() {
        return Ok(Poll::Held(slot.fence));
    }
    let keys = Keys::of(&req.key);
    let lease_ms = req.lease.as_millis().max(1) as u64;
    let waiter = match &*permit.turnstile.place() {
        Place::Held { .. } => None,
        Place::Waiting(waiter) => Some(Some(waiter.clone())),
        Place::Free => Some(None),
    };
    if let Some(waiter) = waiter {
        let want = Want {
            key: keys.turnstile,
            mode: Mode::Write,
            lease_ms,
            tag: Tag::of(req, Some(count)),
        };
        let poll = match waiter {
            None if req.try_once => acquire(pool.clone(), permit.turnstile.clone(), want, req).await?,
            // Through the server's queue on a session that holds nothing,
            // even when free: on one that holds a permit, the turnstile and
            // the pings while it waits would keep that session from idling
            // out, and so a permit abandoned there from returning. (A try
            // first, let go if no slot was free, let later requests pass.)
            None => {
                let waiter = Waiter::start(pool.clone(), permit.turnstile.clone(), want);
                let entered = waiter.entered().await;
                answer(&permit.turnstile, &waiter, entered, req.lease)?
            }
            Some(waiter) => {
                let stage = match waiter.stage() {
                    Stage::Queued(conn) if !pool.is_waiting(conn.pid).await? => waiter.settled().await,
                    stage => stage,
                };
                answer(&permit.turnstile, &waiter, stage, req.lease)?
            }
        };
        if let Poll::Waiting(wake) = poll {
            // The turnstile's grant is not the permit's: look again then.
            return Ok(Poll::Waiting(Box::pin(async move {
                wake.await;
                Woken::Retry
            })));
        }
    }
    if !permit.checked.swap(true, Ordering::Relaxed)
        && let Some(in_use) = pool.count_in_use(keys.number, count).await?
    {
        let_turnstile_go(permit, &keys).await?;
        return Err(EngineError::PermitsDiffer { in_use });
    }
    let mut want = Want {
        key: 0,
        mode: Mode::Write,
        lease_ms,
        tag: Tag::of(req, Some(count)),
    };
    for slot in 0..count {
        want.key = keys.slot(slot);
        let key = want.key;
        if let Some((conn, fence)) = pool.take_now(&want).await? {
            if let Err(e) = conn.count(keys.number, count, true).await {
                conn.give_back(key, Mode::Write).await?;
                return Err(e);
            }
            *permit.slot() = Some(Slot {
                conn,
                number: slot,
                key,
                fence,
            });
            let_turnstile_go(permit, &keys).await?;
            return Ok(Poll::Held(fence));
        }
    }
    if req.try_once {
        let_turnstile_go(permit, &keys).await?;
        return Ok(Poll::Waiting(Box::pin(std::future::pending())));
    }
    if let Some((conn, _)) = permit.turnstile.held() {
        // Its session must not idle out while it waits for a slot.
        conn.ping(keys.turnstile).await?;
    }
    // No slot to watch: the turnstile's holder, alone of all waiters, looks
    // again soon, or at once when this process lets a key go. On the core's
    // backed-off schedule, 16 tasks on one permit took 8 a second.
    let released = pool.changed.clone();
    Ok(Poll::Waiting(Box::pin(async move {
        tokio::select! {
            () = released.notified() => {}
            () = tokio::time::sleep(SLOT_LOOK) => {}
        }
        Woken::Retry
    })))
}

/// How often the turnstile's holder tries the slots again.
const SLOT_LOOK: std::time::Duration = std::time::Duration::from_millis(5);

/// Leaves the turnstile's line, or lets the turnstile go.
async fn let_turnstile_go(permit: &Permit, keys: &Keys) -> Result<(), EngineError> {
    permit.checked.store(false, Ordering::Relaxed);
    let waiter = match &*permit.turnstile.place() {
        Place::Waiting(waiter) => Some(waiter.clone()),
        _ => None,
    };
    if let Some(waiter) = waiter {
        waiter.withdraw();
        waiter.settled().await;
    }
    let held = permit.turnstile.held();
    permit.turnstile.set(Place::Free);
    if let Some((conn, mode)) = held {
        conn.give_back(keys.turnstile, mode).await?;
    }
    Ok(())
}

/// Withdraws the request and lets its permit go: whether it held one.
async fn release(permit: &Permit, req: &Request, count: u32) -> Result<bool, EngineError> {
    let keys = Keys::of(&req.key);
    let_turnstile_go(permit, &keys).await?;
    let Some(slot) = permit.slot().take() else {
        return Ok(false);
    };
    let held = slot.conn.give_back(slot.key, Mode::Write).await?;
    slot.conn.count(keys.number, count, false).await?;
    Ok(held)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_semaphores_keys_are_apart_from_its_locks_and_each_other() {
        let key = LockKey::new("order", "42").unwrap();
        let keys = Keys::of(&key);
        let all = [advisory_key(&key), keys.turnstile, keys.slot(0), keys.slot(1)];
        let distinct: std::collections::HashSet<_> = all.iter().collect();
        assert_eq!(distinct.len(), all.len());
        // Pinned: a release that changed them would let old and new processes both hold.
        assert_eq!(
            (keys.turnstile, keys.slot(0)),
            (-49630903256997328, -1970744826303425587)
        );
    }
}
