//! One side of `scripts/bench ab`: uncontended write cycles on one lock,
//! a block at a time, as `benches/ab.rs` asks on stdin (`cycles N`, answered
//! `cycles <ns for the block>`).
//!
//! The script builds this same file against an older commit (copied into
//! that tree) and against this one, so it uses only what every commit has:
//! `init_from_file`, `lock`, `release`.
//!
//! ```text
//! ab_driver <config file> <lock name>
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
    let lock = dlock::lock("bench", name);
    lock.lock().await.expect("warm").release().await.expect("warm");
    for line in std::io::stdin().lock().lines() {
        let line = line.expect("stdin");
        let Some(cycles) = line.strip_prefix("cycles ") else {
            panic!("ab_driver: unknown command {line:?}");
        };
        let cycles: u64 = cycles.parse().expect("a count");
        let started = Instant::now();
        for _ in 0..cycles {
            lock.lock().await.expect("lock").release().await.expect("release");
        }
        let mut out = std::io::stdout().lock();
        writeln!(out, "cycles {}", started.elapsed().as_nanos()).expect("stdout");
        out.flush().expect("stdout");
    }
}
