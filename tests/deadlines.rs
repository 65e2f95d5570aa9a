//! Every engine call is bounded by the core: an engine that stops answering
//! mid-call (its calls arrive, no answer comes back) costs the caller its
//! wait, never a hang, and leaves nothing held.

use std::sync::Arc;
use std::time::{Duration, Instant};

use dlock::engines::conformance::Faults;
use dlock::engines::memory::MemoryEngine;
use dlock::{Error, Registry, Settings};

struct Setup {
    call_timeout: Duration,
    memory: Arc<MemoryEngine>,
    faults: Arc<Faults>,
    registry: Registry,
    peer: Registry,
}

/// A memory engine behind a fault wrapper, with `call_timeout`.
fn setup(call_timeout: Duration) -> Setup {
    let memory = Arc::new(MemoryEngine::new());
    let faults = Arc::new(Faults::new(memory.clone()));
    let settings = Settings {
        call_timeout,
        ..Settings::default()
    };
    Setup {
        call_timeout,
        registry: Registry::with_engine("hung", faults.clone(), settings).expect("registry"),
        peer: Registry::with_engine("hung", memory.clone(), settings).expect("registry"),
        memory,
        faults,
    }
}

/// Waits until the engine holds nothing: a hung call is not cut at once but
/// runs on for `call_timeout` before its request is withdrawn.
async fn nothing_held(s: &Setup) {
    let deadline = Instant::now() + s.call_timeout + Duration::from_secs(2);
    while s.memory.active_locks() != 0 {
        assert!(Instant::now() < deadline, "a hung request was left in the engine");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_for_on_a_hung_engine_times_out_in_time_and_leaves_nothing_held() {
    // A call timeout far past the wait: the wait is what cuts the hung
    // call. The bound below tells the two apart with room for a busy
    // machine (two CI runs side by side once took 303 ms).
    let s = setup(Duration::from_secs(3));
    s.faults.set_hung(true);
    for busy in [false, true] {
        // Busy: a peer holds it, so the hung request is queued in the engine.
        let holder = match busy {
            true => Some(s.peer.locks("g").get("k").lock().await.expect("peer lock")),
            false => None,
        };
        let started = Instant::now();
        let err = s
            .registry
            .locks("g")
            .get("k")
            .lock_for(Duration::from_millis(250))
            .await
            .expect_err("a hung engine granted the lock");
        let took = started.elapsed();
        assert!(matches!(err, Error::Timeout { .. }), "busy={busy}: {err}");
        assert!(
            took < Duration::from_millis(1500),
            "busy={busy}: answered after {took:?}, not at the 250 ms wait"
        );
        if let Some(holder) = holder {
            holder.release().await.expect("peer release");
        }
        nothing_held(&s).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn try_lock_and_release_on_a_hung_engine_fail_within_the_call_timeout() {
    // The bounds below tell the 200 ms call timeout from the 5 s default
    // and from no answer at all, with room for a busy machine.
    let s = setup(Duration::from_millis(200));
    let lock = s.registry.locks("g").get("k");
    let guard = lock.lock().await.expect("lock");
    s.faults.set_hung(true);
    let started = Instant::now();
    let err = guard.release().await.expect_err("a hung release succeeded");
    assert!(matches!(err, Error::Engine { .. }), "{err}");
    assert!(
        started.elapsed() < Duration::from_millis(1500),
        "release took {:?}",
        started.elapsed()
    );
    nothing_held(&s).await;

    let started = Instant::now();
    let err = lock.try_lock().await.expect_err("a hung try succeeded");
    assert!(matches!(err, Error::Engine { .. }), "{err}");
    assert!(
        started.elapsed() < Duration::from_millis(1500),
        "try took {:?}",
        started.elapsed()
    );
    nothing_held(&s).await;
}

/// A release whose caller stops waiting (a timeout around the annotated
/// function, say) still lets go at the engine.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_the_caller_stops_waiting_for_still_lets_go() {
    let s = setup(Settings::default().call_timeout);
    let guard = s.registry.locks("g").get("k").lock().await.expect("lock");
    s.faults.set_delay(Duration::from_millis(100));
    let cut_short = tokio::time::timeout(Duration::from_millis(10), guard.release()).await;
    assert!(cut_short.is_err(), "the release was not cut short");
    nothing_held(&s).await;
}

/// Waiting forever, a waiter rides out an engine error however long it has
/// waited: it gives up only after the engine failed for a whole lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_waiter_rides_out_a_short_engine_failure() {
    let s = setup(Settings::default().call_timeout);
    let holder = s.peer.locks("g").get("k").lock().await.expect("peer lock");
    let lock = s
        .registry
        .locks("g")
        .get("k")
        .with_lease(Duration::from_millis(300));
    let waiter = tokio::spawn(async move { lock.lock().await.map(|guard| guard.fence()) });
    // Queued for longer than its lease, then the engine fails for a moment.
    tokio::time::sleep(Duration::from_millis(700)).await;
    s.faults.set_cut(true);
    tokio::time::sleep(Duration::from_millis(150)).await;
    s.faults.set_cut(false);
    assert!(!waiter.is_finished(), "the waiter gave up at the first failure");
    holder.release().await.expect("release");
    let got = tokio::time::timeout(Duration::from_secs(5), waiter)
        .await
        .expect("not served");
    got.expect("task")
        .expect("the waiter failed instead of getting the lock");
}
