//! The user-facing handles: `Locks` (a family, one per group) and `Lock`
//! (one name), and how a [`Registry`] hands them out.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::acquire;
use crate::config::{Settings, Wait};
use crate::hold::Limits;
use crate::kit::{Kind, within};
use crate::registry::{Group, Registry};
use crate::{Error, Guard, LockKey, LockView, Mode, Only, audit};

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
            kind: Kind::Lock,
            limits: Limits::default(),
            operator: None,
            group: self.group.clone(),
        }
    }

    /// Every lock and semaphore of this group that someone holds or waits
    /// for, as the engine sees them now. `Error::Unsupported` where the
    /// engine cannot enumerate its locks ([`List`](crate::kit::List)).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), dlock::Error> {
    /// let invoices = dlock::locks("invoice");
    /// let guard = invoices.get("2026-001").lock().await?;
    /// let listed = invoices.list().await?;
    /// assert_eq!(listed.len(), 1);
    /// assert_eq!(listed[0].name, "2026-001");
    /// assert_eq!(listed[0].holders[0].fence, Some(guard.fence()));
    /// guard.release().await
    /// # }
    /// ```
    pub async fn list(&self) -> Result<Vec<LockView>, Error> {
        let group = &self.group;
        let list = group.facet("listing a group's locks", |f| f.list)?;
        let until = Instant::now() + group.settings.call_timeout;
        let mut views = within(until, list.list(&group.name))
            .await
            .map_err(|error| group.listing_error(error))?;
        // Whatever order an engine found them in, and free ones it kept.
        views.retain(|view| !view.is_free());
        views.sort_by(|a, b| (&a.name, a.permits).cmp(&(&b.name, b.permits)));
        Ok(views)
    }

    /// The cycles of waits through a lock of this group, as
    /// [`Registry::deadlocks`](crate::Registry::deadlocks) finds them on
    /// every engine of its registry.
    pub async fn deadlocks(&self) -> Result<Vec<crate::Cycle>, Error> {
        let group = &self.group;
        let mut cycles = crate::deadlock::cycles(&group.engines, group.settings.call_timeout).await?;
        cycles.retain(|cycle| cycle.links.iter().any(|link| *link.group == *group.name));
        Ok(cycles)
    }

    /// Listens for changes to this group's locks and semaphores with the
    /// engine's own watch, and answers once the server listens: the future
    /// resolves at the first change after that, or when the engine can tell
    /// no longer. Read [`list`](Self::list) after this call, and again once
    /// it resolves, and no change falls between. An engine without a watch
    /// ([`Capabilities::watch`](crate::kit::Capabilities::watch)) answers
    /// `Error::Unsupported`: read on a timer there.
    pub async fn watch(&self) -> Result<crate::kit::Changed, Error> {
        let group = &self.group;
        let watch = group.facet("watching a group's locks", |f| f.watch)?;
        let until = Instant::now() + group.settings.call_timeout;
        within(until, watch.watch(&group.name))
            .await
            .map_err(|error| group.listing_error(error))
    }

    /// The semaphore named `name` in this group, admitting `permits`
    /// holders at once. A semaphore is not the lock of the same name. The
    /// name, and that `permits` is at least 1, are checked when acquiring.
    pub fn semaphore(&self, name: impl Into<Arc<str>>, permits: u32) -> Semaphore {
        let mut lock = self.get(name);
        lock.kind = Kind::Semaphore(permits);
        Semaphore(lock)
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
    pub(crate) group: Arc<Group>,
    name: Arc<str>,
    pub(crate) lease: Duration,
    pub(crate) wait: Wait,
    /// A lock's, a [`Semaphore`]'s or an [`Election`](crate::Election)'s.
    pub(crate) kind: Kind,
    limits: Limits,
    /// Who acts on holders through this handle, for the audit trail.
    operator: Option<Arc<str>>,
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

    /// The configured name of the engine this lock is on.
    pub(crate) fn engine_name(&self) -> &str {
        &self.group.engine_name
    }

    /// Who acts through this handle, if [`by`](Self::by) named someone.
    pub(crate) fn operator(&self) -> Option<&str> {
        self.operator.as_deref()
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

    /// Keeps others out until `at_least` after the grant, even if this
    /// hold is released sooner, and even if this process exits then: the
    /// engine lets the hold run out on its own clock (a run-once job's
    /// `hold_at_least`). `Error::Unsupported` on an engine without
    /// [`Capabilities::hold_at_least`](crate::kit::Capabilities::hold_at_least).
    pub fn with_hold_at_least(mut self, at_least: Duration) -> Self {
        self.limits.at_least = Some(at_least);
        self
    }

    /// Ends the hold `at_most` after the grant: it is renewed no further,
    /// and it is lost then ([`LostReason::TimeLimit`](crate::LostReason::TimeLimit)),
    /// so a body cancelled on loss stops there (a run-once job's
    /// `hold_at_most`). Unreleased, the engine lets it go one lease later
    /// at most.
    pub fn with_hold_at_most(mut self, at_most: Duration) -> Self {
        self.limits.at_most = Some(at_most);
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
        acquire::acquire(
            &self.group,
            self.name.clone(),
            mode,
            self.kind.clone(),
            wait,
            self.lease,
            self.limits,
        )
        .await
    }

    /// Who holds this lock and who waits for it, as the engine sees them
    /// now: each one's process label, mode, fence and since when, never
    /// its owner id. `Error::Unsupported` where the engine keeps no records.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), dlock::Error> {
    /// let lock = dlock::lock("report", "monthly");
    /// let guard = lock.read().await?;
    /// let view = lock.inspect().await?;
    /// assert_eq!(view.holders.len(), 1);
    /// assert_eq!(view.holders[0].mode, dlock::Mode::Read);
    /// assert_eq!(view.holders[0].owner, Some(guard.owner_digest()));
    /// guard.release().await?;
    /// assert!(lock.inspect().await?.is_free());
    /// # Ok(())
    /// # }
    /// ```
    pub async fn inspect(&self) -> Result<LockView, Error> {
        let group = &self.group;
        let key = LockKey::new(group.name.clone(), self.name.clone())?;
        let inspect = group.facet("records of who holds and waits", |f| f.inspect)?;
        if self.kind.permits().is_some() {
            group.facet("semaphores", |f| f.semaphores)?;
        }
        let until = Instant::now() + group.settings.call_timeout;
        within(until, inspect.inspect(&key, self.kind.permits()))
            .await
            .map_err(|error| group.engine_error_at(key, self.kind.permits(), error))
    }

    /// Ends every hold of this lock on the server, so that its next waiter
    /// gets in: for a lock stuck behind a holder that is alive but wedged.
    /// Each old holder learns at its next renewal that it was lost, with
    /// [`LostReason::ForceReleased`](crate::LostReason::ForceReleased),
    /// and the next holder's fencing token is greater than every one given
    /// before, so storage that checks tokens refuses the old holder's
    /// writes. Answers how many holds it ended (0: the lock was free).
    ///
    /// Every act on holders is an audit event: a `tracing` warning (target
    /// `dlock::audit`) naming the lock, the holds the act was for as the
    /// records showed them just before, and who acted ([`by`](Self::by)),
    /// and a count in the metric `dlock_operator_acts_total`.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), dlock::Error> {
    /// let lock = dlock::lock("report", "stuck");
    /// let wedged = lock.lock().await?;
    /// assert_eq!(lock.force_release().await?, 1);
    /// assert!(lock.inspect().await?.is_free());
    /// # drop(wedged);
    /// # Ok(())
    /// # }
    /// ```
    pub async fn force_release(&self) -> Result<u32, Error> {
        self.force_release_only(&Only::any()).await
    }

    /// Ends the holds of this lock that `only` admits, as
    /// [`force_release`](Self::force_release) ends them all: the one an
    /// operator looked at, by the fence or owner digest its record showed.
    /// The engine checks it against each hold on the server as it ends it,
    /// so if the lock changed hands since, the new holder keeps it and this
    /// answers 0. `Error::Unsupported` for a fence on an engine whose
    /// records show none.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), dlock::Error> {
    /// let lock = dlock::lock("report", "stuck");
    /// let wedged = lock.lock().await?;
    /// let seen = wedged.fence();
    /// drop(wedged);
    /// let next = lock.lock().await?;
    /// // The hold that was looked at is gone: the next holder keeps its own.
    /// assert_eq!(lock.force_release_only(&dlock::Only::fence(seen)).await?, 0);
    /// assert_eq!(lock.force_release_only(&dlock::Only::fence(next.fence())).await?, 1);
    /// # Ok(())
    /// # }
    /// ```
    pub async fn force_release_only(&self, only: &Only) -> Result<u32, Error> {
        self.act(Act::ForceRelease, only).await
    }

    /// Asks every holder of this lock to let go: each learns it at its next
    /// renewal ([`Guard::revoked`](crate::Guard::revoked)), and an annotated
    /// function with `on_revoke = "cancel"` is cancelled. Nothing is taken
    /// from a holder that does not comply. Answers how many holders were
    /// asked (0: the lock was free).
    pub async fn revoke(&self) -> Result<u32, Error> {
        self.revoke_only(&Only::any()).await
    }

    /// Asks the holders of this lock that `only` admits to let go, as
    /// [`revoke`](Self::revoke) asks them all.
    pub async fn revoke_only(&self, only: &Only) -> Result<u32, Error> {
        self.act(Act::Revoke, only).await
    }

    /// Names who acts on holders through this handle, in the audit trail
    /// of [`force_release`](Self::force_release) and
    /// [`revoke`](Self::revoke): the `dlock` command says its user and
    /// host, the admin page its own name. By default, this process's label.
    pub fn by(mut self, operator: impl Into<Arc<str>>) -> Self {
        self.operator = Some(operator.into());
        self
    }

    /// An operator's act on this lock's holders, if the engine can do it,
    /// with its audit event.
    async fn act(&self, act: Act, only: &Only) -> Result<u32, Error> {
        let group = &self.group;
        let permits = self.kind.permits();
        let held = match permits {
            None => Held::Lock(group.facet(act.what(), |f| f.control)?),
            Some(n) => Held::Permits(group.facet(act.of_permits(), |f| f.permit_control)?, n),
        };
        if only.fence.is_some() && !group.capabilities.fence_in_records {
            return Err(group.unsupported(format!("{} by fence: its records show no fence", act.what())));
        }
        let key = LockKey::new(group.name.clone(), self.name.clone())?;
        let until = Instant::now() + group.settings.call_timeout;
        let seen = match group.engine.facets().inspect {
            Some(inspect) => within(until, inspect.inspect(&key, permits)).await.ok(),
            None => None,
        };
        let call = async {
            match (act, held) {
                (Act::ForceRelease, Held::Lock(control)) => control.force_release(&key, only).await,
                (Act::Revoke, Held::Lock(control)) => control.revoke(&key, only).await,
                (Act::ForceRelease, Held::Permits(control, n)) => {
                    control.force_release_permits(&key, n, only).await
                }
                (Act::Revoke, Held::Permits(control, n)) => control.revoke_permits(&key, n, only).await,
            }
        };
        let done = within(until, call).await;
        let reached = done.map_err(|error| group.engine_error_at(key, permits, error))?;
        audit::acted(self, act.what(), only, seen.as_ref(), reached);
        Ok(reached)
    }

    /// Where this lock comes in a [`LockSet`](crate::LockSet)'s one order.
    pub(crate) fn order_key(&self) -> (&str, &str, &str, Option<u32>) {
        (
            &self.group.name,
            &self.name,
            &self.group.engine_name,
            self.kind.permits(),
        )
    }
}

/// What an operator does to a lock's holders.
#[derive(Clone, Copy)]
enum Act {
    ForceRelease,
    Revoke,
}

/// What an operator's act reaches: a lock's holds, or a semaphore's
/// permits, of this count.
enum Held<'e> {
    Lock(&'e dyn crate::kit::Control),
    Permits(&'e dyn crate::kit::PermitControl, u32),
}

impl Act {
    fn what(self) -> &'static str {
        match self {
            Act::ForceRelease => "force release",
            Act::Revoke => "revocation",
        }
    }

    fn of_permits(self) -> &'static str {
        match self {
            Act::ForceRelease => "force release of permits",
            Act::Revoke => "revocation of permits",
        }
    }
}

