//! The embedded engine: every lock lives in this process. Full semantics —
//! fair FIFO read/write, semaphores, leases, fencing — for single-process
//! services, examples and tests. No config needed: it serves when nothing else is set.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

use dlock_core::kit::{
    Control, Engine, EngineError, Expiry, Facets, Fairness, Fencing, Guarantees, HoldAtLeast, Inspect,
    KeyHashing, Lifecycle, List, LostSignal, OwnerId, PermitControl, Poll, Renewal, Request, Semaphores,
    Wake, Woken, async_trait, process_label,
};
use dlock_core::{HolderRecord, LockKey, LockView, Mode, Only, WaiterRecord};
use tokio::sync::Notify;
use tokio::time::{Instant, sleep_until};

/// The in-process engine. See the [module docs](self).
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), dlock::Error> {
/// use std::sync::Arc;
/// use dlock::engines::memory::MemoryEngine;
///
/// let engine = Arc::new(MemoryEngine::new());
/// let registry = dlock::Registry::with_engine("main", engine.clone(), Default::default())?;
/// let guard = registry.locks("order").get("42").lock().await?;
/// assert_eq!(engine.active_locks(), 1);
/// guard.release().await?;
/// assert_eq!(engine.active_locks(), 0);
/// # Ok(())
/// # }
/// ```
pub struct MemoryEngine {
    state: Mutex<Locks>,
    /// Every hold's and waiter's label: all of them are this process's.
    label: String,
}

impl Default for MemoryEngine {
    fn default() -> Self {
        MemoryEngine {
            state: Mutex::default(),
            label: process_label(),
        }
    }
}

#[derive(Default)]
struct Locks {
    /// By key, and whether it is the key's semaphore rather than its lock.
    by_key: HashMap<(LockKey, bool), LockState, KeyHashing>,
    /// One counter for all keys: strictly increasing per lock, and no state
    /// is kept for a lock nobody holds or waits for.
    last_fence: u64,
    /// Holders forced out, until their lease would have ended.
    forced: HashMap<OwnerId, Instant>,
}

#[derive(Default)]
struct LockState {
    writer: Option<Holder>,
    /// Readers, or a semaphore's permit holders: the holders that share.
    shared: Vec<Holder>,
    queue: Queue,
    /// A semaphore's count, as its first holder or waiter gave it; the
    /// state, and so the count, goes when the last one does.
    permits: Option<u32>,
}

/// Waiters in arrival order, with the lookups a grant decision needs in
/// O(log n), so a sale with 10,000 queued buyers stays cheap to poll.
#[derive(Default)]
struct Queue {
    by_ticket: BTreeMap<u64, Waiter>,
    tickets: HashMap<OwnerId, u64>,
    writers: BTreeSet<u64>,
    next_ticket: u64,
}

struct Holder {
    owner: OwnerId,
    mode: Mode,
    fence: u64,
    /// A permit's slot: the lowest free when granted.
    slot: Option<u32>,
    since: SystemTime,
    expires: Instant,
    /// What the last renewal (or the grant) extended it by, and when.
    lease: Duration,
    renewed: SystemTime,
    /// Asked to let go.
    revoked: bool,
}

struct Waiter {
    owner: OwnerId,
    mode: Mode,
    since: SystemTime,
    wake: Arc<Notify>,
}

impl Queue {
    fn is_empty(&self) -> bool {
        self.by_ticket.is_empty()
    }

    fn get(&self, owner: OwnerId) -> Option<&Waiter> {
        self.tickets.get(&owner).map(|t| &self.by_ticket[t])
    }

    fn push(&mut self, owner: OwnerId, mode: Mode) -> Arc<Notify> {
        let (ticket, wake) = (self.next_ticket, Arc::new(Notify::new()));
        self.next_ticket += 1;
        self.tickets.insert(owner, ticket);
        if mode == Mode::Write {
            self.writers.insert(ticket);
        }
        self.by_ticket.insert(
            ticket,
            Waiter {
                owner,
                mode,
                since: SystemTime::now(),
                wake: wake.clone(),
            },
        );
        wake
    }

    fn remove(&mut self, owner: OwnerId) {
        if let Some(ticket) = self.tickets.remove(&owner) {
            self.by_ticket.remove(&ticket);
            self.writers.remove(&ticket);
        }
    }

    /// Whether `owner` (or a newcomer, if not queued) would be first in line.
    fn is_first(&self, owner: OwnerId) -> bool {
        self.is_among_first(owner, 1)
    }

    /// Whether `owner` (or a newcomer, who comes last) is among the first
    /// `n` in line.
    fn is_among_first(&self, owner: OwnerId, n: usize) -> bool {
        match self.tickets.get(&owner) {
            Some(ticket) => self.by_ticket.keys().take(n).any(|t| t == ticket),
            None => self.by_ticket.len() < n,
        }
    }

    /// Whether a writer is queued ahead of `owner` (of anyone, if not queued).
    fn writer_ahead(&self, owner: OwnerId) -> bool {
        match (self.tickets.get(&owner), self.writers.first()) {
            (_, None) => false,
            (Some(mine), Some(first)) => first < mine,
            (None, Some(_)) => true,
        }
    }
}

impl MemoryEngine {
    /// An engine with no locks; every lock lives as long as the engine.
    pub fn new() -> Self {
        Self::default()
    }

    /// Number of locks and semaphores with any holder or waiter; zero when
    /// all are free.
    pub fn active_locks(&self) -> usize {
        self.locks().by_key.len()
    }

    /// The lifecycle of its locks, or with `permits` of a semaphore's.
    fn holds(&self, permits: Option<u32>) -> Holds<'_> {
        Holds {
            engine: self,
            permits,
        }
    }

    fn locks(&self) -> MutexGuard<'_, Locks> {
        // Every critical section leaves the state consistent before it can panic.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The holds of the engine's locks, or of one semaphore's permits: one
/// lifecycle for both, the semaphore's count kept with its state.
struct Holds<'a> {
    engine: &'a MemoryEngine,
    /// The semaphore's count; `None` for a lock.
    permits: Option<u32>,
}

