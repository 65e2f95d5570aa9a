//! A hold: one engine-level acquisition, shared by every nested guard of the
//! task that made it, from its grant to its release or loss. The table of
//! holds (`table.rs`) is what makes locks reentrant per async task at zero
//! engine cost.

mod table;

use std::collections::hash_map::Entry;
use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

use crate::kit::{Call, Serving, within};
use crate::kit::{Engine, EngineError, Renewal, Request};
use crate::local_queue::Place;
use crate::metrics::{Event, Gauge, Series, Span};
use crate::registry::Group;
use crate::{Error, LockKey, LostReason, Mode, trace};

use table::HoldKey;
pub(crate) use table::{Filed, TaskKey, engine_id, held_by_other_tasks, held_by_this_task};

/// Locks a std mutex, ignoring poison: every critical section here is a few
/// counter updates that cannot leave the state half-written.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

#[derive(Default)]
struct Counts {
    writes: u32,
    reads: u32,
}

/// What a guard's exit leaves to do.
pub(crate) enum Exit {
    /// Other guards of the hold remain.
    Nested,
    /// The last write guard went while read guards remain.
    Downgrade,
    /// The last guard went: let go at the engine.
    Release,
}

/// A run-once job's bounds on a hold, counted from its grant.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Limits {
    /// Released sooner, the engine still keeps others out until then.
    pub at_least: Option<Duration>,
    /// The hold ends then: renewed no further, and lost.
    pub at_most: Option<Duration>,
}

/// What a grant said: its fence, and until when the engine keeps it unrenewed
/// (counted from when the granting request was sent).
pub(crate) struct Grant {
    pub fence: u64,
    pub valid_until: Instant,
}

/// A state that is set once (whether and why a hold is lost; whether its
/// holder was asked to let go), and who watches for it: the channel is
/// made only when someone asks, as most holds are never lost or asked.
#[derive(Default)]
struct Signal<T> {
    state: T,
    watchers: Option<watch::Sender<T>>,
}

impl<T: Clone + Default + PartialEq> Signal<T> {
    /// Sets the state unless it was set already; true if this set it.
    fn set(&mut self, state: T) -> bool {
        if self.state != T::default() {
            return false;
        }
        self.state = state.clone();
        if let Some(watchers) = &self.watchers {
            watchers.send_replace(state);
        }
        true
    }

    fn subscribe(&mut self) -> watch::Receiver<T> {
        let state = self.state.clone();
        self.watchers
            .get_or_insert_with(|| watch::Sender::new(state))
            .subscribe()
    }
}

/// Stops a hold's watchdog: unfiles it from the timer, or aborts its task.
pub(crate) enum Stop {
    Filed(Arc<dyn Unfile>, (Instant, u64)),
    Running(tokio::task::AbortHandle),
}

/// The watchdog's timer, where holds wait for their first renewal.
pub(crate) trait Unfile: Send + Sync {
    fn unfile(&self, key: (Instant, u64));
}

impl Stop {
    fn stop(self) {
        match self {
            Stop::Filed(timer, key) => timer.unfile(key),
            Stop::Running(task) => task.abort(),
        }
    }
}

pub(crate) struct Hold {
    pub group: Arc<Group>,
    /// The request as granted: its `fence` is the hold's token.
    pub req: Request,
    filed: HoldKey,
    counts: Mutex<Counts>,
    lost: Mutex<Signal<Option<LostReason>>>,
    asked: Mutex<Signal<bool>>,
    /// Until when the engine is known to keep the hold; the watchdog moves it
    /// on with each renewal. `None` once released.
    valid_until: Mutex<Option<Instant>>,
    watchdog: Mutex<Option<Stop>>,
    /// Serialises downgrade and release; true once released.
    released: tokio::sync::Mutex<bool>,
    /// When the grant arrived: the hold span runs from here.
    pub held_since: Instant,
    /// A run-once job's bounds, counted from `held_since`.
    limits: Limits,
    /// Its place in the local queue, given up on release or loss.
    place: Mutex<Option<Place>>,
    /// The `hold` span (`trace.rs`), closed when the hold is gone.
    pub span: tracing::Span,
}

