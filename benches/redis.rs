//! dlock's Redis engine against the floor and a peer, in one run, on one
//! redis-server this bench starts on a loopback port.
//!
//! - floor: the minimal correct lock, `SET key token NX PX` + compare-and-delete script;
//! - fenced floor: the least a lock can do that hands out a fencing token
//!   and changes state only in scripts, as dlock's brief asks: one script
//!   `SET NX PX` + `TIME`, then compare-and-delete; no queue, no retention;
//! - rslock: the `rslock` crate (Redlock on one instance);
//! - dlock: the redis engine, write mode.
//!
//! Uncontended cycles run interleaved in blocks so every contender sees the
//! same load; ratios are the median over blocks of (contender / floor).
//! Contended runs alternate dlock and the floor in rounds, each with its
//! own PING sample, and report the median round.
//!
//! Server time per cycle is the usec `INFO commandstats` gives the commands
//! each contender sends (`SENT`), not the sum over all commands: a command
//! a script calls is counted on its own line and again inside the script's
//! `EVALSHA`. The table's "run" count includes those, as a check that
//! nothing else was sent. For context it also gives the server process's
//! CPU per cycle (`INFO cpu`, user + sys), which adds the network I/O of
//! each command and so counts every round trip.
//! Memory: `HELD` locks held at once on a fresh server, for dlock and for
//! the floor under the same key names, `used_memory` per lock.
//! Records: the commands one `inspect` sends, and listing `LISTED` held
//! locks against the bare `SCAN` of their keys, and against that `SCAN`
//! with the least read of each record (its value and `PTTL`).
//!
//! ```text
//! cargo bench --bench redis --features redis
//! ```

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

mod common;

use dlock::engines::redis::{RedisConfig, RedisEngine};
use dlock::kit::{Inspect, List};
use dlock::kit::{Lifecycle, OwnerId, Poll, Request};
use dlock::{LockKey, Mode, Registry, Settings};
use dlock_testkit::fixtures::redis::{info_field, redis_args, redis_cli};
use dlock_testkit::server::TestServer;
use redis::aio::MultiplexedConnection;

use common::{Target, block_ratios, mean, median, p50, row};

const CYCLES: usize = 4000;
/// Cycles of one contender before the next takes a turn.
const BLOCK: usize = 100;
const CLIENTS: usize = 16;
const ROUNDS: usize = 5;
const CONTENDED_FOR: Duration = Duration::from_secs(1);
/// Locks held at once in the memory section.
const HELD: usize = 100_000;
/// Locks held at once in the records section.
const LISTED: usize = 10_000;
/// The memory section's `fence_retention`, short so that its check that
/// the server empties after release does not wait the default minute.
const RETENTION: Duration = Duration::from_secs(1);

/// Median over blocks of (block mean / the floor's block mean).
fn block_ratio(times: &[Duration], floor: &[Duration]) -> f64 {
    median(block_ratios(times, floor, BLOCK))
}

async fn connection(server: &TestServer) -> MultiplexedConnection {
    let client = redis::Client::open(format!("redis://{}", server.address())).expect("url");
    client.get_multiplexed_async_connection().await.expect("connect")
}

async fn registry(server: &TestServer) -> Registry {
    acknowledged_registry(server, 0).await
}

/// A registry whose grants wait for `replicas` replicas (`replicas_ack`).
async fn acknowledged_registry(server: &TestServer, replicas: u32) -> Registry {
    let config = RedisConfig {
        replicas_ack: replicas,
        ..RedisConfig::new(format!("redis://{}", server.address()))
    };
    let engine = RedisEngine::connect("redis", &config).await.expect("connect");
    Registry::with_engine("redis", Arc::new(engine), Settings::default()).expect("registry")
}

/// The commands each contender sends; everything else the server runs in
/// its blocks is called by their scripts. `eval` and `script` stand in
/// case a client falls back on them after `NOSCRIPT`.
const SENT: [&[&str]; 4] = [
    &["set", "evalsha", "eval", "script"],
    &["evalsha", "eval", "script"],
    &["set", "evalsha", "eval", "script"],
    &["evalsha", "eval", "script"],
];

