//! The acquisition lifecycle: reenter, or ask the engine and wait, then hold.

use std::future::{Future, poll_fn};
use std::pin::{Pin, pin};
use std::sync::Arc;
use std::time::Duration;

use tokio::time::{Instant, sleep_until, timeout};

use crate::config::{Queue, Wait};
use crate::guard::Guard;
use crate::hold::{Grant, Hold, Limits, engine_id, held_by_other_tasks};
use crate::kit::{Call, Woken, within};
use crate::kit::{EngineError, Kind, Poll, Records, Renewal, Request};
use crate::local_queue::Place;
use crate::metrics::{Event, Gauge, Labels, Series, Span};
use crate::registry::Group;
use crate::{Error, LockKey, Mode, trace, watchdog};

/// How long a timed-out caller waits for its request to be withdrawn before
/// it is answered; a slower withdrawal finishes in the background.
const WITHDRAW_GRACE: Duration = Duration::from_millis(20);

pub(crate) async fn acquire(
    group: &Arc<Group>,
    name: Arc<str>,
    mode: Mode,
    kind: Kind,
    wait: Wait,
    lease: Duration,
    limits: Limits,
) -> Result<Guard, Error> {
    let key = LockKey::new(group.name.clone(), name)?;
    let permits = kind.permits();
    if let Kind::Election(Some(_)) = kind {
        group.facet("a campaign with a value of its own", |f| f.election_values)?;
    }
    if limits.at_least.is_some() {
        group.facet("hold at least", |f| f.hold_at_least)?;
    }
    // Checked before reentry too: a nested read would later need an engine downgrade.
    if mode == Mode::Read && !group.capabilities.read {
        return Err(group.unsupported("read mode".to_owned()));
    }
    let series = Series::new(mode, permits);
    if let Some(n) = permits {
        check_permits(group, n)?;
    }
    if let Some(hold) = Hold::reenter(group, &key, mode, permits)? {
        group.labels.event(series, Event::Reentered);
        return Ok(Guard::new(hold, mode));
    }
    group.check_lease(lease)?;
    let mut req = Request::new(key, mode, lease);
    req.kind = kind;
    req.try_once = wait == Wait::TRY_ONCE;
    group.labels.event(series, Event::Attempt);
    let span = trace::acquisition(&req, &group.engine_name);
    let since = Instant::now();
    let granted = {
        let _waiting = Waiting::start(&group.labels, series);
        let waited = async {
            let place = local_turn(group, &req, since, wait).await?;
            let grant = wait_for_grant(group, &req, since, wait).await?;
            Ok((place, grant))
        };
        // The span is entered around each poll; a wrapper (`instrument`)
        // would move the whole waiting future into itself on every call.
        let mut waited = pin!(watch_a_long_wait(group, &req, since, waited));
        poll_fn(|cx| span.in_scope(|| waited.as_mut().poll(cx))).await
    };
    // One clock read serves the wait's span, the hold's start and its first renewal.
    let now = Instant::now();
    let waited = now - since;
    match granted {
        Ok((place, grant)) => {
            group.labels.span(Span::Wait, series, waited);
            group.labels.event(series, Event::Acquired);
            trace::waited(&span, waited, Event::Acquired.as_str());
            let fresh = grant.valid_until > now;
            let hold = Hold::start(group.clone(), req, place, grant, limits, now, &span);
            if fresh {
                watchdog::start(&hold, now);
                return Ok(Guard::new(hold, mode));
            }
            // The guard first: dropped while confirming, it lets the hold go.
            let guard = Guard::new(hold.clone(), mode);
            let now = confirm(&hold).await;
            watchdog::start(&hold, now);
            Ok(guard)
        }
        Err(e) => {
            let event = match e {
                Error::Timeout { tried_once: true, .. } => Event::Busy,
                Error::Timeout { .. } => Event::TimedOut,
                Error::Deadlock { .. } => Event::Deadlock,
                _ => Event::Failed,
            };
            group.labels.event(series, event);
            trace::waited(&span, waited, event.as_str());
            trace::not_acquired(&span, &e);
            Err(e)
        }
    }
}

/// A semaphore needs a permit to hand out, and an engine that keeps them.
fn check_permits(group: &Group, permits: u32) -> Result<(), Error> {
    if permits == 0 {
        return Err(Error::config("permits", "a semaphore needs at least 1 permit"));
    }
    group.facet("semaphores", |f| f.semaphores)?;
    Ok(())
}