impl Hold {
    /// Finds this task's hold on `key` (the lock, or with `permits` the
    /// semaphore) and enters it again in `mode`.
    pub fn reenter(
        group: &Group,
        key: &LockKey,
        mode: Mode,
        permits: Option<u32>,
    ) -> Result<Option<Arc<Hold>>, Error> {
        let filed = HoldKey::new(TaskKey::current(), group, key, permits.is_some());
        let table = filed.shard();
        let Some(hold) = table.get(&filed) else {
            return Ok(None);
        };
        if let (Some(asked), Some(in_use)) = (permits, hold.req.permits())
            && asked != in_use
        {
            return Err(Error::PermitCount {
                key: key.clone(),
                asked,
                in_use,
            });
        }
        if let Some(reason) = hold.lost_reason() {
            return Err(Error::Lost {
                key: key.clone(),
                reason,
            });
        }
        let mut counts = lock(&hold.counts);
        match mode {
            Mode::Write if counts.writes == 0 => return Err(Error::Upgrade { key: key.clone() }),
            Mode::Write => counts.writes += 1,
            Mode::Read => counts.reads += 1,
        }
        Ok(Some(hold.clone()))
    }

    /// Files a fresh engine-level hold for the current task. The caller
    /// starts its watchdog.
    pub fn start(
        group: Arc<Group>,
        mut req: Request,
        place: Option<Place>,
        grant: Grant,
        limits: Limits,
        since: Instant,
        acquired: &tracing::Span,
    ) -> Arc<Hold> {
        req.fence = grant.fence;
        if req.permits().is_some() {
            req.slot = group
                .engine
                .serving(&req)
                .ok()
                .and_then(|serving| serving.slot(&req));
        }
        let span = trace::hold(&req, &group.engine_name, acquired);
        let counts = match req.mode {
            Mode::Write => Counts { writes: 1, reads: 0 },
            Mode::Read => Counts { writes: 0, reads: 1 },
        };
        let hold = Arc::new(Hold {
            filed: HoldKey::new(TaskKey::current(), &group, &req.key, req.permits().is_some()),
            group,
            req,
            counts: Mutex::new(counts),
            lost: Mutex::default(),
            asked: Mutex::default(),
            valid_until: Mutex::new(Some(cap(grant.valid_until, limits.at_most.map(|d| since + d)))),
            watchdog: Mutex::new(None),
            released: tokio::sync::Mutex::new(false),
            held_since: since,
            limits,
            place: Mutex::new(place),
            span,
        });
        // Two concurrent futures of one task (join!) may both reach the engine;
        // the first filed serves reentry, the other stays unfiled.
        if let Entry::Vacant(v) = hold.filed.shard().entry(hold.filed.clone()) {
            v.insert(hold.clone());
        }
        hold.group.labels.gauge(Gauge::Held, Series::of(&hold.req), 1.0);
        hold
    }

    /// One more guard of this hold, in the hold's mode, for a share handed
    /// to another task. `Released` if the hold has ended.
    pub fn share(&self) -> Result<Mode, Error> {
        let mut counts = lock(&self.counts);
        let mode = match (counts.writes, counts.reads) {
            (0, 0) => {
                return Err(Error::Released {
                    key: self.req.key.clone(),
                });
            }
            (0, _) => Mode::Read,
            _ => Mode::Write,
        };
        match mode {
            Mode::Write => counts.writes += 1,
            Mode::Read => counts.reads += 1,
        }
        Ok(mode)
    }

    /// Files this hold for the current task too, so that the task's nested
    /// acquisitions reenter it; undone when the returned value drops.
    pub fn file_for_this_task(self: &Arc<Self>) -> Filed {
        table::file_for_this_task(self)
    }

    /// Keeps what stops the watchdog; stops it at once if the hold has
    /// already ended (its task may start after the last guard is gone).
    pub fn set_watchdog(&self, stop: Stop) {
        let mut watchdog = lock(&self.watchdog);
        let counts = lock(&self.counts);
        if counts.writes == 0 && counts.reads == 0 {
            drop((counts, watchdog));
            return stop.stop();
        }
        *watchdog = Some(stop);
    }

