//! A/B: dlock's uncontended write cycle, and a permit's of a semaphore of
//! 4, as an older commit built them against this tree's, on one server, in
//! one run: the two `ab_driver` processes
//! take turns in blocks, each going first in turn, and the ratio is the
//! median over rounds of (this tree's block ÷ the base's). A change to the
//! core that costs time shows here as a number, not as drift between days.
//!
//! ```text
//! scripts/bench ab <commit> [engine...]
//! ```
//!
//! The script builds both drivers and names them in `AB_BASE` and `AB_NEW`
//! (and the commit in `AB_BASE_NAME`); this bench starts each engine's test
//! server and gives both drivers the same config, cut to the settings every
//! commit knows.

use std::any::Any;
use std::path::{Path, PathBuf};
use std::process::Command;

mod common;

use common::{Peer, Target, micros, percentile, row};
use dlock_testkit::Fixture;
use dlock_testkit::fixtures::etcd::Etcd;
use dlock_testkit::fixtures::memcached::Memcached;
use dlock_testkit::fixtures::memory::Memory;
use dlock_testkit::fixtures::mysql::Mysql;
use dlock_testkit::fixtures::postgres::Postgres;
use dlock_testkit::fixtures::redis::Redis;
use dlock_testkit::fixtures::redlock::RedLock;
use dlock_testkit::fixtures::zookeeper::ZooKeeper;

const ROUNDS: usize = 200;
/// The most a change may cost: a tree against itself gives medians 1 %
/// apart here (0.99–1.01) and unchanged engines 4 % (0.96–1.04), so a
/// stricter bound would judge the machine, not the change.
const NOISE: f64 = 1.03;
/// The most a change may cost a permit: what its slot may cost.
const PERMIT_COST: f64 = 1.05;
/// How long a block should take: long enough that switching sides costs
/// nothing measurable, short enough that both sides see the same load.
const BLOCK_TIME: f64 = 20e6;
const ENGINES: [&str; 8] = [
    "memory",
    "redis",
    "zookeeper",
    "etcd",
    "postgres",
    "mysql",
    "memcached",
    "redlock",
];
/// Settings the fixtures tune for the suites that older commits may not
/// know; the cycle does not depend on them.
const TUNING: [&str; 5] = [
    "fence_retention",
    "session_ttl",
    "session_timeout",
    "keeper_idle",
    "waiter_ttl",
];

/// The engine's test server, kept running, and its config.
fn start(engine: &str) -> (Box<dyn Any>, String) {
    fn started<F: Fixture>() -> (Box<dyn Any>, String) {
        let fixture = F::start();
        let config = fixture.engine_config();
        (Box::new(fixture), config)
    }
    match engine {
        "memory" => started::<Memory>(),
        "redis" => started::<Redis>(),
        "zookeeper" => started::<ZooKeeper>(),
        "etcd" => started::<Etcd>(),
        "postgres" => started::<Postgres>(),
        "mysql" => started::<Mysql>(),
        "memcached" => started::<Memcached>(),
        "redlock" => started::<RedLock>(),
        other => panic!("ab: no engine {other:?}; these are: {}", ENGINES.join(" ")),
    }
}

fn config_file(engine: &str, config: &str) -> PathBuf {
    let kept: Vec<&str> = config
        .lines()
        .filter(|line| !TUNING.iter().any(|key| line.starts_with(&format!("{key} ="))))
        .collect();
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/ab");
    std::fs::create_dir_all(&dir).expect("target/ab");
    let path = dir.join(format!("{engine}.toml"));
    std::fs::write(&path, format!("[engines.main]\n{}\n", kept.join("\n"))).expect("write the config");
    path
}

fn main() {
    let driver = |name: &str| {
        std::env::var(name)
            .unwrap_or_else(|_| panic!("ab: {name} is not set; run `scripts/bench ab <commit>`"))
    };
    let (base, new, base_name) = (driver("AB_BASE"), driver("AB_NEW"), driver("AB_BASE_NAME"));
    let asked: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--"))
        .collect();
    let engines: Vec<&str> = match asked.is_empty() {
        true => ENGINES.to_vec(),
        false => asked.iter().map(String::as_str).collect(),
    };
    for engine in engines {
        let (_server, config) = start(engine);
        let config = config_file(engine, &config);
        compare(engine, &config, (&base, &new, &base_name), None);
        compare(engine, &config, (&base, &new, &base_name), Some("4"));
    }
}

/// The two drivers' cycles on `engine`'s server, a lock's or (with
/// `permits`) a permit's, in one row of the table.
fn compare(engine: &str, config: &Path, (base, new, base_name): (&str, &str, &str), permits: Option<&str>) {
    let (case, most) = match permits {
        None => ("uncontended cycle".to_owned(), NOISE),
        Some(n) => (format!("uncontended permit of {n}"), PERMIT_COST),
    };
    // Each its own lock, with names of one length.
    let side = |driver: &str, name: &str| {
        let mut command = Command::new(driver);
        command.arg(config).arg(name).args(permits);
        Peer::spawn(&mut command)
    };
    let mut sides = [side(base, "a"), side(new, "b")];
    let cycle = sides.iter_mut().map(|side| side.cycles(100)).fold(0.0, f64::max);
    let block = ((BLOCK_TIME / cycle) as usize).clamp(20, 20_000);
    let mut ns: [Vec<f64>; 2] = Default::default();
    for round in 0..ROUNDS {
        for turn in 0..2 {
            let side = (turn + round) % 2;
            ns[side].push(sides[side].cycles(block));
        }
    }
    let [base_ns, new_ns] = ns;
    let ratios: Vec<f64> = new_ns.iter().zip(&base_ns).map(|(n, b)| n / b).collect();
    let ratio = percentile(ratios.clone(), 0.5);
    let (new_cycle, base_cycle) = (micros(percentile(new_ns, 0.5)), micros(percentile(base_ns, 0.5)));
    println!(
        "{engine} {case}: this tree {new_cycle}, {base_name} {base_cycle} per cycle; ratio {ratio:.3} (p10 {:.3}, p90 {:.3}; {ROUNDS} rounds of {block})",
        percentile(ratios.clone(), 0.1),
        percentile(ratios, 0.9),
    );
    row(
        engine,
        &format!("A/B {case} (median round ratio)"),
        &new_cycle,
        &format!("at {base_name}"),
        &base_cycle,
        ratio,
        Target::AtMost(most),
    );
}
