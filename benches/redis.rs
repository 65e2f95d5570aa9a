//! dlock's Redis engine against the floor and a peer, in one run, on one
//! redis-server this bench starts on a loopback port.
//!
//! - floor: the minimal correct lock, `SET key token NX PX` + compare-and-delete script;
//! - rslock: the `rslock` crate (Redlock on one instance);
//! - dlock: the redis engine, write mode.
//!
//! ```text
//! cargo bench --bench redis --features redis
//! ```

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use dlock::engines::conformance::server::{TestServer, redis_args};
use dlock::engines::redis::{RedisConfig, RedisEngine};
use dlock::{Registry, Settings};
use redis::aio::MultiplexedConnection;

const CYCLES: usize = 3000;
/// Cycles of one contender before the next takes a turn.
const BLOCK: usize = 100;
const CLIENTS: usize = 16;
const CONTENDED_FOR: Duration = Duration::from_secs(3);

fn p50(mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    samples[samples.len() / 2]
}

fn mean(samples: &[Duration]) -> Duration {
    samples.iter().sum::<Duration>() / samples.len() as u32
}

async fn connection(server: &TestServer) -> MultiplexedConnection {
    let client = redis::Client::open(format!("redis://{}", server.address())).expect("url");
    client.get_multiplexed_async_connection().await.expect("connect")
}

async fn registry(server: &TestServer) -> Registry {
    let config = RedisConfig {
        url: format!("redis://{}", server.address()),
        tls_ca_file: None,
        connect_timeout: Duration::from_secs(5),
        fence_retention: Duration::from_secs(60),
    };
    let engine = RedisEngine::connect("redis", &config).await.expect("connect");
    Registry::with_engine("redis", Arc::new(engine), Settings::default())
}

/// Commands the server ran since the last reset, less the INFO asking.
async fn commands(raw: &mut MultiplexedConnection) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(raw)
        .await
        .expect("info");
    info.lines()
        .filter_map(|line| line.split("calls=").nth(1))
        .filter_map(|rest| rest.split(',').next()?.parse::<u64>().ok())
        .sum::<u64>()
}

async fn reset(raw: &mut MultiplexedConnection) {
    let _: () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query_async(raw)
        .await
        .expect("resetstat");
}

struct Floor {
    connection: MultiplexedConnection,
    unlock: redis::Script,
}

impl Floor {
    async fn try_lock(&mut self, key: &str, token: &str) -> bool {
        let set: Option<String> = redis::cmd("SET")
            .arg(key)
            .arg(token)
            .arg("NX")
            .arg("PX")
            .arg(30_000)
            .query_async(&mut self.connection)
            .await
            .expect("set");
        set.is_some()
    }

    async fn unlock(&mut self, key: &str, token: &str) {
        let _: i64 = self
            .unlock
            .key(key)
            .arg(token)
            .invoke_async(&mut self.connection)
            .await
            .expect("unlock");
    }
}

fn floor(connection: MultiplexedConnection) -> Floor {
    Floor {
        connection,
        unlock: redis::Script::new(
            "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) else return 0 end",
        ),
    }
}