impl Holds<'_> {
    /// Runs `f` on the state of `req`'s lock or semaphore with expired
    /// holders gone, then wakes whoever can now proceed and forgets the
    /// state if it became idle.
    fn with_lock<T>(&self, req: &Request, f: impl FnOnce(&mut LockState, &mut u64, Instant) -> T) -> T {
        let mut locks = self.engine.locks();
        let Locks {
            by_key, last_fence, ..
        } = &mut *locks;
        let key = (req.key.clone(), self.permits.is_some());
        let state = by_key.entry(key.clone()).or_insert_with(|| LockState {
            permits: self.permits,
            ..LockState::default()
        });
        let now = Instant::now();
        state.expire(now);
        let out = f(state, last_fence, now);
        state.wake_ready();
        if state.is_idle() {
            by_key.remove(&key);
        }
        out
    }

    fn attempt(&self, req: &Request) -> Result<Poll, EngineError> {
        self.with_lock(req, |state, last_fence, now| {
            if let Some(in_use) = state.permits
                && self.permits != Some(in_use)
            {
                return Err(EngineError::PermitsDiffer { in_use });
            }
            if state.grantable(req.owner, req.mode) {
                state.queue.remove(req.owner);
                *last_fence += 1;
                let granted = SystemTime::now();
                let holder = Holder {
                    owner: req.owner,
                    mode: req.mode,
                    fence: *last_fence,
                    slot: state.permits.map(|_| state.free_slot()),
                    since: granted,
                    expires: now + req.lease,
                    lease: req.lease,
                    renewed: granted,
                    revoked: false,
                };
                match (req.mode, state.permits) {
                    (Mode::Write, None) => state.writer = Some(holder),
                    _ => state.shared.push(holder),
                }
                return Ok(Poll::Held(*last_fence));
            }
            let wake = match state.queue.get(req.owner) {
                Some(waiter) => waiter.wake.clone(),
                None if !req.try_once => state.queue.push(req.owner, req.mode),
                None => Arc::new(Notify::new()),
            };
            Ok(Poll::Waiting(wake_on(wake, state.next_expiry())))
        })
    }

    fn withdraw(&self, req: &Request) {
        self.with_lock(req, |state, _, _| {
            state.queue.remove(req.owner);
            state.remove_holder(req.owner);
        });
    }

    fn extend(&self, req: &Request) -> Renewal {
        self.with_lock(req, |state, _, now| match state.holder(req.owner) {
            Some(holder) => {
                holder.expires = now + req.lease;
                (holder.lease, holder.renewed) = (req.lease, SystemTime::now());
                match holder.revoked {
                    true => Renewal::Revoked,
                    false => Renewal::Held,
                }
            }
            None => Renewal::Gone,
        })
    }

    fn let_go(&self, req: &Request) -> bool {
        self.with_lock(req, |state, _, _| state.remove_holder(req.owner))
    }
}

