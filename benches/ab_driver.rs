//! One side of `scripts/bench ab`: uncontended write cycles on one lock,
//! or permit cycles on one semaphore of `permits`, a block at a time, as
//! `benches/ab.rs` asks on stdin (`cycles N`, answered `cycles <ns for
//! the block>`).
//!
//! The script builds this same file against an older commit (copied into
//! that tree) and against this one, so it uses only what every commit has:
//! `init_from_file`, `lock`, `semaphore`, `release`.
//!
//! ```text
//! ab_driver <config file> <lock name> [permits]
//! ```

use std::io::{BufRead, Write};
use std::time::Instant;

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [config, name, ..] = args.as_slice() else {
        println!("ab_driver: run by `scripts/bench ab` (ab_driver <config file> <lock name>)");
        return;
    };
    dlock::init_from_file(config).await.expect("init");
    let permits: Option<u32> = args.get(2).map(|n| n.parse().expect("a count of permits"));
    let (lock, semaphore) = (
        dlock::lock("bench", name),
        dlock::semaphore("bench", name, permits.unwrap_or(1)),
    );
    let cycle = || async {
        match permits {
            None => lock.lock().await.expect("lock").release().await.expect("release"),
            Some(_) => semaphore
                .acquire()
                .await
                .expect("acquire")
                .release()
                .await
                .expect("release"),
        }
    };
    cycle().await;
    for line in std::io::stdin().lock().lines() {
        let line = line.expect("stdin");
        let Some(cycles) = line.strip_prefix("cycles ") else {
            panic!("ab_driver: unknown command {line:?}");
        };
        let cycles: u64 = cycles.parse().expect("a count");
        let started = Instant::now();
        for _ in 0..cycles {
            cycle().await;
        }
        let mut out = std::io::stdout().lock();
        writeln!(out, "cycles {}", started.elapsed().as_nanos()).expect("stdout");
        out.flush().expect("stdout");
    }
}
