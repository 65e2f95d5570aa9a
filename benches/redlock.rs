//! dlock's RedLock engine against `rslock` (0.10, RedLock in Rust), in one
//! run, on 3 redis-servers this bench starts on loopback ports.
//!
//! - rslock: `lock` + `unlock` (2 fan-outs to the masters);
//! - dlock, `fence = false`: 2 fan-outs, like rslock;
//! - dlock, `fence = true` (the default): one more fan-out to write the
//!   token back to a majority.
//!
//! Uncontended: `CYCLES` cycles each, in blocks taking turns; ratios are the
//! median over blocks of (dlock / rslock). Contended: 16 clients (each its
//! own engine or lock manager) on one key for one second, rounds
//! alternating; acquisitions per second, median round.
//!
//! ```text
//! cargo bench --bench redlock --features redlock
//! ```

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

mod common;

use dlock::engines::redlock::{RedLockConfig, RedLockEngine};
use dlock::{Lock, Registry, Settings};
use dlock_testkit::fixtures::redlock::RedLock;

use common::{Target, block_ratios, median, p50, row};

const CYCLES: usize = 3000;
const BLOCK: usize = 100;
const CLIENTS: usize = 16;
const ROUNDS: usize = 5;
const LEASE: Duration = Duration::from_secs(10);

fn block_ratio(times: &[Duration], base: &[Duration]) -> f64 {
    median(block_ratios(times, base, BLOCK))
}

fn urls(fixture: &RedLock) -> Vec<String> {
    fixture
        .masters
        .iter()
        .map(|m| format!("redis://{}", m.address()))
        .collect()
}

async fn dlock(fixture: &RedLock, fence: bool) -> Registry {
    let config = RedLockConfig {
        fence,
        ..RedLockConfig::new(urls(fixture))
    };
    let engine = RedLockEngine::connect("redlock", &config).await.expect("connect");
    let settings = Settings {
        lease: LEASE,
        ..Settings::default()
    };
    Registry::with_engine("redlock", Arc::new(engine), settings).expect("registry")
}

fn rslock(fixture: &RedLock) -> rslock::LockManager {
    rslock::LockManager::new(urls(fixture))
}

async fn rslock_cycle(manager: &rslock::LockManager, key: &str) {
    let held = manager.acquire_no_guard(key, LEASE).await.expect("rslock");
    manager.unlock(&held).await;
}

async fn dlock_cycle(lock: &Lock) {
    lock.lock().await.expect("lock").release().await.expect("release");
}

