//! Leader failover, dlock against the peers: the time from the leader's
//! SIGKILL to the candidate behind it knowing it leads, with the same
//! session timeout or TTL on both sides, each on a server this bench
//! starts on a loopback port.
//!
//! - ZooKeeper: two Curator `LeaderLatch` peers (tests/curator/CuratorPeer.java,
//!   each its own JVM, session timeout 10 s) against two dlock candidates
//!   (this binary run again as a candidate, `session_timeout = "10s"`),
//!   `ROUNDS` rounds each, alternating.
//! - etcd: two `etcdctl elect` against two dlock candidates. etcdctl 3.4
//!   campaigns on a 60 s session it does not let one change, so dlock runs
//!   with `session_ttl = "60s"`; one round each, each a minute long.
//!
//! The candidate behind is queued a second before the kill; the time
//! runs from the kill to its line saying it leads.
//!
//! ```text
//! cargo bench --bench election --features zookeeper,etcd
//! ```

mod common;

use std::io::Write;
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use dlock::Registry;
use dlock::engines::etcd::{EtcdConfig, EtcdEngine};
use dlock::engines::zookeeper::{ZooKeeperConfig, ZooKeeperEngine};
use dlock_testkit::Fixture;
use dlock_testkit::fixtures::etcd::{Etcd, etcdctl};
use dlock_testkit::fixtures::zookeeper::{curator_classpath, zookeeper};
use dlock_testkit::printed::Printed;

use common::{Target, percentile, row};

const ROUNDS: usize = 3;
const CURATOR_PEER: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/curator/CuratorPeer.java");
/// Curator's session timeout in CuratorPeer.java, dlock's here too.
const ZK_SESSION: Duration = Duration::from_secs(10);
/// `etcdctl elect`'s session TTL, dlock's here too.
const ETCD_TTL: Duration = Duration::from_secs(60);
/// The longest wait for a line: a minute's TTL and more.
const WAIT: Duration = Duration::from_secs(180);
/// Set in a candidate's environment: `zookeeper <address> <election>` or
/// `etcd <address> <election>`.
const CANDIDATE: &str = "ELECTION_BENCH_CANDIDATE";

/// Two candidates in turn: the first leads, the second queues, the first
/// is killed; the time until the second leads.
fn failover(mut leader: Printed, queue: impl FnOnce() -> Printed, leads: &str) -> Duration {
    leader.line(leads, WAIT);
    let next = queue();
    std::thread::sleep(Duration::from_secs(1));
    let killed = leader.kill();
    next.line(leads, WAIT).1 - killed
}

/// dlock's failover in election `name` on the server `spec` names.
fn dlock_failover(spec: &str, name: &str) -> Duration {
    failover(
        dlock_candidate(spec, name),
        || dlock_candidate(spec, name),
        "leader",
    )
}

fn dlock_candidate(spec: &str, name: &str) -> Printed {
    let exe = std::env::current_exe().expect("this bench's binary");
    let candidate = Printed::spawn(Command::new(exe).env(CANDIDATE, format!("{spec} {name}")));
    candidate.line("ready", WAIT);
    candidate
}

fn curator(address: &str, name: &str, id: &str) -> Printed {
    let mut peer = Printed::spawn(Command::new("java").args([
        "-cp",
        &curator_classpath(CURATOR_PEER),
        "CuratorPeer",
        address,
        &format!("/locks/bench/{name}"),
    ]));
    peer.line("ready", WAIT);
    peer.say(&format!("latch {id}"));
    peer.line("started", WAIT);
    peer.say("lead 600000");
    peer
}

fn etcdctl_candidate(address: &str, name: &str) -> Printed {
    let election = format!("/locks/bench/{name}");
    Printed::spawn(etcdctl(address).args(["elect", &election, "leader"]))
}