/// A semaphore: at most `permits` holders at once, across processes, each
/// with its own lease, renewed by the watchdog like a lock's, so a crashed
/// holder's permit comes back within its lease. Fair where the engine keeps
/// a queue: a waiter never passes an earlier one. Holds are reentrant per
/// task: a task holding a permit takes it again without a second permit.
///
/// Every client of a semaphore must give the same count: asking with
/// another count than its holders and waiters use is
/// [`Error::PermitCount`]; a new count takes over once nobody holds or
/// waits.
///
/// Each acquisition gets a fencing token, greater than every token given
/// before on the semaphore. Up to `permits` holders are valid at once, so
/// storage cannot refuse all but the greatest token as it can for a lock;
/// the token orders and tells apart what the holders write.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), dlock::Error> {
/// let exports = dlock::semaphore("export", "tenant-7", 2);
/// let first = exports.acquire().await?;
/// let other = exports.clone();
/// let second = tokio::spawn(async move { other.try_acquire().await });
/// let second = second.await.expect("task")?.expect("a second permit is free");
/// let third = exports.clone();
/// let third = tokio::spawn(async move { third.try_acquire().await });
/// assert!(third.await.expect("task")?.is_none(), "both permits are taken");
/// second.release().await?;
/// first.release().await
/// # }
/// ```
#[derive(Clone)]
pub struct Semaphore(Lock);

