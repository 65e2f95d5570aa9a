//! Keeps a hold's lease alive and turns lasting failure into the lost signal.
//!
//! A hold's renewal task is started only when its first renewal is due, by
//! one timer task per runtime: most holds end before a third of their
//! lease, and spawning a task per hold (waking an idle worker, then again to
//! abort it) cost a fast engine a tenth of its cycle. A hold whose engine
//! reports loss on its own has that signal polled once when it is filed,
//! with a waker that makes the hold due at once: the signal is watched from
//! the start without a task.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::task::{Context, Poll, Wake, Waker};
use std::time::Duration;

use tokio::runtime::{Handle, Id};
use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tokio::time::{Instant, sleep_until, timeout_at};

use crate::hold::{Hold, Stop, Unfile};
use crate::kit::{LostSignal, Renewal, RevokedSignal};
use crate::metrics::{Event, Series};
use crate::{LostReason, trace};

/// Starts renewing `hold` a third of the way through its validity, counted
/// from `now`. The hold stops it on release.
pub(crate) fn start(hold: &Arc<Hold>, now: Instant) {
    let Some(until) = hold.valid_until() else {
        return;
    };
    // A handed-over grant may be valid for less than the lease.
    let pause = (until.saturating_duration_since(now) / 3).min(hold.req.lease / 3);
    let pushed = hold.serving().and_then(|serving| serving.lost(&hold.req));
    hold.set_watchdog(renew_later(hold, now + pause, pushed));
}

fn spawn(hold: &Arc<Hold>, pushed: LostSignal) -> Stop {
    Stop::Running(tokio::spawn(renew(hold.clone(), pushed)).abort_handle())
}

/// Files `hold` with this runtime's timer, to start its task at `at`, or
/// as soon as `pushed` fires.
fn renew_later(hold: &Arc<Hold>, at: Instant, pushed: Option<LostSignal>) -> Stop {
    let timer = this_runtimes_timer();
    let key = {
        let mut due = timer.due();
        let key = (at, due.filed);
        due.filed += 1;
        let pushed = pushed.map(|signal| watch(signal, &timer, key));
        due.holds.insert(
            key,
            Filed {
                hold: Arc::downgrade(hold),
                pushed,
            },
        );
        // Only a hold due before the timer's next look wakes it.
        if due.alarm.is_none_or(|alarm| at < alarm) {
            due.alarm = Some(at);
            timer.wake.notify_one();
        }
        key
    };
    Stop::Filed(timer, key)
}

/// Polls a loss signal once, so that its firing makes the hold filed at
/// `key` due; one that has fired already does so now.
fn watch(mut signal: LostSignal, timer: &Arc<Timer>, key: Key) -> LostSignal {
    let waker = Waker::from(Arc::new(Fired {
        timer: Arc::downgrade(timer),
        key,
    }));
    match signal.as_mut().poll(&mut Context::from_waker(&waker)) {
        Poll::Pending => signal,
        Poll::Ready(()) => {
            waker.wake();
            Box::pin(std::future::ready(()))
        }
    }
}

type Key = (Instant, u64);

impl Unfile for Timer {
    fn unfile(&self, key: Key) {
        self.due().holds.remove(&key);
    }
}

/// A hold's entry with the timer.
struct Filed {
    hold: Weak<Hold>,
    /// The engine's loss signal, already polled.
    pushed: Option<LostSignal>,
}

/// Wakes the timer for a hold whose loss signal fired. It takes only the
/// timer's `fired` list, so a signal may be polled under `due`'s lock.
struct Fired {
    timer: Weak<Timer>,
    key: Key,
}

