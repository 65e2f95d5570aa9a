//! What gets recorded, read back from metrics-util's debugging recorder.
//! Each test runs on a current-thread runtime with a thread-local recorder,
//! so every task it spawns (watchdog, background release) records there too.

use std::sync::Arc;
use std::time::Duration;

use dlock::Registry;
use dlock::engines::conformance::{Faults, SETTINGS};
use dlock::engines::memory::MemoryEngine;
use dlock::kit::Engine;
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};

/// Totals of everything recorded so far. The debugging recorder hands out
/// deltas (a snapshot drains what it reads), so readings are accumulated.
type Row = (String, Vec<(String, String)>, DebugValue);

struct Recorded {
    snapshotter: Snapshotter,
    rows: Vec<Row>,
}

impl Recorded {
    fn new(snapshotter: Snapshotter) -> Self {
        Recorded {
            snapshotter,
            rows: Vec::new(),
        }
    }

    fn read(&mut self) -> &Self {
        for (key, _, _, value) in self.snapshotter.snapshot().into_vec() {
            let key = key.key();
            let name = key.name().to_owned();
            let labels: Vec<_> = key
                .labels()
                .map(|l| (l.key().to_owned(), l.value().to_owned()))
                .collect();
            match self.rows.iter_mut().find(|(n, l, _)| *n == name && *l == labels) {
                Some((_, _, total)) => match (total, value) {
                    (DebugValue::Counter(t), DebugValue::Counter(d)) => *t += d,
                    (DebugValue::Gauge(t), DebugValue::Gauge(d)) => *t += d,
                    (DebugValue::Histogram(t), DebugValue::Histogram(d)) => t.extend(d),
                    (total, value) => panic!("{name} changed type: {total:?} then {value:?}"),
                },
                None => self.rows.push((name, labels, value)),
            }
        }
        self
    }

    fn matching<'a>(
        &'a self,
        name: &'a str,
        wanted: &'a [(&str, &str)],
    ) -> impl Iterator<Item = &'a DebugValue> {
        self.rows
            .iter()
            .filter(move |(n, labels, _)| {
                n == name
                    && wanted
                        .iter()
                        .all(|(k, v)| labels.iter().any(|(lk, lv)| lk == k && lv == v))
            })
            .map(|(_, _, value)| value)
    }

    /// The count of `event`, over every mode.
    fn event(&self, event: &str) -> u64 {
        self.counter(&[("event", event)])
    }

    fn counter(&self, wanted: &[(&str, &str)]) -> u64 {
        self.matching("dlock_events_total", wanted)
            .map(|value| match value {
                DebugValue::Counter(n) => *n,
                other => panic!("not a counter: {other:?}"),
            })
            .sum()
    }

    fn spans(&self, name: &str, wanted: &[(&str, &str)]) -> Vec<f64> {
        self.matching(name, wanted)
            .flat_map(|value| match value {
                DebugValue::Histogram(values) => values.iter().map(|v| v.into_inner()).collect::<Vec<_>>(),
                other => panic!("{name} is not a histogram: {other:?}"),
            })
            .collect()
    }

    fn gauge(&self, name: &str) -> f64 {
        self.matching(name, &[])
            .map(|value| match value {
                DebugValue::Gauge(v) => v.into_inner(),
                other => panic!("{name} is not a gauge: {other:?}"),
            })
            .sum()
    }
}

fn registry() -> (Registry, Arc<Faults>) {
    let faults = Arc::new(Faults::new(Arc::new(MemoryEngine::new()) as Arc<dyn Engine>));
    (
        Registry::with_engine("mem", faults.clone(), SETTINGS).expect("registry"),
        faults,
    )
}

/// Lets background work (a dropped guard's release) finish.
async fn settle() {
    tokio::time::sleep(Duration::from_millis(20)).await;
}

#[tokio::test(flavor = "current_thread")]
async fn one_cycle_records_events_spans_and_gauges_with_labels() {
    let recorder = DebuggingRecorder::new();
    let mut recorded = Recorded::new(recorder.snapshotter());
    let _local = metrics::set_default_local_recorder(&recorder);
    let (registry, _) = registry();

    let guard = registry.locks("order").get("1").lock().await.expect("lock");
    let during = recorded.read();
    assert_eq!(during.gauge("dlock_held"), 1.0);
    assert_eq!(during.gauge("dlock_waiting"), 0.0);
    guard.release().await.expect("release");

    let after = recorded.read();
    let labels = [("group", "order"), ("mode", "write"), ("engine", "mem")];
    for event in ["attempt", "acquired", "released"] {
        let with_event: Vec<_> = labels.iter().copied().chain([("event", event)]).collect();
        assert_eq!(after.counter(&with_event), 1, "{event} with labels {labels:?}");
    }
    for span in [
        "dlock_wait_seconds",
        "dlock_hold_seconds",
        "dlock_release_seconds",
    ] {
        assert_eq!(
            after.spans(span, &labels).len(),
            1,
            "{span} with labels {labels:?}"
        );
    }
    assert_eq!(after.gauge("dlock_held"), 0.0);
    assert_eq!(after.event("reentered"), 0);
}

