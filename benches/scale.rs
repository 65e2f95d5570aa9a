//! What waiting costs as waiters, processes and keys grow, with default
//! settings, on servers this bench starts on loopback ports: one
//! redis-server, a 3-master Redis Cluster, one ZooKeeper and one
//! nats-server.
//!
//! - **Waiters.** 100 and 10,000 tasks loop on one key (acquire, release,
//!   again), from one process and spread over 4; acquisitions/s in a 3 s
//!   window after a 1 s warm-up, and 10,000 ÷ 100 against the 0.8 target.
//! - **Server load while waiting.** One holder keeps the key while 10,000
//!   tasks wait; the server's commands/s (Redis `INFO stats`, summed over
//!   the cluster's masters), requests/s (ZooKeeper `srvr`, packets
//!   received) or messages/s (NATS `/varz`, `in_msgs`) over 3 s. For comparison, 1,000 waiters with
//!   `queue = "engine"`, where each waiter keeps its own place alive.
//! - **Many keys.** 4 processes × 16 keys, one task per key, hold 0: the
//!   aggregate cycles/s of dlock against the floor (`SET NX PX` +
//!   compare-and-delete) on the same redis-server, rounds taking turns.
//!
//! Each process is this binary again (`--worker`), so waiters really are
//! in separate processes with their own connections.
//!
//! ```text
//! cargo bench --bench scale --features redis,zookeeper,nats [-- redis redis-cluster zookeeper nats]
//! ```

use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

mod common;

use dlock_testkit::Fixture;
use dlock_testkit::fixtures::nats::{Nats, varz};
use dlock_testkit::fixtures::redis::{info_field, redis_args, redis_cli, redis_cluster};
use dlock_testkit::fixtures::zookeeper::{four_letter, zookeeper};
use dlock_testkit::server::TestServer;

use common::{Target, median, row};

const WARM: Duration = Duration::from_secs(1);
const WINDOW: Duration = Duration::from_secs(3);
const ROUNDS: usize = 5;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("--worker") {
        return worker(&args[1..]);
    }
    if args.iter().any(|a| a == "--list") {
        return; // `cargo bench -- --list` asks what runs: this one binary.
    }
    // `-- redis zookeeper` runs only those servers' figures.
    let only =
        |name: &str| !args.iter().any(|a| SERVERS.contains(&a.as_str())) || args.iter().any(|a| a == name);
    let redis = TestServer::start("redis-server", |port| redis_args(port, &[]));
    let cluster = if only("redis-cluster") {
        redis_cluster(3)
    } else {
        Vec::new()
    };
    let zk = only("zookeeper").then(zookeeper);
    let nats = only("nats").then(Nats::start);
    let mut servers = Vec::new();
    if only("redis") {
        servers.push(Server::Redis(&redis));
    }
    if only("redis-cluster") {
        servers.push(Server::Cluster(&cluster));
    }
    if let Some(zk) = &zk {
        servers.push(Server::ZooKeeper(zk));
    }
    if let Some(nats) = &nats {
        servers.push(Server::Nats(nats));
    }
    println!(
        "acquisitions/s, tasks looping on one key (default settings; median of {ROUNDS} rounds, ratio median (range)):"
    );
    for server in &servers {
        for processes in [1, 4] {
            // Rounds alternate the two, so both see the same machine.
            let (mut few, mut many, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
            for _ in 0..ROUNDS {
                few.push(rate(server, "", 100, processes));
                many.push(rate(server, "", 10_000, processes));
                ratios.push(many[many.len() - 1] / few[few.len() - 1]);
            }
            let (few, many) = (median(few), median(many));
            println!(
                "  {:<14} {processes} process(es): 100 waiters {few:>7.0}   10,000 waiters {many:>7.0}   ratio {} (target ≥ 0.80)",
                server.name(),
                spread(ratios.clone())
            );
            row(
                server.name(),
                &format!(
                    "acquisitions/s, 10,000 waiters in {processes} process(es) (median ratio of {ROUNDS} rounds)"
                ),
                &format!("{many:.0}/s"),
                "100 waiters",
                &format!("{few:.0}/s"),
                median(ratios),
                Target::AtLeast(0.8),
            );
        }
    }
    println!("server load while one holder keeps the key (per second, over {WINDOW:?}):");
    for server in &servers {
        let mut loads = Vec::new();
        for processes in [1, 4] {
            let load = waiting_load(server, "", 10_000, processes);
            println!(
                "  {:<14} 10,000 waiters in {processes} process(es): {load:>8.0}",
                server.name()
            );
            loads.push((processes, load));
        }
        let engine = waiting_load(server, "queue = \"engine\"", 1_000, 1);
        println!(
            "  {:<14} 1,000 waiters, queue = \"engine\":   {engine:>8.0}",
            server.name()
        );
        for (processes, load) in loads {
            row(
                server.name(),
                &format!("server load/s while 10,000 wait in {processes} process(es)"),
                &format!("{load:.0}"),
                "1,000 waiters, `queue = \"engine\"`",
                &format!("{engine:.0}"),
                load / engine.max(1.0),
                Target::None,
            );
        }
    }
    if only("redis") {
        many_keys(&Server::Redis(&redis));
    }
}

