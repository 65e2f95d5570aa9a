//! The conformance suite on a 3-member etcd cluster on loopback, with the
//! leader killed part-way through: locks keep working, a hold taken before
//! the failover survives it, and a workload running across the election
//! keeps its counter exact.
//!
//! The leader dies between two cases, not inside one: calls sent in order
//! during an election reach the new leader in any order (each is its own
//! gRPC call, retried on its own), which the FIFO cases would read as
//! unfair. The workload covers what is in flight when it dies.

#![cfg(feature = "etcd")]

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use dlock::engines::conformance::{GuardedCounter, run_each};
use dlock::engines::etcd::{EtcdConfig, EtcdEngine};
use dlock::kit::Engine;
use dlock::{Registry, Settings};
use dlock_testkit::assert_still_held;
use dlock_testkit::fixtures::etcd::{etcd_args, is_leader, wait_serving};
use dlock_testkit::server::{TestServer, free_port};

/// The case before which the leader dies (of the suite's 20).
const KILL_BEFORE_CASE: usize = 6;

/// Two engines taking one lock in turn, a counter that must come out
/// exact, running until told to stop: across the election.
struct Workload {
    stop: Arc<AtomicBool>,
    tasks: Vec<tokio::task::JoinHandle<u64>>,
    counter: Arc<GuardedCounter>,
}

impl Workload {
    async fn start(config: &EtcdConfig) -> Self {
        let (stop, counter) = (
            Arc::new(AtomicBool::new(false)),
            Arc::new(GuardedCounter::default()),
        );
        let mut tasks = Vec::new();
        for _ in 0..2 {
            let engine = Arc::new(EtcdEngine::connect("etcd", config).await.expect("connect"));
            let lock = Registry::with_engine("etcd", engine, Settings::default())
                .expect("registry")
                .locks("cluster")
                .get("workload");
            let (stop, counter) = (stop.clone(), counter.clone());
            tasks.push(tokio::spawn(async move {
                let mut rounds = 0;
                while !stop.load(Ordering::SeqCst) {
                    let guard = lock.lock().await.expect("workload lock");
                    counter.increment().await;
                    guard.release().await.expect("workload release");
                    rounds += 1;
                }
                rounds
            }));
        }
        Workload { stop, tasks, counter }
    }

    async fn check(self) {
        self.stop.store(true, Ordering::SeqCst);
        let mut rounds = 0;
        for task in self.tasks {
            rounds += task.await.expect("workload task");
        }
        println!("cluster: the workload took the lock {rounds} times across the election");
        assert_eq!(self.counter.overlaps(), 0, "holders overlapped");
        assert_eq!(self.counter.count(), rounds, "lost updates");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn conformance_on_a_cluster_losing_its_leader() {
    let members: Vec<(u16, u16)> = (0..3).map(|_| (free_port(), free_port())).collect();
    let servers: Vec<TestServer> = (0..3)
        .map(|i| TestServer::start_at(members[i].0, "etcd", |port| etcd_args(port, &members, i)))
        .collect();
    let endpoints: Vec<String> = servers.iter().map(|s| s.address()).collect();
    for endpoint in &endpoints {
        wait_serving(endpoint);
    }
    let leader = endpoints.iter().position(|e| is_leader(e)).expect("a leader");
    // The default 10 s lease: a session rides out the election.
    let config = EtcdConfig::new(&endpoints);

    let survivor_engine = Arc::new(EtcdEngine::connect("etcd", &config).await.expect("connect"));
    let survivor = Registry::with_engine("etcd", survivor_engine, Settings::default()).expect("registry");
    let held = survivor
        .locks("cluster")
        .get("survivor")
        .lock()
        .await
        .expect("lock");

    let workload = Workload::start(&config).await;
    let servers = Arc::new(Mutex::new(servers));
    let cases = AtomicUsize::new(0);
    run_each(|| async {
        if cases.fetch_add(1, Ordering::SeqCst) == KILL_BEFORE_CASE {
            servers.lock().unwrap()[leader].kill();
            println!("cluster: killed the leader, {}", endpoints[leader]);
            let others: Vec<&String> = (0..3).filter(|&i| i != leader).map(|i| &endpoints[i]).collect();
            let elected = Instant::now();
            while !others.iter().any(|e| is_leader(e)) {
                assert!(elected.elapsed() < Duration::from_secs(20), "no new leader");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            println!("cluster: a new leader after {:?}", elected.elapsed());
        }
        Arc::new(EtcdEngine::connect("etcd", &config).await.expect("connect")) as Arc<dyn Engine>
    })
    .await;
    assert!(
        cases.load(Ordering::SeqCst) > KILL_BEFORE_CASE,
        "the suite ended before the leader was killed"
    );
    workload.check().await;

    let peer_engine = Arc::new(EtcdEngine::connect("etcd", &config).await.expect("connect"));
    let peer = Registry::with_engine("etcd", peer_engine, Settings::default()).expect("registry");
    assert_still_held(held, &peer.locks("cluster").get("survivor")).await;
}