/// With `queue = "local"`, waits for this request's turn in the process's
/// own queue for the lock (see `local_queue.rs`), within the wait.
async fn local_turn(
    group: &Group,
    req: &Request,
    since: Instant,
    wait: Wait,
) -> Result<Option<Place>, Error> {
    // A semaphore's waiters go to the engine each: the line lets one
    // writer through at a time, which would cap a process at one permit.
    if group.settings.queue == Queue::Engine || req.permits().is_some() {
        return Ok(None);
    }
    let engine = engine_id(group);
    let timeout = || Error::Timeout {
        key: req.key.clone(),
        waited: since.elapsed(),
        tried_once: req.try_once,
    };
    if req.try_once {
        return Place::try_take(engine, &req.key, req.mode)
            .map(Some)
            .ok_or_else(timeout);
    }
    let turn = Place::take(engine, &req.key, req.mode);
    match wait {
        Wait::For(wait) => tokio::time::timeout_at(since + wait, turn)
            .await
            .map(Some)
            .map_err(|_| timeout()),
        Wait::Forever => Ok(Some(turn.await)),
    }
}

/// A grant whose call took longer than its validity (a slow connect on a
/// busy machine, a handoff heard late) is not known to stand, and the hold
/// would be lost at once. One renewal, which checks that the hold is still
/// this request's, proves it and counts the validity from there; if it
/// fails, the hold is lost when first looked at, as before. The time after.
async fn confirm(hold: &Arc<Hold>) -> Instant {
    let sent = Instant::now();
    match hold.renewal().await {
        Ok(Renewal::Gone) | Err(_) => {}
        Ok(renewal) => hold.renewed(sent, renewal),
    }
    Instant::now()
}

/// Says on the wait's span, if anyone listens, whom it waits behind: the
/// hold spans of this process's holders are linked to it, and where the
/// engine keeps records, the holders' labels are read in the background,
/// not slowing the wait (see `trace.rs`).
fn name_the_holders(group: &Group, req: &Request) {
    let span = tracing::Span::current();
    if span.is_disabled() {
        return;
    }
    for hold in held_by_other_tasks(group, req) {
        span.follows_from(&hold.span);
    }
    if group.capabilities.records == Records::None {
        return;
    }
    let (engine, key, permits) = (group.engine.clone(), req.key.clone(), req.permits());
    let until = Instant::now() + group.settings.call_timeout;
    tokio::spawn(async move {
        let Some(inspect) = engine.facets().inspect else {
            return;
        };
        if let Ok(view) = within(until, inspect.inspect(&key, permits)).await {
            trace::waited_for(&span, &view);
        }
    });
}