/// A semaphore's permits are recorded under the same names, with `mode` =
/// `permit` and the count as `permits`; a lock of the same group and name
/// keeps its own series.
#[tokio::test(flavor = "current_thread")]
async fn permits_are_recorded_under_the_same_names_with_their_count() {
    let recorder = DebuggingRecorder::new();
    let mut recorded = Recorded::new(recorder.snapshotter());
    let _local = metrics::set_default_local_recorder(&recorder);
    let (registry, _) = registry();
    let exports = registry.locks("export").semaphore("tenant-7", 5);

    let permit = exports.acquire().await.expect("permit");
    let lock = registry
        .locks("export")
        .get("tenant-7")
        .lock()
        .await
        .expect("lock");
    assert_eq!(recorded.read().gauge("dlock_held"), 2.0);
    permit.release().await.expect("release");
    lock.release().await.expect("release");

    let after = recorded.read();
    let permits = [
        ("group", "export"),
        ("mode", "permit"),
        ("engine", "mem"),
        ("permits", "5"),
    ];
    let writes = [("group", "export"), ("mode", "write"), ("engine", "mem")];
    for labels in [&permits[..], &writes[..]] {
        for event in ["attempt", "acquired", "released"] {
            let with_event: Vec<_> = labels.iter().copied().chain([("event", event)]).collect();
            assert_eq!(after.counter(&with_event), 1, "{event} with labels {labels:?}");
        }
        assert_eq!(after.spans("dlock_hold_seconds", labels).len(), 1, "{labels:?}");
    }
    assert_eq!(after.event("attempt"), 2, "each counted once, in its own series");
    assert_eq!(after.gauge("dlock_held"), 0.0);
}

/// The reentrant timer: one hold span from the outermost acquire to the final
/// release, however deep the nesting and whichever guard goes last.
#[tokio::test(flavor = "current_thread")]
async fn nested_acquisitions_record_one_hold_span() {
    let recorder = DebuggingRecorder::new();
    let mut recorded = Recorded::new(recorder.snapshotter());
    let _local = metrics::set_default_local_recorder(&recorder);
    let (registry, _) = registry();
    let lock = registry.locks("order").get("2");

    let outer = lock.lock().await.expect("lock");
    let inner = lock.lock().await.expect("nested");
    let innermost = lock.read().await.expect("nested read");
    inner.release().await.expect("release");
    tokio::time::sleep(Duration::from_millis(150)).await;
    drop(innermost);
    outer.release().await.expect("release");
    settle().await;

    let recorded = recorded.read();
    assert_eq!(recorded.event("attempt"), 1);
    assert_eq!(recorded.event("acquired"), 1);
    assert_eq!(recorded.event("reentered"), 2);
    assert_eq!(recorded.event("released"), 1);
    let holds = recorded.spans("dlock_hold_seconds", &[]);
    assert_eq!(
        holds.len(),
        1,
        "one hold span, not one per nesting level: {holds:?}"
    );
    assert!(holds[0] >= 0.15, "hold ran from the outermost acquire: {holds:?}");
    assert_eq!(recorded.spans("dlock_wait_seconds", &[]).len(), 1);
}

#[tokio::test(flavor = "current_thread")]
async fn timeouts_renewals_and_loss_are_counted() {
    let recorder = DebuggingRecorder::new();
    let mut recorded = Recorded::new(recorder.snapshotter());
    let _local = metrics::set_default_local_recorder(&recorder);
    let (registry, faults) = registry();
    let lock = registry
        .locks("order")
        .get("3")
        .with_lease(Duration::from_millis(90));

    let guard = lock.lock().await.expect("lock");
    let other = registry.locks("order").get("3");
    let waiter = tokio::spawn(async move { other.lock_for(Duration::from_millis(200)).await.map(drop) });
    assert!(waiter.await.expect("task").is_err(), "held lock granted");
    let other = registry.locks("order").get("3");
    let tried = tokio::spawn(async move { other.try_lock().await.map(|guard| guard.is_none()) });
    assert!(
        tried.await.expect("task").expect("try"),
        "held lock granted to a try"
    );
    let waiting = recorded.read();
    assert_eq!(waiting.event("timed_out"), 1);
    assert_eq!(waiting.event("busy"), 1, "the try that found it taken");
    assert_eq!(waiting.gauge("dlock_waiting"), 0.0);
    // Lease 90 ms: renewed every 30 ms while held for 200 ms and more.
    assert!(
        waiting.event("renewed") >= 3,
        "renewed {} times",
        waiting.event("renewed")
    );

    faults.set_cut(true);
    guard.lost().await;
    faults.set_cut(false);
    assert!(guard.release().await.is_err());
    let recorded = recorded.read();
    assert!(recorded.event("renewal_failed") >= 1);
    assert_eq!(recorded.event("lost"), 1);
    assert_eq!(recorded.gauge("dlock_held"), 0.0);
}

/// Each force release and revocation made from this process is counted
/// in `dlock_operator_acts_total`, by group, engine and act; one that
/// reached nobody too, since someone acted.
#[tokio::test(flavor = "current_thread")]
async fn acts_on_holders_are_counted() {
    let recorder = DebuggingRecorder::new();
    let mut recorded = Recorded::new(recorder.snapshotter());
    let _local = metrics::set_default_local_recorder(&recorder);
    let (registry, _) = registry();
    let lock = registry.locks("order").get("stuck");
    let _guard = lock.lock().await.expect("lock");
    lock.revoke().await.expect("revoke");
    lock.force_release().await.expect("force release");
    lock.force_release().await.expect("a second, on a free lock");

    let mut acts = |act: &str| -> u64 {
        let wanted = [("group", "order"), ("engine", "mem"), ("act", act)];
        let found = recorded.read().matching("dlock_operator_acts_total", &wanted);
        found
            .map(|value| match value {
                DebugValue::Counter(n) => *n,
                other => panic!("not a counter: {other:?}"),
            })
            .sum()
    };
    assert_eq!(acts("revocation"), 1);
    assert_eq!(acts("force release"), 2);
}
