//! Fault tests across processes: real worker processes (examples/fault_worker.rs)
//! lock through real servers and write through a fenced register, while the
//! test kills, pauses and restarts things. Each test appends its figures
//! (recovery times, overlaps, stale writes refused) to
//! `target/tmp/fault-figures.txt`, which `scripts/test` prints at the end.

#![cfg(all(feature = "redis", feature = "zookeeper"))]

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use dlock::engines::conformance::register::{FencedRegister, Report};
use dlock::engines::conformance::server::{
    TestServer, example, redis_args, redis_cluster, wait_serving, zookeeper,
};

#[derive(Clone, Copy, PartialEq)]
enum Kind {
    Redis,
    RedisCluster,
    ZooKeeper,
}

/// A real server of `kind` (the first node of a cluster) and a config file
/// pointing workers at it.
struct Setup {
    kind: Kind,
    server: TestServer,
    others: Vec<TestServer>,
    dir: PathBuf,
}

impl Setup {
    fn start(kind: Kind, test: &str) -> Self {
        let mut servers = match kind {
            Kind::Redis => vec![TestServer::start("redis-server", |port| redis_args(port, &[]))],
            Kind::RedisCluster => redis_cluster(3),
            Kind::ZooKeeper => vec![zookeeper()],
        };
        let server = servers.remove(0);
        let dir =
            PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("faults-{test}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("test dir");
        Setup {
            kind,
            server,
            others: servers,
            dir,
        }
    }

    fn name(&self) -> &'static str {
        kind_name(self.kind)
    }

    /// Config with a 1 s lease, a 2 s ZooKeeper session and this wait,
    /// written once (workers start at once and read it).
    fn config(&self, wait: &str) -> PathBuf {
        self.config_queued(wait, "engine")
    }

    fn config_queued(&self, wait: &str, queue: &str) -> PathBuf {
        let engine = match self.kind {
            Kind::Redis => format!("kind = \"redis\"\nurl = \"redis://{}\"", self.server.address()),
            Kind::RedisCluster => {
                let nodes: Vec<String> = std::iter::once(&self.server)
                    .chain(&self.others)
                    .map(|n| format!("\"redis://{}\"", n.address()))
                    .collect();
                format!("kind = \"redis-cluster\"\nnodes = [{}]", nodes.join(", "))
            }
            Kind::ZooKeeper => format!(
                "kind = \"zookeeper\"\nconnect = \"{}\"\nsession_timeout = \"2s\"",
                self.server.address()
            ),
        };
        let path = self.dir.join(format!("dlock-{wait}-{queue}.toml"));
        if path.exists() {
            return path;
        }
        let text = format!(
            "[defaults]\nlease = \"1s\"\nwait = \"{wait}\"\nqueue = \"{queue}\"\n\n[engines.main]\n{engine}\n"
        );
        std::fs::write(&path, text).expect("config");
        path
    }

    fn register(&self, name: &str) -> (PathBuf, FencedRegister) {
        let path = self.dir.join(name);
        let register = FencedRegister::create(&path);
        (path, register)
    }

    /// Starts a worker with the 30 s wait config.
    fn worker(&self, register: &Path, args: &[&str]) -> Worker {
        Worker::start(&self.config("30s"), register, args)
    }
}

struct Worker {
    child: Child,
    lines: mpsc::Receiver<String>,
}