impl Semaphore {
    /// The semaphore's group.
    pub fn group(&self) -> &str {
        self.0.group()
    }

    /// The semaphore's name within its group.
    pub fn name(&self) -> &str {
        self.0.name()
    }

    /// How many holders it admits at once.
    pub fn permits(&self) -> u32 {
        self.0.kind.permits().unwrap_or(1)
    }

    /// Uses `lease` instead of the group's configured lease.
    pub fn with_lease(self, lease: Duration) -> Self {
        Semaphore(self.0.with_lease(lease))
    }

    /// Waits as `wait` says instead of the group's configured wait.
    pub fn with_wait(self, wait: Wait) -> Self {
        Semaphore(self.0.with_wait(wait))
    }

    /// Takes a permit, waiting at most the configured wait.
    pub async fn acquire(&self) -> Result<Guard, Error> {
        self.0.acquire(Mode::Write).await
    }

    /// Takes a permit, waiting at most `wait`.
    pub async fn acquire_for(&self, wait: Duration) -> Result<Guard, Error> {
        self.0.lock_for(wait).await
    }

    /// Takes a permit if one is free now and nobody queues for one; `None`
    /// if not.
    pub async fn try_acquire(&self) -> Result<Option<Guard>, Error> {
        self.0.try_lock().await
    }