/// Resolves on a targeted notification, or when some holder's lease ends.
fn wake_on(notify: Arc<Notify>, expiry: Option<Instant>) -> Wake {
    let notified = notify.notified_owned();
    Box::pin(async move {
        match expiry {
            Some(at) => tokio::select! {
                _ = notified => {}
                _ = sleep_until(at) => {}
            },
            None => notified.await,
        }
        Woken::Retry
    })
}

impl LockState {
    fn expire(&mut self, now: Instant) {
        if self.writer.as_ref().is_some_and(|w| w.expires <= now) {
            self.writer = None;
        }
        self.shared.retain(|r| r.expires > now);
    }

    /// Permits not held, on a semaphore.
    fn free_permits(&self, permits: u32) -> usize {
        (permits as usize).saturating_sub(self.shared.len())
    }

    /// FIFO: a writer needs the lock free and to be first in line; a reader
    /// needs no writer holding and no writer queued ahead of it, so a run of
    /// queued readers is admitted together. On a semaphore with k permits
    /// free, the first k in line may each take one, a newcomer only if fewer
    /// than k queue.
    fn grantable(&self, owner: OwnerId, mode: Mode) -> bool {
        if let Some(permits) = self.permits {
            return self.queue.is_among_first(owner, self.free_permits(permits));
        }
        if self.writer.is_some() {
            return false;
        }
        match mode {
            Mode::Write => self.shared.is_empty() && self.queue.is_first(owner),
            Mode::Read => !self.queue.writer_ahead(owner),
        }
    }

    /// Notifies exactly the waiters that can now proceed.
    fn wake_ready(&self) {
        if let Some(permits) = self.permits {
            for waiter in self.queue.by_ticket.values().take(self.free_permits(permits)) {
                waiter.wake.notify_one();
            }
            return;
        }
        if self.writer.is_some() {
            return;
        }
        for (i, waiter) in self.queue.by_ticket.values().enumerate() {
            match waiter.mode {
                // The head writer, and no one behind it: a reader woken now
                // could not proceed, and each of its polls would wake it again.
                Mode::Write if i == 0 && self.shared.is_empty() => {
                    waiter.wake.notify_one();
                    break;
                }
                Mode::Write => break,
                Mode::Read => waiter.wake.notify_one(),
            }
        }
    }

    fn next_expiry(&self) -> Option<Instant> {
        self.writer.iter().chain(&self.shared).map(|h| h.expires).min()
    }

    fn holder(&mut self, owner: OwnerId) -> Option<&mut Holder> {
        self.writer
            .iter_mut()
            .chain(self.shared.iter_mut())
            .find(|h| h.owner == owner)
    }

    /// The lowest slot no permit holder has (a grant means one is free).
    fn free_slot(&self) -> u32 {
        let mut taken: Vec<u32> = self.shared.iter().filter_map(|h| h.slot).collect();
        taken.sort_unstable();
        (0..)
            .zip(&taken)
            .find(|(free, slot)| free != *slot)
            .map_or(taken.len() as u32, |(free, _)| free)
    }

    fn remove_holder(&mut self, owner: OwnerId) -> bool {
        if self.writer.as_ref().is_some_and(|w| w.owner == owner) {
            self.writer = None;
            return true;
        }
        let before = self.shared.len();
        self.shared.retain(|r| r.owner != owner);
        self.shared.len() != before
    }

    fn is_idle(&self) -> bool {
        self.writer.is_none() && self.shared.is_empty() && self.queue.is_empty()
    }
}

