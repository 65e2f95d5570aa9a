//! The conformance suite on a JetStream cluster of 3 nats-servers on
//! loopback, its bucket kept on all 3 (R3), with the cluster's meta leader
//! killed part-way through: locks keep working, and a hold taken before
//! the failover survives it.

#![cfg(feature = "nats")]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use dlock::engines::conformance::run_each;
use dlock::engines::nats::{NatsConfig, NatsEngine};
use dlock::kit::Engine;
use dlock::{Registry, Settings};
use dlock_testkit::assert_still_held;
use dlock_testkit::fixtures::nats::{SERVER, bucket_leader, cluster_args, healthy, meta_leader};
use dlock_testkit::server::{TestServer, free_port, wait_until};

/// The case before which the meta leader dies.
const KILL_BEFORE_CASE: usize = 6;

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
    let stream_leader = bucket_leader(members[0].1, "dlock").expect("the bucket's leader");
    println!("cluster: the meta leader {name}, the bucket's {stream_leader}");

    let servers = Arc::new(Mutex::new(servers));
    let cases = AtomicUsize::new(0);
    run_each(|| async {
        if cases.fetch_add(1, Ordering::SeqCst) == KILL_BEFORE_CASE {
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
