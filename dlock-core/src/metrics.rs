//! What dlock records, through the `metrics` facade only: the application
//! installs a recorder (Prometheus, StatsD, ...); dlock never chooses one.
//!
//! | name | type | labels |
//! |---|---|---|
//! | `dlock_events_total` | counter | `group`, `mode`, `engine`, `event` (see [`Event`]) |
//! | `dlock_wait_seconds` | histogram | `group`, `mode`, `engine`: first attempt → granted |
//! | `dlock_hold_seconds` | histogram | outermost acquire → final release (reentrant timer) |
//! | `dlock_release_seconds` | histogram | the release call |
//! | `dlock_held` | gauge | holds open in this process |
//! | `dlock_waiting` | gauge | requests waiting in this process |
//!
//! Recording is fire-and-forget: a recorder can neither block nor fail a lock operation.

use std::sync::Arc;
use std::time::Duration;

use metrics::{Label, SharedString};

use crate::Mode;

pub const EVENTS: &str = "dlock_events_total";
pub const WAIT_SECONDS: &str = "dlock_wait_seconds";
pub const HOLD_SECONDS: &str = "dlock_hold_seconds";
pub const RELEASE_SECONDS: &str = "dlock_release_seconds";
pub const HELD: &str = "dlock_held";
pub const WAITING: &str = "dlock_waiting";

/// The `event` label of `dlock_events_total`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Event {
    /// An outermost acquisition started (reentries are not attempts).
    Attempt,
    Acquired,
    /// A nested acquisition in a task that already held the lock.
    Reentered,
    TimedOut,
    /// The engine failed the acquisition.
    Failed,
    Released,
    Renewed,
    RenewalFailed,
    Lost,
    /// A dead waiter was removed from the head of a queue.
    WaiterKicked,
}

impl Event {
    pub fn as_str(self) -> &'static str {
        match self {
            Event::Attempt => "attempt",
            Event::Acquired => "acquired",
            Event::Reentered => "reentered",
            Event::TimedOut => "timed_out",
            Event::Failed => "failed",
            Event::Released => "released",
            Event::Renewed => "renewed",
            Event::RenewalFailed => "renewal_failed",
            Event::Lost => "lost",
            Event::WaiterKicked => "waiter_kicked",
        }
    }
}

/// The labels shared by every series of one group on one engine.
#[derive(Clone, Debug)]
pub struct Labels {
    group: SharedString,
    engine: SharedString,
}

impl Labels {
    pub fn new(group: Arc<str>, engine: Arc<str>) -> Self {
        Labels {
            group: group.into(),
            engine: engine.into(),
        }
    }

    fn with_mode(&self, mode: Mode) -> Vec<Label> {
        vec![
            Label::from_static_parts("mode", mode.as_str()),
            Label::new("group", self.group.clone()),
            Label::new("engine", self.engine.clone()),
        ]
    }

    pub fn event(&self, mode: Mode, event: Event) {
        let mut labels = self.with_mode(mode);
        labels.push(Label::from_static_parts("event", event.as_str()));
        metrics::counter!(EVENTS, labels).increment(1);
    }

    pub fn span(&self, name: &'static str, mode: Mode, took: Duration) {
        metrics::histogram!(name, self.with_mode(mode)).record(took.as_secs_f64());
    }

    pub fn gauge(&self, name: &'static str, mode: Mode, delta: f64) {
        metrics::gauge!(name, self.with_mode(mode)).increment(delta);
    }
}

/// Adds units and help texts for exporters; call once after installing a recorder.
pub fn describe() {
    use metrics::Unit;
    metrics::describe_counter!(EVENTS, "Lock events, by `event`");
    metrics::describe_histogram!(
        WAIT_SECONDS,
        Unit::Seconds,
        "Time from first attempt to grant"
    );
    metrics::describe_histogram!(
        HOLD_SECONDS,
        Unit::Seconds,
        "Time from outermost acquire to final release"
    );
    metrics::describe_histogram!(RELEASE_SECONDS, Unit::Seconds, "Time spent releasing");
    metrics::describe_gauge!(HELD, "Locks held by this process");
    metrics::describe_gauge!(WAITING, "Lock requests waiting in this process");
}
