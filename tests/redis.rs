//! Redis-specific behaviour against real redis-servers on loopback: dead
//! waiters and readers, reader runs, script cache flush, server restart,
//! leak-freedom, unreachable servers.

#![cfg(feature = "redis")]

use std::sync::Arc;
use std::time::{Duration, Instant};

use dlock::config::Polling;
use dlock::engines::conformance::{self, SETTINGS};
use dlock::engines::redis::{RedisConfig, RedisEngine};
use dlock::kit::ClientSettings;
use dlock::kit::{Engine, Lifecycle};
use dlock::kit::{Inspect, List};
use dlock::{Error, LockKey, Mode, Registry, Settings};
use dlock_core::kit::{Poll, Request};
use dlock_testkit::fixtures::redis::{info_field, redis_args};
use dlock_testkit::server::{TestServer, free_port};
use futures_util::StreamExt;

fn start() -> TestServer {
    TestServer::start("redis-server", |port| redis_args(port, &[]))
}

fn config(server: &TestServer) -> RedisConfig {
    RedisConfig {
        client: ClientSettings::with_timeout(Duration::from_secs(2)),
        fence_retention: Duration::from_secs(1),
        waiter_ttl: Duration::from_secs(1),
        ..RedisConfig::new(format!("redis://{}", server.address()))
    }
}

async fn engine(server: &TestServer) -> Arc<RedisEngine> {
    engine_with(server, Duration::from_secs(1)).await
}

/// An engine that drops waiters silent for `waiter_ttl`.
async fn engine_with(server: &TestServer, waiter_ttl: Duration) -> Arc<RedisEngine> {
    let config = RedisConfig {
        waiter_ttl,
        ..config(server)
    };
    Arc::new(RedisEngine::connect("redis", &config).await.expect("connect"))
}

async fn raw(server: &TestServer) -> redis::aio::MultiplexedConnection {
    let client = redis::Client::open(format!("redis://{}", server.address())).expect("url");
    client
        .get_multiplexed_async_connection()
        .await
        .expect("raw connection")
}

/// Waiters poll only every `interval`, so one served sooner heard a
/// notification (their engine needs a `waiter_ttl` of 3 intervals).
fn slow_polling(interval: Duration) -> Settings {
    Settings {
        poll: Polling::Constant { interval },
        ..SETTINGS
    }
}

