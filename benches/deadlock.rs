//! What looking for deadlocks costs the engine, on one Redis and one
//! PostgreSQL server this bench starts on loopback ports. A task that holds
//! a lock and waits behind a holder that never lets go (no cycle) checks
//! every half `deadlock_check`: the engine calls its client makes per
//! second, against a waiter of the same lock that holds nothing (and so
//! never looks), counted on the path to the engine. Then a ring of 3
//! clients: the engine calls all three made from their first wait to the
//! cycle's end, and how long it took. The uncontended path's cost is
//! `scripts/bench ab`'s.
//!
//! ```text
//! cargo bench --bench deadlock --features redis,postgres
//! ```

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{Target, row};
use dlock::engines::conformance::{Faults, SETTINGS};
use dlock::kit::Engine;
use dlock::{Error, Registry};
use dlock_testkit::Fixture;
use dlock_testkit::fixtures::postgres::Postgres;
use dlock_testkit::fixtures::redis::Redis;

/// How long calls are counted once the checking waiter looks.
const WINDOW: Duration = Duration::from_secs(10);

/// A client on `engine`, and the count of its calls to it.
fn client(engine: &Arc<dyn Engine>, name: &str) -> (Registry, Arc<Faults>) {
    let faults = Arc::new(Faults::new(engine.clone()));
    let registry = Registry::with_engine(name, faults.clone(), SETTINGS).expect("registry");
    (registry, faults)
}

/// Engine calls per second of a waiter that holds nothing, and of one
/// that holds a lock (and so looks), both waiting behind a holder that
/// stays.
async fn steady(engine: &Arc<dyn Engine>) -> (f64, f64) {
    let group = format!("deadlock-bench-{}", std::process::id());
    let (holder, _) = client(engine, "holder");
    let held = holder.locks(&group).get("busy").lock().await.expect("the holder");
    let (plain, plain_calls) = client(engine, "plain");
    let (looking, looking_calls) = client(engine, "looking");
    let (mine, busy) = (
        looking.locks(&group).get("mine"),
        looking.locks(&group).get("busy"),
    );
    let plain_wait = plain.locks(&group).get("busy");
    // Each in a task of its own: a hold is its task's, and only a task
    // holding a lock looks.
    let waiting = [
        tokio::spawn(async move { plain_wait.lock().await.map(drop) }),
        tokio::spawn(async move {
            let _mine = mine.lock().await?;
            busy.lock().await.map(drop)
        }),
    ];
    // Past the first look, which posts its waits.
    tokio::time::sleep(SETTINGS.deadlock_check * 2).await;
    let counted = [plain_calls.calls(), looking_calls.calls()];
    tokio::time::sleep(WINDOW).await;
    let per_second = |now: u64, before: u64| (now - before) as f64 / WINDOW.as_secs_f64();
    let rates = (
        per_second(plain_calls.calls(), counted[0]),
        per_second(looking_calls.calls(), counted[1]),
    );
    waiting.iter().for_each(|task| task.abort());
    held.release().await.expect("release");
    rates
}

/// A ring of 3 clients, each holding one lock and asking for the next's:
/// the engine calls of all three from the first wait to the end, and how
/// long the cycle stood.
async fn ring(engine: &Arc<dyn Engine>) -> (u64, Duration) {
    let group = format!("deadlock-ring-{}", std::process::id());
    let clients: Vec<(Registry, Arc<Faults>)> =
        (0..3).map(|i| client(engine, &format!("ring-{i}"))).collect();
    let barrier = Arc::new(tokio::sync::Barrier::new(3));
    let before: u64 = clients.iter().map(|(_, faults)| faults.calls()).sum();
    let started = Instant::now();
    let tasks: Vec<_> = clients
        .iter()
        .enumerate()
        .map(|(i, (registry, _))| {
            let locks = registry.locks(&group);
            let (first, next) = (locks.get(format!("{i}")), locks.get(format!("{}", (i + 1) % 3)));
            let barrier = barrier.clone();
            tokio::spawn(async move {
                let _held = first.lock().await?;
                barrier.wait().await;
                next.lock().await.map(drop)
            })
        })
        .collect();
    let mut gave_up = 0;
    for task in tasks {
        if let Err(Error::Deadlock { .. }) = task.await.expect("a member") {
            gave_up += 1;
        }
    }
    assert_eq!(gave_up, 1, "one member gives up");
    let calls: u64 = clients.iter().map(|(_, faults)| faults.calls()).sum::<u64>() - before;
    (calls, started.elapsed())
}

async fn measure(name: &str, engine: Arc<dyn Engine>) {
    let (plain, looking) = steady(&engine).await;
    println!(
        "{name}: a waiter holding nothing {plain:.1} calls/s, one holding a lock and looking {looking:.1} calls/s"
    );
    row(
        name,
        "deadlock check: engine calls/s of a waiter holding a lock, no cycle",
        &format!("{looking:.1}/s"),
        "a waiter holding nothing",
        &format!("{plain:.1}/s"),
        looking / plain.max(0.1),
        Target::None,
    );
    let (calls, took) = ring(&engine).await;
    println!("{name}: a ring of 3, {calls} engine calls, one gave up after {took:.2?}");
    let looking_for = took
        .saturating_sub(SETTINGS.deadlock_check)
        .as_secs_f64()
        .max(0.001);
    row(
        name,
        "a ring of 3 found: engine calls/s of the 3 while they look",
        &format!(
            "{:.1}/s ({calls} calls, found after {:.2} s)",
            calls as f64 / looking_for,
            took.as_secs_f64()
        ),
        "deadlock_check",
        &format!("{:.1} s", SETTINGS.deadlock_check.as_secs_f64()),
        took.as_secs_f64() / SETTINGS.deadlock_check.as_secs_f64(),
        Target::AtMost(2.0),
    );
}

#[tokio::main]
async fn main() {
    let redis = Redis::start();
    measure("redis", dlock_testkit::engine(&redis).await).await;
    let postgres = Postgres::start();
    measure("postgres", dlock_testkit::engine(&postgres).await).await;
}
