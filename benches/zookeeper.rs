//! dlock's ZooKeeper engine against the floor and Apache Curator, in one
//! run, on one ZooKeeper server this bench starts on a loopback port.
//!
//! - floor: a raw `create EPHEMERAL_SEQUENTIAL` + `delete`, no lock logic;
//! - listed floor: the floor with the children listed in the create's round
//!   trip: the least a lock in Curator's layout can do (a node only learns
//!   that none is ahead of it by reading after its create);
//! - stamped floor: the floor with the create in a `multi` beside an empty
//!   write to the parent, whose new stat tells whether the node is alone:
//!   dlock's layout, with no lock logic;
//! - Curator: `InterProcessReadWriteLock` write lock, from Debian's
//!   libcurator-recipes-java (tests/curator/CuratorPeer.java, in its own JVM);
//! - dlock: the zookeeper engine, write mode.
//!
//! Uncontended cycles run interleaved in blocks, each contender going first
//! in turn, so that all see the same load; ratios are the median over blocks
//! of (dlock's block mean / the other's).
//!
//! Contended handoff: 16 clients, each its own session, on one path; the
//! time from one holder calling release to the next holder's acquire
//! returning. dlock and Curator take turns, `ROUNDS` times.
//!
//! Semaphores, dlock's against Curator's `InterProcessSemaphoreV2` on the
//! same layout (target ≤ 0.7 each): an uncontended acquire + release of a
//! permit of 4, interleaved in blocks; and 16 clients, each its own
//! session, holding 1 ms on a semaphore of 4, time per acquisition (the
//! inverse of acquisitions per second), rounds alternating.
//!
//! ```text
//! cargo bench --bench zookeeper --features zookeeper
//! ```

mod common;

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::Arc;
use std::time::Instant;

use dlock::engines::zookeeper::{ZooKeeperConfig, ZooKeeperEngine};
use dlock::{Registry, Settings};
use dlock_testkit::fixtures::zookeeper::{curator_classpath, zookeeper};
use dlock_testkit::server::TestServer;
use zookeeper_client::{Acls, Client, CreateMode, MultiWriteResult};

use common::{Target, micros, percentile, permit_cycle, permit_rate, row};

const CYCLES: usize = 4000;
const BLOCK: usize = 100;
const CLIENTS: usize = 16;
const ROUNDS: usize = 3;
const HANDOFFS: usize = 2000;

const CURATOR_PEER: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/curator/CuratorPeer.java");

async fn dlock_client(server: &TestServer) -> Registry {
    let config = ZooKeeperConfig::new(server.address());
    let engine = ZooKeeperEngine::connect("zk", &config).await.expect("connect");
    Registry::with_engine("zk", Arc::new(engine), Settings::default()).expect("registry")
}

/// How a floor creates its node.
#[derive(Clone, Copy, PartialEq)]
enum Shape {
    Bare,
    /// The children listed in the create's round trip.
    Listed,
    /// In a `multi` with an empty write to the parent.
    Stamped,
}

/// Raw cycles on one session: `create` + `delete` under `parent`.
struct Floor {
    client: Client,
    parent: &'static str,
    shape: Shape,
}

impl Floor {
    async fn new(server: &TestServer, parent: &'static str, shape: Shape) -> Self {
        let client = Client::connect(&server.address()).await.expect("connect");
        let persistent = CreateMode::Persistent.with_acls(Acls::anyone_all());
        let _ = client.create(parent, &[], &persistent).await;
        Floor {
            client,
            parent,
            shape,
        }
    }

    async fn cycle(&self) {
        let node = CreateMode::EphemeralSequential.with_acls(Acls::anyone_all());
        let prefix = format!("{}/n-", self.parent);
        let node = match self.shape {
            Shape::Bare => {
                let (_, seq) = self.client.create(&prefix, &[], &node).await.expect("create");
                format!("{prefix}{seq}")
            }
            Shape::Listed => {
                let create = self.client.create(&prefix, &[], &node);
                let (created, listed) = tokio::join!(create, self.client.list_children(self.parent));
                listed.expect("list");
                format!("{prefix}{}", created.expect("create").1)
            }
            Shape::Stamped => {
                let mut multi = self.client.new_multi_writer();
                multi.add_create(&prefix, &[], &node).expect("create op");
                multi.add_set_data(self.parent, &[], None).expect("set op");
                match multi.commit().await.expect("multi").remove(0) {
                    MultiWriteResult::Create { path, .. } => path,
                    other => panic!("a create answered {other:?}"),
                }
            }
        };
        self.client.delete(&node, None).await.expect("delete");
    }
}