#[async_trait]
impl Engine for MemoryEngine {
    fn kind(&self) -> &'static str {
        "memory"
    }

    fn address(&self) -> String {
        "in-process".to_owned()
    }

    fn guarantees(&self) -> Guarantees {
        Guarantees {
            read: true,
            fairness: Fairness::Fifo,
            fencing: Fencing::Strict,
            expiry: Expiry::Lease,
            lease_unit: Duration::from_millis(1),
            waiter_ttl: None,
        }
    }

    fn facets(&self) -> Facets<'_> {
        Facets {
            semaphores: Some(self),
            inspect: Some(self),
            list: Some(self),
            control: Some(self),
            permit_control: Some(self),
            hold_at_least: Some(self),
            ..Facets::default()
        }
    }

    async fn downgrade(&self, req: &Request) -> Result<bool, EngineError> {
        Ok(self.holds(None).with_lock(req, |state, _, _| {
            match state.writer.take_if(|w| w.owner == req.owner) {
                Some(mut holder) => {
                    holder.mode = Mode::Read;
                    state.shared.push(holder);
                    true
                }
                None => false,
            }
        }))
    }
}

// The engine's own lifecycle is its locks'; each call goes straight to the
// body it shares with a semaphore's permits.
#[async_trait]
impl Lifecycle for MemoryEngine {
    async fn acquire(&self, req: &Request) -> Result<Poll, EngineError> {
        self.holds(None).attempt(req)
    }

    async fn poll(&self, req: &Request) -> Result<Poll, EngineError> {
        self.holds(None).attempt(req)
    }

    async fn cancel(&self, req: &Request) -> Result<(), EngineError> {
        self.holds(None).withdraw(req);
        Ok(())
    }

    async fn renew(&self, req: &Request) -> Result<Renewal, EngineError> {
        Ok(self.holds(None).extend(req))
    }

    async fn release(&self, req: &Request) -> Result<bool, EngineError> {
        Ok(self.holds(None).let_go(req))
    }

    /// No signal of its own: a failed renewal tells the core.
    fn lost(&self, _req: &Request) -> Option<LostSignal> {
        None
    }
}

#[async_trait]
impl Lifecycle for Holds<'_> {
    async fn acquire(&self, req: &Request) -> Result<Poll, EngineError> {
        self.attempt(req)
    }

    async fn poll(&self, req: &Request) -> Result<Poll, EngineError> {
        self.attempt(req)
    }

    async fn cancel(&self, req: &Request) -> Result<(), EngineError> {
        self.withdraw(req);
        Ok(())
    }

    async fn renew(&self, req: &Request) -> Result<Renewal, EngineError> {
        Ok(self.extend(req))
    }

    async fn release(&self, req: &Request) -> Result<bool, EngineError> {
        Ok(self.let_go(req))
    }

    fn lost(&self, _req: &Request) -> Option<LostSignal> {
        None
    }

    /// A read: no expiry to apply, nobody to wake.
    fn slot(&self, req: &Request) -> Option<u32> {
        let locks = self.engine.locks();
        let state = locks.by_key.get(&(req.key.clone(), self.permits.is_some()))?;
        state.shared.iter().find(|h| h.owner == req.owner)?.slot
    }
}

impl Semaphores for MemoryEngine {
    fn permits(&self, count: u32) -> Box<dyn Lifecycle + '_> {
        Box::new(self.holds(Some(count)))
    }

    fn slots(&self) -> bool {
        true
    }
}

#[async_trait]
impl Inspect for MemoryEngine {
    fn shows_fences(&self) -> bool {
        true
    }

    fn shows_renewals(&self) -> bool {
        true
    }

    async fn inspect(&self, key: &LockKey, permits: Option<u32>) -> Result<LockView, EngineError> {
        let locks = self.locks();
        let (now, wall) = (Instant::now(), SystemTime::now());
        let idle = LockState {
            permits,
            ..LockState::default()
        };
        let state = locks
            .by_key
            .get(&(key.clone(), permits.is_some()))
            .unwrap_or(&idle);
        Ok(self.view(key, state, now, wall))
    }
}

