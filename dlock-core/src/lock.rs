//! The user-facing handles: `Locks` (a family, one per group) and `Lock`
//! (one name), and how a [`Registry`] hands them out.

use std::sync::Arc;
use std::time::Duration;

use crate::config::{Settings, Wait};
use crate::registry::{Group, Registry};
use crate::{Error, Guard, Mode, acquire};

impl Registry {
    /// The lock family of `group`, on the engine its config routes it to.
    pub fn locks(&self, group: &str) -> Locks {
        let group = self
            .group(group, None)
            .expect("a routed group's engine is configured");
        Locks { group }
    }

    /// The lock family of `group` on the engine named `engine`, whatever the routes say.
    pub fn locks_on(&self, group: &str, engine: &str) -> Result<Locks, Error> {
        Ok(Locks {
            group: self.group(group, Some(engine))?,
        })
    }
}

/// The locks of one group, for fine-grained locking (per user, per order).
/// Cheap to clone.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), dlock::Error> {
/// let users = dlock::locks("user");
/// let guard = users.get("7").lock().await?;
/// assert_eq!(guard.key().to_string(), "user/7");
/// // ... guarded work; use guard.fence() when writing to storage ...
/// guard.release().await
/// # }
/// ```
#[derive(Clone)]
pub struct Locks {
    group: Arc<Group>,
}

impl Locks {
    /// The group's name.
    pub fn group(&self) -> &str {
        &self.group.name
    }

    /// The configured name of the engine serving this group.
    pub fn engine(&self) -> &str {
        &self.group.engine_name
    }

    /// The lease, wait and polling this group's locks use.
    pub fn settings(&self) -> &Settings {
        &self.group.settings
    }

    /// The lock named `name` in this group. The name is checked when acquiring.
    pub fn get(&self, name: impl Into<Arc<str>>) -> Lock {
        Lock {
            name: name.into(),
            lease: self.group.settings.lease,
            wait: self.group.settings.wait,
            group: self.group.clone(),
        }
    }
}

/// One named lock, shaped like Go's `RWMutex`: `lock` / `read` wait, `try_*`
/// do not, `*_for` wait at most the given time.
///
/// Holds are reentrant per async task: a task that holds the lock may take it
/// again (write, or read under write) without asking the engine. Another
/// task, spawned ones included, waits its turn.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), dlock::Error> {
/// let lock = dlock::lock("order", "42");
/// let guard = lock.lock().await?; // waits at most the group's configured wait
///
/// // Another task finds it taken.
/// let other = lock.clone();
/// let taken = tokio::spawn(async move { other.try_lock().await });
/// assert!(taken.await.expect("task")?.is_none());
///
/// // This task takes it again with no engine call, under the same fence.
/// let nested = lock.try_lock().await?.expect("reentered");
/// assert_eq!(nested.fence(), guard.fence());
/// nested.release().await?;
/// guard.release().await?; // the outermost guard lets go
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct Lock {
    group: Arc<Group>,
    name: Arc<str>,
    lease: Duration,
    pub(crate) wait: Wait,
}

impl Lock {
    /// The lock's group.
    pub fn group(&self) -> &str {
        &self.group.name
    }

    /// The lock's name within its group.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Uses `lease` instead of the group's configured lease.
    pub fn with_lease(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self
    }

    /// Waits as `wait` says instead of the group's configured wait.
    pub fn with_wait(mut self, wait: Wait) -> Self {
        self.wait = wait;
        self
    }

    /// Takes the write lock, waiting at most the configured wait.
    pub async fn lock(&self) -> Result<Guard, Error> {
        self.acquire(Mode::Write).await
    }

    /// Takes the write lock, waiting at most `wait`.
    pub async fn lock_for(&self, wait: Duration) -> Result<Guard, Error> {
        self.acquire_within(Mode::Write, Wait::For(wait)).await
    }

    /// Takes the write lock if it is free now; `None` if it is not.
    pub async fn try_lock(&self) -> Result<Option<Guard>, Error> {
        none_if_busy(self.acquire_within(Mode::Write, Wait::TRY_ONCE).await)
    }

    /// Takes the read lock, waiting at most the configured wait.
    pub async fn read(&self) -> Result<Guard, Error> {
        self.acquire(Mode::Read).await
    }

    /// Takes the read lock, waiting at most `wait`.
    pub async fn read_for(&self, wait: Duration) -> Result<Guard, Error> {
        self.acquire_within(Mode::Read, Wait::For(wait)).await
    }

    /// Takes the read lock if it is available now; `None` if it is not.
    pub async fn try_read(&self) -> Result<Option<Guard>, Error> {
        none_if_busy(self.acquire_within(Mode::Read, Wait::TRY_ONCE).await)
    }

    /// Takes the lock in `mode` with this lock's lease and wait. What
    /// `#[distributed_lock]` calls.
    pub async fn acquire(&self, mode: Mode) -> Result<Guard, Error> {
        self.acquire_within(mode, self.wait).await
    }

    pub(crate) async fn acquire_within(&self, mode: Mode, wait: Wait) -> Result<Guard, Error> {
        acquire::acquire(&self.group, self.name.clone(), mode, wait, self.lease).await
    }

    /// Where this lock comes in a [`LockSet`](crate::LockSet)'s one order.
    pub(crate) fn order_key(&self) -> (&str, &str, &str) {
        (&self.group.name, &self.name, &self.group.engine_name)
    }
}

/// A timeout as `None`: what the `try_*` calls answer when busy.
pub(crate) fn none_if_busy<T>(result: Result<T, Error>) -> Result<Option<T>, Error> {
    match result {
        Ok(held) => Ok(Some(held)),
        Err(Error::Timeout { .. }) => Ok(None),
        Err(e) => Err(e),
    }
}
