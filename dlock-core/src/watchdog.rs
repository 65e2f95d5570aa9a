//! Keeps a hold's lease alive and turns lasting failure into the lost signal.
//!
//! A hold whose engine reports loss on its own gets a renewal task at once,
//! to watch that signal. Any other hold's task is started only when its
//! first renewal is due, by one timer task per runtime: most holds end
//! before a third of their lease, and spawning a task per hold (waking an
//! idle worker, then again to abort it) cost a fast engine a tenth of its
//! cycle.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use tokio::runtime::{Handle, Id};
use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tokio::time::{Instant, sleep_until, timeout_at};

use crate::LostSignal;
use crate::hold::{Hold, Stop};
use crate::metrics::Event;
use crate::{LostReason, trace};

/// Starts renewing `hold` a third of the way through its validity. The hold
/// stops it on release.
pub(crate) fn start(hold: &Arc<Hold>) {
    let Some(until) = hold.valid_until() else {
        return;
    };
    // A handed-over grant may be valid for less than the lease.
    let pause = (until.saturating_duration_since(Instant::now()) / 3).min(hold.req.lease / 3);
    let stop = match hold.group.engine.lost(&hold.req) {
        Some(pushed) => spawn(hold, pushed, pause),
        None => renew_later(hold, Instant::now() + pause),
    };
    hold.set_watchdog(stop);
}

fn spawn(hold: &Arc<Hold>, pushed: LostSignal, pause: Duration) -> Stop {
    let task = tokio::spawn(renew(hold.clone(), pushed, pause)).abort_handle();
    Box::new(move || task.abort())
}

/// Files `hold` with this runtime's timer, to start its task at `at`.
fn renew_later(hold: &Arc<Hold>, at: Instant) -> Stop {
    let timer = this_runtimes_timer();
    let key = {
        let mut due = timer.due();
        let key = (at, due.filed);
        due.filed += 1;
        due.holds.insert(key, Arc::downgrade(hold));
        // Only a hold due before the timer's next look wakes it.
        if due.alarm.is_none_or(|alarm| at < alarm) {
            due.alarm = Some(at);
            timer.wake.notify_one();
        }
        key
    };
    Box::new(move || {
        timer.due().holds.remove(&key);
    })
}

/// The holds of one runtime whose first renewal is not yet due.
#[derive(Default)]
struct Timer {
    due: Mutex<Due>,
    wake: Notify,
}

#[derive(Default)]
struct Due {
    /// By when each must be renewed, and in which order it was filed.
    holds: BTreeMap<(Instant, u64), Weak<Hold>>,
    filed: u64,
    /// When the timer task looks next; `None`: only when woken.
    alarm: Option<Instant>,
}

impl Timer {
    fn due(&self) -> MutexGuard<'_, Due> {
        self.due.lock().unwrap_or_else(|e| e.into_inner())
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
            let ready = {
                let mut due = self.due();
                let later = due.holds.split_off(&(Instant::now(), u64::MAX));
                let ready = std::mem::replace(&mut due.holds, later);
                due.alarm = due.holds.first_key_value().map(|((at, _), _)| *at);
                ready
            };
            for hold in ready.into_values().filter_map(|hold| hold.upgrade()) {
                let stop = spawn(&hold, Box::pin(std::future::pending()), Duration::ZERO);
                hold.set_watchdog(stop);
            }
        }
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

/// Renews `hold` after `pause`, then every lease/3, until released or lost.
async fn renew(hold: Arc<Hold>, mut pushed: LostSignal, mut pause: Duration) {
    let engine = hold.group.engine.clone();
    let lease = hold.req.lease;
    loop {
        let Some(deadline) = hold.valid_until() else {
            return;
        };
        tokio::select! {
            _ = sleep_until((Instant::now() + pause).min(deadline)) => {}
            _ = &mut pushed => return hold.mark_lost(LostReason::Engine),
        }
        if hold.lost_reason().is_some() {
            return;
        }
        let sent = Instant::now();
        match timeout_at(deadline, engine.renew(&hold.req)).await {
            Ok(Ok(true)) => {
                hold.renewed(sent);
                pause = lease / 3;
                hold.group.labels.event(hold.req.mode, Event::Renewed);
            }
            Ok(Ok(false)) => return hold.mark_lost(LostReason::Rejected),
            // Keep trying, more often, until the validity runs out.
            failed => {
                pause = lease / 9;
                hold.group.labels.event(hold.req.mode, Event::RenewalFailed);
                match failed {
                    Ok(Err(e)) => trace::renewal_failed(&hold.span, &e),
                    _ => trace::renewal_failed(&hold.span, &"no answer while the lease lasted"),
                }
            }
        }
    }
}
