//! dlock's DynamoDB engine against the floor and the `dynamodb-lease`
//! crate, in one run, on one DynamoDB Local this bench starts on a
//! loopback port. The floor and the peer run in a process of their own
//! (`benches/peers/dynamodb`), built with its own SDK.
//!
//! - floor: the least lock DynamoDB allows, a `PutItem` if the item is
//!   absent and a `DeleteItem` if it still holds its owner: 2 requests, no
//!   fence, no lease;
//! - dynamodb-lease: its `acquire` and `release` (a conditional put with a
//!   wall-clock expiry, then a conditional delete);
//! - dlock: the DynamoDB engine, write mode.
//!
//! dlock asks every request for the capacity it consumed, for its metric;
//! the floor does not, and DynamoDB Local spends CPU on the answer.
//!
//! Also the capacity units DynamoDB reports for a cycle (the engine's
//! metric, the floor's return values); and 16 clients, each its own
//! engine, on one lock: the time from a release to the next acquisition,
//! against dynamodb-lease's, and, in a run of fixed length, how evenly the
//! lock went round (there is no queue) and what the refused tries cost.
//!
//! The design's question, no queue or a waiter list in the lock's item,
//! measured on the two protocols written plainly in the peer (`contend`):
//! handoff, how evenly 16 clients got the lock, and capacity units per
//! acquisition.
//!
//! ```text
//! cargo bench --bench dynamodb --features dynamodb
//! ```

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use dlock::engines::dynamodb::CAPACITY_UNITS;
use dlock::{Registry, Settings};
use dlock_testkit::Fixture;
use dlock_testkit::fixtures::dynamodb::DynamoDb;
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};

use common::{Contender, Handoffs, Peer, Target, handoffs, row, uncontended};

const CYCLES: usize = 2000;
const BLOCK: usize = 100;
const CLIENTS: usize = 16;
const ROUNDS: usize = 10;
const SPREAD_RUN: Duration = Duration::from_secs(5);

async fn dlock(fixture: &DynamoDb) -> Registry {
    let engine = dlock_testkit::engine(fixture).await;
    Registry::with_engine("dynamodb", engine, Settings::default()).expect("registry")
}

/// Write units the engine reported since the last call (the debugging
/// recorder hands out what was added since its last snapshot).
fn written(snapshots: &Snapshotter) -> u64 {
    snapshots
        .snapshot()
        .into_vec()
        .into_iter()
        .filter(|(key, ..)| {
            let key = key.key();
            key.name() == CAPACITY_UNITS && key.labels().any(|l| l.key() == "kind" && l.value() == "write")
        })
        .map(|(.., value)| match value {
            DebugValue::Counter(n) => n,
            other => panic!("{CAPACITY_UNITS} is a counter, not {other:?}"),
        })
        .sum()
}

