//! The acquisition lifecycle: reenter, or ask the engine and wait, then hold.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::{Instant, sleep_until};

use crate::config::Queue;
use crate::hold::Hold;
use crate::line::Place;
use crate::lock::GroupCtx;
use crate::metrics::{Event, Gauge, Labels, Span};
use crate::{Engine, Error, Guard, LockKey, Mode, OwnerId, Poll, Request};

/// Shortest lease accepted: engines with millisecond expiry need some margin.
pub const MIN_LEASE: Duration = Duration::from_millis(30);

pub(crate) async fn acquire(
    ctx: &Arc<GroupCtx>,
    name: Arc<str>,
    mode: Mode,
    wait: Option<Duration>,
    lease: Duration,
) -> Result<Guard, Error> {
    let key = LockKey::new(ctx.group.clone(), name)?;
    // Checked before reentry too: a nested read would later need an engine downgrade.
    if mode == Mode::Read && !ctx.engine.engine.supports_read() {
        return Err(ctx.unsupported("read mode"));
    }
    if let Some(hold) = Hold::reenter(ctx, &key, mode)? {
        ctx.labels.event(mode, Event::Reentered);
        return Ok(Guard::new(hold, mode));
    }
    if lease < MIN_LEASE {
        return Err(Error::config(
            "lease",
            format!("{lease:?} is too short; use at least {MIN_LEASE:?}"),
        ));
    }
    let req = Request {
        key,
        owner: OwnerId::random(),
        mode,
        lease,
        waiter_ttl: ctx.settings.waiter_ttl,
        queue: wait != Some(Duration::ZERO),
    };
    ctx.labels.event(mode, Event::Attempt);
    let since = Instant::now();
    let granted = {
        let _waiting = Waiting::start(&ctx.labels, mode);
        match local_turn(ctx, &req, since, wait).await {
            Ok(place) => wait_for_grant(ctx, &req, since, wait)
                .await
                .map(|grant| (place, grant)),
            Err(e) => Err(e),
        }
    };
    match granted {
        Ok((place, (fence, lease_from))) => {
            ctx.labels.span(Span::Wait, mode, since.elapsed());
            ctx.labels.event(mode, Event::Acquired);
            let hold = Hold::start(ctx.clone(), req, place, fence, lease_from);
            Ok(Guard::new(hold, mode))
        }
        Err(e) => {
            let event = match e {
                Error::Timeout { .. } => Event::TimedOut,
                _ => Event::Failed,
            };
            ctx.labels.event(mode, event);
            Err(e)
        }
    }
}

/// With `queue = "local"`, waits for this request's turn in the process's
/// own line for the lock (see `line.rs`), within the wait.
async fn local_turn(
    ctx: &GroupCtx,
    req: &Request,
    since: Instant,
    wait: Option<Duration>,
) -> Result<Option<Place>, Error> {
    if ctx.settings.queue == Queue::Engine {
        return Ok(None);
    }
    let engine = Arc::as_ptr(&ctx.engine.engine) as *const () as usize;
    let timeout = || Error::Timeout {
        key: req.key.clone(),
        waited: since.elapsed(),
    };
    if !req.queue {
        return Place::try_take(engine, &req.key, req.mode)
            .map(Some)
            .ok_or_else(timeout);
    }
    let turn = Place::take(engine, &req.key, req.mode);
    match wait {
        Some(wait) => tokio::time::timeout_at(since + wait, turn)
            .await
            .map(Some)
            .map_err(|_| timeout()),
        None => Ok(Some(turn.await)),
    }
}

/// Asks until granted or the wait runs out; on timeout the request is
/// withdrawn. Returns the fence and when the granting request was sent, from
/// which the engine counts the lease.
async fn wait_for_grant(
    ctx: &GroupCtx,
    req: &Request,
    since: Instant,
    wait: Option<Duration>,
) -> Result<(u64, Instant), Error> {
    let deadline = wait.map(|w| since + w);
    // An engine error is retried on the polling schedule until the wait runs
    // out (for at most a lease if it never does): a restarted or failed-over
    // server, or a dropped connection, comes back; one that stays away is an
    // error, never a silent hang.
    let give_up = deadline.unwrap_or(since + req.lease);
    let engine = &ctx.engine.engine;
    let mut withdraw = Withdraw::arm(engine.clone(), req.clone());
    let mut pauses = ctx.settings.poll.intervals();
    let mut sent = Instant::now();
    let mut queued = false;
    let mut answer = engine.acquire(req).await;
    loop {
        let (wake, failed) = match answer {
            Ok(Poll::Held(fence)) => {
                withdraw.disarm();
                return Ok((fence, sent));
            }
            Ok(Poll::Waiting(wake)) => {
                queued = true;
                (wake, None)
            }
            Err(e) => (Box::pin(std::future::pending()) as crate::Wake, Some(e)),
        };
        let now = Instant::now();
        let timed_out = match (&failed, deadline) {
            _ if !req.queue => true,
            (Some(_), _) => now >= give_up,
            (None, Some(deadline)) => now >= deadline,
            (None, None) => false,
        };
        if timed_out {
            withdraw.disarm();
            if req.queue {
                // Awaited, so the queue is clean when the caller sees the timeout.
                let _ = engine.cancel(req).await;
            }
            return Err(match failed {
                Some(e) => ctx.engine_error(&req.key, e),
                None => Error::Timeout {
                    key: req.key.clone(),
                    waited: since.elapsed(),
                },
            });
        }
        let mut next = now + pauses.next().expect("endless");
        if let Some(deadline) = deadline {
            next = next.min(deadline);
        }
        if failed.is_some() {
            next = next.min(give_up);
        }
        tokio::select! {
            _ = wake => {}
            _ = sleep_until(next) => {}
        }
        sent = Instant::now();
        answer = if queued {
            engine.poll(req).await
        } else {
            engine.acquire(req).await
        };
    }
}

/// Withdraws the request in the background if the waiting future is dropped
/// (caller cancelled) or fails, so no dead waiter or orphan hold is left behind.
struct Withdraw {
    armed: Option<(Arc<dyn Engine>, Request)>,
}

impl Withdraw {
    fn arm(engine: Arc<dyn Engine>, req: Request) -> Self {
        Withdraw {
            armed: Some((engine, req)),
        }
    }

    fn disarm(&mut self) {
        self.armed = None;
    }
}

impl Drop for Withdraw {
    fn drop(&mut self) {
        if let Some((engine, req)) = self.armed.take()
            && let Ok(runtime) = tokio::runtime::Handle::try_current()
        {
            runtime.spawn(async move {
                let _ = engine.cancel(&req).await;
            });
        }
    }
}

/// Counts a request in the `dlock_waiting` gauge for as long as it lives.
struct Waiting<'a> {
    labels: &'a Labels,
    mode: Mode,
}

impl<'a> Waiting<'a> {
    fn start(labels: &'a Labels, mode: Mode) -> Self {
        labels.gauge(Gauge::Waiting, mode, 1.0);
        Waiting { labels, mode }
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.labels.gauge(Gauge::Waiting, self.mode, -1.0);
    }
}
