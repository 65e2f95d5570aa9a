//! The fault suite (`dlock::engines::conformance::fault_suite`) on every
//! engine with a server, one module per engine fixture, plus the faults
//! particular to one engine. Real worker processes (examples/fault_worker.rs)
//! lock through real servers and write through a fenced register while the
//! tests kill, pause and restart things; `scripts/test` prints the figures.

#![cfg(all(feature = "redis", feature = "zookeeper"))]

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use dlock::engines::conformance::fault_suite::{Setup, Worker};
use dlock::engines::conformance::register::FencedRegister;
use dlock::engines::redis::fixture::Redis;

mod redis {
    dlock::engines::fault_suite!(dlock::engines::redis::fixture::Redis);
}

mod redis_cluster {
    dlock::engines::fault_suite!(dlock::engines::redis::fixture::RedisCluster);
}

mod zookeeper {
    dlock::engines::fault_suite!(dlock::engines::zookeeper::fixture::ZooKeeper);
}

#[cfg(feature = "redlock")]
mod redlock {
    dlock::engines::fault_suite!(dlock::engines::redlock::fixture::RedLock);
}

#[cfg(feature = "memcached")]
mod memcached {
    dlock::engines::fault_suite!(dlock::engines::memcached::fixture::Memcached);
}

#[cfg(feature = "mysql")]
mod mysql {
    dlock::engines::fault_suite!(dlock::engines::mysql::fixture::Mysql);
}

#[cfg(feature = "etcd")]
mod etcd {
    dlock::engines::fault_suite!(dlock::engines::etcd::fixture::Etcd);
}

#[cfg(feature = "postgres")]
mod postgres {
    dlock::engines::fault_suite!(dlock::engines::postgres::fixture::Postgres);
}

const LONG: Duration = Duration::from_secs(60);

/// For the tests below that have no fixture: the figure file `scripts/test` prints.
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

#[test]
fn redis_script_flush_and_killed_connections_mid_run_lose_nothing() {
    let setup = Setup::<Redis>::start(Path::new(env!("CARGO_TARGET_TMPDIR")), "flush-kill");
    let (path, register) = setup.register("flush-kill");
    let workers: Vec<Worker> = (0..3)
        .map(|_| setup.worker(&path, &["--cycles", "30", "--hold-ms", "20"]))
        .collect();
    workers[0].entered(LONG);
    let redis = |args: &[&str]| {
        let status = Command::new("redis-cli")
            .args(["-p", &setup.fixture.server.port.to_string()])
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
    setup.figure(format!(
        "SCRIPT FLUSH and CLIENT KILL under 3 workers × 30 cycles: none failed, {} writes, overlaps {}, stale refused {}",
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