const SERVERS: [&str; 4] = ["redis", "redis-cluster", "zookeeper", "nats"];

enum Server<'a> {
    Redis(&'a TestServer),
    Cluster(&'a [TestServer]),
    ZooKeeper(&'a TestServer),
    Nats(&'a Nats),
}

impl Server<'_> {
    fn name(&self) -> &'static str {
        match self {
            Server::Redis(_) => "redis",
            Server::Cluster(_) => "redis-cluster",
            Server::ZooKeeper(_) => "zookeeper",
            Server::Nats(_) => "nats",
        }
    }

    /// A config file for this server with `defaults` (TOML lines) on top.
    fn config(&self, defaults: &str) -> std::path::PathBuf {
        let engine = match self {
            Server::Redis(s) => format!("kind = \"redis\"\nurl = \"redis://{}\"", s.address()),
            Server::Cluster(nodes) => {
                let nodes: Vec<String> = nodes
                    .iter()
                    .map(|n| format!("\"redis://{}\"", n.address()))
                    .collect();
                format!("kind = \"redis-cluster\"\nnodes = [{}]", nodes.join(", "))
            }
            Server::ZooKeeper(s) => format!("kind = \"zookeeper\"\nconnect = \"{}\"", s.address()),
            Server::Nats(n) => n.engine_config(),
        };
        let path = dlock_testkit::server::scratch(&format!("scale-{}-{}.toml", self.name(), defaults.len()));
        let text = format!("[defaults]\n{defaults}\n\n[engines.main]\n{engine}\n");
        std::fs::write(&path, text).expect("config");
        path
    }

    /// Commands (Redis), requests (ZooKeeper) or messages (NATS) the
    /// server has received.
    fn received(&self) -> u64 {
        match self {
            Server::Redis(s) => commands_processed(s),
            Server::Cluster(nodes) => nodes.iter().map(commands_processed).sum(),
            Server::ZooKeeper(s) => four_letter(&s.address(), "srvr")
                .lines()
                .find_map(|l| l.strip_prefix("Received: "))
                .and_then(|n| n.trim().parse().ok())
                .expect("srvr says Received"),
            Server::Nats(n) => varz(n.monitor, "in_msgs"),
        }
    }
}

fn commands_processed(server: &TestServer) -> u64 {
    let info = redis_cli(&["-p", &server.port.to_string(), "INFO", "stats"]);
    info_field(&info, "total_commands_processed")
}

/// `median (min–max)` of per-round ratios.
fn spread(ratios: Vec<f64>) -> String {
    let min = ratios.iter().copied().fold(f64::INFINITY, f64::min);
    let max = ratios.iter().copied().fold(0.0, f64::max);
    format!("{:.2} ({min:.2}–{max:.2})", median(ratios))
}

/// A fresh key per measurement: a worker that exits mid-wait leaves its
/// place behind until its liveness runs out.
fn fresh_key(what: &str) -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    format!("{what}-{}", NEXT.fetch_add(1, Ordering::Relaxed))
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock")
        .as_millis() as u64
}