#[tokio::main]
async fn main() {
    let server = TestServer::start("redis-server", |port| redis_args(port, &[]));
    let mut raw = connection(&server).await;

    // Round trip.
    let mut pings = Vec::with_capacity(CYCLES);
    for _ in 0..CYCLES {
        let started = Instant::now();
        let _: String = redis::cmd("PING").query_async(&mut raw).await.expect("ping");
        pings.push(started.elapsed());
    }
    let ping = p50(pings);

    // Uncontended cycles, interleaved in blocks so all three see the same machine load.
    let mut fl = floor(connection(&server).await);
    fl.unlock
        .prepare_invoke()
        .load_async(&mut fl.connection)
        .await
        .expect("load");
    let rslock = rslock::LockManager::new(vec![format!("redis://{}", server.address())]);
    let dlock = registry(&server).await;
    let lock = dlock.locks("bench").get("uncontended");
    lock.lock().await.expect("warm").release().await.expect("warm");
    let (mut floor_times, mut rslock_times, mut dlock_times) = (Vec::new(), Vec::new(), Vec::new());
    let (mut floor_commands, mut dlock_commands) = (0, 0);
    for block in 0..CYCLES / BLOCK {
        reset(&mut raw).await;
        for i in 0..BLOCK {
            let token = format!("{block}-{i}");
            let started = Instant::now();
            assert!(fl.try_lock("floor", &token).await);
            fl.unlock("floor", &token).await;
            floor_times.push(started.elapsed());
        }
        floor_commands += commands(&mut raw).await;
        for _ in 0..BLOCK {
            let started = Instant::now();
            let held = rslock
                .lock("rslock", Duration::from_secs(30))
                .await
                .expect("rslock");
            rslock.unlock(&held).await;
            rslock_times.push(started.elapsed());
        }
        reset(&mut raw).await;
        for _ in 0..BLOCK {
            let started = Instant::now();
            lock.lock().await.expect("lock").release().await.expect("release");
            dlock_times.push(started.elapsed());
        }
        dlock_commands += commands(&mut raw).await;
    }
    let floor_commands = floor_commands as f64 / CYCLES as f64;
    let dlock_commands = dlock_commands as f64 / CYCLES as f64;

    // Reentrant: nested acquisitions under a held lock.
    let outer = lock.lock().await.expect("outer");
    reset(&mut raw).await;
    let started = Instant::now();
    for _ in 0..CYCLES {
        lock.lock()
            .await
            .expect("nested")
            .release()
            .await
            .expect("nested release");
    }
    let nested = started.elapsed() / CYCLES as u32;
    let nested_commands = commands(&mut raw).await;
    outer.release().await.expect("release");

    // Contended, fair: 16 clients (each its own engine, as separate processes), one key.
    let registries: Vec<Arc<Registry>> = {
        let mut all = Vec::new();
        for _ in 0..CLIENTS {
            all.push(Arc::new(registry(&server).await));
        }
        all
    };
    let released_at = Arc::new(Mutex::new(None::<(Instant, usize)>));
    let handoffs = Arc::new(Mutex::new(Vec::new()));
    let same_owner = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let acquisitions = Arc::new(AtomicU64::new(0));
    let tasks: Vec<_> = registries
        .iter()
        .enumerate()
        .map(|(me, registry)| {
            let (registry, released_at, handoffs) = (registry.clone(), released_at.clone(), handoffs.clone());
            let (same_owner, stop, acquisitions) = (same_owner.clone(), stop.clone(), acquisitions.clone());
            tokio::spawn(async move {
                let lock = registry.locks("bench").get("contended");
                while !stop.load(Ordering::Relaxed) {
                    let guard = lock.lock().await.expect("lock");
                    let now = Instant::now();
                    if let Some((at, previous)) = *released_at.lock().unwrap() {
                        handoffs.lock().unwrap().push(now - at);
                        same_owner.fetch_add(u64::from(previous == me), Ordering::Relaxed);
                    }
                    acquisitions.fetch_add(1, Ordering::Relaxed);
                    *released_at.lock().unwrap() = Some((Instant::now(), me));
                    guard.release().await.expect("release");
                }
            })
        })
        .collect();
    tokio::time::sleep(CONTENDED_FOR).await;
    stop.store(true, Ordering::Relaxed);
    for task in tasks {
        task.await.expect("client");
    }
    let dlock_throughput = acquisitions.load(Ordering::Relaxed) as f64 / CONTENDED_FOR.as_secs_f64();
    let handoff = p50(handoffs.lock().unwrap().clone());

    // The floor, contended: 16 clients retrying every 1 ms, unfair.
    let stop = Arc::new(AtomicBool::new(false));
    let acquisitions = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for me in 0..CLIENTS {
        let mut fl = floor(connection(&server).await);
        let (stop, acquisitions) = (stop.clone(), acquisitions.clone());
        tasks.push(tokio::spawn(async move {
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let token = format!("{me}-{n}");
                n += 1;
                if fl.try_lock("floor-contended", &token).await {
                    acquisitions.fetch_add(1, Ordering::Relaxed);
                    fl.unlock("floor-contended", &token).await;
                } else {
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
            }
        }));
    }
    tokio::time::sleep(CONTENDED_FOR).await;
    stop.store(true, Ordering::Relaxed);
    for task in tasks {
        task.await.expect("client");
    }
    let floor_throughput = acquisitions.load(Ordering::Relaxed) as f64 / CONTENDED_FOR.as_secs_f64();

    // 30 readers queued behind a writer: release to last reader admitted.
    let readers_registry = Arc::new(registry(&server).await);
    let mut admissions = Vec::new();
    for round in 0..10 {
        let name = format!("readers-{round}");
        let writer = readers_registry
            .locks("bench")
            .get(name.as_str())
            .lock()
            .await
            .expect("writer");
        let readers: Vec<_> = (0..30)
            .map(|_| {
                let (registry, name) = (readers_registry.clone(), name.clone());
                tokio::spawn(async move {
                    let guard = registry.locks("bench").get(name).read().await.expect("read");
                    let at = Instant::now();
                    guard.release().await.expect("release");
                    at
                })
            })
            .collect();
        tokio::time::sleep(Duration::from_millis(300)).await;
        let released = Instant::now();
        writer.release().await.expect("release");
        let mut last = released;
        for reader in readers {
            last = last.max(reader.await.expect("reader"));
        }
        admissions.push(last - released);
    }

    let (floor_mean, floor_p50) = (mean(&floor_times), p50(floor_times));
    let (rslock_mean, rslock_p50) = (mean(&rslock_times), p50(rslock_times));
    let (dlock_mean, dlock_p50) = (mean(&dlock_times), p50(dlock_times));
    let ratio = |d: Duration| d.as_secs_f64() / floor_mean.as_secs_f64();
    println!("redis bench ({CYCLES} cycles each, one redis-server on loopback)");
    println!("PING round trip p50: {ping:?}");
    println!("| uncontended cycle | mean | p50 | vs floor (mean) | commands/cycle |");
    println!("|---|---|---|---|---|");
    println!(
        "| floor: SET NX PX + compare-and-delete | {floor_mean:?} | {floor_p50:?} | 1.00 | {floor_commands:.2} |"
    );
    println!(
        "| rslock 0.10 | {rslock_mean:?} | {rslock_p50:?} | {:.2} | |",
        ratio(rslock_mean)
    );
    println!(
        "| dlock redis, write | {dlock_mean:?} | {dlock_p50:?} | {:.2} | {dlock_commands:.2} |",
        ratio(dlock_mean)
    );
    println!("nested reentrant acquire+release: {nested:?}, {nested_commands} Redis commands for {CYCLES}");
    println!(
        "contended, {CLIENTS} clients one key: dlock fair handoff p50 {handoff:?} ({:.2}x PING), {dlock_throughput:.0} acq/s, \
         same owner twice in a row {} times; floor unfair with 1 ms retry {floor_throughput:.0} acq/s",
        handoff.as_secs_f64() / ping.as_secs_f64(),
        same_owner.load(Ordering::Relaxed)
    );
    println!(
        "30 queued readers, writer release to last admitted: p50 {:?}",
        p50(admissions)
    );
}
