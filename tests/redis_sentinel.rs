//! Redis behind Sentinel, failing over for real: a primary, a replica and 3
//! sentinels on loopback; the tests kill the primary and the sentinels
//! promote the replica.

#![cfg(all(feature = "redis", feature = "zookeeper"))]

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use dlock::config::Polling;
use dlock::engines::conformance::SETTINGS;
use dlock::{Registry, Settings};
use dlock_testkit::fixtures::redis::RedisSentinel;
use dlock_testkit::{Fixture, engine, timed_writer};

/// After a failover the same engine keeps working on the new primary: its
/// connection, its script cache (the new primary has never seen the
/// scripts) and its subscriber all move, with no restart of the process.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failover_moves_connections_scripts_and_notifications_to_the_new_primary() {
    let mut fixture = RedisSentinel::start();
    // Polling once a second: a waiter served sooner heard a notification.
    let settings = Settings {
        poll: Polling::Constant {
            interval: Duration::from_secs(1),
        },
        ..SETTINGS
    };
    let text = format!(
        "[engines.main]\n{}\nwaiter_ttl = \"5s\"",
        fixture.engine_config().replace("\nwaiter_ttl = \"1s\"", "")
    );
    let config = dlock::Config::parse(&text, std::iter::empty()).expect("config");
    let engine = dlock::engines::kinds()
        .build("main", &config.engines["main"])
        .await
        .expect("engine");
    let registry = Arc::new(Registry::with_engine("sentinel", engine, settings).expect("registry"));
    let handoff = async |round: &str| {
        let held = registry.locks("ha").get(round).lock().await.expect("lock");
        let waiter = timed_writer(registry.locks("ha").get(round));
        tokio::time::sleep(Duration::from_millis(300)).await;
        let released = Instant::now();
        held.release().await.expect("release");
        waiter.await.expect("task") - released
    };
    assert!(handoff("before").await < Duration::from_millis(300));
    let took = fixture.fail_over();
    println!("redis-sentinel: failover took {took:?}");
    // The first calls after it may still reach the dead primary: within the wait.
    let after = tokio::time::timeout(Duration::from_secs(20), handoff("after"))
        .await
        .expect("no lock on the new primary");
    assert!(
        after < Duration::from_millis(900),
        "no notification after the failover: {after:?}"
    );
}

/// The token after a failover right after a grant is still greater: the
/// promoted replica counts from its own clock (one machine here; in general
/// the servers' clocks must agree within the failover's duration).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fence_increases_across_a_failover_right_after_a_grant() {
    let mut fixture = RedisSentinel::start();
    let registry = Registry::with_engine("sentinel", engine(&fixture).await, SETTINGS).expect("registry");
    let lock = registry
        .locks("fence")
        .get("k")
        .with_lease(Duration::from_secs(1));
    let first = lock.lock().await.expect("lock");
    let last = first.fence();
    fixture.fail_over();
    let _ = first.release().await;
    let next = lock
        .lock_for(Duration::from_secs(20))
        .await
        .expect("lock on the new primary");
    assert!(next.fence() > last, "{} after {last}", next.fence());
    next.release().await.expect("release");
}

/// The primary restarts in place, then the sentinels fail over while it
/// runs, and it stays a writable primary that they cannot demote. An engine
/// still connected to it, which hears no error from it, moves to the new
/// primary on the sentinels' announcement, and shares the lock with an
/// engine that connected after the failover: holders counted inside never
/// overlap, and both finish their turns. Before, the old engine stayed on
/// the old primary for as long as it answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_old_primary_still_writable_after_a_failover_is_left_at_once() {
    let mut fixture = RedisSentinel::start();
    let before = Registry::with_engine("before", engine(&fixture).await, SETTINGS).expect("registry");
    fixture.restart_primary_undemotable();
    // The old engine's next lock reconnects to the restarted primary.
    before
        .locks("two")
        .get("k")
        .lock_for(Duration::from_secs(20))
        .await
        .expect("lock on the restarted primary")
        .release()
        .await
        .expect("release");
    fixture.force_failover();
    // The announcement crosses loopback from the sentinels to the engine.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let after = Registry::with_engine("after", engine(&fixture).await, SETTINGS).expect("registry");
    let (inside, overlaps) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let tasks = [before, after].map(|registry| {
        let (inside, overlaps) = (inside.clone(), overlaps.clone());
        tokio::spawn(async move {
            let lock = registry.locks("two").get("k");
            for _ in 0..25 {
                let guard = lock.lock_for(Duration::from_secs(20)).await.expect("lock");
                if inside.fetch_add(1, Ordering::SeqCst) != 0 {
                    overlaps.fetch_add(1, Ordering::SeqCst);
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
                inside.fetch_sub(1, Ordering::SeqCst);
                guard.release().await.expect("release");
            }
        })
    });
    for task in tasks {
        task.await.expect("an engine never got its turns");
    }
    assert_eq!(overlaps.load(Ordering::SeqCst), 0, "two holders at once");
}

/// Sentinels and data nodes that require a password: the sentinels' from
/// their urls, the data nodes' from `password`. Without it, a clear error
/// at startup.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn passwords_for_the_sentinels_and_the_data_nodes() {
    let fixture = RedisSentinel::start_with_password(Some("s3cret"));
    let registry = Registry::with_engine("sentinel", engine(&fixture).await, SETTINGS).expect("registry");
    let guard = registry.locks("auth").get("k").lock().await.expect("lock");
    guard.release().await.expect("release");

    let secret = dlock_testkit::server::secret_file("s3cret");
    let from_file = fixture.engine_config().replace(
        "\npassword = \"s3cret\"",
        &format!("\npassword_file = \"{}\"", secret.display()),
    );
    let config =
        dlock::Config::parse(&format!("[engines.main]\n{from_file}"), std::iter::empty()).expect("config");
    let engine = dlock::engines::kinds()
        .build("main", &config.engines["main"])
        .await
        .expect("the data nodes' password from its file");
    drop(engine);

    let without = fixture.engine_config().replace("\npassword = \"s3cret\"", "");
    let config =
        dlock::Config::parse(&format!("[engines.main]\n{without}"), std::iter::empty()).expect("config");
    let err = dlock::engines::kinds()
        .build("main", &config.engines["main"])
        .await
        .err()
        .expect("connected without the data nodes' password");
    let message = err.to_string();
    assert!(matches!(err, dlock::Error::Unavailable { .. }), "{message}");
    assert!(
        message.contains("`main`") && message.contains("sentinels"),
        "{message}"
    );
    assert!(
        !message.contains("s3cret"),
        "a sentinel's password in an error: {message}"
    );
}