/// Starts `processes` workers with `args`, sharing one starting time; returns
/// the sum of what they print.
fn run_workers(processes: usize, args: &[String], starts_at: u64) -> u64 {
    let workers: Vec<_> = (0..processes)
        .map(|index| {
            Command::new(std::env::current_exe().expect("this bench"))
                .arg("--worker")
                .args(args)
                .args(["--index", &index.to_string(), "--from", &starts_at.to_string()])
                .stdout(Stdio::piped())
                .spawn()
                .expect("worker")
        })
        .collect();
    workers
        .into_iter()
        .map(|w| {
            let out = w.wait_with_output().expect("worker output");
            assert!(out.status.success(), "worker failed: {:?}", out.status);
            String::from_utf8_lossy(&out.stdout)
                .trim()
                .parse::<u64>()
                .expect("worker count")
        })
        .sum()
}

/// Acquisitions/s of `waiters` tasks looping on one key over `processes`.
fn rate(server: &Server, defaults: &str, waiters: usize, processes: usize) -> f64 {
    let config = server.config(defaults);
    let args = [
        "loop",
        config.to_str().expect("utf-8 path"),
        &fresh_key("hot"),
        &(waiters / processes).to_string(),
        "1",
    ]
    .map(String::from);
    let count = run_workers(processes, &args, unix_ms() + 1_500);
    count as f64 / WINDOW.as_secs_f64()
}

/// The server's load per second while `waiters` wait behind a holder.
fn waiting_load(server: &Server, defaults: &str, waiters: usize, processes: usize) -> f64 {
    let config = server.config(defaults);
    let key = fresh_key("held");
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let settings = dlock::Config::from_file(&config).expect("config");
    let registry = runtime
        .block_on(dlock::Registry::build(&settings, &dlock::engines::kinds()))
        .expect("registry");
    let holder = runtime
        .block_on(registry.locks("scale").get(key.clone()).lock())
        .expect("hold");
    let starts_at = unix_ms() + 1_500;
    let args = [
        "wait",
        config.to_str().expect("utf-8 path"),
        &key,
        &(waiters / processes).to_string(),
    ]
    .map(String::from);
    let workers = std::thread::spawn(move || run_workers(processes, &args, starts_at));
    std::thread::sleep(Duration::from_millis(1_500) + WARM * 2);
    let before = server.received();
    std::thread::sleep(WINDOW);
    let load = (server.received() - before) as f64 / WINDOW.as_secs_f64();
    runtime.block_on(holder.release()).expect("release");
    let acquired = workers.join().expect("workers");
    assert_eq!(acquired, waiters as u64, "every waiter gets the lock");
    load
}

/// 64 distinct keys in 4 processes, hold 0: dlock's aggregate cycles/s
/// against the floor's, rounds taking turns.
fn many_keys(server: &Server) {
    let Server::Redis(redis) = server else {
        unreachable!("the floor is plain Redis")
    };
    let config = server.config("");
    let mut ratios = Vec::new();
    let (mut dlock_rates, mut floor_rates) = (Vec::new(), Vec::new());
    for _ in 0..ROUNDS {
        for floor in [false, true] {
            let what = if floor { "floor" } else { "loop" };
            let target = if floor {
                format!("redis://{}", redis.address())
            } else {
                config.to_str().expect("utf-8 path").to_owned()
            };
            let args = [what, &target, &fresh_key("many"), "1", "16"].map(String::from);
            let count = run_workers(4, &args, unix_ms() + 1_500) as f64 / WINDOW.as_secs_f64();
            if floor { &mut floor_rates } else { &mut dlock_rates }.push(count);
        }
        ratios.push(dlock_rates.last().unwrap() / floor_rates.last().unwrap());
    }
    println!(
        "many keys: 4 processes × 16 keys, one task per key, hold 0 (cycles/s; median of {ROUNDS} rounds, ratio median (range)):"
    );
    let (floor, dlock) = (median(floor_rates), median(dlock_rates));
    println!(
        "  floor {floor:>8.0}   dlock {dlock:>8.0}   dlock ÷ floor {} (target ≥ 0.90)",
        spread(ratios.clone())
    );
    row(
        "redis",
        "many keys: 4 processes × 16 keys, cycles/s (median ratio of rounds)",
        &format!("{dlock:.0}/s"),
        "floor",
        &format!("{floor:.0}/s"),
        median(ratios),
        Target::AtLeast(0.9),
    );
}