    /// The lock-shaped handle a [`LockSet`](crate::LockSet) takes.
    /// Who holds permits and who waits, as [`Lock::inspect`] tells it.
    pub async fn inspect(&self) -> Result<LockView, Error> {
        self.0.inspect().await
    }

    /// Ends the permits whose holds `only` admits ([`Only::any`]: every
    /// permit), as [`Lock::force_release_only`] ends a lock's holds: each
    /// holder learns at its next renewal that it was released by force,
    /// and the next waiter gets the permit. `Error::Unsupported` on an
    /// engine without
    /// [`Capabilities::permit_control`](crate::kit::Capabilities::permit_control).
    pub async fn force_release_only(&self, only: &Only) -> Result<u32, Error> {
        self.0.force_release_only(only).await
    }

    /// Asks the holders of permits that `only` admits to let go, as
    /// [`Lock::revoke_only`] asks a lock's.
    pub async fn revoke_only(&self, only: &Only) -> Result<u32, Error> {
        self.0.revoke_only(only).await
    }

    /// Names who acts on holders through this handle, as [`Lock::by`].
    pub fn by(self, operator: impl Into<Arc<str>>) -> Self {
        Semaphore(self.0.by(operator))
    }

    pub(crate) fn lock(&self) -> &Lock {
        &self.0
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