fn request(group: &str, name: &str, mode: Mode, lease: Duration, queue: bool) -> Request {
    let mut req = Request::new(LockKey::new(group, name).expect("key"), mode, lease);
    req.try_once = !queue;
    req
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_waiter_at_the_head_is_kicked() {
    let server = start();
    let engine = engine_with(&server, Duration::from_millis(500)).await;
    let holder = request("kick", "k", Mode::Write, Duration::from_secs(10), false);
    let dead = request("kick", "k", Mode::Write, Duration::from_secs(10), true);
    assert!(matches!(engine.acquire(&holder).await, Ok(Poll::Held(_))));
    // Queued, then never heard from again: its liveness key lapses after 500 ms.
    assert!(matches!(engine.acquire(&dead).await, Ok(Poll::Waiting(_))));
    let registry = Registry::with_engine("redis", engine.clone(), SETTINGS).expect("registry");
    let next = dlock_testkit::timed_writer(registry.locks("kick").get("k"));
    tokio::time::sleep(Duration::from_millis(100)).await;
    let released = Instant::now();
    assert!(engine.release(&holder).await.expect("release"));
    let granted = next.await.expect("task");
    let took = granted - released;
    // The dead head's ttl (from its last sign of life, before `released`) plus one poll (100 ms).
    assert!(
        took <= Duration::from_millis(500 + 100 + 150),
        "kicked after {took:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_that_dies_leaves_its_waiters_first_in_line() {
    let server = start();
    let engine = engine_with(&server, Duration::from_secs(3)).await;
    let lease = Duration::from_millis(300);
    let holder = request("order", "k", Mode::Write, lease, false);
    let waiter = request("order", "k", Mode::Write, lease, true);
    let newcomer = request("order", "k", Mode::Write, lease, false);
    assert!(matches!(engine.acquire(&holder).await, Ok(Poll::Held(_))));
    assert!(matches!(engine.acquire(&waiter).await, Ok(Poll::Waiting(_))));
    // The holder never renews: its lease runs out with the waiter still queued.
    tokio::time::sleep(lease * 2).await;
    assert!(
        matches!(engine.acquire(&newcomer).await, Ok(Poll::Waiting(_))),
        "a newcomer jumped the queue once the holder's lease ran out"
    );
    assert!(matches!(engine.poll(&waiter).await, Ok(Poll::Held(_))));
    assert!(engine.release(&waiter).await.expect("release"));
    assert!(matches!(engine.acquire(&newcomer).await, Ok(Poll::Held(_))));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_reader_expires_on_its_own_while_others_renew() {
    let server = start();
    let engine = engine(&server).await;
    let registry = Registry::with_engine("redis", engine.clone(), SETTINGS).expect("registry");
    let locks = registry.locks("readers");
    // A reader that dies at once, lease 1 s; a live reader renewing a 1 s lease for 2.5 s.
    let dead = request("readers", "r", Mode::Read, Duration::from_secs(1), false);
    assert!(matches!(engine.acquire(&dead).await, Ok(Poll::Held(_))));
    let live = locks
        .get("r")
        .with_lease(Duration::from_secs(1))
        .read()
        .await
        .expect("read");
    let writer = dlock_testkit::timed_writer(locks.get("r"));
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert!(!writer.is_finished(), "writer admitted beside a live reader");
    let released = Instant::now();
    live.release().await.expect("release");
    let granted = writer.await.expect("task");
    // The dead reader's lease ran out long ago despite the other's renewals.
    assert!(
        granted - released < Duration::from_millis(300),
        "writer waited {:?}",
        granted - released
    );
}

/// A dead reader's record goes with its hold: the view shows the live
/// reader alone, and the next script to drop the dead drops its record.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_readers_record_goes_with_it() {
    let server = start();
    let engine = engine(&server).await;
    let dead = request("records", "r", Mode::Read, Duration::from_millis(300), false);
    let live = request("records", "r", Mode::Read, Duration::from_secs(10), false);
    assert!(matches!(engine.acquire(&dead).await, Ok(Poll::Held(_))));
    assert!(matches!(engine.acquire(&live).await, Ok(Poll::Held(_))));
    tokio::time::sleep(Duration::from_millis(400)).await;
    let view = engine.inspect(&live.key, None).await.expect("inspect");
    let owners: Vec<_> = view.holders.iter().map(|h| h.owner.clone()).collect();
    assert_eq!(owners, [Some(live.owner.digest())], "{view:?}");
    let writer = request("records", "r", Mode::Write, Duration::from_secs(10), true);
    assert!(matches!(engine.acquire(&writer).await, Ok(Poll::Waiting(_))));
    let mut raw = raw(&server).await;
    let kept: Vec<String> = redis::cmd("HKEYS")
        .arg("{dlock:records:r}:i")
        .query_async(&mut raw)
        .await
        .expect("hkeys");
    let mut expected = vec![live.owner.to_string(), writer.owner.to_string()];
    expected.sort();
    let mut kept = kept;
    kept.sort();
    assert_eq!(kept, expected, "the records kept");
    engine.cancel(&writer).await.expect("cancel");
    assert!(engine.release(&live).await.expect("release"));
}

/// A hold or a waiter from a dlock that kept no records shows with what
/// the layout tells (mode, fence, lease, owner digest) and no label; a
/// handoff to such a waiter writes it as it expects, its id alone; this
/// process's holds carry its `client_name`, and `CLIENT LIST` names its
/// connection after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn holds_without_records_show_what_is_known() {
    let server = start();
    let config = RedisConfig {
        client: ClientSettings {
            client_name: Some("billing 7".into()),
            ..config(&server).client
        },
        ..config(&server)
    };
    let engine = Arc::new(RedisEngine::connect("redis", &config).await.expect("connect"));
    let mut raw = raw(&server).await;
    let clients: String = redis::cmd("CLIENT")
        .arg("LIST")
        .query_async(&mut raw)
        .await
        .expect("client list");
    assert!(
        clients.lines().any(|client| client.contains(" name=billing_7 ")),
        "{clients}"
    );
    let old = dlock::kit::OwnerId::random();
    let gate = format!("{:014x}{:011x}~{old}", 7, 1000);
    let _: () = redis::cmd("SET")
        .arg("{dlock:old:a}:w")
        .arg(&gate)
        .arg("PX")
        .arg(60_000)
        .query_async(&mut raw)
        .await
        .expect("set");
    let view = engine
        .inspect(&LockKey::new("old", "a").expect("key"), None)
        .await
        .expect("inspect");
    let [holder] = view.holders.as_slice() else {
        panic!("{view:?}")
    };
    assert_eq!(
        (holder.label.as_deref(), holder.since, holder.fence),
        (None, None, Some(7))
    );
    assert_eq!(holder.owner, Some(old.digest()));

    let mine = request("old", "b", Mode::Write, Duration::from_secs(10), false);
    assert!(matches!(engine.acquire(&mine).await, Ok(Poll::Held(_))));
    let view = engine.inspect(&mine.key, None).await.expect("inspect");
    assert_eq!(view.holders[0].label.as_deref(), Some("billing 7"), "{view:?}");
    // An older dlock's waiter: queued as any, without a record.
    let waiter = request("old", "b", Mode::Write, Duration::from_secs(10), true);
    assert!(matches!(engine.acquire(&waiter).await, Ok(Poll::Waiting(_))));
    let _: () = redis::cmd("HDEL")
        .arg("{dlock:old:b}:i")
        .arg(waiter.owner.to_string())
        .query_async(&mut raw)
        .await
        .expect("hdel");
    assert!(engine.release(&mine).await.expect("release"));
    let gate: String = redis::cmd("GET")
        .arg("{dlock:old:b}:w")
        .query_async(&mut raw)
        .await
        .expect("get");
    assert_eq!(
        gate[26..],
        waiter.owner.to_string(),
        "handed over as an older dlock reads it: {gate}"
    );
}

/// A listing reads a lone writer's or an idle lock's gate raw and the
/// others by script, and each lock it shows is what `inspect` shows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listing_shows_every_lock_as_inspect_does() {
    let server = start();
    let engine = engine(&server).await;
    let lease = Duration::from_secs(10);
    let take = async |name: &str, mode: Mode, queue: bool| {
        let req = request("mix", name, mode, lease, queue);
        let poll = engine.acquire(&req).await.expect("acquire");
        (req, matches!(poll, Poll::Held(_)))
    };
    let (_lone, held) = take("lone", Mode::Write, false).await;
    assert!(held);
    let (_writer, held) = take("queued", Mode::Write, false).await;
    assert!(held);
    let (_waiter, held) = take("queued", Mode::Write, true).await;
    assert!(!held);
    for _ in 0..2 {
        assert!(take("read", Mode::Read, false).await.1);
    }
    let (idle, held) = take("idle", Mode::Write, false).await;
    assert!(held && engine.release(&idle).await.expect("release"));
    let mut raw = raw(&server).await;
    let older = format!("{:014x}{:011x}~{}", 7, 1000, dlock::kit::OwnerId::random());
    let _: () = redis::cmd("SET")
        .arg("{dlock:mix:older}:w")
        .arg(&older)
        .arg("PX")
        .arg(60_000)
        .query_async(&mut raw)
        .await
        .expect("set");

    let mut listed = engine.list("mix").await.expect("list");
    listed.sort_by(|a, b| a.name.cmp(&b.name));
    let names: Vec<&str> = listed.iter().map(|v| v.name.as_str()).collect();
    assert_eq!(names, ["idle", "lone", "older", "queued", "read"]);
    let shape: Vec<(usize, usize)> = listed
        .iter()
        .map(|v| (v.holders.len(), v.waiters.len()))
        .collect();
    assert_eq!(shape, [(0, 0), (1, 0), (1, 0), (1, 1), (2, 0)], "{listed:?}");
    for mut view in listed {
        let key = LockKey::new("mix", view.name.as_str()).expect("key");
        let mut inspected = engine.inspect(&key, None).await.expect("inspect");
        // The lease's end, read a moment apart, from the same deadline.
        for (a, b) in view.holders.iter_mut().zip(&mut inspected.holders) {
            let (x, y) = (a.lease_ends.expect("an end"), b.lease_ends.expect("an end"));
            let apart = x
                .duration_since(y)
                .or_else(|_| y.duration_since(x))
                .expect("apart");
            assert!(apart < Duration::from_secs(1), "{x:?} and {y:?}");
            (a.lease_ends, a.renewed) = (b.lease_ends, b.renewed);
        }
        assert_eq!(view, inspected);
    }
}