/// A worker process: `loop CONFIG KEY TASKS KEYS` counts the acquisitions
/// in the window of `TASKS` tasks on each of `KEYS` keys; `floor URL KEY 1
/// KEYS` does the same with the floor; `wait CONFIG KEY TASKS` has each task
/// acquire once and counts them. Prints the count.
fn worker(args: &[String]) {
    let value = |flag: &str| {
        let at = args.iter().position(|a| a == flag).expect("flag");
        args[at + 1].parse::<u64>().expect("number")
    };
    let (index, from) = (value("--index"), value("--from"));
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let count = runtime.block_on(async {
        let (what, target, key) = (&args[0], &args[1], &args[2]);
        let tasks: usize = args[3].parse().expect("tasks");
        let start = tokio::time::Instant::now() + Duration::from_millis(from.saturating_sub(unix_ms()));
        match what.as_str() {
            "wait" => waiters(target, key, tasks).await,
            _ => {
                let keys: usize = args[4].parse().expect("keys");
                let names: Vec<String> = (0..keys)
                    .map(|k| {
                        if keys == 1 {
                            key.clone()
                        } else {
                            format!("{key}-{index}-{k}")
                        }
                    })
                    .collect();
                let counted = Arc::new(AtomicU64::new(0));
                let window = (start + WARM, start + WARM + WINDOW);
                for name in names {
                    for _ in 0..tasks {
                        let counted = counted.clone();
                        if what == "floor" {
                            tokio::spawn(floor_loop(target.clone(), name.clone(), counted, window));
                        } else {
                            tokio::spawn(dlock_loop(target.clone(), name.clone(), counted, window));
                        }
                    }
                }
                tokio::time::sleep_until(window.1).await;
                counted.load(Ordering::Relaxed)
            }
        }
    });
    println!("{count}");
    // Tasks still queued are left behind: their keys are not used again.
    std::process::exit(0);
}

type Window = (tokio::time::Instant, tokio::time::Instant);

/// The process's registry, from `config` on first use.
async fn registry(config: &str) -> &'static dlock::Registry {
    static READY: tokio::sync::OnceCell<()> = tokio::sync::OnceCell::const_new();
    READY
        .get_or_init(|| async { dlock::init_from_file(config).await.expect("config") })
        .await;
    dlock::registry()
}

async fn dlock_loop(config: String, key: String, counted: Arc<AtomicU64>, window: Window) {
    let lock = registry(&config).await.locks("scale").get(key);
    tokio::time::sleep_until(window.0 - WARM).await;
    loop {
        let guard = lock.lock().await.expect("lock");
        let now = tokio::time::Instant::now();
        guard.release().await.expect("release");
        if now >= window.0 && now < window.1 {
            counted.fetch_add(1, Ordering::Relaxed);
        }
    }
}

async fn floor_loop(url: String, key: String, counted: Arc<AtomicU64>, window: Window) {
    let client = redis::Client::open(url).expect("url");
    let mut connection = client.get_multiplexed_async_connection().await.expect("connect");
    let unlock = redis::Script::new(
        "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0",
    );
    let token = format!("{}-{key}", std::process::id());
    tokio::time::sleep_until(window.0 - WARM).await;
    loop {
        let set: Option<String> = redis::cmd("SET")
            .arg(&key)
            .arg(&token)
            .arg("NX")
            .arg("PX")
            .arg(30_000)
            .query_async(&mut connection)
            .await
            .expect("set");
        assert!(set.is_some(), "one task per key: the floor is never contended");
        let now = tokio::time::Instant::now();
        let _: i64 = unlock
            .key(&key)
            .arg(&token)
            .invoke_async(&mut connection)
            .await
            .expect("unlock");
        if now >= window.0 && now < window.1 {
            counted.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// `tasks` tasks each acquire `key` once (a holder keeps it at first).
async fn waiters(config: &str, key: &str, tasks: usize) -> u64 {
    let lock = registry(config).await.locks("scale").get(key.to_owned());
    let handles: Vec<_> = (0..tasks)
        .map(|_| {
            let lock = lock.clone();
            tokio::spawn(async move { lock.lock().await.expect("lock").release().await.expect("release") })
        })
        .collect();
    let mut acquired = 0;
    for handle in handles {
        handle.await.expect("waiter");
        acquired += 1;
    }
    acquired
}