/// Asks until granted or the wait runs out; on timeout the request is
/// withdrawn. Every call is bounded: by the wait, and by `call_timeout`.
async fn wait_for_grant(group: &Group, req: &Request, since: Instant, wait: Wait) -> Result<Grant, Error> {
    let deadline = match wait {
        Wait::For(wait) if !req.try_once => Some(since + wait),
        _ => None,
    };
    let engine = &group.engine;
    let call_timeout = group.settings.call_timeout;
    let mut withdraw = Withdraw::arm(group, req);
    let mut pauses = group.settings.poll.intervals();
    let mut queued = false;
    // The last failure, and since when the engine has failed without a break.
    let mut failure: Option<(EngineError, Instant)> = None;
    loop {
        // An engine whose wake-up fires at once, again and again, must
        // still let the other tasks of this worker run (the holder among them).
        tokio::task::consume_budget().await;
        let sent = Instant::now();
        // The wait ran out while pausing: a call now could only be cut off.
        if (queued || failure.is_some()) && deadline.is_some_and(|d| sent >= d) {
            return Err(give_up(&mut withdraw, group, req, since, failure.map(|(e, _)| e)).await);
        }
        let bound = deadline.map_or(sent + call_timeout, |d| d.min(sent + call_timeout));
        let answer = withdraw
            .answer(bound, || {
                let (engine, req) = (engine.clone(), req.clone());
                let call = async move {
                    let serving = engine.serving(&req)?;
                    if queued {
                        serving.poll(&req).await
                    } else {
                        serving.acquire(&req).await
                    }
                };
                Call::new(call, Some(call_timeout))
            })
            .await;
        let answer = match answer {
            Ok(Poll::Held(fence)) => {
                withdraw.disarm();
                return Ok(Grant {
                    fence,
                    valid_until: sent + req.lease,
                });
            }
            Ok(Poll::Waiting(wake)) => Ok(wake),
            Err(e) => Err(e),
        };
        let now = Instant::now();
        let wake = match answer {
            Ok(wake) => {
                if !queued && !req.try_once {
                    name_the_holders(group, req);
                }
                queued = true;
                failure = None;
                wake
            }
            // Cut off by the wait's deadline: a timeout, unless the engine
            // was failing already (then its last failure is the answer).
            Err(_) if deadline.is_some_and(|d| now >= d) => {
                return Err(give_up(&mut withdraw, group, req, since, failure.map(|(e, _)| e)).await);
            }
            // An answer, not a failure: asking again cannot change it.
            Err(e @ EngineError::PermitsDiffer { .. }) => {
                return Err(give_up(&mut withdraw, group, req, since, Some(e)).await);
            }
            Err(e) => {
                let failing_since = failure.map_or(sent, |(_, since)| since);
                failure = Some((e, failing_since));
                never()
            }
        };
        if req.try_once {
            if failure.is_none() {
                withdraw.disarm(); // answered busy: nothing was queued
            }
            return Err(give_up(&mut withdraw, group, req, since, failure.map(|(e, _)| e)).await);
        }
        // An engine error is retried on the polling schedule until the wait
        // runs out, or, waiting forever, until the engine has failed for a
        // whole lease: a restarted or failed-over server, or a dropped
        // connection, comes back; one that stays away is an error, never a
        // silent hang.
        let give_up_at = match (&failure, deadline) {
            (_, Some(deadline)) => Some(deadline),
            (Some((_, failing_since)), None) => Some(*failing_since + req.lease),
            (None, None) => None,
        };
        if give_up_at.is_some_and(|at| now >= at) {
            return Err(give_up(&mut withdraw, group, req, since, failure.map(|(e, _)| e)).await);
        }
        // Jittered down to half, so waiters of an engine without a queue do
        // not poll in step; never slower than the configured schedule.
        let pause = pauses
            .next()
            .expect("endless")
            .mul_f64(rand::random_range(0.5..=1.0));
        let next = give_up_at.map_or(now + pause, |at| at.min(now + pause));
        tokio::select! {
            woken = wake => if let Woken::Granted { fence, valid_for } = woken {
                withdraw.disarm();
                return Ok(Grant { fence, valid_until: sent + valid_for });
            },
            _ = sleep_until(next) => {}
        }
    }
}

/// Withdraws the request, and says why it ended: the engine's last failure,
/// or a timeout.
async fn give_up(
    withdraw: &mut Withdraw<'_>,
    group: &Group,
    req: &Request,
    since: Instant,
    failure: Option<EngineError>,
) -> Error {
    withdraw.now().await;
    match failure {
        Some(e) => group.engine_error(req, e),
        None => Error::Timeout {
            key: req.key.clone(),
            waited: since.elapsed(),
            tried_once: req.try_once,
        },
    }
}

/// Runs `waited`. Most waits end at their first poll (an uncontended
/// grant): then nothing more. A longer one is watched, with no layer
/// around `waited` itself until then: it may look for a deadlock
/// (`deadlock.rs`), and warns if it is stuck behind this process.
async fn watch_a_long_wait<T>(
    group: &Arc<Group>,
    req: &Request,
    since: Instant,
    waited: impl Future<Output = Result<T, Error>>,
) -> Result<T, Error> {
    let mut waited = pin!(waited);
    if let Some(out) = at_once(waited.as_mut()).await {
        return out;
    }
    let warned = warn_if_stuck_behind_this_process(group, req, since, waited);
    crate::deadlock::watched(group, req, since, warned, take_wait).await
}

/// A deadlock look's wait for one of its task's holds: a lock of its own,
/// tried once (`deadlock.rs`).
fn take_wait(waits: Arc<Group>, name: String) -> Pin<Box<dyn Future<Output = Option<Guard>> + Send>> {
    Box::pin(async move {
        let lease = waits.settings.lease;
        let limits = Limits::default();
        acquire(
            &waits,
            name.into(),
            Mode::Write,
            Kind::Lock,
            Wait::TRY_ONCE,
            lease,
            limits,
        )
        .await
        .ok()
    })
}