impl Wake for Fired {
    fn wake(self: Arc<Self>) {
        if let Some(timer) = self.timer.upgrade() {
            lock(&timer.fired).push(self.key);
            timer.wake.notify_one();
        }
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

/// The holds of one runtime whose first renewal is not yet due.
#[derive(Default)]
struct Timer {
    due: Mutex<Due>,
    /// Holds whose loss signal fired.
    fired: Mutex<Vec<Key>>,
    wake: Notify,
}

#[derive(Default)]
struct Due {
    /// By when each must be renewed, and in which order it was filed.
    holds: BTreeMap<Key, Filed>,
    filed: u64,
    /// When the timer task looks next; `None`: only when woken.
    alarm: Option<Instant>,
}

impl Timer {
    fn due(&self) -> MutexGuard<'_, Due> {
        lock(&self.due)
    }

    /// Starts each hold's renewal task when it is due.
    async fn start_when_due(self: Arc<Self>) {
        loop {
            let alarm = self.due().alarm;
            match alarm {
                Some(at) => tokio::select! {
                    _ = sleep_until(at) => {}
                    _ = self.wake.notified() => {}
                },
                None => self.wake.notified().await,
            }
            let fired = std::mem::take(&mut *lock(&self.fired));
            let ready = {
                let mut due = self.due();
                let later = due.holds.split_off(&(Instant::now(), u64::MAX));
                let mut ready = std::mem::replace(&mut due.holds, later);
                for key in fired {
                    ready.extend(due.holds.remove_entry(&key));
                }
                due.alarm = due.holds.first_key_value().map(|((at, _), _)| *at);
                ready
            };
            for filed in ready.into_values() {
                let Some(hold) = filed.hold.upgrade() else {
                    continue;
                };
                let pushed = filed.pushed.unwrap_or_else(|| Box::pin(std::future::pending()));
                hold.set_watchdog(spawn(&hold, pushed));
            }
        }
    }
}

/// Resolves when `asked` fires, and then takes it; never without one.
async fn fired(asked: &mut Option<RevokedSignal>) {
    match asked {
        Some(signal) => {
            signal.await;
            *asked = None;
        }
        None => std::future::pending().await,
    }
}

/// One runtime's timer and its task.
struct Running {
    runtime: Id,
    task: JoinHandle<()>,
    timer: Arc<Timer>,
}

/// Every runtime's timer; one whose runtime has shut down is dropped when
/// the next one is made.
static TIMERS: Mutex<Vec<Running>> = Mutex::new(Vec::new());

fn this_runtimes_timer() -> Arc<Timer> {
    let runtime = Handle::current().id();
    let mut timers = TIMERS.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(running) = timers
        .iter()
        .find(|r| r.runtime == runtime && !r.task.is_finished())
    {
        return running.timer.clone();
    }
    timers.retain(|r| !r.task.is_finished());
    let timer = Arc::new(Timer::default());
    let task = tokio::spawn(timer.clone().start_when_due());
    timers.push(Running {
        runtime,
        task,
        timer: timer.clone(),
    });
    timer
}

/// Renews `hold` now, then every lease/3, until released or lost; at once
/// when the engine hears it may have been asked to let go.
async fn renew(hold: Arc<Hold>, mut pushed: LostSignal) {
    let lease = hold.req.lease;
    let mut pause = Duration::ZERO;
    let mut asked = hold.serving().and_then(|serving| serving.revoked(&hold.req));
    loop {
        let Some(deadline) = hold.valid_until() else {
            return;
        };
        let mut heard = false;
        tokio::select! {
            // A fired signal comes first, before a renewal that is due.
            biased;
            _ = &mut pushed => return hold.mark_gone(LostReason::Engine).await,
            _ = fired(&mut asked) => heard = true,
            _ = sleep_until((Instant::now() + pause).min(deadline)) => {}
        }
        if hold.lost_reason().is_some() {
            return;
        }
        let sent = Instant::now();
        match timeout_at(deadline, hold.renewal()).await {
            Ok(Ok(Renewal::Gone)) => return hold.mark_gone(LostReason::Rejected).await,
            Ok(Ok(renewal)) => {
                hold.renewed(sent, renewal);
                pause = lease / 3;
                hold.group.labels.event(Series::of(&hold.req), Event::Renewed);
            }
            // Keep trying, more often, until the validity runs out.
            failed => {
                pause = lease / 9;
                hold.group
                    .labels
                    .event(Series::of(&hold.req), Event::RenewalFailed);
                match failed {
                    Ok(Err(e)) => trace::renewal_failed(&hold.span, &e),
                    _ => trace::renewal_failed(&hold.span, &"no answer while the lease lasted"),
                }
            }
        }
        // Listens again: a revoked hold may still be forced out.
        if heard {
            asked = hold.serving().and_then(|serving| serving.revoked(&hold.req));
        }
    }
}
