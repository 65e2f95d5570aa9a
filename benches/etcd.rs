//! dlock's etcd engine against the floor and etcd's own lock, in one run,
//! on one etcd member this bench starts on loopback ports.
//!
//! - floor: a put under an existing lease plus a delete, 2 round trips, no
//!   lock logic;
//! - stamped floor: what dlock's engine sends, on one client: a transaction
//!   that puts the request's key under the lease if it does not exist and
//!   reads the newest two keys under the lock's prefix (the revision of the
//!   put is the fence; the read tells whether any request is ahead), then a
//!   delete;
//! - Lock RPC: etcd's server-side lock (`lock` / `unlock` through
//!   `etcd-client`), which runs etcd's `concurrency.Mutex` in the server;
//! - dlock: the etcd engine, write mode.
//!
//! Contended handoff: 16 clients, each its own connection and lease, on one
//! lock, taking turns in FIFO order (the owner changes on every
//! acquisition); the time from one holder calling release to the next
//! holder's acquire returning. Readers: 30 readers queued behind a writer,
//! the time from its release until all 30 hold, and how many watch events
//! etcd sent meanwhile.
//!
//! ```text
//! cargo bench --bench etcd --features etcd
//! ```

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use dlock::engines::etcd::etcd_client::{
    Client, Compare, CompareOp, GetOptions, KvClient, LockOptions, PutOptions, SortOrder, SortTarget, Txn,
    TxnOp,
};
use dlock::engines::etcd::{EtcdConfig, EtcdEngine};
use dlock::{Registry, Settings};
use dlock_testkit::Fixture;
use dlock_testkit::fixtures::etcd::{Etcd, metric};

use common::{Contender, Handoffs, Target, handoffs, micros, row, uncontended};

const CYCLES: usize = 4000;
const BLOCK: usize = 100;
const CLIENTS: usize = 16;
const ROUNDS: usize = 60;
const READERS: usize = 30;

async fn client(endpoint: &str) -> (Client, i64) {
    let mut client = Client::connect([endpoint], None).await.expect("connect");
    let lease = client.lease_grant(600, None).await.expect("lease").id();
    (client, lease)
}

/// The stamped floor's cycle: the put and the read of the queue's head in
/// one transaction, then the delete.
async fn stamped_cycle(kv: &mut KvClient, lease: i64) {
    let key = format!("/bench/stamped/{lease:x}");
    let newest = GetOptions::new()
        .with_prefix()
        .with_sort(SortTarget::Create, SortOrder::Descend)
        .with_limit(2);
    let txn = Txn::new()
        .when([Compare::create_revision(key.as_str(), CompareOp::Equal, 0)])
        .and_then([
            TxnOp::put(
                key.as_str(),
                "dlock write 0",
                Some(PutOptions::new().with_lease(lease)),
            ),
            TxnOp::get("/bench/stamped/", Some(newest)),
        ])
        .or_else([TxnOp::get(key.as_str(), None)]);
    assert!(
        kv.txn(txn).await.expect("put").succeeded(),
        "the stamped floor's lock is free"
    );
    kv.delete(key, None).await.expect("delete");
}

async fn dlock(endpoint: &str) -> Registry {
    let config = EtcdConfig::new(&[endpoint.to_owned()]);
    let engine = EtcdEngine::connect("etcd", &config).await.expect("connect");
    Registry::with_engine("etcd", Arc::new(engine), Settings::default()).expect("registry")
}

async fn lock_rpc_handoffs(endpoint: &str) -> Arc<Handoffs> {
    let handoffs = Arc::new(Handoffs::default());
    let mut tasks = Vec::new();
    for _ in 0..CLIENTS {
        let ((mut client, lease), handoffs) = (client(endpoint).await, handoffs.clone());
        tasks.push(tokio::spawn(async move {
            for _ in 0..ROUNDS {
                let options = LockOptions::new().with_lease(lease);
                let held = client
                    .lock("/bench/handoff-rpc", Some(options))
                    .await
                    .expect("lock");
                handoffs.entered();
                handoffs.leaving();
                client.unlock(held.key()).await.expect("unlock");
            }
        }));
    }
    for task in tasks {
        task.await.expect("client");
    }
    handoffs
}

