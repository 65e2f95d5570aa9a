//! What dlock records, through the `metrics` facade only: the application
//! installs a recorder (Prometheus, StatsD, ...); dlock never chooses one.
//!
//! | name | type | labels |
//! |---|---|---|
//! | `dlock_events_total` | counter | `group`, `mode`, `engine`, `event` (see [`Event`]) |
//! | `dlock_wait_seconds` | histogram | `group`, `mode`, `engine`: first attempt → granted |
//! | `dlock_hold_seconds` | histogram | grant of the outermost acquisition → final release (reentrant timer) |
//! | `dlock_release_seconds` | histogram | the release call |
//! | `dlock_held` | gauge | holds open in this process |
//! | `dlock_waiting` | gauge | requests waiting in this process |
//! | `dlock_operator_acts_total` | counter | `group`, `engine`, `act`: force releases and revocations made from this process |
//!
//! A semaphore's permits are recorded under the same names with `mode` =
//! `permit` and one more label, `permits`: the semaphore's count ([`Series`]).
//!
//! Recording is fire-and-forget: a recorder can neither block nor fail a lock operation.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use metrics::{Label, SharedString};

use crate::Mode;
use crate::kit::Request;

/// Counter of lock events, labelled by [`Event`].
pub const EVENTS: &str = "dlock_events_total";
/// Histogram: seconds from an outermost acquisition's first attempt to its grant.
pub const WAIT_SECONDS: &str = "dlock_wait_seconds";
/// Histogram: seconds from an outermost acquisition's grant to its release.
pub const HOLD_SECONDS: &str = "dlock_hold_seconds";
/// Histogram: seconds the engine's release call took.
pub const RELEASE_SECONDS: &str = "dlock_release_seconds";
/// Gauge: holds open in this process.
pub const HELD: &str = "dlock_held";
/// Gauge: requests waiting in this process.
pub const WAITING: &str = "dlock_waiting";
/// Counter of operators' acts on holders made from this process, labelled
/// `act` = `force release` or `revocation`.
pub const OPERATOR_ACTS: &str = "dlock_operator_acts_total";

/// The `event` label of `dlock_events_total`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Event {
    /// An outermost acquisition started (reentries are not attempts).
    Attempt,
    /// An outermost acquisition was granted.
    Acquired,
    /// A nested acquisition in a task that already held the lock.
    Reentered,
    /// An outermost acquisition's wait ran out.
    TimedOut,
    /// A try that does not wait found the lock taken: a run-once job
    /// skipped its run.
    Busy,
    /// The engine failed the acquisition.
    Failed,
    /// A hold was let go at the engine (counted whatever the engine answered).
    Released,
    /// The watchdog renewed a lease.
    Renewed,
    /// A renewal failed or got no answer in time; the watchdog tries again.
    RenewalFailed,
    /// A hold became known lost (counted once per hold).
    Lost,
    /// A holder learnt it was asked to let go (counted once per hold).
    Revoked,
    /// A wait closed a cycle of waits and gave up (`Error::Deadlock`):
    /// counted once per cycle, by the member that gives up.
    Deadlock,
}

impl Event {
    /// Every event, in label order.
    pub const ALL: [Event; 12] = [
        Event::Attempt,
        Event::Acquired,
        Event::Reentered,
        Event::TimedOut,
        Event::Busy,
        Event::Failed,
        Event::Released,
        Event::Renewed,
        Event::RenewalFailed,
        Event::Lost,
        Event::Revoked,
        Event::Deadlock,
    ];

    /// The `event` label's value: `"attempt"`, `"timed_out"`, ...
    pub fn as_str(self) -> &'static str {
        match self {
            Event::Attempt => "attempt",
            Event::Acquired => "acquired",
            Event::Reentered => "reentered",
            Event::TimedOut => "timed_out",
            Event::Busy => "busy",
            Event::Failed => "failed",
            Event::Released => "released",
            Event::Renewed => "renewed",
            Event::RenewalFailed => "renewal_failed",
            Event::Lost => "lost",
            Event::Revoked => "revoked",
            Event::Deadlock => "deadlock",
        }
    }
}

/// The span histograms.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Span {
    /// [`WAIT_SECONDS`].
    Wait,
    /// [`HOLD_SECONDS`].
    Hold,
    /// [`RELEASE_SECONDS`].
    Release,
}

impl Span {
    const ALL: [Span; 3] = [Span::Wait, Span::Hold, Span::Release];

    /// The histogram's name.
    pub fn name(self) -> &'static str {
        match self {
            Span::Wait => WAIT_SECONDS,
            Span::Hold => HOLD_SECONDS,
            Span::Release => RELEASE_SECONDS,
        }
    }
}

/// The gauges.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Gauge {
    /// [`HELD`].
    Held,
    /// [`WAITING`].
    Waiting,
}

impl Gauge {
    const ALL: [Gauge; 2] = [Gauge::Held, Gauge::Waiting];

