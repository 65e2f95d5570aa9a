//! The user-facing handles: `Locks` (a family, one per group) and `Lock` (one name).

use std::sync::Arc;
use std::time::Duration;

use crate::metrics::Labels;
use crate::registry::{NamedEngine, Settings};
use crate::{EngineError, Error, Guard, LockKey, Mode, acquire};

/// What every lock of one group shares.
pub(crate) struct GroupCtx {
    pub group: Arc<str>,
    pub engine: NamedEngine,
    pub settings: Settings,
    pub labels: Labels,
}

impl GroupCtx {
    pub fn new(group: Arc<str>, engine: NamedEngine, settings: Settings) -> Self {
        let labels = Labels::new(group.clone(), engine.name.clone());
        GroupCtx {
            group,
            engine,
            settings,
            labels,
        }
    }

    /// Names this group's engine, its address and the lock in an engine failure.
    pub fn engine_error(&self, key: &LockKey, error: EngineError) -> Error {
        match error {
            EngineError::Unsupported(feature) => self.unsupported(feature),
            EngineError::Failed(source) => Error::Engine {
                engine: self.engine.name.to_string(),
                kind: self.engine.engine.kind(),
                address: self.engine.engine.address(),
                key: key.clone(),
                source,
            },
        }
    }

    pub fn unsupported(&self, feature: &'static str) -> Error {
        Error::Unsupported {
            engine: self.engine.name.to_string(),
            kind: self.engine.engine.kind(),
            feature,
        }
    }
}

/// The locks of one group, for fine-grained locking (per user, per order).
/// Cheap to clone.
///
/// ```
/// # async fn demo(locks: dlock_core::Locks) -> Result<(), dlock_core::Error> {
/// let guard = locks.get("user-7").lock().await?;
/// // ... guarded work; use guard.fence() when writing to storage ...
/// guard.release().await
/// # }
/// ```
#[derive(Clone)]
pub struct Locks {
    ctx: Arc<GroupCtx>,
}

impl Locks {
    pub(crate) fn new(ctx: Arc<GroupCtx>) -> Self {
        Locks { ctx }
    }

    pub fn group(&self) -> &str {
        &self.ctx.group
    }

    /// The configured name of the engine serving this group.
    pub fn engine(&self) -> &str {
        &self.ctx.engine.name
    }

    /// The lease, wait and polling this group's locks use.
    pub fn settings(&self) -> &Settings {
        &self.ctx.settings
    }

    /// The lock named `name` in this group. The name is checked when acquiring.
    pub fn get(&self, name: impl Into<Arc<str>>) -> Lock {
        Lock {
            ctx: self.ctx.clone(),
            name: name.into(),
            lease: self.ctx.settings.lease,
        }
    }
}

/// One named lock, shaped like Go's `RWMutex`: `lock` / `read` wait, `try_*`
/// do not, `*_for` wait at most the given time.
///
/// Holds are reentrant per async task: a task that holds the lock may take it
/// again (write, or read under write) without asking the engine.
#[derive(Clone)]
pub struct Lock {
    ctx: Arc<GroupCtx>,
    name: Arc<str>,
    lease: Duration,
}

impl Lock {
    pub fn group(&self) -> &str {
        &self.ctx.group
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// Uses `lease` instead of the group's configured lease.
    pub fn with_lease(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self
    }

    /// Takes the write lock, waiting at most the configured wait.
    pub async fn lock(&self) -> Result<Guard, Error> {
        self.acquire(Mode::Write, None).await
    }

    /// Takes the write lock, waiting at most `wait`.
    pub async fn lock_for(&self, wait: Duration) -> Result<Guard, Error> {
        self.acquire(Mode::Write, Some(wait)).await
    }

    /// Takes the write lock if it is free now; `None` if it is not.
    pub async fn try_lock(&self) -> Result<Option<Guard>, Error> {
        none_if_busy(self.acquire(Mode::Write, Some(Duration::ZERO)).await)
    }

    /// Takes the read lock, waiting at most the configured wait.
    pub async fn read(&self) -> Result<Guard, Error> {
        self.acquire(Mode::Read, None).await
    }

    /// Takes the read lock, waiting at most `wait`.
    pub async fn read_for(&self, wait: Duration) -> Result<Guard, Error> {
        self.acquire(Mode::Read, Some(wait)).await
    }

    /// Takes the read lock if it is available now; `None` if it is not.
    pub async fn try_read(&self) -> Result<Option<Guard>, Error> {
        none_if_busy(self.acquire(Mode::Read, Some(Duration::ZERO)).await)
    }

    /// Takes the lock in `mode`, waiting at most `wait` (`None`: the configured
    /// wait; zero: try once). What `#[distributed_lock]` calls.
    pub async fn acquire(&self, mode: Mode, wait: Option<Duration>) -> Result<Guard, Error> {
        let wait = wait.or(self.ctx.settings.wait);
        acquire::acquire(&self.ctx, self.name.clone(), mode, wait, self.lease).await
    }
}

fn none_if_busy(result: Result<Guard, Error>) -> Result<Option<Guard>, Error> {
    match result {
        Ok(guard) => Ok(Some(guard)),
        Err(Error::Timeout { .. }) => Ok(None),
        Err(e) => Err(e),
    }
}