/// This binary as a candidate: connects, says `ready`, campaigns, says
/// `leader` once it leads, and leads until killed.
async fn candidate(spec: &str) {
    let mut words = spec.split(' ');
    let (kind, address, name) = match (words.next(), words.next(), words.next()) {
        (Some(kind), Some(address), Some(name)) => (kind, address, name),
        _ => panic!("{CANDIDATE}: kind, address and name"),
    };
    let engine: Arc<dyn dlock::kit::Engine> = match kind {
        "zookeeper" => {
            let config = ZooKeeperConfig {
                session_timeout: ZK_SESSION,
                ..ZooKeeperConfig::new(address.to_owned())
            };
            Arc::new(ZooKeeperEngine::connect("zk", &config).await.expect("connect"))
        }
        _ => {
            let config = EtcdConfig {
                session_ttl: ETCD_TTL,
                ..EtcdConfig::new(&[address.to_owned()])
            };
            Arc::new(EtcdEngine::connect("etcd", &config).await.expect("connect"))
        }
    };
    let registry = Registry::with_engine("main", engine, dlock::Settings::default()).expect("registry");
    println!("ready");
    let term = registry
        .locks("bench")
        .election(name)
        .campaign()
        .await
        .expect("campaign");
    println!("leader");
    let _ = std::io::stdout().flush();
    std::future::pending::<()>().await;
    drop(term);
}

fn seconds(d: Duration) -> String {
    format!("{:.2} s", d.as_secs_f64())
}

/// Rounds of both sides, alternating; prints and adds the row.
fn compare(
    engine: &str,
    peer: &str,
    rounds: usize,
    mut theirs: impl FnMut(&str) -> Duration,
    mut ours: impl FnMut(&str) -> Duration,
) {
    let (mut peers, mut dlocks, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
    for round in 0..rounds {
        // A fresh election each time: a killed candidate's node or key
        // stays till its session ends.
        let (peer_name, our_name) = (format!("peer-{round}"), format!("dlock-{round}"));
        let (p, d) = if round % 2 == 0 {
            let p = theirs(&peer_name);
            (p, ours(&our_name))
        } else {
            let d = ours(&our_name);
            (theirs(&peer_name), d)
        };
        println!(
            "{engine} round {round}: failover {peer} {}, dlock {} = {:.2}×",
            seconds(p),
            seconds(d),
            d.as_secs_f64() / p.as_secs_f64()
        );
        ratios.push(d.as_secs_f64() / p.as_secs_f64());
        peers.push(p.as_secs_f64());
        dlocks.push(d.as_secs_f64());
    }
    let median = |v: Vec<f64>| Duration::from_secs_f64(percentile(v, 0.5));
    row(
        engine,
        &format!("leader SIGKILLed → the next knows it leads (median of {rounds})"),
        &seconds(median(dlocks)),
        peer,
        &seconds(median(peers)),
        percentile(ratios, 0.5),
        Target::AtMost(1.0),
    );
}

#[tokio::main]
async fn main() {
    if let Ok(spec) = std::env::var(CANDIDATE) {
        return candidate(&spec).await;
    }
    let zk = zookeeper();
    let address = zk.address();
    println!("ZooKeeper 3.8 on {address}, session timeout {ZK_SESSION:?} on both sides");
    let spec = format!("zookeeper {address}");
    compare(
        "zookeeper",
        "Curator LeaderLatch",
        ROUNDS,
        |name| {
            failover(
                curator(&address, name, "a"),
                || curator(&address, name, "b"),
                "leader",
            )
        },
        |name| dlock_failover(&spec, name),
    );
    drop(zk);

    let etcd = Etcd::start();
    let address = etcd.server.address();
    println!("etcd on {address}, session TTL {ETCD_TTL:?} on both sides (etcdctl elect's, fixed)");
    let spec = format!("etcd {address}");
    compare(
        "etcd",
        "etcdctl elect",
        1,
        // etcdctl prints its key, then its proposal, once it leads.
        |name| {
            failover(
                etcdctl_candidate(&address, name),
                || etcdctl_candidate(&address, name),
                "leader",
            )
        },
        |name| dlock_failover(&spec, name),
    );
}
