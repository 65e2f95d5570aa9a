//! dlock's memcached engine against the floor, in one run, on one memcached
//! this bench starts on a loopback port.
//!
//! - floor: the least lock memcached allows, `add` (meta `ms ... ME`) then a
//!   plain `delete`, on one open connection: 2 round trips, no fence, no
//!   ownership check on release;
//! - dlock: the memcached engine, write mode: `add` with the fence counter's
//!   increment in the same round trip, then a CAS-checked delete.
//!
//! The two take turns in blocks of `BLOCK` cycles, each going first in
//! turn; the ratio is the median over blocks of (dlock / floor).
//!
//! ```text
//! cargo bench --bench memcached --features memcached
//! ```

mod common;

use dlock::engines::conformance::Fixture;
use dlock::engines::memcached::fixture::Memcached;
use dlock::{Registry, Settings};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

use common::{Target, block_ratios, p50, percentile, row, take_turns};

const CYCLES: usize = 4000;
const BLOCK: usize = 100;

/// `add` + `delete` on one connection.
struct Floor(BufReader<TcpStream>);

impl Floor {
    async fn exchange(&mut self, command: &[u8]) -> String {
        self.0.get_mut().write_all(command).await.expect("send");
        let mut line = String::new();
        self.0.read_line(&mut line).await.expect("reply");
        line
    }

    async fn cycle(&mut self) {
        assert_eq!(self.exchange(b"ms floor 1 T30 ME\r\nx\r\n").await, "HD\r\n");
        assert_eq!(self.exchange(b"md floor\r\n").await, "HD\r\n");
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let fixture = Memcached::start();
    let stream = TcpStream::connect(fixture.server.address())
        .await
        .expect("connect");
    stream.set_nodelay(true).expect("nodelay");
    let mut floor = Floor(BufReader::new(stream));
    let engine = dlock::engines::conformance::engine(&fixture).await;
    let registry = Registry::with_engine("memcached", engine, Settings::default()).expect("registry");
    let lock = registry.locks("bench").get("uncontended");
    lock.lock().await.expect("warm").release().await.expect("warm");

    let [floor_times, dlock_times] = take_turns(
        (CYCLES, BLOCK),
        async || floor.cycle().await,
        async || lock.lock().await.expect("lock").release().await.expect("release"),
    )
    .await;
    let ratios = block_ratios(&dlock_times, &floor_times, BLOCK);
    println!("uncontended cycle, {CYCLES} each, interleaved in blocks of {BLOCK}:");
    println!("  floor (add + delete)       p50 {:>8.1?}", p50(&floor_times));
    println!("  dlock memcached, write     p50 {:>8.1?}", p50(&dlock_times));
    let ratio = percentile(ratios.clone(), 0.5);
    println!(
        "  dlock / floor, median block {ratio:.3} (p10 {:.3}, p90 {:.3}; target ≤ 1.15)",
        percentile(ratios.clone(), 0.1),
        percentile(ratios, 0.9)
    );
    row(
        "memcached",
        "uncontended cycle (median block ratio)",
        &format!("{:.1?}", p50(&dlock_times)),
        "floor (add + delete)",
        &format!("{:.1?}", p50(&floor_times)),
        ratio,
        Target::AtMost(1.15),
    );
}
