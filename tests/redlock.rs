//! RedLock against real redis-servers on loopback: what a majority means
//! when masters die, what a master restarted empty does to a held lock (and
//! that the fence catches it), bad settings.

#![cfg(feature = "redlock")]

use std::sync::Arc;
use std::time::{Duration, Instant};

use dlock::engines::conformance::SETTINGS;
use dlock::engines::kinds;
use dlock::engines::redlock::{RedLockConfig, RedLockEngine};
use dlock::kit::ClientSettings;
use dlock::kit::Engine;
use dlock::{Config, Error, Registry, Settings};
use dlock_testkit::fixtures::redlock::RedLock;
use dlock_testkit::proxy::CutProxy;
use dlock_testkit::store::FencedStore;
use dlock_testkit::{Fixture, assert_unreachable_is_a_clear_error, engine};

fn registry(engine: Arc<dyn Engine>) -> Registry {
    Registry::with_engine("redlock", engine, SETTINGS).expect("registry")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_of_five_masters_down_locks_work_three_down_a_clear_error_in_the_wait() {
    let mut fixture = RedLock::start();
    let registry = registry(engine(&fixture).await);
    let lock = registry.locks("quorum").get("k");
    for master in &mut fixture.masters[..2] {
        master.kill();
    }
    let guard = lock
        .lock_for(Duration::from_secs(2))
        .await
        .expect("3 of 5 are a majority");
    let waiter = registry.locks("quorum").get("k");
    let busy = tokio::spawn(async move { waiter.try_lock().await.expect("try").is_none() });
    assert!(busy.await.expect("task"), "held twice with 3 of 5 masters");
    guard.release().await.expect("release on 3 of 5");
    fixture.masters[2].kill();
    let started = Instant::now();
    let err = lock
        .lock_for(Duration::from_secs(1))
        .await
        .expect_err("2 of 5 are no majority");
    let took = started.elapsed();
    assert!(took < Duration::from_millis(1500), "answered after {took:?}");
    let message = err.to_string();
    assert!(matches!(err, Error::Engine { .. }), "{message}");
    assert!(message.contains("3 of 5 masters failed"), "{message}");
}

/// A master that stops answering (`CLIENT PAUSE`, alive but silent) does
/// not hold up the others: each call returns once a majority said yes. Its
/// calls finish when it wakes, in the order they were made, so the releases
/// reach it last: nothing is left there. Paused before the first call, its
/// connection opens only then, so its first calls all start late, together.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_master_holds_up_nothing_and_still_gets_every_release() {
    let fixture = RedLock::with_masters(3);
    let urls = fixture
        .masters
        .iter()
        .map(|m| format!("redis://{}", m.address()))
        .collect();
    let config = RedLockConfig {
        fence: false,
        master_timeout: Duration::from_secs(10),
        ..RedLockConfig::new(urls)
    };
    let registry = registry(Arc::new(
        RedLockEngine::connect("rl", &config).await.expect("connect"),
    ));
    // A hold left on the paused master by a call landing out of order
    // would outlast the checks below.
    let lock = registry
        .locks("silent")
        .get("k")
        .with_lease(Duration::from_secs(60));
    let client = redis::Client::open(format!("redis://{}", fixture.masters[0].address())).expect("url");
    let mut master = client.get_multiplexed_async_connection().await.expect("raw");
    let pause = Duration::from_secs(5);
    let _: () = redis::cmd("CLIENT")
        .arg("PAUSE")
        .arg(pause.as_millis() as u64)
        .arg("ALL")
        .query_async(&mut master)
        .await
        .expect("pause");
    let paused_at = Instant::now();
    for _ in 0..20 {
        let guard = lock
            .lock_for(Duration::from_secs(1))
            .await
            .expect("2 of 3 answer");
        guard.release().await.expect("release on 2 of 3");
    }
    let took = paused_at.elapsed();
    assert!(took < pause, "20 cycles waited for the paused master: {took:?}");
    tokio::time::sleep(pause - took).await;
    let mut left = None;
    while paused_at.elapsed() < pause + Duration::from_secs(10) {
        left = redis::cmd("DBSIZE").query_async::<u64>(&mut master).await.ok();
        if left == Some(0) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(left, Some(0), "keys left on the master that was paused");
}

/// The failure RedLock's critics point at: a holder's keys on a minority,
/// the rest of its majority restarted empty; a second client takes a
/// majority. Both hold. The token of the newer holder is greater (counters
/// never go below the masters' clocks), so a fenced store refuses the older.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_master_restarted_empty_lets_two_hold_and_the_fence_refuses_the_older() {
    let mut fixture = RedLock::start();
    // The first holder reaches masters 0, 1, 2 only: 3 and 4 are cut off
    // from it for good, so no call of its can land there late.
    let mut urls: Vec<String> = fixture
        .masters
        .iter()
        .map(|m| format!("redis://{}", m.address()))
        .collect();
    for url in &mut urls[3..] {
        let target = url.trim_start_matches("redis://").parse().expect("address");
        let proxy = CutProxy::start(target).await;
        proxy.cut();
        *url = format!("redis://{}", proxy.address);
    }
    // A lease long enough that the first holder's next renewal, which finds
    // no majority, comes after the second holder is in, however busy the
    // machine.
    let first = Registry::with_engine(
        "redlock",
        Arc::new(
            RedLockEngine::connect("first", &RedLockConfig::new(urls))
                .await
                .expect("3 of 5 answer"),
        ),
        Settings {
            lease: Duration::from_secs(18),
            ..SETTINGS
        },
    )
    .expect("registry");
    let old = first
        .locks("restart")
        .get("k")
        .lock()
        .await
        .expect("first holder");
    // Master 0 restarts empty: the first holder's key is now on 1 and 2 only.
    fixture.masters[0].restart();
    // A master just restarted may be slow to answer on a busy machine; a
    // slow master is not what this case is about.
    let config = format!(
        "[engines.main]\n{}\nmaster_timeout = \"1s\"",
        fixture.engine_config()
    );
    let config = Config::parse(&config, []).expect("config");
    let patient = kinds()
        .build("main", &config.engines["main"])
        .await
        .expect("engine");
    let second = registry(patient);
    let new = second
        .locks("restart")
        .get("k")
        .lock_for(Duration::from_secs(5))
        .await
        .expect("the second holder takes masters 0, 3, 4");
    assert!(!old.is_lost(), "the first holder does not know yet");
    let dir = dlock_testkit::server::scratch("redlock");
    std::fs::create_dir_all(&dir).expect("dir");
    let store = FencedStore::create(&dir.join("store"));
    store.write(new.fence(), 1).expect("the newer holder writes");
    assert!(
        store.write(old.fence(), 2).is_err(),
        "the older holder's token {} was not below the newer's {}",
        old.fence(),
        new.fence()
    );
    assert_eq!(store.value(), 1);
    // Its next renewal finds no majority: the first holder learns it lost.
    let reason = tokio::time::timeout(Duration::from_secs(12), old.lost()).await;
    assert!(reason.is_ok(), "the first holder never learned it lost the lock");
    new.release().await.expect("release");
    std::fs::remove_dir_all(dir).ok();
}

#[tokio::test]
async fn too_few_masters_and_an_unreachable_majority_are_clear_errors() {
    let two = RedLockConfig::new(vec!["redis://127.0.0.1:1".into(), "redis://127.0.0.1:2".into()]);
    match RedLockEngine::connect("rl", &two).await {
        Err(Error::Config { field, message }) => {
            assert_eq!(field, "engines.rl.masters");
            assert!(message.contains("at least 3"), "{message}");
        }
        other => panic!("expected a config error, got {:?}", other.err()),
    }
    let fixture = RedLock::with_masters(1);
    let ports: Vec<u16> = (0..2).map(|_| dlock_testkit::server::free_port()).collect();
    let mut masters = vec![format!("redis://{}", fixture.masters[0].address())];
    masters.extend(ports.iter().map(|p| format!("redis://127.0.0.1:{p}")));
    let config = RedLockConfig {
        client: ClientSettings::with_timeout(Duration::from_secs(1)),
        ..RedLockConfig::new(masters)
    };
    let connect = RedLockEngine::connect("rl", &config);
    assert_unreachable_is_a_clear_error(connect, "rl", &ports[0].to_string(), Duration::from_secs(3)).await;
}