/// Acquisitions per second by `CLIENTS` tasks running `cycle` for one second.
async fn contended<F>(cycle: F) -> f64
where
    F: Fn(usize) -> std::pin::Pin<Box<dyn Future<Output = ()> + Send>> + Send + Sync + 'static,
{
    let (stop, count) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicU64::new(0)));
    let cycle = Arc::new(cycle);
    let tasks: Vec<_> = (0..CLIENTS)
        .map(|client| {
            let (stop, count, cycle) = (stop.clone(), count.clone(), cycle.clone());
            tokio::spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    cycle(client).await;
                    count.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    let started = Instant::now();
    tokio::time::sleep(Duration::from_secs(1)).await;
    stop.store(true, Ordering::Relaxed);
    // Counted at the stop: waiters still have to get the lock once to see it.
    let rate = count.load(Ordering::Relaxed) as f64 / started.elapsed().as_secs_f64();
    for task in tasks {
        task.await.expect("client");
    }
    rate
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let fixture = RedLock::with_masters(3);
    let manager = rslock(&fixture);
    let (plain, fenced) = (dlock(&fixture, false).await, dlock(&fixture, true).await);
    let (plain_lock, fenced_lock) = (
        plain.locks("bench").get("plain"),
        fenced.locks("bench").get("fenced"),
    );
    rslock_cycle(&manager, "rslock").await;
    dlock_cycle(&plain_lock).await;
    dlock_cycle(&fenced_lock).await;

    let mut times: [Vec<Duration>; 3] = Default::default();
    for round in 0..CYCLES / BLOCK {
        for turn in 0..3 {
            let who = (turn + round) % 3;
            for _ in 0..BLOCK {
                let started = Instant::now();
                match who {
                    0 => rslock_cycle(&manager, "rslock").await,
                    1 => dlock_cycle(&plain_lock).await,
                    _ => dlock_cycle(&fenced_lock).await,
                }
                times[who].push(started.elapsed());
            }
        }
    }
    println!("uncontended cycle on 3 masters, {CYCLES} each, interleaved in blocks of {BLOCK}:");
    println!("  rslock 0.10             p50 {:>8.1?}  1.00", p50(&times[0]));
    println!(
        "  dlock, fence = false    p50 {:>8.1?}  {:.3} (target ≤ 1.0)",
        p50(&times[1]),
        block_ratio(&times[1], &times[0])
    );
    println!(
        "  dlock, fence = true     p50 {:>8.1?}  {:.3} (target ≤ 1.6)",
        p50(&times[2]),
        block_ratio(&times[2], &times[0])
    );
    for (who, fence, target) in [(1, "off", 1.0), (2, "on", 1.6)] {
        row(
            "redlock (3 masters)",
            &format!("uncontended cycle, fence {fence} (median block ratio)"),
            &format!("{:.1?}", p50(&times[who])),
            "rslock 0.10",
            &format!("{:.1?}", p50(&times[0])),
            block_ratio(&times[who], &times[0]),
            Target::AtMost(target),
        );
    }

    // Contended: each client its own engine or lock manager, as processes would be.
    let managers: Arc<Vec<rslock::LockManager>> = Arc::new((0..CLIENTS).map(|_| rslock(&fixture)).collect());
    let mut locks = (Vec::new(), Vec::new());
    for _ in 0..CLIENTS {
        locks
            .0
            .push(dlock(&fixture, false).await.locks("bench").get("contended-plain"));
        locks
            .1
            .push(dlock(&fixture, true).await.locks("bench").get("contended-fenced"));
    }
    let (plain_locks, fenced_locks) = (Arc::new(locks.0), Arc::new(locks.1));
    let mut rates: [Vec<f64>; 3] = Default::default();
    for _ in 0..ROUNDS {
        let m = managers.clone();
        rates[0].push(
            contended(move |c| {
                let m = m.clone();
                Box::pin(async move { rslock_cycle(&m[c], "contended").await })
            })
            .await,
        );
        let l = plain_locks.clone();
        rates[1].push(
            contended(move |c| {
                let l = l.clone();
                Box::pin(async move { dlock_cycle(&l[c]).await })
            })
            .await,
        );
        let l = fenced_locks.clone();
        rates[2].push(
            contended(move |c| {
                let l = l.clone();
                Box::pin(async move { dlock_cycle(&l[c]).await })
            })
            .await,
        );
    }
    let [r, p, f] = rates.map(median);
    println!("contended, {CLIENTS} clients on one key, acquisitions/s (median of {ROUNDS} rounds):");
    println!("  rslock 0.10 (retry delay up to 200 ms)  {r:>8.0}  1.00");
    println!(
        "  dlock, fence = false                    {p:>8.0}  {:.2} (target ≥ 1.0)",
        p / r
    );
    println!("  dlock, fence = true                     {f:>8.0}  {:.2}", f / r);
    for (fence, ours, target) in [("off", p, Target::AtLeast(1.0)), ("on", f, Target::None)] {
        row(
            "redlock (3 masters)",
            &format!("contended, {CLIENTS} clients, acquisitions/s, fence {fence}"),
            &format!("{ours:.0}/s"),
            "rslock 0.10",
            &format!("{r:.0}/s"),
            ours / r,
            target,
        );
    }
}
