//! What `#[distributed_lock]` expands to calls. Not a public API.

use std::fmt::{self, Write as _};
use std::future::{Future, poll_fn};
use std::pin::pin;
use std::sync::{Arc, OnceLock};
use std::task::Poll;
use std::time::Duration;

pub use dlock_core::Mode;
use dlock_core::{Error, HeldLock, Locks, Wait};

tokio::task_local! {
    pub(crate) static CURRENT: HeldLock;
}

/// What one annotated function asks for, as a `static` in its body.
pub struct Site {
    group: &'static str,
    engine: Option<&'static str>,
    mode: Mode,
    wait: Option<Duration>,
    lease: Option<Duration>,
    cancel_on_lost: bool,
    locks: OnceLock<Locks>,
}

impl Site {
    pub const fn new(
        group: &'static str,
        engine: Option<&'static str>,
        mode: Mode,
        wait: Option<Duration>,
        lease: Option<Duration>,
        cancel_on_lost: bool,
    ) -> Self {
        Site {
            group,
            engine,
            mode,
            wait,
            lease,
            cancel_on_lost,
            locks: OnceLock::new(),
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

/// Runs `body` in the hold's `tracing` span (entered around each poll, so
/// the body's future is not moved into a wrapper) until it ends, or, with
/// `cancel`, until the lock is lost. Once the body has waited, the loss is
/// judged before each poll, so a task resumed after a pause past its lease
/// stops before it acts (the first poll follows the grant at once); the lost
/// future itself is only polled, and wakes this task, while the body waits.
async fn in_hold<F: Future>(
    held: &HeldLock,
    body: F,
    cancel: bool,
) -> Result<F::Output, dlock_core::LostReason> {
    let mut body = pin!(body);
    let mut lost = pin!(cancel.then(|| held.lost()));
    let mut waited = false;
    poll_fn(|cx| {
        if waited && let Some(reason) = held.lost_reason() {
            return Poll::Ready(Err(reason));
        }
        if let Poll::Ready(out) = held.span().in_scope(|| body.as_mut().poll(cx)) {
            return Poll::Ready(Ok(out));
        }
        match lost.as_mut().as_pin_mut() {
            Some(lost) => {
                waited = true;
                lost.poll(cx).map(Err)
            }
            None => Poll::Pending,
        }
    })
    .await
}

/// Acquires, runs `body` under the lock (cancelling it if the lock is lost
/// and the site says so), then releases. The guard also releases if this
/// future is dropped or the body panics.
pub async fn run<O: Outcome>(site: &'static Site, name: Arc<str>, body: impl Future<Output = O>) -> O {
    let mut lock = match site.locks() {
        Ok(locks) => locks.get(name),
        Err(e) => return O::lock_error(e),
    };
    if let Some(lease) = site.lease {
        lock = lock.with_lease(lease);
    }
    if let Some(wait) = site.wait {
        lock = lock.with_wait(Wait::For(wait));
    }
    let guard = match lock.acquire(site.mode).await {
        Ok(guard) => guard,
        Err(e) => return O::lock_error(e),
    };
    let held = guard.held().clone();
    let body = CURRENT.scope(held.clone(), body);
    let out = match in_hold(&held, body, site.cancel_on_lost).await {
        Ok(out) => out,
        Err(reason) => O::lock_error(Error::Lost {
            key: held.key().clone(),
            reason,
        }),
    };
    // A failed release leaves the lease to free the lock; the body's outcome stands.
    let _ = guard.release().await;
    out
}
