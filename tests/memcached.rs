//! memcached-specific behaviour against a real memcached on loopback: a
//! lock that changed hands is never deleted or extended by its old holder,
//! odd names hash to a safe key that keeps the full name, revoke flags the
//! holder's item and force release leaves a tombstone, bad settings and an
//! unreachable server are clear errors.

#![cfg(feature = "memcached")]

use std::time::{Duration, SystemTime};

use dlock::engines::memcached::{MemcachedConfig, MemcachedEngine};
use dlock::kit::ClientSettings;
use dlock::kit::{Control, Engine, Inspect, Kind, Lifecycle, Poll, Renewal, Request};
use dlock::{Error, LockKey, Mode, Only};
use dlock_testkit::fixtures::memcached::Memcached;
use dlock_testkit::server::free_port;
use dlock_testkit::{Breakable, Fixture, assert_unreachable_is_a_clear_error, engine};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

/// A fresh connection that has sent `command`.
async fn send(fixture: &Memcached, command: &str) -> BufReader<TcpStream> {
    let mut stream = BufReader::new(
        TcpStream::connect(fixture.server.address())
            .await
            .expect("connect"),
    );
    stream
        .get_mut()
        .write_all(command.as_bytes())
        .await
        .expect("send");
    stream
}

/// Sends one raw command and returns its status line (and value, if any).
async fn raw(fixture: &Memcached, command: &str) -> String {
    let mut stream = send(fixture, command).await;
    let mut line = String::new();
    stream.read_line(&mut line).await.expect("reply");
    if let Some(size) = line.strip_prefix("VA ").and_then(|r| r.split(' ').next()) {
        let mut value = vec![0; size.trim().parse::<usize>().expect("size") + 2];
        stream.read_exact(&mut value).await.expect("value");
        line.push_str(&String::from_utf8_lossy(&value));
    }
    line
}

/// Every key the server holds, from `lru_crawler metadump`.
async fn keys(fixture: &Memcached) -> String {
    let mut stream = send(fixture, "lru_crawler metadump all\r\n").await;
    let mut dump = String::new();
    while !dump.ends_with("END\r\n") {
        assert!(
            stream.read_line(&mut dump).await.expect("dump") > 0,
            "no END in {dump:?}"
        );
    }
    dump
}

fn request(name: &str) -> Request {
    Request::new(
        LockKey::new("mc", name).expect("key"),
        Mode::Write,
        Duration::from_secs(5),
    )
}

/// The engine's control facet, which this engine offers.
fn control(engine: &dyn Engine) -> &dyn Control {
    engine.facets().control.expect("control")
}

/// The engine's records facet, which this engine offers.
fn records(engine: &dyn Engine) -> &dyn Inspect {
    engine.facets().inspect.expect("records")
}

#[tokio::test]
async fn a_lock_that_changed_hands_is_neither_deleted_nor_extended_by_its_old_holder() {
    let fixture = Memcached::start();
    let engine = engine(&fixture).await;
    let old = request("k");
    assert!(matches!(engine.acquire(&old).await, Ok(Poll::Held(_))));
    // The item expires (forced here) and another client takes the lock.
    assert_eq!(raw(&fixture, "md dlock:mc:k\r\n").await, "HD\r\n");
    assert_eq!(raw(&fixture, "ms dlock:mc:k 3 T30 ME\r\nnew\r\n").await, "HD\r\n");
    assert_eq!(
        engine.renew(&old).await.expect("renew"),
        Renewal::Gone,
        "the old holder extended it"
    );
    assert!(
        !engine.release(&old).await.expect("release"),
        "the old holder deleted it"
    );
    assert!(
        raw(&fixture, "mg dlock:mc:k v\r\n").await.ends_with("new\r\n"),
        "the new holder's item is gone"
    );
}

/// The fence counter lost to a restart or a `flush_all` starts again from
/// the clock in microseconds, past every token it gave before.
#[tokio::test]
async fn fences_keep_rising_across_a_restart_and_a_flush() {
    let mut fixture = Memcached::start();
    let mut last = 0;
    // Several of each: memcached's whole-second clock lags or leads the
    // true time by a different fraction each time, and a start taken from
    // it once came out below the last token.
    let rounds = ["after a restart", "after flush_all"].repeat(4);
    for round in std::iter::once("first").chain(rounds) {
        // Spread over a few seconds, so some rounds cross a tick.
        tokio::time::sleep(Duration::from_millis(300)).await;
        match round {
            "after a restart" => {
                fixture.kill();
                fixture.restart();
            }
            "after flush_all" => assert_eq!(raw(&fixture, "flush_all\r\n").await, "OK\r\n"),
            _ => {}
        }
        let engine = engine(&fixture).await;
        for _ in 0..3 {
            let holder = request("k");
            let Ok(Poll::Held(fence)) = engine.acquire(&holder).await else {
                panic!("{round}: a free lock was refused")
            };
            assert!(fence > last, "{round}: fence {fence} after {last}");
            last = fence;
            assert!(engine.release(&holder).await.expect("release"));
        }
    }
}

