//! dlock's memcached engine against the floor, in one run, on one memcached
//! this bench starts on a loopback port.
//!
//! - floor: the least lock memcached allows, `add` (meta `ms ... ME`) then a
//!   plain `delete`, on one open connection: 2 round trips, no fence, no
//!   ownership check on release;
//! - stamped floor: what dlock's engine sends, on one open connection: the
//!   `add` of an item holding an owner and the lock's name, asking for its
//!   CAS value, with a fence counter's increment in the same round trip,
//!   then a CAS-checked delete;
//! - dlock: the memcached engine, write mode.
//!
//! The three take turns in blocks of `BLOCK` cycles, each going first in
//! turn; a ratio is the median over blocks of (dlock / the other).
//!
//! ```text
//! cargo bench --bench memcached --features memcached
//! ```

mod common;

use dlock::{Registry, Settings};
use dlock_testkit::Fixture;
use dlock_testkit::fixtures::memcached::Memcached;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

use common::{Contender, Target, uncontended};

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

    async fn line(&mut self) -> String {
        let mut line = String::new();
        self.0.read_line(&mut line).await.expect("reply");
        line
    }

    async fn stamped_cycle(&mut self) {
        // An owner id and the lock's name, as dlock's item holds.
        const VALUE: &str = "0123456789abcdef0123456789abcdef bench\0stamped";
        let add = format!(
            "ms stamped {} T31 ME c\r\n{VALUE}\r\nma bench:fence v\r\n",
            VALUE.len()
        );
        let added = self.exchange(add.as_bytes()).await;
        let cas = added
            .strip_prefix("HD c")
            .expect("the stamped floor's lock is free")
            .trim();
        assert!(self.line().await.starts_with("VA "), "the fence");
        assert!(self.line().await.trim().parse::<u64>().is_ok(), "the fence");
        let delete = format!("md stamped C{cas}\r\n");
        assert_eq!(self.exchange(delete.as_bytes()).await, "HD\r\n");
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
    let stream = TcpStream::connect(fixture.server.address())
        .await
        .expect("connect");
    stream.set_nodelay(true).expect("nodelay");
    let mut stamped = Floor(BufReader::new(stream));
    assert_eq!(stamped.exchange(b"ms bench:fence 1\r\n0\r\n").await, "HD\r\n");
    let engine = dlock_testkit::engine(&fixture).await;
    let registry = Registry::with_engine("memcached", engine, Settings::default()).expect("registry");
    let lock = registry.locks("bench").get("uncontended");
    lock.lock().await.expect("warm").release().await.expect("warm");

    uncontended(
        ("memcached", "uncontended cycle"),
        &[
            Contender::floor("floor (add + delete)", Target::AtMost(1.10)),
            Contender::stamped("stamped floor (dlock's commands)", Target::AtMost(1.05)),
            Contender::dlock("dlock memcached, write"),
        ],
        (CYCLES, BLOCK),
        fixture.server.pid(),
        async |who, block| {
            for _ in 0..block {
                match who {
                    0 => floor.cycle().await,
                    1 => stamped.stamped_cycle().await,
                    _ => lock.lock().await.expect("lock").release().await.expect("release"),
                }
            }
            None
        },
    )
    .await;
}
