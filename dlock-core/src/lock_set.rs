//! Several locks taken as one, in an order that does not depend on the
//! caller's, so that two callers naming the same locks never deadlock.

use std::time::Duration;

use tokio::time::Instant;

use crate::config::Wait;
use crate::lock::none_if_busy;
use crate::{Error, Guard, Lock, Mode, Semaphore};

/// Several locks taken as a unit: all of them, or, if one cannot be had
/// within the wait, none (what was taken is released). They are taken in
/// one order, by group, then name, then engine, whatever the order they
/// were added in: `transfer(a, b)` and `transfer(b, a)` cannot deadlock
/// each other. A lock added twice is taken once, for write if either asks
/// for write, with the lease and wait it was first added with. Each lock
/// keeps its own fence.
///
/// The order covers the set's own locks: a lock this task held before
/// asking for the set is reentered where it falls, so holding one lock
/// while waiting for a set can still deadlock with another set.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), dlock::Error> {
/// let accounts = dlock::locks("account");
/// let (from, to) = ("7", "3");
/// let both = dlock::LockSet::new()
///     .write(accounts.get(from))
///     .write(accounts.get(to))
///     .read(dlock::lock("rates", "eur"));
/// let guards = both.acquire().await?; // account/3, account/7, rates/eur
/// let fence = guards.get("account", from).expect("taken").fence();
/// // ... move the money, handing each store its own lock's fence ...
/// guards.release().await?;
/// # let _ = fence;
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Default)]
pub struct LockSet {
    /// In the order taken, each lock once.
    locks: Vec<(Lock, Mode)>,
}

impl LockSet {
    /// An empty set.
    pub fn new() -> Self {
        LockSet::default()
    }

    /// Adds `lock`, to be taken in `mode`.
    pub fn with(mut self, lock: Lock, mode: Mode) -> Self {
        match self
            .locks
            .binary_search_by(|(other, _)| other.order_key().cmp(&lock.order_key()))
        {
            Ok(same) if mode == Mode::Write => self.locks[same].1 = Mode::Write,
            Ok(_) => {}
            Err(at) => self.locks.insert(at, (lock, mode)),
        }
        self
    }

    /// Adds `lock`, to be taken for write.
    pub fn write(self, lock: Lock) -> Self {
        self.with(lock, Mode::Write)
    }

    /// Adds `lock`, to be taken for read.
    pub fn read(self, lock: Lock) -> Self {
        self.with(lock, Mode::Read)
    }

    /// Adds a permit of `semaphore`, which comes in the order by its group
    /// and name like a lock.
    pub fn permit(self, semaphore: &Semaphore) -> Self {
        self.with(semaphore.lock().clone(), Mode::Write)
    }

    /// Takes every lock, waiting at most the shortest wait among them
    /// (each lock's own, configured or set with `with_wait`).
    pub async fn acquire(&self) -> Result<Guards, Error> {
        let shortest = self
            .locks
            .iter()
            .map(|(lock, _)| lock.wait)
            .min_by_key(|wait| match wait {
                Wait::For(d) => *d,
                Wait::Forever => Duration::MAX,
            });
        self.acquire_within(shortest.unwrap_or(Wait::TRY_ONCE)).await
    }

    /// Takes every lock, waiting at most `wait` for all of them together.
    pub async fn acquire_for(&self, wait: Duration) -> Result<Guards, Error> {
        self.acquire_within(Wait::For(wait)).await
    }

    /// Takes every lock if each is free now; `None` if one is not.
    pub async fn try_acquire(&self) -> Result<Option<Guards>, Error> {
        none_if_busy(self.acquire_within(Wait::TRY_ONCE).await)
    }

    async fn acquire_within(&self, wait: Wait) -> Result<Guards, Error> {
        let deadline = match wait {
            Wait::For(d) => Some(Instant::now() + d),
            Wait::Forever => None,
        };
        let mut guards = Guards(Vec::with_capacity(self.locks.len()));
        for (lock, mode) in &self.locks {
            let left = match deadline {
                Some(at) => Wait::For(at.saturating_duration_since(Instant::now())),
                None => Wait::Forever,
            };
            // On an error `guards` drops, releasing what was taken.
            guards.0.push(lock.acquire_within(*mode, left).await?);
        }
        Ok(guards)
    }
}

/// The guards of a [`LockSet`], in the order taken. Dropping them releases
/// every lock in the background; [`release`](Guards::release) does so in
/// place.
#[must_use = "the locks are released as soon as the guards are dropped"]
#[derive(Debug)]
pub struct Guards(Vec<Guard>);

impl Guards {
    /// Each lock's guard, in the order taken.
    pub fn iter(&self) -> impl Iterator<Item = &Guard> + Clone {
        self.0.iter()
    }

    /// The guard of lock `name` of `group`, if the set has it.
    pub fn get(&self, group: &str, name: &str) -> Option<&Guard> {
        self.0
            .iter()
            .find(|guard| guard.key().group() == group && guard.key().name() == name)
    }

    /// Releases every lock, the last taken first. The first error is
    /// returned once all have been released (`Err(Lost)` if a lock had
    /// been lost meanwhile).
    pub async fn release(mut self) -> Result<(), Error> {
        let mut first = Ok(());
        while let Some(guard) = self.0.pop() {
            let released = guard.release().await;
            if first.is_ok() {
                first = released;
            }
        }
        first
    }
}