/// The `t` (seconds left) and `f` (client flags) of `key`'s item.
async fn left_and_flags(fixture: &Memcached, key: &str) -> (i64, u32) {
    let line = raw(fixture, &format!("mg {key} t f\r\n")).await;
    let flag = |name: char| {
        line.split_whitespace()
            .find_map(|t| t.strip_prefix(name)?.parse::<i64>().ok())
            .unwrap_or_else(|| panic!("no {name} in {line:?}"))
    };
    (flag('t'), flag('f') as u32)
}

/// Revoke sets the holder's item's flags, keeping its value and expiry;
/// the holder's renewals hear it and keep them; the next holder's item has
/// none. Force release leaves a tombstone named by the owner's digest
/// alone, expiring when the item would have, then deletes the item; the
/// next holder's fence is greater.
#[tokio::test]
async fn revoke_flags_the_item_and_force_release_leaves_a_tombstone_that_ends_with_the_lease() {
    let fixture = Memcached::start();
    let engine = engine(&fixture).await;
    let key = LockKey::new("mc", "ctl").expect("key");
    let holder = request("ctl");
    let Ok(Poll::Held(first)) = engine.acquire(&holder).await else {
        panic!("a free lock was refused")
    };
    let (left, flags) = left_and_flags(&fixture, "dlock:mc:ctl").await;
    assert_eq!(flags, 0);
    assert_eq!(
        control(&*engine)
            .revoke(&key, &Only::any())
            .await
            .expect("revoke"),
        1
    );
    let (left_after, flags) = left_and_flags(&fixture, "dlock:mc:ctl").await;
    assert!(
        flags == 1 && left_after <= left,
        "{left_after} s left after {left}, flags {flags}"
    );
    for _ in 0..2 {
        assert_eq!(engine.renew(&holder).await.expect("renew"), Renewal::Revoked);
        assert_eq!(left_and_flags(&fixture, "dlock:mc:ctl").await.1, 1);
    }
    assert_eq!(
        control(&*engine)
            .revoke(&key, &Only::any())
            .await
            .expect("revoke"),
        1,
        "asked again"
    );

    assert_eq!(
        control(&*engine)
            .force_release(&key, &Only::any())
            .await
            .expect("force release"),
        1
    );
    assert_eq!(engine.renew(&holder).await.expect("renew"), Renewal::Gone);
    assert!(control(&*engine).forced_out(&holder).await.expect("forced out"));
    let tombstone = format!(
        "dlock-forced:{:032x}:{}",
        key.stable_hash(),
        holder.owner.digest()
    );
    let (left, _) = left_and_flags(&fixture, &tombstone).await;
    assert!(
        (1..=7).contains(&left),
        "the tombstone has {left} s left, the lease 5 s"
    );
    let dump = keys(&fixture).await;
    assert!(
        !dump.contains(&holder.owner.to_string()),
        "an owner id in a key: {dump}"
    );

    let next = request("ctl");
    let Ok(Poll::Held(second)) = engine.acquire(&next).await else {
        panic!("the lock forced free was refused")
    };
    assert!(second > first, "fence {second} after {first}");
    assert_eq!(engine.renew(&next).await.expect("renew"), Renewal::Held);
    assert!(!control(&*engine).forced_out(&next).await.expect("forced out"));
    assert!(engine.release(&next).await.expect("release"));
}