#[async_trait]
impl List for MemoryEngine {
    async fn list(&self, group: &str) -> Result<Vec<LockView>, EngineError> {
        let locks = self.locks();
        let (now, wall) = (Instant::now(), SystemTime::now());
        let views = locks
            .by_key
            .iter()
            .filter(|((key, _), _)| key.group() == group)
            .map(|((key, _), state)| self.view(key, state, now, wall));
        Ok(views.collect())
    }
}

#[async_trait]
impl Control for MemoryEngine {
    async fn forced_out(&self, req: &Request) -> Result<bool, EngineError> {
        let now = Instant::now();
        let forced = &self.locks().forced;
        Ok(forced.get(&req.owner).is_some_and(|until| *until > now))
    }

    async fn force_release(&self, key: &LockKey, only: &Only) -> Result<u32, EngineError> {
        Ok(self.force_out((key.clone(), false), only))
    }

    async fn revoke(&self, key: &LockKey, only: &Only) -> Result<u32, EngineError> {
        Ok(self.ask_to_let_go((key.clone(), false), only))
    }
}

#[async_trait]
impl PermitControl for MemoryEngine {
    async fn force_release_permits(&self, key: &LockKey, _: u32, only: &Only) -> Result<u32, EngineError> {
        Ok(self.force_out((key.clone(), true), only))
    }

    async fn revoke_permits(&self, key: &LockKey, _: u32, only: &Only) -> Result<u32, EngineError> {
        Ok(self.ask_to_let_go((key.clone(), true), only))
    }
}

impl MemoryEngine {
    /// Ends the holds of the lock or semaphore `at` that `only` admits,
    /// noting each owner forced out until its lease would have ended, and
    /// wakes who can proceed; how many it ended.
    fn force_out(&self, at: (LockKey, bool), only: &Only) -> u32 {
        let mut locks = self.locks();
        let Locks { by_key, forced, .. } = &mut *locks;
        let now = Instant::now();
        forced.retain(|_, until| *until > now);
        let Some(state) = by_key.get_mut(&at) else {
            return 0;
        };
        state.expire(now);
        let admitted = |h: &Holder| only.admits(Some(h.fence), Some(&h.owner.digest()));
        let mut ended: Vec<Holder> = state.writer.take_if(|h| admitted(h)).into_iter().collect();
        let (out, kept): (Vec<Holder>, _) = state.shared.drain(..).partition(|h| admitted(h));
        ended.extend(out);
        state.shared = kept;
        forced.extend(ended.iter().map(|h| (h.owner, h.expires)));
        state.wake_ready();
        if state.is_idle() {
            by_key.remove(&at);
        }
        ended.len() as u32
    }

    /// Marks the holds of the lock or semaphore `at` that `only` admits as
    /// asked to let go; how many.
    fn ask_to_let_go(&self, at: (LockKey, bool), only: &Only) -> u32 {
        let mut locks = self.locks();
        let Some(state) = locks.by_key.get_mut(&at) else {
            return 0;
        };
        state.expire(Instant::now());
        let holders = state.writer.iter_mut().chain(state.shared.iter_mut());
        let admitted = holders.filter(|h| only.admits(Some(h.fence), Some(&h.owner.digest())));
        admitted.map(|h| h.revoked = true).count() as u32
    }
}

#[async_trait]
impl HoldAtLeast for MemoryEngine {}

impl MemoryEngine {
    /// What `state` shows, `now` being `wall` on the system clock: its
    /// holders whose lease has not run out, and its waiters. (The state is
    /// left as it is: expiring holders is for the calls that wake waiters.)
    fn view(&self, key: &LockKey, state: &LockState, now: Instant, wall: SystemTime) -> LockView {
        let live = state
            .writer
            .iter()
            .chain(&state.shared)
            .filter(|h| h.expires > now);
        let holders = live.map(|h| HolderRecord {
            label: Some(self.label.clone()),
            mode: h.mode,
            fence: Some(h.fence),
            slot: h.slot,
            since: Some(h.since),
            lease_ends: Some(wall + h.expires.saturating_duration_since(now)),
            lease: Some(h.lease),
            renewed: Some(h.renewed),
            owner: Some(h.owner.digest()),
        });
        let waiters = state.queue.by_ticket.values().map(|w| WaiterRecord {
            label: Some(self.label.clone()),
            mode: w.mode,
            since: Some(w.since),
            owner: Some(w.owner.digest()),
        });
        LockView {
            group: key.group().to_owned(),
            name: key.name().to_owned(),
            permits: state.permits,
            holders: holders.collect(),
            waiters: waiters.collect(),
        }
    }
}

