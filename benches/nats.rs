//! dlock's NATS engine against the floor, a NATS request and a plain
//! poll, in one run, on one nats-server with JetStream this bench starts on
//! loopback ports.
//!
//! - floor: what the engine writes, bare: a key created only if absent
//!   (a JetStream publish expecting no earlier message) and purged, two
//!   round trips, no line to read and no TTL;
//! - dlock: the NATS engine, write mode, which also waits until its watch
//!   has applied its own write before it reads its line.
//!
//! Contended handoff: 16 clients, each its own connection, on one lock;
//! the time from one holder calling release to the next holder's acquire
//! returning. Against a NATS request (a core request and its reply,
//! through the server), and against the design the watch replaces: the
//! same 16 clients each trying a create, and on a refusal waiting as the
//! core's default polling does (10 ms, doubling to 200 ms): the handoff,
//! and the messages the server received per acquisition (`/varz`).
//!
//! ```text
//! cargo bench --bench nats --features nats
//! ```

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use dlock::engines::nats::async_nats::{self, jetstream};
use dlock::engines::nats::{NatsConfig, NatsEngine};
use dlock::{Registry, Settings};
use dlock_testkit::Fixture;
use dlock_testkit::fixtures::nats::{Nats, varz};
use futures_util::StreamExt;

use common::{Contender, Handoffs, Target, handoffs, micros, percentile, row, uncontended};

const CYCLES: usize = 4000;
const BLOCK: usize = 100;
const CLIENTS: usize = 16;
const ROUNDS: usize = 60;

async fn dlock(url: &str) -> Registry {
    let engine = NatsEngine::connect("nats", &NatsConfig::new(&[url.to_owned()]))
        .await
        .expect("connect");
    Registry::with_engine("nats", Arc::new(engine), Settings::default()).expect("registry")
}

/// The floor's client: the bucket the engine made, written bare.
async fn floor(url: &str) -> jetstream::Context {
    jetstream::new(async_nats::connect(url).await.expect("connect"))
}

/// Publishes to `key` of the bucket if its last revision is `expected`;
/// whether it was written.
async fn publish(js: &jetstream::Context, key: &str, headers: async_nats::HeaderMap, expected: u64) -> bool {
    let mut headers = headers;
    headers.insert(
        "Nats-Expected-Last-Subject-Sequence",
        expected.to_string().as_str(),
    );
    let message = jetstream::message::PublishMessage::build().headers(headers);
    let ack = js
        .send_publish(format!("$KV.dlock.{key}"), message)
        .await
        .expect("publish");
    ack.await.is_ok()
}

async fn create(js: &jetstream::Context, key: &str) -> bool {
    publish(js, key, async_nats::HeaderMap::new(), 0).await
}

async fn purge(js: &jetstream::Context, key: &str) {
    let mut headers = async_nats::HeaderMap::new();
    headers.insert("KV-Operation", "PURGE");
    headers.insert("Nats-Rollup", "sub");
    // Any last revision: a purge of a key this client made.
    let message = jetstream::message::PublishMessage::build().headers(headers);
    let ack = js
        .send_publish(format!("$KV.dlock.{key}"), message)
        .await
        .expect("publish");
    ack.await.expect("purge");
}

/// The p50 of a core NATS request and its reply, through the server.
async fn request_round_trip(url: &str) -> f64 {
    let server = async_nats::connect(url).await.expect("connect");
    let mut requests = server.subscribe("bench.echo").await.expect("subscribe");
    let answering = server.clone();
    tokio::spawn(async move {
        while let Some(request) = requests.next().await {
            if let Some(reply) = request.reply {
                answering.publish(reply, request.payload).await.expect("reply");
            }
        }
    });
    server.flush().await.expect("flush");
    let client = async_nats::connect(url).await.expect("connect");
    let mut times = Vec::new();
    for _ in 0..2000 {
        let started = Instant::now();
        client.request("bench.echo", "".into()).await.expect("request");
        times.push(started.elapsed().as_nanos() as f64);
    }
    percentile(times, 0.5)
}

