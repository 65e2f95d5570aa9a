//! Semaphores against the same engine's lock, in one run, on every engine
//! this build has, each on servers this bench starts on loopback ports
//! (the test fixtures):
//!
//! - uncontended: a permit's acquire + release ÷ the lock's write cycle,
//!   taken in turns in blocks (target ≤ 1.10);
//! - contended: 16 tasks, each holding 1 ms, acquisitions per second with 4
//!   permits ÷ with 1 (target ≥ 3: the permits really run in parallel),
//!   rounds alternating;
//! - on Redis, also against the `distributed-lock` crate's Redis semaphore
//!   (`benches/peers/distributed-lock`; a script per acquire and release,
//!   no queue, no fence): the uncontended permit cycle, in blocks taking
//!   turns (target ≤ 1.0), and the contended rate on 4 permits, rounds
//!   alternating.
//!
//! ```text
//! cargo bench --bench semaphore --all-features [-- engine...]
//! ```

use std::time::Duration;

mod common;

use dlock::{Locks, Registry, Settings};
use dlock_testkit::Fixture;

use common::{Rate, Target, block_ratios, median, micros, permit_cycle, permit_rate, row, take_turns};

const CYCLES: usize = 4000;
/// Cycles of one side before the other takes a turn.
const BLOCK: usize = 100;
const CLIENTS: usize = 16;
const HOLD: Duration = Duration::from_millis(1);
const ROUNDS: usize = 3;
const ROUND_FOR: Duration = Duration::from_secs(1);

/// Uncontended: a permit of 4 against the lock of the same group.
async fn uncontended(engine: &str, locks: &Locks) {
    let (lock, semaphore) = (locks.get("lock"), locks.semaphore("permits", 4));
    let [lock_times, permit_times] = take_turns(
        (CYCLES, BLOCK),
        async || lock.lock().await.expect("lock").release().await.expect("release"),
        async || permit_cycle(&semaphore).await,
    )
    .await;
    let ratio = median(block_ratios(&permit_times, &lock_times, BLOCK));
    let p50 = |times: &[Duration]| micros(common::p50(times).as_nanos() as f64);
    println!(
        "{engine}: uncontended permit {} vs lock {}: {ratio:.3}",
        p50(&permit_times),
        p50(&lock_times)
    );
    row(
        engine,
        "semaphore: uncontended acquire + release ÷ the lock's cycle (median block ratio)",
        &p50(&permit_times),
        "lock",
        &p50(&lock_times),
        ratio,
        Target::AtMost(1.10),
    );
}

/// `CLIENTS` tasks, each holding `HOLD`, on a semaphore of `permits`, for
/// `ROUND_FOR`.
async fn per_second(locks: &Locks, permits: u32, round: usize) -> Rate {
    let semaphore = locks.semaphore(format!("contended-{permits}-{round}"), permits);
    let rate = permit_rate(vec![semaphore; CLIENTS], HOLD, ROUND_FOR).await;
    println!("  {permits} permit(s), round {round}: {}", spread(&rate));
    rate
}

fn spread(rate: &Rate) -> String {
    format!(
        "{:.0}/s, each task {}-{} acquisitions",
        rate.per_second, rate.fewest, rate.most
    )
}

/// The median round by rate.
#[cfg(feature = "redis")]
fn median_round(mut rounds: Vec<Rate>) -> Rate {
    rounds.sort_by(|a, b| a.per_second.total_cmp(&b.per_second));
    rounds.swap_remove(rounds.len() / 2)
}

async fn contended(engine: &str, locks: &Locks) {
    let (mut one, mut four) = (Vec::new(), Vec::new());
    for round in 0..ROUNDS {
        one.push(per_second(locks, 1, round).await.per_second);
        four.push(per_second(locks, 4, round).await.per_second);
    }
    let (one, four) = (median(one), median(four));
    println!("{engine}: {CLIENTS} tasks holding {HOLD:?}: {four:.0}/s on 4 permits, {one:.0}/s on 1");
    row(
        engine,
        "semaphore: 16 tasks holding 1 ms, acquisitions/s on 4 permits ÷ on 1",
        &format!("{four:.0}/s"),
        "1 permit",
        &format!("{one:.0}/s"),
        four / one,
        Target::AtLeast(3.0),
    );
}