    /// A guard in `mode` is gone; says what that leaves to do.
    pub fn exit(self: &Arc<Self>, mode: Mode) -> Exit {
        let mut table = self.filed.shard();
        let mut counts = lock(&self.counts);
        match mode {
            Mode::Write => counts.writes -= 1,
            Mode::Read => counts.reads -= 1,
        }
        match (counts.writes, counts.reads) {
            (0, 0) => {
                if table.get(&self.filed).is_some_and(|h| Arc::ptr_eq(h, self)) {
                    table.remove(&self.filed);
                }
                drop((counts, table));
                self.stop_watchdog();
                Exit::Release
            }
            (0, _) if mode == Mode::Write => Exit::Downgrade,
            _ => Exit::Nested,
        }
    }

    fn stop_watchdog(&self) {
        let stop = lock(&self.watchdog).take();
        if let Some(stop) = stop {
            stop.stop();
        }
    }

    /// Lets go at the engine and records the hold's spans.
    pub async fn release(&self) -> Result<(), Error> {
        let mut released = self.released.lock().await;
        *released = true;
        // Judged once more before the engine lets go; after, time no longer tells.
        let _ = self.lost_reason();
        lock(&self.valid_until).take();
        let started = Instant::now();
        let keep = self
            .limits
            .at_least
            .map(|d| (self.held_since + d).saturating_duration_since(started));
        let keep = keep.filter(|k| !k.is_zero()).map(|k| self.in_lease_units(k));
        let release = self.call(move |engine, req| async move {
            // `keep` is set only where the engine offers the facet (see
            // `acquire`); a plain release asks for no facet.
            let facet = keep.and_then(|keep| Some((keep, engine.facets().hold_at_least?)));
            match facet {
                Some((keep, facet)) => facet.release_after(&req, keep).await,
                None => engine.serving(&req)?.release(&req).await,
            }
        });
        let result = within(started + self.group.settings.call_timeout, release).await;
        // The next local request goes to the engine only once this one let go.
        lock(&self.place).take();
        let (labels, series) = (&self.group.labels, Series::of(&self.req));
        let ended = Instant::now();
        labels.span(Span::Release, series, ended - started);
        labels.span(Span::Hold, series, ended - self.held_since);
        labels.gauge(Gauge::Held, series, -1.0);
        labels.event(series, Event::Released);
        match result {
            Ok(true) => self.ok_unless_lost(),
            Ok(false) => {
                self.mark_gone(LostReason::Rejected).await;
                self.ok_unless_lost()
            }
            Err(e) => Err(self.group.engine_error(&self.req, e)),
        }
    }

    /// The engine no longer has this hold: marks it lost, as `otherwise`
    /// unless an operator forced it out. Asked only on this cold path, and
    /// only if not lost already, as it may cost a round trip.
    pub(crate) async fn mark_gone(&self, otherwise: LostReason) {
        if self.lost_reason().is_some() {
            return;
        }
        let forced = self.group.capabilities.control && {
            let call = self.call(|engine, req| async move {
                match engine.facets().control {
                    Some(control) => control.forced_out(&req).await,
                    None => Ok(false),
                }
            });
            let until = Instant::now() + self.group.settings.call_timeout;
            matches!(within(until, call).await, Ok(true))
        };
        self.mark_lost(if forced {
            LostReason::ForceReleased
        } else {
            otherwise
        });
    }