/// 16 clients taking one lock by a plain poll: the key-value API's
/// create, and on a refusal the core's default pauses, 10 ms doubling to
/// 200 ms; a purge to let go.
async fn poll_handoffs(url: &str) -> Arc<Handoffs> {
    let handoffs = Arc::new(Handoffs::default());
    let mut tasks = Vec::new();
    for _ in 0..CLIENTS {
        let kv = floor(url).await.get_key_value("dlock").await.expect("bucket");
        let handoffs = handoffs.clone();
        tasks.push(tokio::spawn(async move {
            for _ in 0..ROUNDS {
                let mut pause = Duration::from_millis(10);
                while kv.create("poll", "held".into()).await.is_err() {
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(Duration::from_millis(200));
                }
                handoffs.entered();
                handoffs.leaving();
                kv.purge("poll").await.expect("purge");
            }
        }));
    }
    for task in tasks {
        task.await.expect("client");
    }
    handoffs
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let fixture = Nats::start();
    let url = format!("nats://{}", fixture.server.address());
    let registry = dlock(&url).await;
    let lock = registry.locks("bench").get("uncontended");
    lock.lock().await.expect("warm").release().await.expect("warm");
    let js = floor(&url).await;
    let mut next = 0u64;

    uncontended(
        ("nats", "uncontended cycle"),
        &[
            Contender::stamped("floor (create + purge)", Target::AtMost(1.10)),
            Contender::dlock("dlock nats, write, fenced, FIFO"),
        ],
        (CYCLES, BLOCK),
        fixture.server.pid(),
        async |who, block| {
            for _ in 0..block {
                match who {
                    0 => {
                        // A fresh key, as the engine writes one per request.
                        next += 1;
                        let key = format!("floor.{next}");
                        assert!(create(&js, &key).await, "the floor's key is new");
                        purge(&js, &key).await;
                    }
                    _ => lock.lock().await.expect("lock").release().await.expect("release"),
                }
            }
            None
        },
    )
    .await;

    println!("handoff, {CLIENTS} clients on one lock, {ROUNDS} rounds each, release → next acquisition:");
    let round_trip = request_round_trip(&url).await;
    println!(
        "  a NATS request round trip          p50 {:>9}",
        micros(round_trip)
    );
    let mut locks = Vec::new();
    for _ in 0..CLIENTS {
        locks.push(dlock(&url).await.locks("bench").get("handoff"));
    }
    let per_acquisition =
        |before: u64| (varz(fixture.monitor, "in_msgs") - before) as f64 / (CLIENTS * ROUNDS) as f64;
    let received = varz(fixture.monitor, "in_msgs");
    let dlock_handoffs = handoffs(locks, ROUNDS).await;
    let dlock_messages = per_acquisition(received);
    println!(
        "  dlock nats (the watch)             {}",
        dlock_handoffs.summary()
    );
    let received = varz(fixture.monitor, "in_msgs");
    let polled = poll_handoffs(&url).await;
    let poll_messages = per_acquisition(received);
    println!("  a plain poll (10–200 ms)           {}", polled.summary());
    println!(
        "  messages the server received per acquisition: dlock {dlock_messages:.1}, the poll {poll_messages:.1}"
    );
    let ratio = dlock_handoffs.p50() / round_trip;
    println!("  dlock / request round trip p50 {ratio:.2}");
    row(
        "nats",
        &format!("handoff p50, {CLIENTS} clients, FIFO"),
        &dlock_handoffs.p50_micros(),
        "a NATS request round trip",
        &micros(round_trip),
        ratio,
        Target::None,
    );
    let against_poll = dlock_handoffs.p50() / polled.p50();
    println!("  dlock / plain poll p50 {against_poll:.3}");
    row(
        "nats",
        &format!("handoff p50, {CLIENTS} clients: the watch against a poll"),
        &dlock_handoffs.p50_micros(),
        "create retried at 10–200 ms",
        &polled.p50_micros(),
        against_poll,
        Target::AtMost(1.0),
    );
    row(
        "nats",
        &format!("server messages per acquisition, {CLIENTS} clients: the watch against a poll"),
        &format!("{dlock_messages:.1}"),
        "create retried at 10–200 ms",
        &format!("{poll_messages:.1}"),
        dlock_messages / poll_messages,
        Target::AtMost(1.0),
    );
}