impl Worker {
    fn start(config: &Path, register: &Path, args: &[&str]) -> Self {
        let mut child = Command::new(example("fault_worker"))
            .arg("--config")
            .arg(config)
            .arg("--register")
            .arg(register)
            .args(args)
            .stdout(Stdio::piped())
            .spawn()
            .expect("start fault_worker");
        let stdout = child.stdout.take().expect("stdout");
        let (send, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let _ = send.send(line);
            }
        });
        Worker { child, lines }
    }

    fn pid(&self) -> String {
        self.child.id().to_string()
    }

    /// Waits for the next `entered <fence>` line; returns the fence.
    fn entered(&self, within: Duration) -> u64 {
        let deadline = Instant::now() + within;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let line = self
                .lines
                .recv_timeout(left)
                .expect("worker never entered its critical section");
            if let Some(fence) = line.strip_prefix("entered ") {
                return fence.parse().expect("fence");
            }
        }
    }

    /// Waits for the worker to exit and returns its summary counts.
    fn finish(mut self, within: Duration) -> Summary {
        let deadline = Instant::now() + within;
        while self.child.try_wait().expect("wait").is_none() {
            if Instant::now() > deadline {
                let _ = self.child.kill();
                panic!("a worker hung past {within:?}");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let summary = self
            .lines
            .iter()
            .find(|l| l.starts_with("bought="))
            .expect("worker summary");
        Summary::parse(&summary)
    }

    fn signal(&self, signal: &str) {
        let status = Command::new("kill")
            .args([signal, &self.pid()])
            .status()
            .expect("kill");
        assert!(status.success());
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[derive(Debug, Default)]
struct Summary {
    bought: u64,
    sold_out: u64,
    refused: u64,
    lost: u64,
    failed: u64,
}

impl Summary {
    fn parse(line: &str) -> Self {
        let mut s = Summary::default();
        for pair in line.split_whitespace() {
            let (name, n) = pair.split_once('=').expect("name=value");
            let n = n.parse().expect("count");
            match name {
                "bought" => s.bought = n,
                "sold_out" => s.sold_out = n,
                "refused" => s.refused = n,
                "lost" => s.lost = n,
                "failed" => s.failed = n,
                _ => {}
            }
        }
        s
    }
}

fn figure(line: String) {
    let path = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("fault-figures.txt");
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .expect("figures");
    writeln!(file, "{line}").expect("write figure");
    println!("{line}");
}

const LONG: Duration = Duration::from_secs(60);

fn holder_killed(kind: Kind) {
    let setup = Setup::start(kind, &format!("{}-killed", kind_name(kind)));
    let (path, register) = setup.register("killed");
    let holder = setup.worker(&path, &["--hold-ms", "60000"]);
    holder.entered(LONG);
    let waiter = setup.worker(&path, &[]);
    std::thread::sleep(Duration::from_millis(300));
    let killed_at = Instant::now();
    holder.signal("-KILL");
    waiter.entered(LONG);
    let recovered = killed_at.elapsed();
    let summary = waiter.finish(LONG);
    assert_eq!(summary.bought, 1, "{summary:?}");
    let bound = match kind {
        Kind::ZooKeeper => Duration::from_millis(2000 + 1500), // the session timeout
        _ => Duration::from_millis(1000 + 700),                // the lease, and a margin
    };
    assert!(recovered < bound, "free again only after {recovered:?}");
    assert_eq!(register.value(), 1);
    figure(format!(
        "{}: holder SIGKILLed → lock free again after {recovered:.2?} ({})",
        setup.name(),
        match kind {
            Kind::ZooKeeper => "session timeout 2 s",
            _ => "lease 1 s",
        }
    ));
}

fn kind_name(kind: Kind) -> &'static str {
    match kind {
        Kind::Redis => "redis",
        Kind::RedisCluster => "redis-cluster",
        Kind::ZooKeeper => "zookeeper",
    }
}

fn holder_paused(kind: Kind, on_lost: &str) -> Report {
    let setup = Setup::start(kind, &format!("{}-paused-{on_lost}", kind_name(kind)));
    let (path, register) = setup.register("paused");
    let holder = setup.worker(&path, &["--hold-ms", "5000", "--on-lost", on_lost]);
    let stale_fence = holder.entered(LONG);
    holder.signal("-STOP");
    let waiter = setup.worker(&path, &[]);
    let fresh_fence = waiter.entered(LONG);
    let waiter = waiter.finish(LONG);
    assert_eq!(waiter.bought, 1, "the waiter's write was refused: {waiter:?}");
    assert!(
        fresh_fence > stale_fence,
        "fences {stale_fence} then {fresh_fence}"
    );
    holder.signal("-CONT");
    let holder = holder.finish(LONG);
    match on_lost {
        // The body is dropped on lost, before its late write.
        "cancel" => assert_eq!(
            (holder.lost, holder.bought, holder.refused),
            (1, 0, 0),
            "{holder:?}"
        ),
        // The body runs on; the register refuses its stale write.
        _ => assert_eq!((holder.bought, holder.refused), (0, 1), "{holder:?}"),
    }
    assert_eq!(register.value(), 1, "only the fresh holder's write counts");
    let report = register.report();
    assert!(
        report.overlaps >= 1,
        "the paused holder's section overlapped the next: {report:?}"
    );
    figure(format!(
        "{}: holder SIGSTOPped past its lease, on_lost = {on_lost}: overlaps {}, stale writes refused {}, writes accepted {}",
        setup.name(),
        report.overlaps,
        report.stale_refused,
        report.writes
    ));
    report
}

fn server_restarted(kind: Kind) {
    let mut setup = Setup::start(kind, &format!("{}-restart", kind_name(kind)));
    let (path, register) = setup.register("restart");
    let holder = setup.worker(&path, &["--hold-ms", "3000"]);
    holder.entered(LONG);
    let waiters: Vec<Worker> = (0..3)
        .map(|_| setup.worker(&path, &["--hold-ms", "100"]))
        .collect();
    std::thread::sleep(Duration::from_millis(500));
    let restarted_at = Instant::now();
    setup.server.kill();
    // Down longer than half the ZooKeeper session: the holder must hear it.
    std::thread::sleep(Duration::from_millis(1500));
    setup.server.restart();
    if kind == Kind::ZooKeeper {
        wait_serving(&setup.server.address());
    }
    let holder = holder.finish(LONG);
    assert_eq!(
        holder.lost, 1,
        "the holder kept a lock across the outage: {holder:?}"
    );
    let mut bought = 0;
    for waiter in waiters {
        let summary = waiter.finish(LONG);
        assert_eq!(summary.failed, 0, "a waiter gave up: {summary:?}");
        bought += summary.bought;
    }
    assert_eq!(bought, 3, "every waiter got its turn");
    let report = register.report();
    figure(format!(
        "{}: server down 1.5 s with 1 holder and 3 waiters: holder lost, all 3 waiters done {:.2?} after the crash; overlaps {}, stale refused {}",
        setup.name(),
        restarted_at.elapsed(),
        report.overlaps,
        report.stale_refused
    ));
}

fn server_gone_mid_wait(kind: Kind) {
    let mut setup = Setup::start(kind, &format!("{}-gone", kind_name(kind)));
    let (path, _register) = setup.register("gone");
    let holder = setup.worker(&path, &["--hold-ms", "60000"]);
    holder.entered(LONG);
    let waiter = Worker::start(&setup.config("3s"), &path, &[]);
    std::thread::sleep(Duration::from_millis(500));
    let gone_at = Instant::now();
    setup.server.kill();
    let summary = waiter.finish(Duration::from_secs(10));
    let waited = gone_at.elapsed();
    assert_eq!(summary.failed, 1, "{summary:?}");
    assert!(
        waited < Duration::from_secs(5),
        "the waiter hung {waited:?} past a 3 s wait"
    );
    let holder = holder.finish(Duration::from_secs(70));
    assert_eq!(holder.lost, 1, "{holder:?}");
    figure(format!(
        "{}: server gone mid-wait (wait 3 s): waiter failed with an engine error {waited:.2?} after, holder lost",
        setup.name()
    ));
}

fn flash_sale(kind: Kind) {
    let setup = Setup::start(kind, &format!("{}-flash", kind_name(kind)));
    let (path, register) = setup.register("stock");
    let started = Instant::now();
    // 10,000 buyers of one item: each process lines its buyers up locally.
    let config = setup.config_queued("120s", "local");
    let shops: Vec<Worker> = (0..4)
        .map(|_| {
            Worker::start(
                &config,
                &path,
                &["--key", "item-1", "--tasks", "2500", "--limit", "10"],
            )
        })
        .collect();
    let (mut sold, mut sold_out) = (0, 0);
    for shop in shops {
        let summary = shop.finish(Duration::from_secs(300));
        assert_eq!(
            (summary.failed, summary.refused, summary.lost),
            (0, 0, 0),
            "{summary:?}"
        );
        sold += summary.bought;
        sold_out += summary.sold_out;
    }
    assert_eq!((sold, sold_out), (10, 9_990));
    assert_eq!(register.value(), 10);
    let report = register.report();
    assert_eq!(report.overlaps, 0, "{report:?}");
    figure(format!(
        "{}: flash sale, 4 processes × 2,500 buyers, stock 10: sold={sold} oversold=0 in {:.2?}",
        setup.name(),
        started.elapsed()
    ));
}

#[test]
fn redis_holder_killed_frees_the_lock_within_the_lease() {
    holder_killed(Kind::Redis);
}

#[test]
fn zookeeper_holder_killed_frees_the_lock_within_the_session_timeout() {
    holder_killed(Kind::ZooKeeper);
}

#[test]
fn redis_holder_paused_past_its_lease_is_cancelled_or_fenced() {
    holder_paused(Kind::Redis, "cancel");
    let report = holder_paused(Kind::Redis, "ignore");
    assert!(report.stale_refused >= 1);
}

#[test]
fn zookeeper_holder_paused_past_its_session_is_cancelled_or_fenced() {
    holder_paused(Kind::ZooKeeper, "cancel");
    let report = holder_paused(Kind::ZooKeeper, "ignore");
    assert!(report.stale_refused >= 1);
}

#[test]
fn redis_server_restarted_with_a_holder_and_waiters() {
    server_restarted(Kind::Redis);
}

#[test]
fn zookeeper_server_restarted_with_a_holder_and_waiters() {
    server_restarted(Kind::ZooKeeper);
}

#[test]
fn redis_server_gone_mid_wait_fails_within_the_wait() {
    server_gone_mid_wait(Kind::Redis);
}

#[test]
fn zookeeper_server_gone_mid_wait_fails_within_the_wait() {
    server_gone_mid_wait(Kind::ZooKeeper);
}

#[test]
fn redis_flash_sale_across_four_processes() {
    flash_sale(Kind::Redis);
}

#[test]
fn redis_cluster_flash_sale_across_four_processes() {
    flash_sale(Kind::RedisCluster);
}

#[test]
fn zookeeper_flash_sale_across_four_processes() {
    flash_sale(Kind::ZooKeeper);
}

#[test]
fn redis_script_flush_and_killed_connections_mid_run_lose_nothing() {
    let setup = Setup::start(Kind::Redis, "redis-flush-kill");
    let (path, register) = setup.register("flush-kill");
    let workers: Vec<Worker> = (0..3)
        .map(|_| setup.worker(&path, &["--cycles", "30", "--hold-ms", "20"]))
        .collect();
    workers[0].entered(LONG);
    let redis = |args: &[&str]| {
        let status = Command::new("redis-cli")
            .args(["-p", &setup.server.port.to_string()])
            .args(args)
            .stdout(Stdio::null())
            .status()
            .expect("redis-cli");
        assert!(status.success());
    };
    std::thread::sleep(Duration::from_millis(300));
    redis(&["SCRIPT", "FLUSH"]);
    std::thread::sleep(Duration::from_millis(300));
    // Every client connection, waiters' and subscribers' included.
    redis(&["CLIENT", "KILL", "TYPE", "normal"]);
    redis(&["CLIENT", "KILL", "TYPE", "pubsub"]);
    let mut bought = 0;
    for worker in workers {
        let summary = worker.finish(LONG);
        assert_eq!((summary.failed, summary.refused), (0, 0), "{summary:?}");
        bought += summary.bought + summary.lost;
    }
    let report = register.report();
    assert_eq!(register.value(), report.writes, "a write was lost");
    assert_eq!(bought, 90, "every cycle ended");
    figure(format!(
        "redis: SCRIPT FLUSH and CLIENT KILL under 3 workers × 30 cycles: none failed, {} writes, overlaps {}, stale refused {}",
        report.writes, report.overlaps, report.stale_refused
    ));
}

/// The in-process variant for the memory engine: a holder whose renewals
/// stop (a task stalled past its lease) is lost, its late write refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_holder_stalled_past_its_lease_is_fenced() {
    use std::sync::Arc;

    use dlock::engines::conformance::Faults;
    use dlock::engines::memory::MemoryEngine;
    use dlock::{LostReason, Registry, Settings};

    let engine: Arc<dyn dlock::Engine> = Arc::new(MemoryEngine::new());
    let stalled_path = Faults::new(engine.clone());
    let stalled_path = Arc::new(stalled_path);
    let holder =
        Registry::with_engine("memory", stalled_path.clone(), Settings::default()).expect("registry");
    let peer = Registry::with_engine("memory", engine, Settings::default()).expect("registry");
    let dir =
        PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("faults-memory-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let register = FencedRegister::create(&dir.join("stalled"));

    let lock = holder
        .locks("faults")
        .get("k")
        .with_lease(Duration::from_millis(300));
    let stale = lock.lock().await.expect("lock");
    register.mark(stale.fence(), "enter");
    let value = register.read(stale.fence()).expect("read");
    stalled_path.set_cut(true); // renewals stop reaching the engine
    let started = Instant::now();
    assert_eq!(stale.lost().await, LostReason::LeaseElapsed);
    let fresh = peer.locks("faults").get("k").lock().await.expect("lock");
    let freed_after = started.elapsed();
    register.mark(fresh.fence(), "enter");
    let fresh_value = register.read(fresh.fence()).expect("read");
    register
        .write(fresh.fence(), fresh_value + 1)
        .expect("fresh write");
    register.mark(fresh.fence(), "exit");
    assert!(
        register.write(stale.fence(), value + 1).is_err(),
        "the stale write went through"
    );
    register.mark(stale.fence(), "exit");
    fresh.release().await.expect("release");
    let report = register.report();
    assert_eq!(
        (report.overlaps, report.stale_refused, register.value()),
        (1, 1, 1),
        "{report:?}"
    );
    figure(format!(
        "memory: holder stalled past its 300 ms lease: lost, lock free after {freed_after:.2?}; overlaps 1, stale writes refused 1"
    ));
}