/// Registers `kind = "memory"`, which takes no settings.
pub fn register(kinds: &mut dlock_core::kit::Kinds) {
    #[derive(serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    struct MemorySettings {
        /// The label of this process's holds; default `<host>:<pid>`.
        client_name: Option<String>,
    }
    kinds.register("memory", |name: String, settings: MemorySettings| async move {
        let mut engine = MemoryEngine::new();
        if let Some(label) = settings.client_name {
            dlock_core::kit::check_label(&label).map_err(|problem| {
                dlock_core::kit::Connecting {
                    name: &name,
                    kind: "memory",
                }
                .bad("client_name", problem)
            })?;
            engine.label = label;
        }
        Ok(engine)
    });
}

#[cfg(test)]
mod tests {
    use std::task::{Context, Waker};
    use std::time::Duration;

    use super::*;

    fn request(mode: Mode) -> Request {
        let key = LockKey::new("memory-test", "wake").expect("key");
        Request::new(key, mode, Duration::from_secs(30))
    }

    async fn waiting(engine: &MemoryEngine, req: &Request) -> Wake {
        match engine.poll(req).await.expect("memory engine") {
            Poll::Waiting(wake) => wake,
            Poll::Held(_) => panic!("{:?} was granted", req.mode),
        }
    }

    fn woken(wake: &mut Wake) -> bool {
        wake.as_mut()
            .poll(&mut Context::from_waker(Waker::noop()))
            .is_ready()
    }

    /// The lock is free and a writer heads the queue with a reader behind
    /// it: only the writer is woken. Woken too, the reader polled, was told
    /// to wait, and was woken again at once by its own poll: a loop that
    /// never yields, which froze a server's workers under load.
    #[tokio::test]
    async fn a_reader_behind_the_head_writer_is_not_woken_with_it() {
        let engine = MemoryEngine::new();
        let (holder, writer, reader) = (request(Mode::Write), request(Mode::Write), request(Mode::Read));
        assert!(matches!(engine.acquire(&holder).await, Ok(Poll::Held(_))));
        let mut writer_wake = waiting(&engine, &writer).await;
        let mut reader_wake = waiting(&engine, &reader).await;
        assert!(engine.release(&holder).await.expect("release"));

        assert!(woken(&mut writer_wake), "the head writer is woken");
        assert!(!woken(&mut reader_wake), "the reader behind it is not");
        drop(reader_wake); // as the core does: each poll brings a new wake-up
        let mut polled_again = waiting(&engine, &reader).await;
        assert!(!woken(&mut polled_again), "nor by its own poll");

        assert!(matches!(engine.poll(&writer).await, Ok(Poll::Held(_))));
        assert!(engine.release(&writer).await.expect("release"));
        assert!(
            woken(&mut polled_again),
            "the reader is woken once the writer is done"
        );
        assert!(matches!(engine.poll(&reader).await, Ok(Poll::Held(_))));
    }

    /// A record shows the lease a hold asked for, and the renewal that
    /// set its end: the grant, then each renewal after it.
    #[tokio::test]
    async fn a_record_shows_the_lease_and_the_last_renewal() {
        let engine = MemoryEngine::new();
        let holder = request(Mode::Write);
        assert!(matches!(engine.acquire(&holder).await, Ok(Poll::Held(_))));
        let renewed = async || {
            let view = engine.inspect(&holder.key, None).await.expect("inspect");
            let record = &view.holders[0];
            assert_eq!(record.lease, Some(Duration::from_secs(30)), "{view:?}");
            record.renewed.expect("a renewal")
        };
        let granted = renewed().await;
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert_eq!(granted, renewed().await, "unrenewed, the same");
        assert!(matches!(engine.renew(&holder).await, Ok(Renewal::Held)));
        let later = renewed().await.duration_since(granted).expect("later");
        assert!(
            later >= Duration::from_millis(20),
            "renewed {later:?} after the grant"
        );
    }
}