    /// The lifecycle that serves this hold, for the signals it gives.
    #[inline]
    pub(crate) fn serving(&self) -> Option<Serving<'_>> {
        self.group.engine.serving(&self.req).ok()
    }

    /// The engine call `make` makes for this hold, as a [`Call`].
    fn call<T: Send + 'static, F>(&self, make: impl FnOnce(Arc<dyn Engine>, Request) -> F) -> Call<T>
    where
        F: Future<Output = Result<T, EngineError>> + Send + 'static,
    {
        let call = make(self.group.engine.clone(), self.req.clone());
        Call::new(call, Some(self.group.settings.call_timeout))
    }

    /// One renewal. Should the watchdog stop mid-call, the renewal still
    /// ends before a release or downgrade starts: each waits for it.
    pub(crate) fn renewal(self: &Arc<Self>) -> Call<Renewal> {
        let hold = self.clone();
        let call = async move {
            let released = hold.released.lock().await;
            if *released {
                return Ok(Renewal::Gone);
            }
            hold.group.engine.serving(&hold.req)?.renew(&hold.req).await
        };
        Call::new(call, Some(self.group.settings.call_timeout))
    }

    /// Turns the engine-level hold into a read hold.
    pub async fn downgrade(&self) -> Result<(), Error> {
        let released = self.released.lock().await;
        if *released {
            return Ok(());
        }
        let call = self.call(|engine, req| async move { engine.downgrade(&req).await });
        match within(Instant::now() + self.group.settings.call_timeout, call).await {
            Ok(true) => {
                if let Some(place) = lock(&self.place).as_ref() {
                    place.downgrade();
                }
                self.ok_unless_lost()
            }
            Ok(false) => {
                self.mark_gone(LostReason::Rejected).await;
                self.ok_unless_lost()
            }
            Err(e) => Err(self.group.engine_error(&self.req, e)),
        }
    }

    /// When the hold ends as lost, by its `hold_at_most`.
    fn ends_at(&self) -> Option<Instant> {
        self.limits.at_most.map(|d| self.held_since + d)
    }

    /// `keep` rounded up to what the engine can count, and no shorter
    /// than the shortest lease it takes.
    fn in_lease_units(&self, keep: Duration) -> Duration {
        let unit = self.group.capabilities.lease_unit;
        let units = keep.as_nanos().div_ceil(unit.as_nanos().max(1));
        unit.saturating_mul(units.try_into().unwrap_or(u32::MAX))
            .max(self.group.capabilities.min_lease())
    }

    fn ok_unless_lost(&self) -> Result<(), Error> {
        match self.lost_reason() {
            Some(reason) => Err(Error::Lost {
                key: self.req.key.clone(),
                reason,
            }),
            None => Ok(()),
        }
    }

    /// Records the loss once; later reasons are ignored.
    pub fn mark_lost(&self, reason: LostReason) {
        let first = lock(&self.lost).set(Some(reason));
        if first {
            // The next local waiter may go to the engine: this hold no
            // longer keeps it out, whether or not its task lets go.
            lock(&self.place).take();
            self.group.labels.event(Series::of(&self.req), Event::Lost);
            trace::lost(&self.span, reason);
        }
    }

    /// Why the hold is lost, if it is. Judged at the moment of asking: a hold
    /// past its validity is lost even before the watchdog wakes (a process
    /// resumed after a long pause must not act first and learn later).
    pub fn lost_reason(&self) -> Option<LostReason> {
        if let Some(reason) = lock(&self.lost).state {
            return Some(reason);
        }
        let now = Instant::now();
        let expired = lock(&self.valid_until).is_some_and(|until| now >= until);
        if !expired {
            return None;
        }
        let reason = match self.ends_at() {
            Some(end) if now >= end => LostReason::TimeLimit,
            _ => LostReason::LeaseElapsed,
        };
        self.mark_lost(reason);
        Some(reason)
    }

    /// Until when the engine is known to keep the hold; `None` once released.
    pub fn valid_until(&self) -> Option<Instant> {
        *lock(&self.valid_until)
    }

    /// A renewal sent at `sent` found the hold still held; `Revoked`: and
    /// its holder asked to let go.
    pub fn renewed(&self, sent: Instant, renewal: Renewal) {
        if let Some(until) = lock(&self.valid_until).as_mut() {
            *until = cap((*until).max(sent + self.req.lease), self.ends_at());
        }
        if renewal == Renewal::Revoked {
            self.mark_revoked();
        }
    }

    /// The holder was asked to let go; told once.
    fn mark_revoked(&self) {
        let first = lock(&self.asked).set(true);
        if first {
            self.group.labels.event(Series::of(&self.req), Event::Revoked);
            trace::revoked(&self.span);
        }
    }

    pub fn is_revoked(&self) -> bool {
        lock(&self.asked).state
    }

    pub fn subscribe_revoked(&self) -> watch::Receiver<bool> {
        lock(&self.asked).subscribe()
    }

    pub fn subscribe_lost(&self) -> watch::Receiver<Option<LostReason>> {
        lock(&self.lost).subscribe()
    }
}

/// `until`, or `end` if that comes first.
fn cap(until: Instant, end: Option<Instant>) -> Instant {
    end.map_or(until, |end| until.min(end))
}
