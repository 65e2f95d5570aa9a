//! The lock's cases: exclusion, sharing, order, reentrancy, waits and
//! cancellation, leases, fencing and loss.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use dlock_core::{Error, LostReason, MIN_LEASE, Mode};
use tokio::sync::{Barrier, oneshot};
use tokio::time::{Instant, sleep, timeout};

use super::{
    Asking, LONG_LEASE, Queue, SETTLE, a_waiter_keeps_its_turn, available, cut_off_holder_learns_it_lost,
    raw_request, served_after_abandoned, served_within, until_queued, within,
};
use crate::conformance::{GuardedCounter, Harness};

/// A counter incremented by a read-pause-write under the lock, from both
/// clients at once: it comes out exact only if no two holders overlapped.
pub async fn mutual_exclusion(h: &Harness) {
    const TASKS: u64 = 16;
    const ROUNDS: u64 = 25;
    let counter = Arc::new(GuardedCounter::default());
    let tasks: Vec<_> = (0..TASKS)
        .map(|i| {
            let lock = if i % 2 == 0 {
                h.lock("counter")
            } else {
                h.peer_lock("counter")
            };
            let counter = counter.clone();
            tokio::spawn(async move {
                for _ in 0..ROUNDS {
                    let guard = lock.lock().await.expect("lock");
                    counter.increment().await;
                    guard.release().await.expect("release");
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.expect("task panicked");
    }
    assert_eq!(counter.overlaps(), 0, "holders overlapped");
    assert_eq!(counter.count(), TASKS * ROUNDS, "lost updates");
}

/// Five readers, from both clients, all inside at once.
pub async fn readers_overlap(h: &Harness) {
    let barrier = Arc::new(Barrier::new(5));
    let tasks: Vec<_> = (0..5)
        .map(|i| {
            let lock = if i % 2 == 0 {
                h.lock("shared")
            } else {
                h.peer_lock("shared")
            };
            let barrier = barrier.clone();
            tokio::spawn(async move {
                let guard = lock.read().await.expect("read");
                within(
                    Duration::from_secs(5),
                    "all readers holding at once",
                    barrier.wait(),
                )
                .await;
                guard.release().await.expect("release");
            })
        })
        .collect();
    for task in tasks {
        task.await.expect("task panicked");
    }
}

/// A writer keeps out another writer and readers; with read mode, a
/// reader keeps out a writer and admits another reader.
pub async fn writer_excludes_readers_and_writers(h: &Harness) {
    let read = h.capabilities().read;
    let writer = h.lock("x").lock().await.expect("lock");
    assert!(
        !available(&h.peer_lock("x"), Mode::Write).await,
        "second writer admitted"
    );
    assert!(
        !available(&h.lock("x"), Mode::Write).await,
        "writer from another task admitted"
    );
    if read {
        assert!(
            !available(&h.peer_lock("x"), Mode::Read).await,
            "reader admitted beside a writer"
        );
    }
    writer.release().await.expect("release");
    if read {
        let reader = h.lock("x").read().await.expect("read");
        assert!(
            !available(&h.peer_lock("x"), Mode::Write).await,
            "writer admitted beside a reader"
        );
        assert!(
            available(&h.peer_lock("x"), Mode::Read).await,
            "second reader refused"
        );
        reader.release().await.expect("release");
    }
    assert!(
        available(&h.peer_lock("x"), Mode::Write).await,
        "lock not free after release"
    );
}

/// Waiters that queued one after another are served in that order.
pub async fn fifo_order(h: &Harness) {
    let holder = h.lock("fifo").lock().await.expect("lock");
    let waiters = (0..5)
        .map(|i| {
            let lock = if i % 2 == 0 {
                h.lock("fifo")
            } else {
                h.peer_lock("fifo")
            };
            Box::pin(async move { lock.lock().await }) as Asking
        })
        .collect();
    let queue = Queue::join(h, waiters).await;
    holder.release().await.expect("release");
    assert_eq!(
        queue.served().await,
        [0, 1, 2, 3, 4],
        "not first come, first served"
    );

    // Without timing: a queued waiter keeps its turn against a newcomer even
    // at the instant the lock is free.
    let holder = raw_request(h, "fifo-raw", Mode::Write, false);
    let queued = raw_request(h, "fifo-raw", Mode::Write, true);
    let newcomer = raw_request(h, "fifo-raw", Mode::Write, false);
    a_waiter_keeps_its_turn(h, &[holder], queued, newcomer).await;
}

/// Behind a writer: R1 R2 R3 W2 R4 R5 queue in that order. R1-R3 are admitted
/// together, then W2 alone, then R4 and R5 together: readers never jump a
/// queued writer, and a run of readers is not served one by one.
pub async fn queued_readers_admitted_together(h: &Harness) {
    let first_run = Arc::new(Barrier::new(3));
    let second_run = Arc::new(Barrier::new(2));
    let log = Arc::new(Mutex::new(Vec::new()));
    let holder = h.lock("runs").lock().await.expect("lock");
    let plan = [
        ("R1", Mode::Read, Some(first_run.clone())),
        ("R2", Mode::Read, Some(first_run.clone())),
        ("R3", Mode::Read, Some(first_run)),
        ("W2", Mode::Write, None),
        ("R4", Mode::Read, Some(second_run.clone())),
        ("R5", Mode::Read, Some(second_run)),
    ];
    let mut tasks = Vec::new();
    let queued = h.queued();
    for (i, (name, mode, barrier)) in plan.into_iter().enumerate() {
        let lock = if i % 2 == 0 {
            h.lock("runs")
        } else {
            h.peer_lock("runs")
        };
        let log = log.clone();
        tasks.push(tokio::spawn(async move {
            let guard = lock.acquire(mode).await.expect("acquire");
            log.lock().unwrap().push(name);
            if let Some(run) = barrier {
                within(
                    Duration::from_secs(5),
                    "a run of readers holding together",
                    run.wait(),
                )
                .await;
            } else {
                sleep(Duration::from_millis(100)).await;
            }
            log.lock().unwrap().push(name);
            guard.release().await.expect("release");
        }));
        until_queued(h, queued + 1 + i as u64).await;
    }
    holder.release().await.expect("release");
    for task in tasks {
        task.await.expect("task panicked");
    }
    let log = log.lock().unwrap().clone();
    fn phase<'a>(names: &[&'a str]) -> Vec<&'a str> {
        let mut sorted = names.to_vec();
        sorted.sort();
        sorted
    }
    // Enter and leave of each run: R1-R3 entered before any left, and so on.
    assert_eq!(phase(&log[0..3]), ["R1", "R2", "R3"], "first run: {log:?}");
    assert_eq!(phase(&log[3..6]), ["R1", "R2", "R3"], "first run: {log:?}");
    assert_eq!(log[6..8], ["W2", "W2"], "writer alone: {log:?}");
    assert_eq!(phase(&log[8..10]), ["R4", "R5"], "second run: {log:?}");
}

/// A task that holds the lock takes it again, and under write also for read,
/// without a single engine call; the hold ends with the outermost guard.
pub async fn reentrancy_makes_no_engine_call(h: &Harness) {
    let lock = h.lock("re").with_lease(LONG_LEASE);
    let outer = lock.lock().await.expect("lock");
    let calls = h.faults.calls();
    let inner = lock.lock().await.expect("nested lock");
    let nested_read = if h.capabilities().read {
        Some(lock.read().await.expect("nested read"))
    } else {
        None
    };
    assert_eq!(h.faults.calls(), calls, "a nested acquisition called the engine");
    assert_eq!(inner.fence(), outer.fence(), "a nested guard is the same hold");
    inner.release().await.expect("nested release");
    if let Some(read) = nested_read {
        read.release().await.expect("nested read release");
    }
    assert_eq!(h.faults.calls(), calls, "a nested release called the engine");
    assert!(
        !available(&h.peer_lock("re"), Mode::Write).await,
        "freed by a nested release"
    );
    outer.release().await.expect("release");
    assert!(
        available(&h.peer_lock("re"), Mode::Write).await,
        "not freed by the outer release"
    );
}

/// A task spawned by a holder does not hold its parent's lock.
pub async fn spawned_tasks_do_not_inherit(h: &Harness) {
    let lock = h.lock("inherit");
    let guard = lock.lock().await.expect("lock");
    assert!(
        !available(&lock, Mode::Write).await,
        "a spawned task reentered its parent's lock"
    );
    guard.release().await.expect("release");
}

/// Releasing the write guard while a nested read guard lives keeps a read hold.
pub async fn downgrade_write_to_read(h: &Harness) {
    let lock = h.lock("down").with_lease(LONG_LEASE);
    let write = lock.lock().await.expect("lock");
    let read = lock.read().await.expect("nested read");
    write.release().await.expect("downgrade");
    assert!(
        available(&h.peer_lock("down"), Mode::Read).await,
        "readers refused after downgrade"
    );
    assert!(
        !available(&h.peer_lock("down"), Mode::Write).await,
        "writer admitted while a read hold remains"
    );
    let again = lock
        .lock()
        .await
        .expect_err("write after downgrade is an upgrade");
    assert!(matches!(again, Error::Upgrade { .. }), "{again}");
    read.release().await.expect("release");
    assert!(
        available(&h.peer_lock("down"), Mode::Write).await,
        "not free after the last release"
    );
}

/// Asking for write while holding read is `Error::Upgrade`, at once.
pub async fn upgrade_is_an_error(h: &Harness) {
    let lock = h.lock("up");
    let read = lock.read().await.expect("read");
    let err = within(Duration::from_secs(1), "upgrade refusal", lock.lock())
        .await
        .expect_err("upgrade must fail");
    assert!(
        matches!(err, Error::Upgrade { .. }),
        "expected Upgrade, got {err}"
    );
    assert!(err.to_string().contains("up"), "message names the lock: {err}");
    read.release().await.expect("release");
}

/// `try_lock` answers at once and leaves nothing queued behind it.
pub async fn try_lock_does_not_queue(h: &Harness) {
    let lock = h.lock("try");
    let guard = lock.try_lock().await.expect("try").expect("free lock refused");
    let busy = within(
        Duration::from_secs(2),
        "try on a busy lock",
        h.peer_lock("try").try_lock(),
    )
    .await;
    assert!(busy.expect("try").is_none(), "busy lock granted");
    guard.release().await.expect("release");
    // Had the failed try queued, this fair acquisition would wait behind it.
    let again = within(Duration::from_secs(1), "acquire after a failed try", lock.lock()).await;
    again.expect("lock").release().await.expect("release");
}

/// A wait that runs out is `Error::Timeout`, close to the wait asked for.
pub async fn wait_timeout(h: &Harness) {
    let holder = h.lock("timeout").lock().await.expect("lock");
    let started = Instant::now();
    let err = h
        .peer_lock("timeout")
        .lock_for(Duration::from_millis(300))
        .await
        .expect_err("acquired a held lock");
    let waited = started.elapsed();
    assert!(
        matches!(err, Error::Timeout { .. }),
        "expected Timeout, got {err}"
    );
    assert!(waited >= Duration::from_millis(300), "gave up early: {waited:?}");
    assert!(waited < Duration::from_secs(3), "gave up late: {waited:?}");
    assert!(
        err.to_string().contains(&h.group),
        "message names the lock: {err}"
    );
    holder.release().await.expect("release");
    served_within(
        Duration::from_secs(1),
        "acquire after a timed-out waiter",
        h.lock("timeout"),
    )
    .await;
}

/// A waiter whose task is aborted withdraws at once; the next one is not
/// made to wait for its liveness to run out.
pub async fn cancelled_waiter_leaves_queue(h: &Harness) {
    let holder = h.lock("abort-wait").lock().await.expect("lock");
    let lock = h.lock("abort-wait");
    let waiter = tokio::spawn(async move { lock.lock().await.map(drop) });
    sleep(SETTLE).await;
    waiter.abort();
    assert!(waiter.await.is_err(), "waiter was not cancelled");
    sleep(Duration::from_millis(100)).await;
    holder.release().await.expect("release");
    served_within(
        Duration::from_millis(700),
        "acquire after a cancelled waiter",
        h.peer_lock("abort-wait"),
    )
    .await;
}

/// Waiters dropped at every moment of their acquisition, many in the middle
/// of an engine call (sent, not yet answered), leave nothing behind: once
/// the holder lets go, the next caller is served as after clean cancels.
pub async fn waiters_dropped_mid_call_leave_nothing_behind(h: &Harness) {
    const ROUNDS: u64 = 60;
    // A request left behind would hold or queue for the whole long lease:
    // the bound below tells that from a slow machine's cleanup.
    let holder = h
        .lock("dropped")
        .with_lease(LONG_LEASE)
        .lock()
        .await
        .expect("lock");
    for round in 0..ROUNDS {
        let lock = if round % 2 == 0 {
            h.lock("dropped")
        } else {
            h.peer_lock("dropped")
        }
        .with_lease(LONG_LEASE);
        // From before the first request leaves to after it is queued: a
        // loopback round trip takes 0.1 to 2 ms.
        let after = Duration::from_micros(round * 4000 / ROUNDS);
        // In a task of its own: in the holder's task the lock would reenter.
        let attempt = tokio::spawn(async move {
            let granted = async {
                if round % 3 == 0 {
                    lock.try_lock().await.map(|guard| guard.is_some())
                } else {
                    lock.lock().await.map(|_| true)
                }
            };
            timeout(after, granted).await
        });
        if let Ok(answer) = attempt.await.expect("task panicked") {
            assert!(
                !answer.expect("engine failed"),
                "round {round}: granted while held"
            );
        }
    }
    holder.release().await.expect("release");
    // Usually served within milliseconds. A waiter whose withdrawal has not
    // reached the server yet is granted in its turn and gives the lock back
    // at once. A request truly left behind holds or queues for the whole
    // 30 s lease.
    served_within(
        Duration::from_secs(3),
        "acquire after waiters dropped mid-call",
        h.peer_lock("dropped").with_lease(LONG_LEASE),
    )
    .await;
}

/// A guard dropped because its task was aborted frees the lock well before its lease.
pub async fn guard_dropped_in_cancelled_task_frees_lock(h: &Harness) {
    let lock = h.lock("abort-hold").with_lease(LONG_LEASE);
    let (held, is_held) = oneshot::channel();
    let task = tokio::spawn(async move {
        let _guard = lock.lock().await.expect("lock");
        held.send(()).expect("send");
        std::future::pending::<()>().await;
    });
    is_held.await.expect("holder started");
    assert!(!available(&h.peer_lock("abort-hold"), Mode::Write).await);
    task.abort();
    let _ = task.await;
    served_within(
        Duration::from_secs(3),
        "acquire after the holder was aborted",
        h.peer_lock("abort-hold"),
    )
    .await;
}

/// A peer that took the lock and vanished (no renewal, no release) holds it
/// only until its lease runs out.
pub async fn lease_expiry_frees_abandoned_holder(h: &Harness) {
    let abandoned = raw_request(h, "abandoned", Mode::Write, false);
    served_after_abandoned(h, abandoned, h.lock("abandoned").lock()).await;
}

/// Fences rise strictly in the order holders enter, across both clients.
pub async fn fencing_is_monotonic(h: &Harness) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let tasks: Vec<_> = (0..8)
        .map(|i| {
            let lock = if i % 2 == 0 {
                h.lock("fence")
            } else {
                h.peer_lock("fence")
            };
            let seen = seen.clone();
            tokio::spawn(async move {
                for _ in 0..10 {
                    let guard = lock.lock().await.expect("lock");
                    seen.lock().unwrap().push(guard.fence());
                    guard.release().await.expect("release");
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.expect("task panicked");
    }
    let mut fences = seen.lock().unwrap().clone();
    assert_eq!(fences.len(), 80);
    assert!(
        fences.windows(2).all(|w| w[0] < w[1]),
        "fences not strictly increasing: {fences:?}"
    );
    if h.capabilities().read {
        let (a, b) = (
            h.lock("fence").read().await.expect("read"),
            h.peer_lock("fence").read().await.expect("read"),
        );
        fences.extend([a.fence(), b.fence()]);
        assert!(
            a.fence() != b.fence() && a.fence().min(b.fence()) > fences[79],
            "reader fences: {fences:?}"
        );
        let last = a.fence().max(b.fence());
        a.release().await.expect("release");
        b.release().await.expect("release");
        let w = h.lock("fence").lock().await.expect("lock");
        assert!(w.fence() > last, "writer after readers: {} <= {last}", w.fence());
        w.release().await.expect("release");
    }
}

/// Cut off from the engine, a holder learns it lost the lock within one
/// lease; the engine gives the lock to the next client; release reports it.
pub async fn lost_when_renewals_fail(h: &Harness) {
    let lock = h.lock("lost-cut").with_lease(Duration::from_secs(1));
    let guard = lock.lock().await.expect("lock");
    cut_off_holder_learns_it_lost(h, guard, lock.lock(), h.peer_lock("lost-cut").lock()).await;
}

/// A grant whose answer comes back after the lease it was asked with (a
/// slow connect, a busy machine) is confirmed by a renewal, not taken for
/// lost at once: the engine granted it on arrival and still holds it.
pub async fn a_grant_heard_after_its_lease_is_confirmed(h: &Harness) {
    let lease = Duration::from_secs(2);
    let lock = h.lock("late-grant").with_lease(lease);
    let before = h.faults.calls();
    h.faults.set_delay(lease + Duration::from_secs(1));
    let (guard, ()) = tokio::join!(lock.lock(), async {
        // Once the request is on its way, later calls go straight through.
        while h.faults.calls() == before {
            sleep(Duration::from_millis(5)).await;
        }
        h.faults.set_delay(Duration::ZERO);
    });
    let guard = guard.expect("lock");
    sleep(Duration::from_millis(200)).await;
    assert!(!guard.is_lost(), "a late grant was taken for lost");
    assert!(
        h.peer_lock("late-grant").try_lock().await.expect("try").is_none(),
        "the confirmed hold does not exclude"
    );
    guard.release().await.expect("release of a confirmed hold");
}

/// The engine forgets the hold early (its leases run ten times shorter than
/// the holder thinks); the next renewal is refused and the holder learns it.
/// The lease is 1 s, or ten lease units where a tenth of a second cannot be
/// said (memcached counts whole seconds).
pub async fn lost_when_server_drops_hold(h: &Harness) {
    let lease = Duration::from_secs(1).max(h.capabilities().lease_unit * 10);
    h.faults.shorten_leases(10);
    let lock = h.lock("lost-early").with_lease(lease);
    let guard = lock.lock().await.expect("lock");
    let reason = within(lease * 3, "lost signal", guard.lost()).await;
    assert_eq!(reason, LostReason::Rejected);
    h.faults.shorten_leases(1);
    let next = within(lease * 5, "peer acquire", h.peer_lock("lost-early").lock())
        .await
        .expect("lock");
    if h.fenced() {
        assert!(next.fence() > guard.fence());
    }
    assert!(matches!(guard.release().await, Err(Error::Lost { .. })));
    next.release().await.expect("release");
}

/// Awkward names are distinct locks, each excluding only itself.
pub async fn key_edge_cases(h: &Harness) {
    let long = "k".repeat(10 * 1024);
    let names = [
        "{braces}",
        "{",
        "}",
        "}{",
        "a:b:c",
        "a:b",
        "with spaces",
        "with spaces ",
        "ünïcødé ✓ 锁",
        "\n\t\r",
        "a/b",
        "*?[]",
        "\"'\\",
        "%s%n",
        "x",
        "{x}",
        long.as_str(),
    ];
    let lease = LONG_LEASE;
    let mut held = Vec::new();
    for name in names {
        let guard = h.lock(name).with_lease(lease).try_lock().await.expect("try");
        held.push(guard.unwrap_or_else(|| panic!("{name:?} collided with another name")));
    }
    // Group and name do not run together: ("g:a", "b") is not ("g", "a:b").
    let other_group = format!("{}:a", h.group);
    let joined = h.registry.locks(&other_group).get("b");
    assert!(
        available(&joined, Mode::Write).await,
        "group/name boundary collided"
    );
    for name in names {
        assert!(
            !available(&h.peer_lock(name), Mode::Write).await,
            "{name:?} admitted a second holder"
        );
    }
    for guard in held {
        guard.release().await.expect("release");
    }
}

/// Bad keys fail with `InvalidKey` before any engine call.
pub async fn invalid_keys_are_rejected(h: &Harness) {
    let calls = h.faults.calls();
    let too_long = "n".repeat(dlock_core::MAX_NAME_LEN + 1);
    for lock in [h.lock(""), h.registry.locks("").get("x"), h.lock(&too_long)] {
        let err = lock.lock().await.expect_err("invalid key accepted");
        assert!(
            matches!(err, Error::InvalidKey { .. }),
            "expected InvalidKey, got {err}"
        );
    }
    assert_eq!(h.faults.calls(), calls, "an invalid key reached the engine");
}

/// What the engine lacks (read mode, a lease shorter than its unit) is
/// refused with a typed error, before any engine call.
pub async fn what_the_engine_lacks_is_a_typed_error(h: &Harness) {
    let calls = h.faults.calls();
    let capabilities = h.capabilities();
    if !capabilities.read {
        h.assert_read_refused("lacks").await;
    }
    let too_short = capabilities.min_lease() - Duration::from_millis(1);
    let err = h
        .lock("lacks")
        .with_lease(too_short)
        .lock()
        .await
        .expect_err("a lease below the minimum must be refused");
    if too_short >= MIN_LEASE {
        assert!(
            matches!(err, Error::Unsupported { .. }),
            "expected Unsupported, got {err}"
        );
    } else {
        assert!(
            matches!(err, Error::Config { .. }),
            "expected a config error, got {err}"
        );
    }
    assert_eq!(h.faults.calls(), calls, "a refused request reached the engine");
}