/// A hold's record comes from its item alone: the configured label, the
/// owner's digest, when it was granted by this client's clock, and the
/// item's end (the lease rounded up, plus a second); no fence, which is
/// taken after the item is written. A semaphore shows each slot held, and
/// the count its items keep. An item dlock did not write still shows as a
/// holder, with nothing it cannot tell.
#[tokio::test]
async fn records_read_the_label_and_times_from_the_item_and_never_a_fence() {
    let fixture = Memcached::start();
    let config = MemcachedConfig {
        connections: 2,
        client: ClientSettings {
            client_name: Some("billing 7".to_owned()),
            ..ClientSettings::default()
        },
        ..MemcachedConfig::new(fixture.server.address())
    };
    let named = MemcachedEngine::connect("mc", &config).await.expect("connect");
    let looking = engine(&fixture).await;
    let holder = request("shown");
    let before = SystemTime::now();
    assert!(matches!(named.acquire(&holder).await, Ok(Poll::Held(_))));
    let after = SystemTime::now();
    let view = records(&*looking)
        .inspect(&holder.key, None)
        .await
        .expect("inspect");
    let [record] = view.holders.as_slice() else {
        panic!("one holder expected: {view:?}");
    };
    assert_eq!(
        (
            record.label.as_deref(),
            record.owner.clone(),
            record.fence,
            record.mode
        ),
        (Some("billing 7"), Some(holder.owner.digest()), None, Mode::Write)
    );
    let since = record.since.expect("since");
    let millis = Duration::from_millis(1);
    assert!(since + millis >= before && since <= after, "since {since:?}");
    // A 5 s lease is an item of 7 s, of which memcached says 5 to 7 are
    // left (its clock can move two seconds in one tick).
    let ends = record.lease_ends.expect("lease end");
    let read = SystemTime::now();
    assert!(
        ends >= read + Duration::from_secs(4) && ends <= read + Duration::from_secs(7),
        "ends {ends:?}, read at {read:?}"
    );
    assert!(named.release(&holder).await.expect("release"));
    assert!(
        records(&*looking)
            .inspect(&holder.key, None)
            .await
            .expect("inspect")
            .is_free()
    );

    let permit = |name: &str| {
        let mut req = request(name);
        req.kind = Kind::Semaphore(3);
        req
    };
    let (first, second) = (permit("sem"), permit("sem"));
    for req in [&first, &second] {
        let permits = dlock::kit::Semaphores::permits(&named, 3);
        assert!(matches!(permits.acquire(req).await, Ok(Poll::Held(_))));
    }
    // Asked with another count, the view keeps the one the items agree on.
    let view = records(&*looking)
        .inspect(&first.key, Some(5))
        .await
        .expect("inspect");
    let mut owners: Vec<_> = view.holders.iter().map(|r| r.owner.clone()).collect();
    owners.sort_unstable();
    let mut expected = vec![Some(first.owner.digest()), Some(second.owner.digest())];
    expected.sort_unstable();
    assert_eq!((view.permits, owners), (Some(3), expected), "{view:?}");

    assert_eq!(
        raw(&fixture, "ms dlock:mc:foreign 3 T60\r\nabc\r\n").await,
        "HD\r\n"
    );
    let foreign = LockKey::new("mc", "foreign").expect("key");
    let view = records(&*looking).inspect(&foreign, None).await.expect("inspect");
    let [record] = view.holders.as_slice() else {
        panic!("one holder expected: {view:?}");
    };
    assert_eq!(
        (record.label.clone(), record.owner.clone(), record.since),
        (None, None, None)
    );
}

#[tokio::test]
async fn odd_names_hash_to_a_safe_key_whose_item_keeps_the_full_name() {
    let fixture = Memcached::start();
    let engine = engine(&fixture).await;
    let name = format!("with spaces ✓ {}", "k".repeat(300));
    let req = request(&name);
    assert!(matches!(engine.acquire(&req).await, Ok(Poll::Held(_))));
    let dump = keys(&fixture).await;
    // metadump URL-encodes keys: `dlock:#...` is `dlock%3A%23...`.
    let key = dump
        .split_whitespace()
        .filter_map(|w| w.strip_prefix("key="))
        .find(|k| k.starts_with("dlock%3A%23"))
        .unwrap_or_else(|| panic!("no hashed key in {dump:?}"))
        .replace("%3A", ":")
        .replace("%23", "#");
    let item = raw(&fixture, &format!("mg {key} v\r\n")).await;
    assert!(item.contains(&name), "the item does not keep the name: {item:?}");
    assert!(engine.release(&req).await.expect("release"));
}

#[tokio::test]
async fn bad_settings_and_an_unreachable_server_are_clear_errors() {
    let port = free_port();
    let config = MemcachedConfig {
        connections: 2,
        client: ClientSettings::with_timeout(Duration::from_secs(1)),
        ..MemcachedConfig::new(format!("127.0.0.1:{port}"))
    };
    let connect = MemcachedEngine::connect("mc", &config);
    assert_unreachable_is_a_clear_error(connect, "mc", &port.to_string(), Duration::from_secs(3)).await;

    let none = MemcachedConfig {
        connections: 0,
        ..config
    };
    match MemcachedEngine::connect("mc", &none).await {
        Err(Error::Config { field, .. }) => assert_eq!(field, "engines.mc.connections"),
        other => panic!("expected a config error, got {:?}", other.err()),
    }
}