/// 30 readers queued behind a writer: time from its release until all
/// hold, and the watch events etcd sent meanwhile.
async fn readers(endpoint: &str) -> (Duration, f64) {
    let registry = dlock(endpoint).await;
    let lock = registry.locks("bench").get("readers");
    let writer = lock.lock().await.expect("lock");
    let (admitted, all_in) = tokio::sync::mpsc::channel(READERS);
    let mut holders = Vec::new();
    for _ in 0..READERS {
        let (registry, admitted) = (dlock(endpoint).await, admitted.clone());
        holders.push(tokio::spawn(async move {
            let read = registry.locks("bench").get("readers").read().await.expect("read");
            admitted.send(Instant::now()).await.expect("report");
            tokio::time::sleep(Duration::from_millis(300)).await;
            read.release().await.expect("release");
        }));
    }
    // Every reader queued and watching.
    while metric(endpoint, "etcd_debugging_mvcc_watcher_total") < READERS as f64 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let events = metric(endpoint, "etcd_debugging_mvcc_events_total");
    let released = Instant::now();
    writer.release().await.expect("release");
    let mut all_in = all_in;
    let mut last = released;
    for _ in 0..READERS {
        last = last.max(all_in.recv().await.expect("admitted"));
    }
    let sent = metric(endpoint, "etcd_debugging_mvcc_events_total") - events;
    for holder in holders {
        holder.await.expect("reader");
    }
    (last - released, sent)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let fixture = Etcd::start();
    let endpoint = fixture.server.address();
    let (floor, floor_lease) = client(&endpoint).await;
    // The key-value client alone: cloning a whole `Client` per call costs
    // a tenth of a cycle.
    let mut floor = floor.kv_client();
    let (stamped, stamped_lease) = client(&endpoint).await;
    let mut stamped = stamped.kv_client();
    let (mut rpc, rpc_lease) = client(&endpoint).await;
    let registry = dlock(&endpoint).await;
    let lock = registry.locks("bench").get("uncontended");
    lock.lock().await.expect("warm").release().await.expect("warm");

    uncontended(
        ("etcd", "uncontended cycle"),
        &[
            Contender::floor("floor (put under a lease + delete)", Target::AtMost(1.10)),
            Contender::stamped("stamped floor (dlock's requests)", Target::AtMost(1.05)),
            Contender::floor("etcd Lock RPC (lock + unlock)", Target::AtMost(1.0)),
            Contender::dlock("dlock etcd, write, fenced, FIFO"),
        ],
        (CYCLES, BLOCK),
        fixture.server.pid(),
        async |who, block| {
            for _ in 0..block {
                match who {
                    0 => {
                        let options = PutOptions::new().with_lease(floor_lease);
                        floor.put("/bench/floor", "", Some(options)).await.expect("put");
                        floor.delete("/bench/floor", None).await.expect("delete");
                    }
                    1 => stamped_cycle(&mut stamped, stamped_lease).await,
                    2 => {
                        let options = LockOptions::new().with_lease(rpc_lease);
                        let held = rpc.lock("/bench/rpc", Some(options)).await.expect("lock");
                        rpc.unlock(held.key()).await.expect("unlock");
                    }
                    _ => lock.lock().await.expect("lock").release().await.expect("release"),
                }
            }
            None
        },
    )
    .await;

    println!("handoff, {CLIENTS} clients on one lock, {ROUNDS} rounds each, release → next acquisition:");
    let rpc_handoffs = lock_rpc_handoffs(&endpoint).await;
    println!("  etcd Lock RPC                      {}", rpc_handoffs.summary());
    let mut locks = Vec::new();
    for _ in 0..CLIENTS {
        locks.push(dlock(&endpoint).await.locks("bench").get("handoff"));
    }
    let dlock_handoffs = handoffs(locks, ROUNDS).await;
    println!(
        "  dlock etcd                         {}",
        dlock_handoffs.summary()
    );
    let ratio = dlock_handoffs.p50() / rpc_handoffs.p50();
    println!("  dlock / Lock RPC p50 {ratio:.3} (target ≤ 0.8)");
    row(
        "etcd",
        &format!("handoff p50, {CLIENTS} clients, FIFO"),
        &dlock_handoffs.p50_micros(),
        "etcd Lock RPC",
        &rpc_handoffs.p50_micros(),
        ratio,
        Target::AtMost(0.8),
    );

    let (all_in, events) = readers(&endpoint).await;
    println!(
        "{READERS} readers queued behind a writer: all hold {} after its release, {events} watch events sent (target: one each)",
        micros(all_in.as_nanos() as f64)
    );
    row(
        "etcd",
        &format!("{READERS} queued readers: watch events to admit them"),
        &format!("{events}, all in after {}", micros(all_in.as_nanos() as f64)),
        "one each",
        &READERS.to_string(),
        events / READERS as f64,
        Target::AtMost(1.0),
    );
}