    /// The gauge's name.
    pub fn name(self) -> &'static str {
        match self {
            Gauge::Held => HELD,
            Gauge::Waiting => WAITING,
        }
    }
}

/// Which of a group's series a recording goes to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Series {
    /// A lock, in one mode: `mode="write"` or `mode="read"`.
    Lock(Mode),
    /// A permit of a semaphore of this many permits: `mode="permit"`,
    /// `permits="5"`.
    Permit(u32),
}

impl Series {
    /// The series of a request in `mode`, for a semaphore's permit if
    /// `permits` says so.
    pub fn new(mode: Mode, permits: Option<u32>) -> Self {
        match permits {
            Some(n) => Series::Permit(n),
            None => Series::Lock(mode),
        }
    }

    /// The series of `req`.
    pub fn of(req: &Request) -> Self {
        Series::new(req.mode, req.permits())
    }

    /// The `mode` label, and the spans' `mode` field: `write`, `read` or
    /// `permit`.
    pub fn mode(self) -> &'static str {
        match self {
            Series::Lock(mode) => mode.as_str(),
            Series::Permit(_) => "permit",
        }
    }
}

/// The series of one group on one engine. Handles are registered with the
/// recorder on first use and reused, so recording costs an increment, not a
/// label lookup: install the recorder before taking the first lock.
#[derive(Debug)]
pub struct Labels {
    group: SharedString,
    engine: SharedString,
    by_mode: [OnceLock<Handles>; 2],
    /// Semaphores' series, by count: few per group, and off the locks' path.
    by_permits: Mutex<HashMap<u32, Handles>>,
}

#[derive(Debug)]
struct Handles {
    events: [metrics::Counter; Event::ALL.len()],
    spans: [metrics::Histogram; Span::ALL.len()],
    gauges: [metrics::Gauge; Gauge::ALL.len()],
}

impl Labels {
    /// The series of `group` on the engine configured as `engine`; nothing
    /// is registered until the first recording.
    pub fn new(group: Arc<str>, engine: Arc<str>) -> Self {
        Labels {
            group: group.into(),
            engine: engine.into(),
            by_mode: Default::default(),
            by_permits: Mutex::default(),
        }
    }

    /// Runs `record` on the handles of `series`.
    fn with(&self, series: Series, record: impl FnOnce(&Handles)) {
        match series {
            Series::Lock(mode) => record(self.by_mode[mode as usize].get_or_init(|| self.register(series))),
            Series::Permit(n) => {
                let mut by_permits = self.by_permits.lock().unwrap_or_else(|e| e.into_inner());
                record(by_permits.entry(n).or_insert_with(|| self.register(series)));
            }
        }
    }

    fn register(&self, series: Series) -> Handles {
        let mut labels = vec![
            Label::from_static_parts("mode", series.mode()),
            Label::new("group", self.group.clone()),
            Label::new("engine", self.engine.clone()),
        ];
        if let Series::Permit(n) = series {
            labels.push(Label::new("permits", n.to_string()));
        }
        let with_event = |event: Event| {
            let mut labels = labels.clone();
            labels.push(Label::from_static_parts("event", event.as_str()));
            metrics::counter!(EVENTS, labels)
        };
        Handles {
            events: Event::ALL.map(with_event),
            spans: Span::ALL.map(|span| metrics::histogram!(span.name(), labels.clone())),
            gauges: Gauge::ALL.map(|gauge| metrics::gauge!(gauge.name(), labels.clone())),
        }
    }

    /// Counts one `event` of a request of `series`.
    pub fn event(&self, series: Series, event: Event) {
        self.with(series, |h| h.events[event as usize].increment(1));
    }

    /// Records that `span` took `took`.
    pub fn span(&self, span: Span, series: Series, took: Duration) {
        self.with(series, |h| h.spans[span as usize].record(took.as_secs_f64()));
    }

    /// Moves `gauge` by `delta` (+1 when a hold or wait starts, -1 when it ends).
    pub fn gauge(&self, gauge: Gauge, series: Series, delta: f64) {
        self.with(series, |h| h.gauges[gauge as usize].increment(delta));
    }
}

/// Adds units and help texts for exporters; call once after installing a recorder.
pub fn describe() {
    use metrics::Unit;
    metrics::describe_counter!(EVENTS, "Lock events, by `event`");
    metrics::describe_histogram!(WAIT_SECONDS, Unit::Seconds, "Time from first attempt to grant");
    metrics::describe_histogram!(
        HOLD_SECONDS,
        Unit::Seconds,
        "Time from outermost acquire to final release"
    );
    metrics::describe_histogram!(RELEASE_SECONDS, Unit::Seconds, "Time spent releasing");
    metrics::describe_gauge!(HELD, "Locks held by this process");
    metrics::describe_gauge!(WAITING, "Lock requests waiting in this process");
    metrics::describe_counter!(
        OPERATOR_ACTS,
        "Force releases and revocations made from this process, by `act`"
    );
}