/// The server process's CPU time so far, user + sys, in µs.
fn cpu(info: &str) -> f64 {
    (info_field::<f64>(info, "used_cpu_user") + info_field::<f64>(info, "used_cpu_sys")) * 1e6
}

/// What the server did since the last reset: the calls and usec of the
/// commands in `sent`, all calls but the bench's own `CONFIG RESETSTAT`
/// and `INFO`, and the process CPU since `cpu_before`.
async fn commands(raw: &mut MultiplexedConnection, sent: &[&str], cpu_before: f64) -> Stats {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .arg("cpu")
        .query_async(raw)
        .await
        .expect("info");
    let field = |line: &str, name: &str| -> u64 {
        line.split(name)
            .nth(1)
            .and_then(|rest| rest.split(',').next()?.parse().ok())
            .unwrap_or(0)
    };
    let mut stats = Stats {
        cpu_usec: cpu(&info) - cpu_before,
        ..Stats::default()
    };
    for line in info.lines() {
        let Some((name, _)) = line.strip_prefix("cmdstat_").and_then(|l| l.split_once(':')) else {
            continue;
        };
        if name == "config" || name == "info" {
            continue;
        }
        stats.run += field(line, "calls=");
        if sent.contains(&name) {
            stats.calls += field(line, "calls=");
            stats.usec += field(line, "usec=");
        }
    }
    stats
}

#[derive(Default, Clone, Copy)]
struct Stats {
    /// Commands sent, and the server's usec for them.
    calls: u64,
    usec: u64,
    /// Commands run, scripts' calls included.
    run: u64,
    cpu_usec: f64,
}

impl std::ops::AddAssign for Stats {
    fn add_assign(&mut self, other: Stats) {
        self.calls += other.calls;
        self.usec += other.usec;
        self.run += other.run;
        self.cpu_usec += other.cpu_usec;
    }
}

