//! The randomized fault run (`dlock_testkit::random_faults`)
//! on every engine with a server, one test per engine, each at two seeds
//! for 9 s of faults and a quiet stretch (25–35 s an engine): one on the
//! lock, the other on a semaphore of 2, each permit fenced per slot (a
//! seed given runs both). Two longer runs rather than three shorter ones:
//! as many seconds of faults, one quiet stretch fewer. The seeds are
//! printed; to run
//! one engine longer or at a given seed, `scripts/fault-run <engine>
//! <seconds> [seed]`, which sets `FAULT_RUN_SECONDS` and `FAULT_RUN_SEED`.
//! The engines run one at a time: five workers and a server each are load
//! enough for a 2-core machine.

#![cfg(all(
    feature = "redis",
    feature = "redlock",
    feature = "zookeeper",
    feature = "etcd",
    feature = "postgres",
    feature = "mysql",
    feature = "memcached"
))]

use std::sync::Mutex;
use std::time::Duration;

use dlock_testkit::Breakable;
use dlock_testkit::random_faults::{self, Contended};

static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

fn run<F: Breakable>() {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let number = |name: &str| {
        std::env::var(name).ok().map(|v| {
            v.parse::<u64>()
                .unwrap_or_else(|_| panic!("{name} takes a number, not {v:?}"))
        })
    };
    let seconds = number("FAULT_RUN_SECONDS").unwrap_or(9);
    let seeds = match number("FAULT_RUN_SEED") {
        Some(seed) => vec![seed],
        None => {
            let first = (dlock::kit::OwnerId::random().as_u128() as u64) >> 16;
            vec![first, first + 1]
        }
    };
    let paths = dlock_testkit::paths!();
    // The lock at every seed but the last, which runs a semaphore of 2.
    let last = seeds.len() - 1;
    for (i, seed) in seeds.into_iter().enumerate() {
        let duration = Duration::from_secs(seconds);
        if i < last || last == 0 {
            random_faults::run::<F>(&paths, seed, duration, Contended::Lock);
        }
        if i == last {
            random_faults::run::<F>(&paths, seed, duration, Contended::Permits(2));
        }
    }
}

macro_rules! random_faults {
    ($name:ident, $fixture:ty, $feature:literal) => {
        #[cfg(feature = $feature)]
        #[test]
        fn $name() {
            run::<$fixture>();
        }
    };
}

dlock_testkit::every_setup!(random_faults);