/// A record tells the lease its hold asked for, and the renewal that set
/// its deadline: a lone writer's (read from its gate), a reader's (from
/// the readers' set), each moving with a renewal and not before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_shows_the_lease_and_the_renewal_that_set_its_end() {
    let server = start();
    let engine = RedisEngine::connect("redis", &config(&server))
        .await
        .expect("connect");
    let lease = Duration::from_secs(20);
    for (name, mode) in [("lone", Mode::Write), ("read", Mode::Read)] {
        let holder = request("renewed", name, mode, lease, false);
        assert!(matches!(engine.acquire(&holder).await, Ok(Poll::Held(_))));
        let renewed = async || {
            let view = engine.inspect(&holder.key, None).await.expect("inspect");
            let [record] = view.holders.as_slice() else {
                panic!("{view:?}")
            };
            assert_eq!(record.lease, Some(lease), "{view:?}");
            record.renewed.expect("a renewal")
        };
        let granted = renewed().await;
        tokio::time::sleep(Duration::from_millis(50)).await;
        // A lone writer's deadline is the gate's PTTL read against the
        // server's clock: the same to a millisecond or two.
        let again = renewed().await;
        let moved = again.duration_since(granted).unwrap_or_default();
        assert!(
            moved <= Duration::from_millis(5),
            "{name}: moved {moved:?}, unrenewed"
        );
        assert_eq!(
            engine.renew(&holder).await.expect("renew"),
            dlock::kit::Renewal::Held
        );
        let later = renewed().await.duration_since(granted).unwrap_or_default();
        assert!(later >= Duration::from_millis(50), "{name}: renewed {later:?} on");
        assert!(engine.release(&holder).await.expect("release"));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thirty_queued_readers_are_admitted_on_one_notification() {
    let server = start();
    let engine = engine_with(&server, Duration::from_secs(3)).await;
    // Polling once a second: only notifications can admit them quickly.
    let settings = slow_polling(Duration::from_secs(1));
    let registry = Arc::new(Registry::with_engine("redis", engine, settings).expect("registry"));
    let writer = registry.locks("run").get("catalog").lock().await.expect("lock");
    let readers: Vec<_> = (0..30)
        .map(|_| {
            let registry = registry.clone();
            tokio::spawn(async move {
                let guard = registry.locks("run").get("catalog").read().await.expect("read");
                let at = Instant::now();
                tokio::time::sleep(Duration::from_millis(200)).await;
                guard.release().await.expect("release");
                at
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let released = Instant::now();
    writer.release().await.expect("release");
    let mut last = released;
    for reader in readers {
        last = last.max(reader.await.expect("task"));
    }
    let took = last - released;
    println!("30 queued readers: last admitted {took:?} after the writer released");
    assert!(
        took < Duration::from_millis(300),
        "readers admitted one poll at a time: {took:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_wakes_only_the_engine_of_the_next_waiter() {
    let server = start();
    // Polling once a second: only notifications can hand over quickly.
    let settings = slow_polling(Duration::from_secs(1));
    let mut registries = Vec::new();
    for _ in 0..3 {
        registries.push(Arc::new(
            Registry::with_engine(
                "redis",
                engine_with(&server, Duration::from_secs(3)).await,
                settings,
            )
            .expect("registry"),
        ));
    }
    let client = redis::Client::open(format!("redis://{}", server.address())).expect("url");
    let mut listener = client.get_async_pubsub().await.expect("pubsub");
    listener
        .psubscribe("{dlock:fanout:k}:n:*")
        .await
        .expect("psubscribe");
    let holder = registries[0].locks("fanout").get("k").lock().await.expect("lock");
    let mut waiters = Vec::new();
    for (registry, write) in [(registries[1].clone(), true), (registries[2].clone(), false)] {
        waiters.push(tokio::spawn(async move {
            let lock = registry.locks("fanout").get("k");
            let guard = if write {
                lock.lock().await
            } else {
                lock.read().await
            }
            .expect("lock");
            tokio::time::sleep(Duration::from_millis(100)).await;
            guard.release().await.expect("release");
        }));
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let released = Instant::now();
    holder.release().await.expect("release");
    for waiter in waiters {
        waiter.await.expect("waiter");
    }
    assert!(
        released.elapsed() < Duration::from_millis(800),
        "a waiter polled its way in"
    );

    let mut raw = raw(&server).await;
    let mut messages = listener.on_message();
    let mut channels = Vec::new();
    for _ in 0..2 {
        let message = tokio::time::timeout(Duration::from_secs(1), messages.next())
            .await
            .expect("a notification per handover")
            .expect("message");
        let channel = message.get_channel_name().to_owned();
        let (_, listening): (String, u64) = redis::cmd("PUBSUB")
            .arg("NUMSUB")
            .arg(&channel)
            .query_async(&mut raw)
            .await
            .expect("numsub");
        assert_eq!(listening, 1, "{channel} reaches more than one engine");
        channels.push(channel);
    }
    assert_ne!(
        channels[0], channels[1],
        "both waiters' engines heard the same channel"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_subscriber_is_replaced_and_notifications_resume() {
    let server = start();
    // Polling once every 2 s: a waiter in well under that heard a notification.
    let settings = slow_polling(Duration::from_secs(2));
    let engine = engine_with(&server, Duration::from_secs(6)).await;
    let registry = Registry::with_engine("redis", engine, settings).expect("registry");
    let mut raw = raw(&server).await;
    for round in 0..2 {
        let holder = registry.locks("resub").get("k").lock().await.expect("lock");
        let waiter = dlock_testkit::timed_writer(registry.locks("resub").get("k"));
        tokio::time::sleep(Duration::from_millis(300)).await;
        if round == 0 {
            // The subscriber goes; the waiter polls at once and subscribes anew.
            let killed: u64 = redis::cmd("CLIENT")
                .arg("KILL")
                .arg("TYPE")
                .arg("pubsub")
                .query_async(&mut raw)
                .await
                .expect("client kill");
            assert_eq!(killed, 1, "one subscriber connection per engine");
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
        let released = Instant::now();
        holder.release().await.expect("release");
        let took = waiter.await.expect("waiter") - released;
        assert!(
            took < Duration::from_millis(500),
            "round {round}: waited {took:?}"
        );
    }
}

/// A lock handed straight to a waiter lasts at most that waiter's lease, as
/// any grant does, not its whole liveness window (`waiter_ttl`, 3 s by
/// default): a waiter that dies right after the handoff blocks the next for
/// its lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handed_over_grant_lasts_the_lease_not_the_waiter_ttl() {
    let server = start();
    let engine = engine_with(&server, Duration::from_secs(3)).await;
    let lease = Duration::from_secs(1);
    let holder = request("handoff", "k", Mode::Write, Duration::from_secs(30), false);
    let waiter = request("handoff", "k", Mode::Write, lease, true);
    assert!(matches!(engine.acquire(&holder).await, Ok(Poll::Held(_))));
    // The first try subscribes and asks to be tried again; the second waits
    // on the notification.
    let Ok(Poll::Waiting(subscribed)) = engine.acquire(&waiter).await else {
        panic!("not queued")
    };
    assert!(matches!(subscribed.await, dlock::kit::Woken::Retry));
    let Ok(Poll::Waiting(mut handed)) = engine.poll(&waiter).await else {
        panic!("not queued")
    };
    assert!(engine.release(&holder).await.expect("release"));
    let released = Instant::now();
    loop {
        match tokio::time::timeout(Duration::from_secs(5), handed).await {
            Ok(dlock::kit::Woken::Granted { valid_for, .. }) => break assert_eq!(valid_for, lease),
            // A wake may come spuriously (notifications lost on a busy
            // machine); the waiter then asks again, as the core does, and
            // a grant it finds by asking lasts its lease too.
            Ok(dlock::kit::Woken::Retry) => match engine.poll(&waiter).await {
                Ok(Poll::Waiting(again)) => handed = again,
                Ok(Poll::Held(_)) => break,
                Err(e) => panic!("poll after a wake: {e}"),
            },
            Err(_) => panic!("no handoff within 5 s of the release"),
        }
    }
    // The waiter now dies holding: nobody renews it.
    let registry = Registry::with_engine("redis", engine.clone(), SETTINGS).expect("registry");
    let next = dlock_testkit::timed_writer(registry.locks("handoff").get("k"));
    let took = next.await.expect("next") - released;
    assert!(
        took >= lease - Duration::from_millis(100) && took < lease + Duration::from_millis(800),
        "free again {took:?} after the handoff, for a {lease:?} lease"
    );
}

/// A holder's connection killed (`CLIENT KILL`): its release fails on the
/// dead connection and is sent again on a fresh one, so the lock is free
/// at once, not when the lease runs out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_on_a_killed_connection_is_sent_again() {
    let server = start();
    let engine = engine(&server).await;
    let holder = request("killed", "k", Mode::Write, Duration::from_secs(30), false);
    assert!(matches!(engine.acquire(&holder).await, Ok(Poll::Held(_))));
    let killed: u64 = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("TYPE")
        .arg("normal")
        .query_async(&mut raw(&server).await)
        .await
        .expect("client kill");
    assert!(killed >= 1, "the engine's connection was not killed");
    // Let the client see its connection closed before the release.
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        engine.release(&holder).await.expect("release"),
        "the hold was lost"
    );
    let next = request("killed", "k", Mode::Write, Duration::from_secs(30), false);
    assert!(
        matches!(engine.acquire(&next).await, Ok(Poll::Held(_))),
        "still taken after the release"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn script_flush_during_use_is_transparent() {
    let server = start();
    let registry = Registry::with_engine("redis", engine(&server).await, SETTINGS).expect("registry");
    let lock = registry.locks("flush").get("x");
    let mut raw = raw(&server).await;
    for round in 0..6 {
        if round % 2 == 1 {
            let _: () = redis::cmd("SCRIPT")
                .arg("FLUSH")
                .query_async(&mut raw)
                .await
                .expect("flush");
        }
        let guard = lock.lock().await.expect("lock after SCRIPT FLUSH");
        guard.release().await.expect("release after SCRIPT FLUSH");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_server_makes_holders_lost() {
    let mut server = start();
    let registry = Registry::with_engine("redis", engine(&server).await, SETTINGS).expect("registry");
    let guard = registry
        .locks("restart")
        .get("x")
        .with_lease(Duration::from_secs(1))
        .lock()
        .await
        .expect("lock");
    let lost = guard.lost();
    server.restart();
    let started = Instant::now();
    let reason = tokio::time::timeout(Duration::from_secs(5), lost)
        .await
        .expect("lost within 5 s");
    println!("restart: lost ({reason}) after {:?}", started.elapsed());
    assert!(matches!(guard.release().await, Err(Error::Lost { .. })));
    // The engine reconnects: the lock works again.
    let again = registry
        .locks("restart")
        .get("x")
        .lock()
        .await
        .expect("lock after restart");
    again.release().await.expect("release");
}

/// The whole conformance suite, then every lease, liveness key and retention
/// runs out: nothing is left on the server.
/// Waiting costs O(processes): 5,000 tasks of one process wait behind a
/// holder with the default settings, and the server sees a few commands a
/// second, where a waiter each keeping its place alive (every `waiter_ttl`,
/// 1 s here) would send at least 5,000. Then each of them gets the lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn five_thousand_waiters_cost_the_server_what_one_does() {
    const WAITERS: u64 = 5_000;
    let server = start();
    let registry =
        Registry::with_engine("redis", engine(&server).await, Settings::default()).expect("registry");
    let lock = registry.locks("scale").get("hot");
    let holder = lock.lock().await.expect("hold");
    let counter = Arc::new(conformance::GuardedCounter::default());
    let waiters: Vec<_> = (0..WAITERS)
        .map(|_| {
            let (lock, counter) = (lock.clone(), counter.clone());
            tokio::spawn(async move {
                let guard = lock.lock().await.expect("lock");
                counter.increment().await;
                guard.release().await.expect("release");
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let mut raw = raw(&server).await;
    let commands = async |raw: &mut redis::aio::MultiplexedConnection| -> u64 {
        let info: String = redis::cmd("INFO")
            .arg("stats")
            .query_async(raw)
            .await
            .expect("info");
        info_field::<u64>(&info, "total_commands_processed")
    };
    let before = commands(&mut raw).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let per_second = (commands(&mut raw).await - before) / 2;
    assert!(
        per_second < WAITERS / 10,
        "{per_second} commands/s while {WAITERS} waited"
    );
    holder.release().await.expect("release");
    for waiter in waiters {
        waiter.await.expect("waiter");
    }
    assert_eq!(counter.overlaps(), 0, "holders overlapped");
    assert_eq!(counter.count(), WAITERS, "every waiter got the lock once");
}

/// Past its first renewal a holder watches its lock, so a revocation or a
/// force release reaches it at once (see the helper).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn past_its_first_renewal_a_holder_hears_a_revocation_and_a_force_release_at_once() {
    let server = start();
    let registry =
        Registry::with_engine("redis", engine(&server).await, Settings::default()).expect("registry");
    dlock_testkit::assert_acts_heard_at_once(&registry).await;
}

/// Once the conformance suite is done, every lock and semaphore key has
/// gone; what stays is the label the engines registered, which expires
/// within the hour it is kept for.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn no_key_is_left_behind() {
    let server = start();
    let server_ref = &server;
    conformance::run_each(|| async move { engine(server_ref).await as Arc<dyn Engine> }).await;
    let mut raw = raw(&server).await;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let keys: Vec<String> = redis::cmd("KEYS")
            .arg("*")
            .query_async(&mut raw)
            .await
            .expect("keys");
        let (labels, left): (Vec<String>, Vec<String>) = keys
            .into_iter()
            .partition(|key| key.starts_with("{dlock:}:label:"));
        if left.is_empty() {
            let [label] = labels.as_slice() else {
                panic!("one label registered: {labels:?}");
            };
            let ttl: i64 = redis::cmd("TTL")
                .arg(label)
                .query_async(&mut raw)
                .await
                .expect("ttl");
            assert!((1..=3600).contains(&ttl), "{label} kept {ttl} s");
            break;
        }
        assert!(Instant::now() < deadline, "{} keys left: {left:?}", left.len());
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test]
async fn an_unreachable_server_is_a_clear_error_in_time() {
    let port = free_port();
    let config = RedisConfig {
        client: ClientSettings::with_timeout(Duration::from_secs(1)),
        ..RedisConfig::new(format!("redis://127.0.0.1:{port}"))
    };
    let connect = RedisEngine::connect("main", &config);
    dlock_testkit::assert_unreachable_is_a_clear_error(
        connect,
        "main",
        &port.to_string(),
        Duration::from_secs(3),
    )
    .await;

    let bad = RedisConfig {
        url: "redis//u:secret@nowhere".into(),
        ..config.clone()
    };
    match RedisEngine::connect("main", &bad).await {
        Err(Error::Config { field, message }) => {
            assert_eq!(field, "engines.main.url");
            assert!(
                message.contains("redis//u:") && message.contains("redis://"),
                "{message}"
            );
            assert!(
                !message.contains("secret"),
                "a password in an error message: {message}"
            );
        }
        other => panic!("expected a config error, got {:?}", other.err()),
    }
    // An unencoded `/` in the password still stays out of the message.
    let slashed = RedisConfig {
        url: "redis://u:pa/ss@127.0.0.1:6790/x/y".into(),
        ..config
    };
    match RedisEngine::connect("main", &slashed).await {
        Err(err) => assert!(
            !err.to_string().contains("pa/ss"),
            "a password in an error message: {err}"
        ),
        Ok(_) => panic!("connected to a url with a malformed path"),
    }

    // The scripts use both as key expiries: zero is refused before connecting.
    for field in ["fence_retention", "waiter_ttl"] {
        let mut zero = RedisConfig::new(format!("redis://127.0.0.1:{port}"));
        match field {
            "fence_retention" => zero.fence_retention = Duration::ZERO,
            _ => zero.waiter_ttl = Duration::ZERO,
        }
        match RedisEngine::connect("main", &zero).await {
            Err(Error::Config { field: named, .. }) => assert_eq!(named, format!("engines.main.{field}")),
            other => panic!("expected a config error for {field}, got {:?}", other.err()),
        }
    }
}

/// An ACL user logs in with the password in the url, or with `username`
/// and `password_file`; a password in both places is refused.
#[tokio::test]
async fn acl_users_authenticate_from_the_url_or_a_password_file() {
    let server = start();
    let mut raw = raw(&server).await;
    let _: () = redis::cmd("ACL")
        .arg(&["SETUSER", "locker", "on", ">s3cret", "~*", "&*", "+@all"][..])
        .query_async(&mut raw)
        .await
        .expect("acl setuser");
    let with = |url: String| RedisConfig {
        url,
        ..config(&server)
    };
    let good = with(format!("redis://locker:s3cret@{}", server.address()));
    let from_file = RedisConfig {
        credentials: dlock::kit::Credentials {
            username: Some("locker".into()),
            password_file: Some(dlock_testkit::server::secret_file("s3cret")),
            ..Default::default()
        },
        ..with(format!("redis://{}", server.address()))
    };
    for config in [&good, &from_file] {
        let registry = Registry::with_engine(
            "redis",
            Arc::new(RedisEngine::connect("acl", config).await.expect("connect")),
            SETTINGS,
        )
        .expect("registry");
        registry
            .locks("acl")
            .get("x")
            .lock()
            .await
            .expect("lock")
            .release()
            .await
            .expect("release");
    }
    let twice = RedisConfig {
        url: good.url.clone(),
        ..from_file.clone()
    };
    match RedisEngine::connect("acl", &twice).await {
        Err(Error::Config { field, message }) => {
            assert_eq!(field, "engines.acl.password_file");
            assert!(!message.contains("s3cret"), "{message}");
        }
        other => panic!("expected a config error, got {:?}", other.err()),
    }

    let bad = with(format!("redis://locker:wrong@{}", server.address()));
    let err = RedisEngine::connect("acl", &bad)
        .await
        .err()
        .expect("wrong password accepted");
    let message = err.to_string();
    assert!(
        matches!(err, Error::Unavailable { .. }) && message.contains("`acl`"),
        "{message}"
    );
}

/// The harness, not the engine: a server restarted while its port is taken
/// (here by a socket bound to it that does not listen, as the local end of
/// some client's connection would in a busy suite) starts once the port is
/// free again, instead of failing.
#[test]
fn a_restart_waits_out_a_port_taken_meanwhile() {
    let mut server = start();
    server.kill();
    let taken = tokio::net::TcpSocket::new_v4().expect("socket");
    taken
        .bind(([127, 0, 0, 1], server.port).into())
        .expect("take the port");
    let freed = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(700));
        drop(taken);
    });
    let started = Instant::now();
    server.restart();
    assert!(
        started.elapsed() >= Duration::from_millis(600),
        "served while the port was taken"
    );
    freed.join().unwrap();
    let mut client = redis::Client::open(format!("redis://{}", server.address()))
        .and_then(|c| c.get_connection())
        .expect("connect after the restart");
    let pong: String = redis::cmd("PING").query(&mut client).expect("ping");
    assert_eq!(pong, "PONG");
}