/// Resets the command stats; returns the process CPU so far (see `cpu`).
async fn reset(raw: &mut MultiplexedConnection) -> f64 {
    let _: () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query_async(raw)
        .await
        .expect("resetstat");
    let info: String = redis::cmd("INFO")
        .arg("cpu")
        .query_async(raw)
        .await
        .expect("info");
    cpu(&info)
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

/// The fenced floor: one script takes the lock and reads the server clock.
struct FencedFloor {
    floor: Floor,
    lock: redis::Script,
}

impl FencedFloor {
    async fn try_lock(&mut self, key: &str, token: &str) -> Option<u64> {
        let fence: Option<u64> = self
            .lock
            .key(key)
            .arg(token)
            .invoke_async(&mut self.floor.connection)
            .await
            .expect("lock");
        fence
    }
}

fn fenced_floor(connection: MultiplexedConnection) -> FencedFloor {
    FencedFloor {
        floor: floor(connection),
        lock: redis::Script::new(
            "if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', 30000) then \
               local t = redis.call('TIME') return t[1] * 1000000 + t[2] end return false",
        ),
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

async fn ping(raw: &mut MultiplexedConnection, n: usize) -> Duration {
    let mut pings = Vec::with_capacity(n);
    for _ in 0..n {
        let started = Instant::now();
        let _: String = redis::cmd("PING").query_async(raw).await.expect("ping");
        pings.push(started.elapsed());
    }
    p50(&pings)
}

/// Times `BLOCK` cycles of `cycle`, appending each cycle's time, and
/// returns what the server did for them, counting `sent` as sent.
async fn block<F: AsyncFnMut(usize)>(
    raw: &mut MultiplexedConnection,
    times: &mut Vec<Duration>,
    sent: &[&str],
    mut cycle: F,
) -> Stats {
    let cpu = reset(raw).await;
    for i in 0..BLOCK {
        let started = Instant::now();
        cycle(i).await;
        times.push(started.elapsed());
    }
    commands(raw, sent, cpu).await
}

struct Contended {
    handoff_p50: Duration,
    per_second: f64,
    same_owner: u64,
}

/// dlock, fair: 16 clients (each its own engine, as separate processes) on one key.
async fn dlock_contended(registries: &[Arc<Registry>], name: &str) -> Contended {
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
            let name = name.to_owned();
            tokio::spawn(async move {
                let lock = registry.locks("bench").get(name);
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
    let handoffs = handoffs.lock().unwrap().clone();
    Contended {
        handoff_p50: p50(&handoffs),
        per_second: acquisitions.load(Ordering::Relaxed) as f64 / CONTENDED_FOR.as_secs_f64(),
        same_owner: same_owner.load(Ordering::Relaxed),
    }
}

/// The floor, contended: 16 clients retrying every 1 ms, unfair. Acquisitions a second.
async fn floor_contended(floors: &mut Vec<Floor>, name: &str) -> f64 {
    let stop = Arc::new(AtomicBool::new(false));
    let acquisitions = Arc::new(AtomicU64::new(0));
    let tasks: Vec<_> = floors
        .drain(..)
        .enumerate()
        .map(|(me, mut fl)| {
            let (stop, acquisitions, key) = (stop.clone(), acquisitions.clone(), name.to_owned());
            tokio::spawn(async move {
                let mut n = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let token = format!("{me}-{n}");
                    n += 1;
                    if fl.try_lock(&key, &token).await {
                        acquisitions.fetch_add(1, Ordering::Relaxed);
                        fl.unlock(&key, &token).await;
                    } else {
                        tokio::time::sleep(Duration::from_millis(1)).await;
                    }
                }
                fl
            })
        })
        .collect();
    tokio::time::sleep(CONTENDED_FOR).await;
    stop.store(true, Ordering::Relaxed);
    for task in tasks {
        floors.push(task.await.expect("client"));
    }
    acquisitions.load(Ordering::Relaxed) as f64 / CONTENDED_FOR.as_secs_f64()
}

async fn used_memory(raw: &mut MultiplexedConnection) -> i64 {
    let info: String = redis::cmd("INFO")
        .arg("memory")
        .query_async(raw)
        .await
        .expect("info");
    info_field(&info, "used_memory")
}

async fn dbsize(raw: &mut MultiplexedConnection) -> u64 {
    redis::cmd("DBSIZE").query_async(raw).await.expect("dbsize")
}

/// Runs `step(i)` for every i in `0..HELD`, 32 at a time.
async fn each_lock<F, Fut>(step: F)
where
    F: Fn(usize) -> Fut + Clone + Send + 'static,
    Fut: Future<Output = ()> + Send,
{
    each_of(HELD, step).await
}

/// Every one of `requests` granted, 32 at a time.
async fn take_all(engine: &Arc<RedisEngine>, requests: &Arc<Vec<Request>>) {
    each_of(requests.len(), {
        let (engine, requests) = (engine.clone(), requests.clone());
        move |i| {
            let (engine, requests) = (engine.clone(), requests.clone());
            async move {
                assert!(matches!(engine.acquire(&requests[i]).await, Ok(Poll::Held(_))));
            }
        }
    })
    .await;
}

/// Runs `step(i)` for every i in `0..n`, 32 at a time.
async fn each_of<F, Fut>(n: usize, step: F)
where
    F: Fn(usize) -> Fut + Clone + Send + 'static,
    Fut: Future<Output = ()> + Send,
{
    let tasks: Vec<_> = (0..32)
        .map(|worker| {
            let step = step.clone();
            tokio::spawn(async move {
                for i in (worker..n).step_by(32) {
                    step(i).await;
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.expect("worker");
    }
}

/// `used_memory` per held lock, dlock's and the floor's under the same key
/// names (the floor's key is dlock's record, its token a 32-hex id as
/// dlock's owner ids are), on a server of its own; then dlock lets go and
/// the server must keep only the registered label once the retention has
/// passed.
async fn memory() {
    let server = TestServer::start("redis-server", |port| redis_args(port, &[]));
    let mut raw = connection(&server).await;
    let lease = Duration::from_secs(300);
    let key = |i: usize| LockKey::new("bench", format!("held-{i}")).expect("key");
    let requests: Arc<Vec<Request>> = Arc::new(
        (0..HELD)
            .map(|i| Request::new(key(i), Mode::Write, lease))
            .collect(),
    );
    // A long label, as a pod's host name makes: records carry a reference
    // to it, so its length costs a held lock nothing.
    let mut config = RedisConfig {
        fence_retention: RETENTION,
        ..RedisConfig::new(format!("redis://{}", server.address()))
    };
    config.client.client_name =
        Some("checkout-7f9c6d5b8-xk2lp.prod.eu-west-1.compute.internal:4242".to_owned());
    let engine = Arc::new(RedisEngine::connect("redis", &config).await.expect("connect"));
    // Loads the scripts, so that the cache is not counted; the one key left
    // is the label's.
    let warm = Request::new(key(HELD), Mode::Write, lease);
    assert!(matches!(engine.acquire(&warm).await, Ok(Poll::Held(_))));
    assert!(engine.release(&warm).await.expect("release"));
    while dbsize(&mut raw).await > 1 {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    let before = used_memory(&mut raw).await;
    let floor_keys: Arc<Vec<String>> =
        Arc::new((0..HELD).map(|i| format!("{{dlock:bench:held-{i}}}:w")).collect());
    let floor_connection = connection(&server).await;
    each_lock({
        let (keys, connection) = (floor_keys.clone(), floor_connection.clone());
        move |i| {
            let (keys, mut connection) = (keys.clone(), connection.clone());
            async move {
                let set: Option<String> = redis::cmd("SET")
                    .arg(&keys[i])
                    .arg(OwnerId::random().to_string())
                    .arg("NX")
                    .arg("PX")
                    .arg(millis(lease))
                    .query_async(&mut connection)
                    .await
                    .expect("set");
                assert!(set.is_some());
            }
        }
    })
    .await;
    assert_eq!(dbsize(&mut raw).await, HELD as u64 + 1);
    let floor = (used_memory(&mut raw).await - before) as f64 / HELD as f64;
    for keys in floor_keys.chunks(1000) {
        let _: () = redis::cmd("DEL")
            .arg(keys)
            .query_async(&mut raw)
            .await
            .expect("del");
    }

    let before = used_memory(&mut raw).await;
    take_all(&engine, &requests).await;
    let keys = dbsize(&mut raw).await - 1;
    let dlock = (used_memory(&mut raw).await - before) as f64 / HELD as f64;
    println!(
        "memory, {HELD} write locks held at once: dlock {dlock:.0} B/lock ({:.2} keys/lock), \
         floor {floor:.0} B/lock, dlock {:.2}x the floor",
        keys as f64 / HELD as f64,
        dlock / floor
    );
    row(
        "redis",
        &format!("`used_memory` per held lock, {HELD} held"),
        &format!("{dlock:.0} B"),
        "floor",
        &format!("{floor:.0} B"),
        dlock / floor,
        Target::AtMost(1.25),
    );

    each_lock({
        let (engine, requests) = (engine.clone(), requests.clone());
        move |i| {
            let (engine, requests) = (engine.clone(), requests.clone());
            async move {
                assert!(engine.release(&requests[i]).await.expect("release"));
            }
        }
    })
    .await;
    let released = Instant::now();
    let left = dbsize(&mut raw).await - 1;
    tokio::time::sleep(RETENTION).await;
    let mut after = dbsize(&mut raw).await - 1;
    // Redis expires keys in the background, a sample at a time.
    while after > 0 && released.elapsed() < RETENTION * 10 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        after = dbsize(&mut raw).await - 1;
    }
    println!(
        "released: {left} idle records left at once, each keeping the last fencing token \
         fence_retention past its release ({RETENTION:?} here, short for the bench; default \
         1 min); DBSIZE {after} {:?} after release",
        released.elapsed()
    );
    assert_eq!(after, 0, "keys left after the retention");
}

/// Records, on a server of their own with `LISTED` locks held: the
/// commands one `inspect` sends, and `list` of the group against the bare
/// enumeration of the same keys (the `SCAN` loop `list` starts with,
/// alone) and against that enumeration reading each record raw, in turns,
/// median of `ROUNDS`.
async fn records() {
    let server = TestServer::start("redis-server", |port| redis_args(port, &[]));
    let mut raw = connection(&server).await;
    let config = RedisConfig::new(format!("redis://{}", server.address()));
    let engine = Arc::new(RedisEngine::connect("redis", &config).await.expect("connect"));
    let lease = Duration::from_secs(300);
    let requests: Arc<Vec<Request>> = Arc::new(
        (0..LISTED)
            .map(|i| {
                let key = LockKey::new("listed", format!("held-{i}")).expect("key");
                Request::new(key, Mode::Write, lease)
            })
            .collect(),
    );
    take_all(&engine, &requests).await;

    let one = &requests[0].key;
    engine.inspect(one, None).await.expect("warm");
    const INSPECTS: u64 = 100;
    let cpu = reset(&mut raw).await;
    for _ in 0..INSPECTS {
        let view = engine.inspect(one, None).await.expect("inspect");
        assert_eq!(view.holders.len(), 1);
    }
    // The commands the client sent: a script's own calls are not round trips.
    let counted = commands(&mut raw, &["evalsha", "eval", "script"], cpu).await;
    let sent = counted.calls as f64 / INSPECTS as f64;
    row(
        "redis",
        "round trips per `inspect` (`INFO commandstats`)",
        &format!("{sent:.0}"),
        "one command",
        "1",
        sent,
        Target::AtMost(2.0),
    );

    let pattern = "{dlock:listed:*}:[ws]";
    let mut times: [Vec<Duration>; 3] = Default::default();
    for round in 0..ROUNDS * 3 {
        let started = Instant::now();
        match round % 3 {
            0 => assert_eq!(engine.list("listed").await.expect("list").len(), LISTED),
            1 => assert_eq!(scan(&mut raw, pattern, false).await, LISTED),
            _ => assert_eq!(scan(&mut raw, pattern, true).await, LISTED),
        }
        times[round % 3].push(started.elapsed());
    }
    let (list, bare, read) = (p50(&times[0]), p50(&times[1]), p50(&times[2]));
    row(
        "redis",
        &format!("list of {LISTED} held locks (median of {ROUNDS})"),
        &format!("{list:.1?}"),
        "bare `SCAN` of the same keys",
        &format!("{bare:.1?}"),
        list.as_secs_f64() / bare.as_secs_f64(),
        Target::AtMost(1.5),
    );
    row(
        "redis",
        &format!("list of {LISTED} held locks (median of {ROUNDS})"),
        &format!("{list:.1?}"),
        "`SCAN`, and an `MGET` and `PTTL`s of each batch found",
        &format!("{read:.1?}"),
        list.as_secs_f64() / read.as_secs_f64(),
        Target::AtMost(1.5),
    );
    // Where a listing's time goes: the server's part, against the bare SCAN's.
    let cpu = reset(&mut raw).await;
    engine.list("listed").await.expect("list");
    let listed = commands(&mut raw, &["evalsha", "scan", "mget", "pttl", "time"], cpu).await;
    let cpu = reset(&mut raw).await;
    scan(&mut raw, pattern, false).await;
    let scanned = commands(&mut raw, &["scan"], cpu).await;
    println!(
        "list of {LISTED}: {list:.1?} in all, of which the server {} µs ({} commands); \
         bare SCAN {bare:.1?}, of which the server {} µs",
        listed.usec, listed.calls, scanned.usec
    );
}

/// The keys matching `pattern`, by `SCAN` in batches of 1000, each batch's
/// records read if `read` (an `MGET` of the values and each key's `PTTL`,
/// in one pipeline: the least that tells who holds and until when): how
/// many it found.
async fn scan(raw: &mut MultiplexedConnection, pattern: &str, read: bool) -> usize {
    let (mut cursor, mut found) = (0_u64, 0);
    loop {
        let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(pattern)
            .arg("COUNT")
            .arg(1000)
            .query_async(raw)
            .await
            .expect("scan");
        if read && !keys.is_empty() {
            let mut pipe = redis::pipe();
            pipe.cmd("MGET").arg(&keys);
            for key in &keys {
                pipe.cmd("PTTL").arg(key);
            }
            let replies: Vec<redis::Value> = pipe.query_async(raw).await.expect("mget");
            assert_eq!(replies.len(), keys.len() + 1);
        }
        found += keys.len();
        if next == 0 {
            return found;
        }
        cursor = next;
    }
}

#[tokio::main]
async fn main() {
    let server = TestServer::start("redis-server", |port| redis_args(port, &[]));
    let mut raw = connection(&server).await;

    // Uncontended cycles, interleaved in blocks so all see the same machine load.
    let mut fl = floor(connection(&server).await);
    let mut fenced = fenced_floor(connection(&server).await);
    for script in [&fl.unlock, &fenced.lock] {
        script.prepare_invoke().load_async(&mut raw).await.expect("load");
    }
    let rslock = rslock::LockManager::new(vec![format!("redis://{}", server.address())]);
    let dlock = registry(&server).await;
    let lock = dlock.locks("bench").get("uncontended");
    lock.lock().await.expect("warm").release().await.expect("warm");
    let mut times: [Vec<Duration>; 4] = Default::default();
    let mut counted = [Stats::default(); 4];
    for round in 0..CYCLES / BLOCK {
        for turn in 0..4 {
            // Each contender goes first in turn.
            let who = (turn + round) % 4;
            let times = &mut times[who];
            counted[who] += match who {
                0 => {
                    block(&mut raw, times, SENT[who], async |i| {
                        let token = format!("{round}-{i}");
                        assert!(fl.try_lock("floor", &token).await);
                        fl.unlock("floor", &token).await;
                    })
                    .await
                }
                1 => {
                    block(&mut raw, times, SENT[who], async |i| {
                        let token = format!("{round}-{i}");
                        assert!(fenced.try_lock("fenced", &token).await.is_some());
                        fenced.floor.unlock("fenced", &token).await;
                    })
                    .await
                }
                2 => {
                    block(&mut raw, times, SENT[who], async |_| {
                        let held = rslock
                            .lock("rslock", Duration::from_secs(30))
                            .await
                            .expect("rslock");
                        rslock.unlock(&held).await;
                    })
                    .await
                }
                _ => {
                    block(&mut raw, times, SENT[who], async |_| {
                        lock.lock().await.expect("lock").release().await.expect("release");
                    })
                    .await
                }
            };
        }
    }

    // Reentrant: nested acquisitions under a held lock.
    let outer = lock.lock().await.expect("outer");
    let cpu = reset(&mut raw).await;
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
    let nested_commands = commands(&mut raw, SENT[3], cpu).await;
    outer.release().await.expect("release");

    // Contended: dlock fair and the floor unfair take turns, each round with its own PING.
    let mut registries = Vec::new();
    let mut floors = Vec::new();
    for _ in 0..CLIENTS {
        registries.push(Arc::new(registry(&server).await));
        floors.push(floor(connection(&server).await));
    }
    let mut rounds = Vec::new();
    for round in 0..ROUNDS {
        let ping = ping(&mut raw, 1000).await;
        let dlock = dlock_contended(&registries, &format!("contended-{round}")).await;
        let floor = floor_contended(&mut floors, &format!("floor-contended-{round}")).await;
        println!(
            "round {round}: PING {ping:?}; dlock handoff p50 {:?} ({:.2}x PING), {:.0} acq/s, \
             same owner twice in a row {} times; floor unfair {floor:.0} acq/s ({:.2}x dlock)",
            dlock.handoff_p50,
            dlock.handoff_p50.as_secs_f64() / ping.as_secs_f64(),
            dlock.per_second,
            dlock.same_owner,
            floor / dlock.per_second,
        );
        rounds.push((ping, dlock, floor));
    }

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

    let names = [
        "floor: SET NX PX + compare-and-delete",
        "fenced floor: script SET NX PX + TIME, compare-and-delete",
        "rslock 0.10",
        "dlock redis, write",
    ];
    let floor_mean = mean(&times[0]);
    println!("redis bench ({CYCLES} uncontended cycles each, one redis-server on loopback)");
    println!(
        "| uncontended cycle | mean | p50 | vs floor (mean) | vs floor (median block) | commands/cycle sent (run) | server usec/cycle, sent | vs floor | process CPU µs/cycle | vs floor |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|");
    let per_cycle = |n: f64| n / CYCLES as f64;
    for (who, name) in names.iter().enumerate() {
        let m = mean(&times[who]);
        println!(
            "| {name} | {m:?} | {:?} | {:.2} | {:.2} | {:.2} ({:.2}) | {:.2} | {:.2} | {:.1} | {:.2} |",
            p50(&times[who]),
            m.as_secs_f64() / floor_mean.as_secs_f64(),
            block_ratio(&times[who], &times[0]),
            per_cycle(counted[who].calls as f64),
            per_cycle(counted[who].run as f64),
            per_cycle(counted[who].usec as f64),
            counted[who].usec as f64 / counted[0].usec as f64,
            per_cycle(counted[who].cpu_usec),
            counted[who].cpu_usec / counted[0].cpu_usec,
        );
    }
    for (base, target) in [(0, Target::AtMost(1.10)), (1, Target::None), (2, Target::None)] {
        row(
            "redis",
            "uncontended cycle (median block ratio)",
            &format!("{:.1?}", p50(&times[3])),
            names[base],
            &format!("{:.1?}", p50(&times[base])),
            block_ratio(&times[3], &times[base]),
            target,
        );
    }
    row(
        "redis",
        "server time per uncontended cycle (`INFO commandstats`)",
        &format!("{:.2} µs", per_cycle(counted[3].usec as f64)),
        names[0],
        &format!("{:.2} µs", per_cycle(counted[0].usec as f64)),
        counted[3].usec as f64 / counted[0].usec as f64,
        Target::AtMost(1.5),
    );
    println!(
        "nested reentrant acquire+release: {nested:?}, {} Redis commands for {CYCLES}",
        nested_commands.calls
    );
    let handoff_ratio = median(
        rounds
            .iter()
            .map(|(ping, d, _)| d.handoff_p50.as_secs_f64() / ping.as_secs_f64())
            .collect(),
    );
    let throughput_ratio = median(rounds.iter().map(|(_, d, f)| d.per_second / f).collect());
    println!(
        "contended, {CLIENTS} clients one key, median of {ROUNDS} rounds: dlock fair handoff p50 \
         {handoff_ratio:.2}x PING; dlock fair throughput {throughput_ratio:.2}x the floor's unfair"
    );
    println!(
        "30 queued readers, writer release to last admitted: p50 {:?}",
        p50(&admissions)
    );
    let median_of = |f: &dyn Fn(&(Duration, Contended, f64)) -> f64| median(rounds.iter().map(f).collect());
    row(
        "redis",
        &format!("fair handoff p50, {CLIENTS} clients (median of {ROUNDS} rounds)"),
        &format!(
            "{:.1} µs",
            median_of(&|(_, d, _)| d.handoff_p50.as_secs_f64() * 1e6)
        ),
        "PING",
        &format!("{:.1} µs", median_of(&|(ping, _, _)| ping.as_secs_f64() * 1e6)),
        handoff_ratio,
        Target::AtMost(3.0),
    );
    row(
        "redis",
        &format!("contended throughput, {CLIENTS} clients, fair"),
        &format!("{:.0}/s", median_of(&|(_, d, _)| d.per_second)),
        "floor, unfair",
        &format!("{:.0}/s", median_of(&|(_, _, f)| *f)),
        throughput_ratio,
        Target::None,
    );

    // replicas_ack: the cycle with a WAIT for one replica, against the same
    // engine without, taking turns on the server that now has a replica.
    let replica = TestServer::start("redis-server", |port| {
        redis_args(port, &["--replicaof", "127.0.0.1", &server.port.to_string()])
    });
    let replica_port = replica.port.to_string();
    while !redis_cli(&["-p", &replica_port, "info", "replication"]).contains("master_link_status:up") {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let acked = acknowledged_registry(&server, 1).await;
    let acked_lock = acked.locks("bench").get("acked");
    let mut with_replica: [Vec<Duration>; 2] = Default::default();
    for round in 0..CYCLES / BLOCK / 2 {
        for turn in 0..2 {
            let who = (turn + round) % 2;
            let lock = if who == 0 { &lock } else { &acked_lock };
            block(&mut raw, &mut with_replica[who], SENT[3], async |_| {
                lock.lock().await.expect("lock").release().await.expect("release");
            })
            .await;
        }
    }
    println!(
        "replicas_ack = 1 (WAIT for one replica, server with one replica): cycle p50 {:?} against {:?} without, {:.2}x (median block)",
        p50(&with_replica[1]),
        p50(&with_replica[0]),
        block_ratio(&with_replica[1], &with_replica[0])
    );

    memory().await;
    records().await;
}

fn millis(d: Duration) -> u64 {
    d.as_millis().try_into().expect("ms")
}
