//! What `#[distributed_lock]` expands to calls. Not a public API.

use std::fmt::{self, Write as _};
use std::future::{Future, poll_fn};
use std::pin::pin;
use std::sync::{Arc, OnceLock};
use std::task::Poll;
use std::time::Duration;

pub use dlock_core::Mode;
use dlock_core::{Error, Guard, HeldLock, Lock, LockSet, Locks, LostReason, Semaphore, Wait};

use crate::Ran;

tokio::task_local! {
    /// The lock of the innermost annotated function; `None` in one with
    /// several locks (each has its own fence: `dlock::held_lock`).
    pub(crate) static CURRENT: Option<HeldLock>;
}

/// What one annotated function asks for, as a `static` in its body.
pub struct Site {
    group: &'static str,
    engine: Option<&'static str>,
    permits: Option<u32>,
    mode: Mode,
    wait: Option<Duration>,
    lease: Option<Duration>,
    cancel: Cancel,
    job: Job,
    locks: OnceLock<Locks>,
}

/// What a run-once job asks of its lock (`if_held`, `hold_at_least`,
/// `hold_at_most`).
pub struct Job {
    /// Skip the run when the lock is held: try once, do not wait.
    pub skip: bool,
    pub hold_at_least: Option<Duration>,
    pub hold_at_most: Option<Duration>,
}

/// When a site's body is dropped before it ends.
pub struct Cancel {
    /// When the lock is known lost.
    pub on_lost: bool,
    /// When an operator asks the holder to let go.
    pub on_revoke: bool,
}

impl Site {
    // One argument per option group, written by the attribute's expansion only.
    #[allow(clippy::too_many_arguments)]
    pub const fn new(
        group: &'static str,
        engine: Option<&'static str>,
        permits: Option<u32>,
        mode: Mode,
        wait: Option<Duration>,
        lease: Option<Duration>,
        cancel: Cancel,
        job: Job,
    ) -> Self {
        Site {
            group,
            engine,
            permits,
            mode,
            wait,
            lease,
            cancel,
            job,
            locks: OnceLock::new(),
        }
    }

    /// Lock (or semaphore) `name` with this site's lease and wait.
    fn lock(&self, name: Arc<str>) -> Result<Wanted, Error> {
        let locks = self.locks()?;
        let wait = match self.job.skip {
            true => Some(Wait::TRY_ONCE),
            false => self.wait.map(Wait::For),
        };
        Ok(match self.permits {
            Some(n) => {
                let semaphore = self
                    .lease
                    .into_iter()
                    .fold(locks.semaphore(name, n), Semaphore::with_lease);
                Wanted::Permit(wait.into_iter().fold(semaphore, Semaphore::with_wait))
            }
            None => {
                let lock = self.lease.into_iter().fold(locks.get(name), Lock::with_lease);
                let lock = wait.into_iter().fold(lock, Lock::with_wait);
                let lock = self
                    .job
                    .hold_at_least
                    .into_iter()
                    .fold(lock, Lock::with_hold_at_least);
                let lock = self
                    .job
                    .hold_at_most
                    .into_iter()
                    .fold(lock, Lock::with_hold_at_most);
                Wanted::Lock(lock, self.mode)
            }
        })
    }

    /// Whether the body stops on loss or on revocation at all.
    fn cancels(&self) -> bool {
        self.cancel.on_lost || self.cancel.on_revoke
    }

    /// Why the body must stop now, as this site says: its lock is known
    /// lost, or its holder was asked to let go.
    fn stop_now(&self, held: &HeldLock) -> Option<Error> {
        if self.cancel.on_lost
            && let Some(reason) = held.lost_reason()
        {
            return Some(lost(held, reason));
        }
        (self.cancel.on_revoke && held.is_revoked()).then(|| revoked(held))
    }

    /// Resolves when the body must stop, as this site says.
    async fn stopped(&self, held: &HeldLock) -> Error {
        let lost = async {
            match self.cancel.on_lost {
                true => lost(held, held.lost().await),
                false => std::future::pending().await,
            }
        };
        let revoked = async {
            match self.cancel.on_revoke {
                true => {
                    held.revoked().await;
                    revoked(held)
                }
                false => std::future::pending().await,
            }
        };
        tokio::select! {
            error = lost => error,
            error = revoked => error,
        }
    }