/// 16 clients take one lock again and again for `SPREAD_RUN`: how many
/// times each got it.
async fn spread(fixture: &DynamoDb) -> Vec<usize> {
    let stop = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    for _ in 0..CLIENTS {
        let (lock, stop) = (dlock(fixture).await.locks("bench").get("spread"), stop.clone());
        tasks.push(tokio::spawn(async move {
            let mut got = 0;
            while !stop.load(Ordering::Relaxed) {
                lock.lock().await.expect("lock").release().await.expect("release");
                got += 1;
            }
            got
        }));
    }
    tokio::time::sleep(SPREAD_RUN).await;
    stop.store(true, Ordering::Relaxed);
    let mut counts = Vec::new();
    for task in tasks {
        counts.push(task.await.expect("client"));
    }
    counts
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let recorder = DebuggingRecorder::new();
    let snapshots = recorder.snapshotter();
    recorder.install().expect("the metrics recorder");
    let fixture = DynamoDb::start();
    let endpoint = format!("http://{}", fixture.server.address());
    let mut peer = Peer::built("dynamodb", "dynamodb-peer", &[&endpoint]);
    let registry = dlock(&fixture).await;
    let lock = registry.locks("bench").get("uncontended");
    for _ in 0..50 {
        lock.lock().await.expect("warm").release().await.expect("warm");
    }
    peer.ask("floor 50");
    peer.ask("lease 50");

    uncontended(
        ("dynamodb", "uncontended cycle"),
        &[
            Contender::peer(
                "floor (conditional put + delete)",
                Target::AtMost(1.15),
                peer.pid(),
            ),
            Contender::peer("dynamodb-lease", Target::AtMost(1.0), peer.pid()),
            Contender::dlock("dlock dynamodb, write"),
        ],
        (CYCLES, BLOCK),
        fixture.server.pid(),
        async |who, block| match who {
            0 => Some(peer.cycles_of(&format!("floor {block}"), block)),
            1 => Some(peer.cycles_of(&format!("lease {block}"), block)),
            _ => {
                for _ in 0..block {
                    lock.lock().await.expect("lock").release().await.expect("release");
                }
                None
            }
        },
    )
    .await;

    written(&snapshots);
    for _ in 0..BLOCK {
        lock.lock().await.expect("lock").release().await.expect("release");
    }
    let per_cycle = written(&snapshots) as f64 / BLOCK as f64;
    let floor = peer.ask(&format!("floor-units {BLOCK}"))[0] as f64 / BLOCK as f64;
    println!("capacity units per uncontended cycle: dlock {per_cycle:.2}, floor {floor:.2}");
    row(
        "dynamodb",
        "write capacity units per uncontended cycle (as DynamoDB reports them)",
        &format!("{per_cycle:.2}"),
        "floor",
        &format!("{floor:.2}"),
        per_cycle / floor,
        Target::AtMost(1.0),
    );

    let mut locks = Vec::new();
    for _ in 0..CLIENTS {
        locks.push(dlock(&fixture).await.locks("bench").get("handoff"));
    }
    let ours = handoffs(locks, ROUNDS).await;
    let theirs = Handoffs::of(
        peer.ask(&format!("lease-handoff {CLIENTS} {ROUNDS}"))
            .into_iter()
            .map(|ns| ns as f64)
            .collect(),
    );
    println!("handoff, {CLIENTS} clients: dlock {}", ours.summary());
    println!("handoff, {CLIENTS} clients: dynamodb-lease {}", theirs.summary());
    row(
        "dynamodb",
        &format!("handoff p50, {CLIENTS} clients, no queue"),
        &ours.p50_micros(),
        "dynamodb-lease (10 ms between tries)",
        &theirs.p50_micros(),
        ours.p50() / theirs.p50(),
        Target::AtMost(1.0),
    );

    written(&snapshots);
    let counts = spread(&fixture).await;
    let units = written(&snapshots) as f64;
    let total: usize = counts.iter().sum();
    let (fewest, most) = (*counts.iter().min().unwrap(), *counts.iter().max().unwrap());
    println!(
        "{CLIENTS} clients for {SPREAD_RUN:?}: {total} acquisitions, fewest {fewest}, most {most}; {:.1} write units each",
        units / total as f64
    );
    row(
        "dynamodb",
        &format!("{CLIENTS} clients for {SPREAD_RUN:?}: most ÷ fewest acquisitions of one client (no queue)"),
        &most.to_string(),
        "fewest",
        &fewest.to_string(),
        most as f64 / fewest.max(1) as f64,
        Target::None,
    );
    row(
        "dynamodb",
        &format!("write capacity units per acquisition, {CLIENTS} clients contending"),
        &format!("{:.1}", units / total as f64),
        "uncontended",
        &format!("{per_cycle:.2}"),
        units / total as f64 / per_cycle,
        Target::None,
    );

    let run_ms = SPREAD_RUN.as_millis();
    let [poll, queue] =
        ["poll", "queue"].map(|protocol| peer.ask(&format!("contend {protocol} {CLIENTS} {run_ms}")));
    for (protocol, figures) in [("no queue (poll)", &poll), ("waiter list (queue)", &queue)] {
        println!(
            "{protocol}, {CLIENTS} clients for {SPREAD_RUN:?}: handoff p50 {:.1} ms, fewest {}, most {}, {} acquisitions, {:.2} units each",
            figures[0] as f64 / 1e6,
            figures[1],
            figures[2],
            figures[3],
            figures[4] as f64 / 100.0
        );
    }
    let design = |what: &str, ours: f64, theirs: f64, shown: &dyn Fn(f64) -> String| {
        row(
            "dynamodb",
            &format!("design, {CLIENTS} clients for {SPREAD_RUN:?}: {what}"),
            &format!("no queue: {}", shown(ours)),
            "waiter list",
            &shown(theirs),
            ours / theirs,
            Target::None,
        );
    };
    let ms = |ns: f64| format!("{:.1} ms", ns / 1e6);
    design("handoff p50", poll[0] as f64, queue[0] as f64, &ms);
    let spread = |f: &[u128]| f[2] as f64 / f[1].max(1) as f64;
    design(
        "most ÷ fewest acquisitions of one client",
        spread(&poll),
        spread(&queue),
        &|x| format!("{x:.1}"),
    );
    design(
        "capacity units per acquisition",
        poll[4] as f64 / 100.0,
        queue[4] as f64 / 100.0,
        &|x| format!("{x:.2}"),
    );
    design("acquisitions", poll[3] as f64, queue[3] as f64, &|x| {
        format!("{x:.0}")
    });
}
