//! The conformance suite on a JetStream cluster of 3 nats-servers on
//! loopback, its bucket kept on all 3 (R3), with the server that leads
//! both the cluster (its meta leader) and the bucket's stream killed
//! part-way through: locks keep working, a hold taken before the failover
//! survives it, and the key of a holder that stopped renewing, whose TTL
//! ran out during the election, is removed by the stream's new leader.

#![cfg(feature = "nats")]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use dlock::engines::conformance::run_each;
use dlock::engines::nats::async_nats;
use dlock::engines::nats::{NatsConfig, NatsEngine};
use dlock::kit::{Engine, Lifecycle, Poll, Request};
use dlock::{LockKey, Mode};
use dlock::{Registry, Settings};
use dlock_testkit::assert_still_held;
use dlock_testkit::fixtures::nats::{SERVER, bucket_leader, cluster_args, healthy, meta_leader};
use dlock_testkit::server::{TestServer, free_port, wait_until};

/// The case before which the meta leader dies.
const KILL_BEFORE_CASE: usize = 6;

/// The abandoned hold's lease: shorter than an election.
const LEASE: Duration = Duration::from_secs(2);

/// Moves the bucket's stream's leadership to the server `name` (the meta
/// leader), through a client of the server at `address`, and waits until
/// the member whose monitoring port is `monitor` sees it there.
async fn lead_the_bucket(address: &str, name: &str, monitor: u16) {
    let started = Instant::now();
    let client = async_nats::connect(address).await.expect("client");
    while bucket_leader(monitor, "dlock").as_deref() != Some(name) {
        let asked = format!("{{\"placement\":{{\"preferred\":\"{name}\"}}}}");
        let _ = client
            .request("$JS.API.STREAM.LEADER.STEPDOWN.KV_dlock", asked.into())
            .await;
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "the bucket's leader did not move to {name}"
        );
    }
    println!("cluster: {name} leads the cluster and the bucket");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn conformance_on_a_cluster_losing_its_meta_leader() {
    let members: Vec<(u16, u16, u16)> = (0..3).map(|_| (free_port(), free_port(), free_port())).collect();
    let servers: Vec<TestServer> = (0..3)
        .map(|i| TestServer::start_at(members[i].0, SERVER, |_| cluster_args(&members, i)))
        .collect();
    let serving = || members.iter().all(|m| healthy(m.1, "/healthz")) && meta_leader(members[0].1).is_some();
    wait_until(Duration::from_secs(60), serving, || {
        "the NATS cluster did not serve".to_owned()
    });
    let name = meta_leader(members[0].1).expect("a meta leader");
    let leader = members
        .iter()
        .position(|m| name == format!("n{}", m.0))
        .expect("the meta leader is a member");
    let config = NatsConfig {
        replicas: 3,
        ..NatsConfig::new(
            &servers
                .iter()
                .map(|s| format!("nats://{}", s.address()))
                .collect::<Vec<_>>(),
        )
    };

    let survivor_engine = Arc::new(
        Box::pin(NatsEngine::connect("nats", &config))
            .await
            .expect("connect"),
    );
    let survivor = Registry::with_engine("nats", survivor_engine, Settings::default()).expect("registry");
    let held = survivor
        .locks("cluster")
        .get("survivor")
        .lock()
        .await
        .expect("lock");
    lead_the_bucket(&servers[0].address(), &name, members[0].1).await;
    // A holder that stops renewing: its key's TTL runs out while the
    // cluster elects.
    let abandoned = Request::new(LockKey::new("cluster", "abandoned").unwrap(), Mode::Write, LEASE);
    let holder = Box::pin(NatsEngine::connect("nats", &config))
        .await
        .expect("connect");

    let servers = Arc::new(Mutex::new(servers));
    let cases = AtomicUsize::new(0);
    run_each(|| async {
        if cases.fetch_add(1, Ordering::SeqCst) == KILL_BEFORE_CASE {
            assert!(matches!(
                holder.acquire(&abandoned).await.expect("acquire"),
                Poll::Held(_)
            ));
            servers.lock().unwrap()[leader].kill();
            println!("cluster: killed the meta leader, {name}");
            let elected = Instant::now();
            let other = members[(leader + 1) % 3].1;
            while meta_leader(other).is_none_or(|now| now == name) {
                assert!(elected.elapsed() < Duration::from_secs(20), "no new meta leader");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            println!("cluster: a new meta leader after {:?}", elected.elapsed());
            // And the bucket's stream led again, if its leader died too.
            while bucket_leader(other, "dlock").is_none_or(|now| now == name) {
                assert!(
                    elected.elapsed() < Duration::from_secs(30),
                    "the bucket has no leader"
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            println!("cluster: the bucket led again after {:?}", elected.elapsed());
            let peer = Box::pin(NatsEngine::connect("nats", &config))
                .await
                .expect("connect");
            let mut tried = Request::new(LockKey::new("cluster", "abandoned").unwrap(), Mode::Write, LEASE);
            tried.try_once = true;
            let led = Instant::now();
            while !matches!(peer.acquire(&tried).await.expect("try"), Poll::Held(_)) {
                assert!(
                    led.elapsed() < Duration::from_secs(3),
                    "the overdue key outlived the election"
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            peer.release(&tried).await.expect("release");
            println!(
                "cluster: the abandoned key, overdue, was gone {:?} after",
                led.elapsed()
            );
        }
        Arc::new(
            Box::pin(NatsEngine::connect("nats", &config))
                .await
                .expect("connect"),
        ) as Arc<dyn Engine>
    })
    .await;
    assert!(
        cases.load(Ordering::SeqCst) > KILL_BEFORE_CASE,
        "the suite ended before the meta leader was killed"
    );

    let peer_engine = Arc::new(
        Box::pin(NatsEngine::connect("nats", &config))
            .await
            .expect("connect"),
    );
    let peer = Registry::with_engine("nats", peer_engine, Settings::default()).expect("registry");
    assert_still_held(held, &peer.locks("cluster").get("survivor")).await;
}