    /// The group's locks, looked up once: the global registry never changes.
    fn locks(&self) -> Result<&Locks, Error> {
        if let Some(locks) = self.locks.get() {
            return Ok(locks);
        }
        let registry = crate::registry();
        let locks = match self.engine {
            Some(engine) => registry.locks_on(self.group, engine)?,
            None => registry.locks(self.group),
        };
        Ok(self.locks.get_or_init(|| locks))
    }
}

/// What a site takes: a lock in a mode, or a semaphore's permit.
enum Wanted {
    Lock(Lock, Mode),
    Permit(Semaphore),
}

/// Renders a key template into its one allocation: short keys are formatted
/// on the stack first, then copied into the shared string.
pub fn render(args: fmt::Arguments<'_>) -> Arc<str> {
    if let Some(text) = args.as_str() {
        return text.into();
    }
    let mut stack = StackText {
        len: 0,
        bytes: [0; 256],
    };
    match stack.write_fmt(args) {
        Ok(()) => stack.as_str().into(),
        Err(_) => fmt::format(args).into(),
    }
}

struct StackText {
    len: usize,
    bytes: [u8; 256],
}

impl StackText {
    fn as_str(&self) -> &str {
        std::str::from_utf8(&self.bytes[..self.len]).expect("only whole strs are written")
    }
}

impl fmt::Write for StackText {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        let end = self.len + s.len();
        self.bytes
            .get_mut(self.len..end)
            .ok_or(fmt::Error)?
            .copy_from_slice(s.as_bytes());
        self.len = end;
        Ok(())
    }
}

/// What an annotated function may return: a `Result` whose error type can
/// carry a lock error.
#[diagnostic::on_unimplemented(
    message = "#[distributed_lock] needs the function to return `Result<T, E>` with `E: From<dlock::Error>`, not `{Self}`",
    label = "taking the lock can fail (timeout, engine unreachable, lock lost): return a `Result` whose error converts from `dlock::Error`"
)]
pub trait Outcome {
    fn lock_error(error: Error) -> Self;
}

impl<T, E: From<Error>> Outcome for Result<T, E> {
    fn lock_error(error: Error) -> Self {
        Err(error.into())
    }
}

/// What a function with `if_held = "skip"` may return: `Result<Ran<T>, E>`,
/// its body returning `Result<T, E>`.
#[diagnostic::on_unimplemented(
    message = "`if_held = \"skip\"` needs the function to return `Result<dlock::Ran<T>, E>`, not `{Self}`",
    label = "a skipped run returns `Ok(Ran::Skipped)`; the body returns `Result<T, E>`, which becomes `Ran::Done(T)`"
)]
pub trait JobOutcome: Outcome {
    type Body: Outcome;
    fn done(body: Self::Body) -> Self;
    fn skipped() -> Self;
}

impl<T, E: From<Error>> JobOutcome for Result<Ran<T>, E> {
    type Body = Result<T, E>;

    fn done(body: Result<T, E>) -> Self {
        body.map(Ran::Done)
    }

    fn skipped() -> Self {
        Ok(Ran::Skipped)
    }
}

/// Runs `body` in the holds' `tracing` spans (entered around each poll, so
/// the body's future is not moved into a wrapper) until it ends, or until
/// `stop` resolves (the lock lost or revoked). Once the body has waited,
/// `judge` is asked before each poll, so a task resumed after a pause past
/// its lease stops before it acts (the first poll follows the grant at
/// once); `stop` itself is only polled, and wakes this task, while the
/// body waits.
async fn in_hold<'h, F: Future>(
    holds: impl Iterator<Item = &'h HeldLock> + Clone,
    judge: impl Fn() -> Option<Error>,
    stop: Option<impl Future<Output = Error>>,
    body: F,
) -> Result<F::Output, Error> {
    let mut body = pin!(body);
    let mut stop = pin!(stop);
    let mut waited = false;
    poll_fn(|cx| {
        if waited && let Some(error) = judge() {
            return Poll::Ready(Err(error));
        }
        if let Poll::Ready(out) = in_spans(holds.clone(), || body.as_mut().poll(cx)) {
            return Poll::Ready(Ok(out));
        }
        match stop.as_mut().as_pin_mut() {
            Some(stop) => {
                waited = true;
                stop.poll(cx).map(Err)
            }
            None => Poll::Pending,
        }
    })
    .await
}

fn in_spans<'h, R>(mut holds: impl Iterator<Item = &'h HeldLock>, f: impl FnOnce() -> R) -> R {
    match holds.next() {
        Some(first) => first.span().in_scope(|| in_spans(holds, f)),
        None => f(),
    }
}