/// Runs `waited`; if it takes `deadlock_warning` and another task of this
/// process holds the lock, says so: the classic trap is a holder awaiting a
/// task it spawned that asks for the same lock.
async fn warn_if_stuck_behind_this_process<T>(
    group: &Group,
    req: &Request,
    since: Instant,
    mut waited: Pin<&mut impl Future<Output = T>>,
) -> T {
    tokio::select! {
        biased;
        out = &mut waited => return out,
        _ = sleep_until(since + group.settings.deadlock_warning) => {}
    }
    // The lock's holder, or every permit of the semaphore, held by other
    // tasks of this process: a semaphore with a permit left elsewhere is
    // only busy.
    let holds = held_by_other_tasks(group, req);
    let all_here = holds.len() >= req.permits().unwrap_or(1) as usize;
    if let Some(hold) = holds.first().filter(|_| all_here) {
        tracing::warn!(
            lock = %req.key,
            waited = ?since.elapsed(),
            held_for = ?hold.held_since.elapsed(),
            "waiting for a lock another task of this process holds; if that task awaits this one, \
             neither moves again: hand this task a share of the hold (dlock::spawn, HeldLock::share)"
        );
    }
    waited.await
}

/// `fut`'s output if it finishes at its first poll.
async fn at_once<F: Future>(mut fut: Pin<&mut F>) -> Option<F::Output> {
    poll_fn(|cx| match fut.as_mut().poll(cx) {
        std::task::Poll::Ready(out) => std::task::Poll::Ready(Some(out)),
        std::task::Poll::Pending => std::task::Poll::Ready(None),
    })
    .await
}

fn never() -> crate::kit::Wake {
    Box::pin(std::future::pending())
}

/// Withdraws the request if the waiting future is dropped (caller cancelled)
/// or gives up, so no dead waiter or orphan hold is left behind. It also
/// keeps the request's engine call under way: a call is never cut (see
/// `run_on.rs`), so a withdrawal waits for its end, and a call not answered
/// by `call_timeout` is awaited again rather than sent twice. The withdrawal
/// runs in its own task, bounded by `call_timeout`.
struct Withdraw<'a> {
    armed: Option<(&'a Group, &'a Request)>,
    under_way: Option<Call<Poll>>,
}

impl<'a> Withdraw<'a> {
    fn arm(group: &'a Group, req: &'a Request) -> Self {
        Withdraw {
            armed: Some((group, req)),
            under_way: None,
        }
    }

    fn disarm(&mut self) {
        self.armed = None;
    }

    /// Awaits the call under way, or else the one `next` makes, until `bound`.
    async fn answer(
        &mut self,
        bound: Instant,
        next: impl FnOnce() -> Call<Poll>,
    ) -> Result<Poll, EngineError> {
        let call = self.under_way.get_or_insert_with(next);
        let answer = within(bound, &mut *call).await;
        if call.is_done() {
            self.under_way = None;
        }
        answer
    }

    /// Withdraws now, and waits a moment for it, so that the queue is
    /// usually clean when the caller hears of its timeout.
    async fn now(&mut self) {
        if let Some(task) = self.spawn() {
            let _ = timeout(WITHDRAW_GRACE, task).await;
        }
    }

    fn spawn(&mut self) -> Option<tokio::task::JoinHandle<()>> {
        let (group, req) = self.armed.take()?;
        let runtime = tokio::runtime::Handle::try_current().ok()?;
        let under_way = self.under_way.take().and_then(Call::into_rest);
        let (engine, req) = (group.engine.clone(), req.clone());
        let call_timeout = group.settings.call_timeout;
        Some(runtime.spawn(async move {
            if let Some(call) = under_way {
                let _ = timeout(call_timeout, call).await;
            }
            let cancel = async move { engine.serving(&req)?.cancel(&req).await };
            let cancel = Call::new(cancel, Some(call_timeout));
            let _ = within(Instant::now() + call_timeout, cancel).await;
        }))
    }
}

impl Drop for Withdraw<'_> {
    fn drop(&mut self) {
        self.spawn();
    }
}

/// Counts a request in the `dlock_waiting` gauge for as long as it lives.
struct Waiting<'a> {
    labels: &'a Labels,
    series: Series,
}

impl<'a> Waiting<'a> {
    fn start(labels: &'a Labels, series: Series) -> Self {
        labels.gauge(Gauge::Waiting, series, 1.0);
        Waiting { labels, series }
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.labels.gauge(Gauge::Waiting, self.series, -1.0);
    }
}