/// A Curator peer in its own JVM, driven line by line.
struct Curator {
    child: Child,
    input: ChildStdin,
    output: BufReader<ChildStdout>,
}

impl Curator {
    fn start(server: &TestServer, path: &str) -> Self {
        let mut child = Command::new("java")
            .args(["-cp", &curator_classpath(CURATOR_PEER), "CuratorPeer"])
            .args([server.address(), path.to_owned()])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("run the Curator peer");
        let input = child.stdin.take().expect("stdin");
        let mut output = BufReader::new(child.stdout.take().expect("stdout"));
        let mut ready = String::new();
        output.read_line(&mut ready).expect("from the peer");
        assert_eq!(ready.trim(), "ready", "the Curator peer did not start");
        Curator { child, input, output }
    }

    /// Runs `n` uncontended cycles; their mean in ns.
    fn cycles(&mut self, n: usize) -> f64 {
        self.ask(&format!("cycles {n}"), "cycles ") / n as f64
    }

    /// Runs `n` uncontended cycles of a permit of `permits`; their mean in ns.
    fn permit_cycles(&mut self, n: usize, permits: u32) -> f64 {
        self.ask(&format!("permit-cycles {n} {permits}"), "cycles ") / n as f64
    }

    /// Sends `command`; the number after `prefix` in the answer.
    fn ask(&mut self, command: &str, prefix: &str) -> f64 {
        writeln!(self.input, "{command}").expect("to the peer");
        let mut line = String::new();
        self.output.read_line(&mut line).expect("from the peer");
        line.strip_prefix(prefix)
            .and_then(|t| t.trim().parse().ok())
            .unwrap_or_else(|| panic!("the Curator peer answered {line:?}"))
    }
}