fn lost(held: &HeldLock, reason: LostReason) -> Error {
    Error::Lost {
        key: held.key().clone(),
        reason,
    }
}

fn revoked(held: &HeldLock) -> Error {
    Error::Revoked {
        key: held.key().clone(),
    }
}

/// Acquires, runs `body` under the lock (cancelling it if the lock is lost
/// or revoked and the site says so), then releases. The guard also releases if this
/// future is dropped or the body panics.
pub async fn run<O: Outcome>(site: &'static Site, name: Arc<str>, body: impl Future<Output = O>) -> O {
    match take(site, name).await {
        Ok(guard) => run_held(site, guard, body).await,
        Err(e) => O::lock_error(e),
    }
}

/// [`run`] for a run-once job that skips its run when the lock is held
/// elsewhere: the skip is `Ran::Skipped`, logged at debug (and counted as
/// the `busy` event by the core).
pub async fn run_job<O: JobOutcome>(
    site: &'static Site,
    name: Arc<str>,
    body: impl Future<Output = O::Body>,
) -> O {
    match take(site, name).await {
        Ok(guard) => O::done(run_held(site, guard, body).await),
        Err(Error::Timeout {
            key,
            tried_once: true,
            ..
        }) => {
            tracing::debug!(lock = %key, "run skipped: the lock is held elsewhere");
            O::skipped()
        }
        Err(e) => O::lock_error(e),
    }
}

async fn take(site: &'static Site, name: Arc<str>) -> Result<Guard, Error> {
    match site.lock(name)? {
        Wanted::Lock(lock, mode) => lock.acquire(mode).await,
        Wanted::Permit(semaphore) => semaphore.acquire().await,
    }
}

async fn run_held<O: Outcome>(site: &'static Site, guard: Guard, body: impl Future<Output = O>) -> O {
    let held = guard.held().clone();
    let judge = || site.stop_now(&held);
    let stop = site.cancels().then(|| site.stopped(&held));
    let body = CURRENT.scope(Some(held.clone()), body);
    let out = match in_hold(std::iter::once(&held), judge, stop, body).await {
        Ok(out) => out,
        Err(e) => O::lock_error(e),
    };
    // A failed release leaves the lease to free the lock; the body's outcome stands.
    let _ = guard.release().await;
    out
}

/// [`run`] for a function with several locks: they are taken as one
/// [`LockSet`], in its order, whatever order they were written in; the
/// body is cancelled when one is lost or revoked whose site says so.
pub async fn run_all<O: Outcome, const N: usize>(
    locks: [(&'static Site, Arc<str>); N],
    body: impl Future<Output = O>,
) -> O {
    let sites = locks.clone();
    let mut set = LockSet::new();
    for (site, name) in locks {
        set = match site.lock(name) {
            Ok(Wanted::Lock(lock, mode)) => set.with(lock, mode),
            Ok(Wanted::Permit(semaphore)) => set.permit(&semaphore),
            Err(e) => return O::lock_error(e),
        };
    }
    let guards = match set.acquire().await {
        Ok(guards) => guards,
        Err(e) => return O::lock_error(e),
    };
    let out = {
        let holds = guards.iter().map(Guard::held);
        // Each hold with the site that asked for it.
        let sited = holds.clone().filter_map(|held| {
            let key = held.key();
            let site = sites
                .iter()
                .find(|(site, name)| key.group() == site.group && key.name() == &**name)?;
            Some((site.0, held))
        });
        let judge = || sited.clone().find_map(|(site, held)| site.stop_now(held));
        let stop = sites
            .iter()
            .any(|(site, _)| site.cancels())
            .then(|| first_stop(sited.clone()));
        let body = CURRENT.scope(None, body);
        match in_hold(holds.clone(), judge, stop, body).await {
            Ok(out) => out,
            Err(e) => O::lock_error(e),
        }
    };
    let _ = guards.release().await;
    out
}

/// The first of `holds` to stop the body, as its site says (nothing is set
/// up until the body waits).
async fn first_stop<'h>(holds: impl Iterator<Item = (&'static Site, &'h HeldLock)>) -> Error {
    let mut signals: Vec<_> = holds
        .filter(|(site, _)| site.cancels())
        .map(|(site, held)| Box::pin(site.stopped(held)))
        .collect();
    poll_fn(|cx| {
        for signal in &mut signals {
            if let Poll::Ready(error) = signal.as_mut().poll(cx) {
                return Poll::Ready(error);
            }
        }
        Poll::Pending
    })
    .await
}
