//! dlock's ZooKeeper engine against the floor and Apache Curator, in one
//! run, on one ZooKeeper server this bench starts on a loopback port.
//!
//! - floor: a raw `create EPHEMERAL_SEQUENTIAL` + `delete`, no lock logic;
//! - Curator: `InterProcessReadWriteLock` write lock, from Debian's
//!   libcurator-recipes-java (tests/curator/CuratorPeer.java, in its own JVM);
//! - dlock: the zookeeper engine, write mode.
//!
//! Contended handoff: 16 clients, each its own session, on one path; the
//! time from one holder calling release to the next holder's acquire
//! returning. The three take turns, `ROUNDS` times, after a warm-up.
//!
//! ```text
//! cargo bench --bench zookeeper --features zookeeper
//! ```

use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use dlock::engines::conformance::server::TestServer;
use dlock::engines::zookeeper::fixture::{curator_classpath, zookeeper};
use dlock::engines::zookeeper::{ZooKeeperConfig, ZooKeeperEngine};
use dlock::{Registry, Settings};
use zookeeper_client::{Acls, Client, CreateMode};

const CYCLES: usize = 2000;
const CLIENTS: usize = 16;
const ROUNDS: usize = 5;

async fn dlock_client(server: &TestServer) -> Registry {
    let config = ZooKeeperConfig::new(server.address());
    let engine = ZooKeeperEngine::connect("zk", &config).await.expect("connect");
    Registry::with_engine("zk", Arc::new(engine), Settings::default()).expect("registry")
}

/// Mean uncontended cycle of the floor.
async fn floor(server: &TestServer) -> Duration {
    let client = Client::connect(&server.address()).await.expect("connect");
    let container = CreateMode::Persistent.with_acls(Acls::anyone_all());
    let _ = client.create("/floor", &[], &container).await;
    let node = CreateMode::EphemeralSequential.with_acls(Acls::anyone_all());
    let cycle = || async {
        let (_, seq) = client.create("/floor/n-", &[], &node).await.expect("create");
        client
            .delete(&format!("/floor/n-{seq}"), None)
            .await
            .expect("delete");
    };
    for _ in 0..CYCLES / 10 {
        cycle().await;
    }
    let started = Instant::now();
    for _ in 0..CYCLES {
        cycle().await;
    }
    started.elapsed() / CYCLES as u32
}

/// Mean uncontended cycle and p50 handoff of dlock.
async fn dlock(server: &TestServer, round: usize) -> (Duration, Duration) {
    let solo = dlock_client(server)
        .await
        .locks("bench")
        .get(format!("solo-{round}"));
    for _ in 0..CYCLES / 10 {
        solo.lock().await.expect("lock").release().await.expect("release");
    }
    let started = Instant::now();
    for _ in 0..CYCLES {
        solo.lock().await.expect("lock").release().await.expect("release");
    }
    let uncontended = started.elapsed() / CYCLES as u32;

    let released_at: Arc<Mutex<Option<Instant>>> = Arc::default();
    let handoffs: Arc<Mutex<Vec<Duration>>> = Arc::default();
    let mut clients = Vec::new();
    for _ in 0..CLIENTS {
        clients.push(dlock_client(server).await);
    }
    let mut tasks = tokio::task::JoinSet::new();
    for client in clients {
        let lock = client.locks("bench").get(format!("contended-{round}"));
        let (released_at, handoffs) = (released_at.clone(), handoffs.clone());
        tasks.spawn(async move {
            for _ in 0..CYCLES / CLIENTS {
                let guard = lock.lock().await.expect("lock");
                if let Some(at) = *released_at.lock().unwrap() {
                    handoffs.lock().unwrap().push(at.elapsed());
                }
                *released_at.lock().unwrap() = Some(Instant::now());
                guard.release().await.expect("release");
            }
        });
    }
    while let Some(done) = tasks.join_next().await {
        done.expect("client");
    }
    let mut handoffs = std::mem::take(&mut *handoffs.lock().unwrap());
    handoffs.sort();
    (uncontended, handoffs[handoffs.len() / 2])
}

/// Mean uncontended cycle and p50 handoff of Curator, measured the same way
/// inside its JVM.
fn curator(server: &TestServer, round: usize) -> (Duration, Duration) {
    let source = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/curator/CuratorPeer.java");
    let out = Command::new("java")
        .args(["-cp", &curator_classpath(source), "CuratorPeer"])
        .args([
            server.address(),
            format!("/locks/curator/round-{round}"),
            "bench".into(),
        ])
        .args([CYCLES.to_string(), CLIENTS.to_string()])
        .output()
        .expect("run the Curator peer");
    let text = String::from_utf8_lossy(&out.stdout);
    let figure = |name: &str| {
        let nanos = text
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|n| n.trim().parse().ok())
            .unwrap_or_else(|| panic!("no {name} from Curator: {text}"));
        Duration::from_nanos(nanos)
    };
    (figure("uncontended_ns"), figure("handoff_ns"))
}

fn micros(d: Duration) -> String {
    format!("{:.0} µs", d.as_secs_f64() * 1e6)
}

#[tokio::main]
async fn main() {
    let server = zookeeper();
    println!(
        "ZooKeeper 3.8 on {}, {CYCLES} cycles, {CLIENTS} contenders",
        server.address()
    );
    // The server's JIT warms up first, so round 0 is not slower for the floor.
    for _ in 0..3 {
        floor(&server).await;
    }
    let (mut cycle_ratios, mut handoff_ratios) = (Vec::new(), Vec::new());
    for round in 0..ROUNDS {
        let floor = floor(&server).await;
        let (dlock_cycle, dlock_handoff) = dlock(&server, round).await;
        let (curator_cycle, curator_handoff) = curator(&server, round);
        let ratio = |a: Duration, b: Duration| a.as_secs_f64() / b.as_secs_f64();
        println!(
            "round {round}: uncontended cycle: floor {}, Curator {}, dlock {} = {:.2}× Curator, {:.2}× floor",
            micros(floor),
            micros(curator_cycle),
            micros(dlock_cycle),
            ratio(dlock_cycle, curator_cycle),
            ratio(dlock_cycle, floor),
        );
        println!(
            "round {round}: contended handoff p50: Curator {}, dlock {} = {:.2}× Curator",
            micros(curator_handoff),
            micros(dlock_handoff),
            ratio(dlock_handoff, curator_handoff),
        );
        cycle_ratios.push(ratio(dlock_cycle, curator_cycle));
        handoff_ratios.push(ratio(dlock_handoff, curator_handoff));
    }
    let median = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    println!(
        "median of {ROUNDS} rounds, dlock / Curator: uncontended cycle {:.2}×, contended handoff p50 {:.2}×",
        median(cycle_ratios),
        median(handoff_ratios)
    );
}