/// Starts `F`'s server(s) and benches its engine, if the command line
/// names it or no engine; the fixture and the bench's locks, for more.
async fn on<F: Fixture>() -> Option<(F, Locks)> {
    let named: Vec<String> = std::env::args().skip(1).filter(|a| !a.starts_with('-')).collect();
    if !named.is_empty() && !named.iter().any(|name| name == F::NAME) {
        return None;
    }
    let fixture = tokio::task::block_in_place(F::start);
    let engine = dlock_testkit::engine(&fixture).await;
    let registry = Registry::with_engine(F::NAME, engine, Settings::default()).expect("registry");
    let locks = registry.locks("bench");
    uncontended(F::NAME, &locks).await;
    contended(F::NAME, &locks).await;
    Some((fixture, locks))
}

/// A permit of 4 against the `distributed-lock` crate's: uncontended, and
/// `CLIENTS` tasks holding `HOLD`.
#[cfg(feature = "redis")]
async fn against_distributed_lock(redis: &dlock_testkit::fixtures::redis::Redis, locks: &Locks) {
    use common::{Contender, Peer};
    let mut peer = Peer::start("redis", &format!("redis://{}", redis.server.address()));
    peer.ask("permit-cycles 10 4");
    let semaphore = locks.semaphore("against-peer", 4);
    let peer_pid = peer.pid();
    common::uncontended(
        ("redis", "semaphore: uncontended acquire + release"),
        &[
            Contender::peer("distributed-lock 0.2", Target::AtMost(1.0), peer_pid),
            Contender::dlock("dlock redis, permit of 4"),
        ],
        (CYCLES, BLOCK),
        redis.server.pid(),
        async |who, block| {
            if who == 0 {
                return Some(peer.cycles_of(&format!("permit-cycles {block} 4"), block));
            }
            for _ in 0..block {
                permit_cycle(&semaphore).await;
            }
            None
        },
    )
    .await;

    let (mut ours, mut theirs) = (Vec::new(), Vec::new());
    for round in 0..ROUNDS {
        ours.push(per_second(locks, 4, ROUNDS + round).await);
        let command = format!(
            "permit-rate {CLIENTS} 4 {} {}",
            HOLD.as_millis(),
            ROUND_FOR.as_millis()
        );
        let answer = peer.ask(&command);
        let rate = Rate {
            per_second: answer[0] as f64,
            fewest: answer[1] as u64,
            most: answer[2] as u64,
        };
        println!("  distributed-lock, round {round}: {}", spread(&rate));
        theirs.push(rate);
    }
    let (ours, theirs) = (median_round(ours), median_round(theirs));
    println!(
        "redis: {CLIENTS} tasks holding {HOLD:?} on 4 permits, median rounds: dlock {}; distributed-lock {}",
        spread(&ours),
        spread(&theirs)
    );
    row(
        "redis",
        "semaphore: 16 tasks holding 1 ms on 4 permits, acquisitions/s (median round) and each task's",
        &spread(&ours),
        "distributed-lock 0.2",
        &spread(&theirs),
        ours.per_second / theirs.per_second,
        Target::None,
    );
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    use dlock_testkit::fixtures;
    on::<fixtures::memory::Memory>().await;
    #[cfg(feature = "redis")]
    if let Some((redis, locks)) = on::<fixtures::redis::Redis>().await {
        against_distributed_lock(&redis, &locks).await;
    }
    #[cfg(feature = "zookeeper")]
    on::<fixtures::zookeeper::ZooKeeper>().await;
    #[cfg(feature = "etcd")]
    on::<fixtures::etcd::Etcd>().await;
    #[cfg(feature = "postgres")]
    on::<fixtures::postgres::Postgres>().await;
    #[cfg(feature = "mysql")]
    on::<fixtures::mysql::Mysql>().await;
    #[cfg(feature = "memcached")]
    on::<fixtures::memcached::Memcached>().await;
    #[cfg(feature = "redlock")]
    on::<fixtures::redlock::RedLock>().await;
}