impl Drop for Curator {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Uncontended cycles of the floors, Curator and dlock, interleaved in
/// blocks; prints each one's median block and dlock's ratios.
async fn uncontended(server: &TestServer) {
    let floor = Floor::new(server, "/floor", Shape::Bare).await;
    let listed = Floor::new(server, "/listed-floor", Shape::Listed).await;
    let stamped = Floor::new(server, "/stamped-floor", Shape::Stamped).await;
    let mut curator = Curator::start(server, "/locks/curator/solo");
    let solo = dlock_client(server).await.locks("bench").get("solo");
    let names = [
        "floor (create + delete)",
        "listed floor",
        "stamped floor",
        "Curator",
        "dlock",
    ];
    let mut ns: [Vec<f64>; 5] = Default::default();
    // The first blocks warm the server's and Curator's JITs up, unrecorded.
    let warm_up = 4;
    for round in 0..warm_up + CYCLES / BLOCK {
        for turn in 0..names.len() {
            let who = (turn + round) % names.len();
            let started = Instant::now();
            let mean = match who {
                3 => curator.cycles(BLOCK),
                _ => {
                    for _ in 0..BLOCK {
                        match who {
                            0 => floor.cycle().await,
                            1 => listed.cycle().await,
                            2 => stamped.cycle().await,
                            _ => solo.lock().await.expect("lock").release().await.expect("release"),
                        }
                    }
                    started.elapsed().as_nanos() as f64 / BLOCK as f64
                }
            };
            if round >= warm_up {
                ns[who].push(mean);
            }
        }
    }
    println!(
        "uncontended cycle, {CYCLES} each, interleaved in blocks of {BLOCK} (mean per cycle, median block):"
    );
    for (name, times) in names.iter().zip(&ns) {
        println!("  {name:<25}{:>10}", micros(percentile(times.clone(), 0.5)));
    }
    let ratio = |a: &[f64], b: &[f64]| {
        let ratios: Vec<f64> = a.iter().zip(b).map(|(a, b)| a / b).collect();
        format!(
            "{:.3} (p10 {:.3}, p90 {:.3})",
            percentile(ratios.clone(), 0.5),
            percentile(ratios.clone(), 0.1),
            percentile(ratios, 0.9)
        )
    };
    println!(
        "  dlock / floor          {}; target ≤ 1.10",
        ratio(&ns[4], &ns[0])
    );
    println!("  dlock / stamped floor  {}", ratio(&ns[4], &ns[2]));
    println!("  stamped floor / floor  {}", ratio(&ns[2], &ns[0]));
    println!("  listed floor / floor   {}", ratio(&ns[1], &ns[0]));
    println!("  dlock / Curator        {}", ratio(&ns[4], &ns[3]));
    let median = |times: &[f64]| micros(percentile(times.to_vec(), 0.5));
    for (base, target) in [(0, Target::AtMost(1.10)), (2, Target::None), (3, Target::None)] {
        let ratios: Vec<f64> = ns[4].iter().zip(&ns[base]).map(|(a, b)| a / b).collect();
        row(
            "zookeeper",
            "uncontended cycle (median block ratio)",
            &median(&ns[4]),
            names[base],
            &median(&ns[base]),
            percentile(ratios, 0.5),
            target,
        );
    }
}

/// A permit of 4, uncontended: dlock's and Curator's cycles interleaved in
/// blocks, dlock's ratio to Curator's.
async fn permits_uncontended(server: &TestServer) {
    let mut curator = Curator::start(server, "/locks/curator/permits-solo");
    let semaphore = dlock_client(server)
        .await
        .locks("bench")
        .semaphore("permits-solo", 4);
    let (mut dlock_ns, mut curator_ns) = (Vec::new(), Vec::new());
    let warm_up = 4;
    for round in 0..warm_up + CYCLES / BLOCK {
        for turn in 0..2 {
            let started = Instant::now();
            let mean = if (turn + round) % 2 == 0 {
                curator.permit_cycles(BLOCK, 4)
            } else {
                for _ in 0..BLOCK {
                    permit_cycle(&semaphore).await;
                }
                started.elapsed().as_nanos() as f64 / BLOCK as f64
            };
            if round >= warm_up {
                if (turn + round) % 2 == 0 {
                    &mut curator_ns
                } else {
                    &mut dlock_ns
                }
                .push(mean);
            }
        }
    }
    let ratios: Vec<f64> = dlock_ns.iter().zip(&curator_ns).map(|(a, b)| a / b).collect();
    let ratio = percentile(ratios, 0.5);
    let (ours, theirs) = (percentile(dlock_ns, 0.5), percentile(curator_ns, 0.5));
    println!(
        "uncontended permit of 4: dlock {}, Curator {}: {ratio:.2}× Curator",
        micros(ours),
        micros(theirs)
    );
    row(
        "zookeeper",
        "semaphore: uncontended permit of 4 (median block ratio)",
        &micros(ours),
        "Curator InterProcessSemaphoreV2",
        &micros(theirs),
        ratio,
        Target::AtMost(0.7),
    );
}

const PERMITS_FOR: std::time::Duration = std::time::Duration::from_secs(2);

/// Acquisitions per second of `CLIENTS` dlock clients, each its own
/// session, holding 1 ms on a semaphore of 4.
async fn dlock_permit_rate(server: &TestServer, round: usize) -> f64 {
    let mut semaphores = Vec::new();
    for _ in 0..CLIENTS {
        semaphores.push(
            dlock_client(server)
                .await
                .locks("bench")
                .semaphore(format!("permits-{round}"), 4),
        );
    }
    permit_rate(semaphores, std::time::Duration::from_millis(1), PERMITS_FOR)
        .await
        .per_second
}

/// dlock's time per acquisition over Curator's, 16 contenders on a
/// semaphore of 4, median of `ROUNDS` alternating rounds.
async fn permits_contended(server: &TestServer) {
    let (mut ratios, mut ours, mut theirs) = (Vec::new(), Vec::new(), Vec::new());
    for round in 0..ROUNDS {
        let dlock = dlock_permit_rate(server, round).await;
        let mut curator = Curator::start(server, &format!("/locks/curator/permits-{round}"));
        let command = format!("permit-rate {CLIENTS} 4 1 {}", PERMITS_FOR.as_millis());
        let curator = curator.ask(&command, "rate ");
        println!(
            "round {round}: {CLIENTS} clients holding 1 ms on 4 permits: dlock {dlock:.0}/s, Curator {curator:.0}/s"
        );
        ratios.push(curator / dlock);
        ours.push(dlock);
        theirs.push(curator);
    }
    row(
        "zookeeper",
        &format!(
            "semaphore: {CLIENTS} clients holding 1 ms on 4 permits, time per acquisition (median of {ROUNDS} rounds)"
        ),
        &format!("{:.0}/s", percentile(ours, 0.5)),
        "Curator InterProcessSemaphoreV2",
        &format!("{:.0}/s", percentile(theirs, 0.5)),
        percentile(ratios, 0.5),
        Target::AtMost(0.7),
    );
}

/// p50 handoff of dlock, in ns.
async fn dlock_handoff(server: &TestServer, round: usize) -> f64 {
    let handoffs = Arc::new(common::Handoffs::default());
    let mut clients = Vec::new();
    for _ in 0..CLIENTS {
        clients.push(dlock_client(server).await);
    }
    let mut tasks = tokio::task::JoinSet::new();
    for client in clients {
        let lock = client.locks("bench").get(format!("contended-{round}"));
        let handoffs = handoffs.clone();
        tasks.spawn(async move {
            for _ in 0..HANDOFFS / CLIENTS {
                let guard = lock.lock().await.expect("lock");
                handoffs.entered();
                handoffs.leaving();
                guard.release().await.expect("release");
            }
        });
    }
    while let Some(done) = tasks.join_next().await {
        done.expect("client");
    }
    handoffs.p50()
}

/// p50 handoff of Curator, measured the same way inside its JVM, in ns.
fn curator_handoff(server: &TestServer, round: usize) -> f64 {
    let out = Command::new("java")
        .args(["-cp", &curator_classpath(CURATOR_PEER), "CuratorPeer"])
        .args([
            server.address(),
            format!("/locks/curator/round-{round}"),
            "bench".into(),
        ])
        // Its bench mode times as many uncontended cycles first; unused here.
        .args([HANDOFFS.to_string(), CLIENTS.to_string()])
        .output()
        .expect("run the Curator peer");
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines()
        .find_map(|l| l.strip_prefix("handoff_ns"))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or_else(|| panic!("no handoff_ns from Curator: {text}"))
}

#[tokio::main]
async fn main() {
    let server = zookeeper();
    println!("ZooKeeper 3.8 on {}", server.address());
    uncontended(&server).await;
    permits_uncontended(&server).await;
    permits_contended(&server).await;
    let (mut ratios, mut dlock_p50s, mut curator_p50s) = (Vec::new(), Vec::new(), Vec::new());
    for round in 0..ROUNDS {
        let dlock = dlock_handoff(&server, round).await;
        let curator = curator_handoff(&server, round);
        println!(
            "round {round}: contended handoff p50, {CLIENTS} contenders: Curator {}, dlock {} = {:.2}× Curator",
            micros(curator),
            micros(dlock),
            dlock / curator
        );
        ratios.push(dlock / curator);
        dlock_p50s.push(dlock);
        curator_p50s.push(curator);
    }
    let ratio = percentile(ratios, 0.5);
    println!("median of {ROUNDS} rounds, dlock / Curator contended handoff p50: {ratio:.2}×");
    row(
        "zookeeper",
        &format!("handoff p50, {CLIENTS} contenders (median of {ROUNDS} rounds)"),
        &micros(percentile(dlock_p50s, 0.5)),
        "Curator",
        &micros(percentile(curator_p50s, 0.5)),
        ratio,
        Target::None,
    );
}
