//! dlock's mysql engine against the floor and a peer, in one run, on one
//! MariaDB this bench makes and starts on a loopback port.
//!
//! - floor: `GET_LOCK` + `RELEASE_LOCK`, prepared, on one open connection:
//!   2 round trips, no table, no fence, no lease, no queue;
//! - stamped floor: the statements dlock's engine sends for a write hold
//!   taken at once, on one open connection: `GET_LOCK` that also checks the
//!   queue table for rows and draws the fence (`UUID_SHORT()`), then
//!   `RELEASE_LOCK`;
//! - peer: the `distributed-lock` crate's MySQL lock (0.2, on sqlx, itself
//!   `GET_LOCK`), built from `benches/peers/distributed-lock` and driven
//!   over a pipe, with a pool of 32;
//! - dlock: the mysql engine, write mode, fence and queue included, with 32
//!   connections.
//!
//! Uncontended, the three take turns in blocks of `BLOCK` cycles, each
//! going first in turn; ratios are medians over blocks. Read mode takes
//! turns with the floor the same way (no target). Contended: 16
//! clients in one process take one lock for `ROUND`; acquisitions a second.
//!
//! ```text
//! cargo bench --bench mysql --features mysql
//! ```

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use dlock::engines::mysql::{MysqlConfig, MysqlEngine};
use dlock::{Registry, Settings};
use dlock_testkit::Fixture;
use dlock_testkit::fixtures::mysql::Mysql;
use mysql_async::prelude::Queryable;

use common::{Contender, Peer, Target, block_ratios, median, p50, row, take_turns, uncontended};

const CYCLES: usize = 3000;
const BLOCK: usize = 100;
const CLIENTS: usize = 16;
const ROUND: Duration = Duration::from_secs(3);

/// `GET_LOCK` + `RELEASE_LOCK` on one connection.
async fn floor_cycle(conn: &mut mysql_async::Conn, name: &str) {
    let got: Option<i64> = conn
        .exec_first("SELECT GET_LOCK(?, 10)", (name,))
        .await
        .expect("lock");
    assert_eq!(got, Some(1));
    let _: Option<i64> = conn
        .exec_first("SELECT RELEASE_LOCK(?)", (name,))
        .await
        .expect("unlock");
}

/// What dlock's engine sends for a write hold taken at once: the gate, the
/// queue table read and the fence in one statement, then the gate let go.
async fn stamped_cycle(conn: &mut mysql_async::Conn) {
    const TAKE: &str = "SELECT IF(GET_LOCK(?, 0) = 1, \
        IF(EXISTS(SELECT 1 FROM dlock_queue WHERE lock_key = ? AND name <=> ? AND expires > UTC_TIMESTAMP(6)), 0, UUID_SHORT()), \
        NULL)";
    let fence: Option<u64> = conn
        .exec_first(
            TAKE,
            ("stamped", b"\x01\x05benchstamped".to_vec(), None::<Vec<u8>>),
        )
        .await
        .expect("lock");
    assert!(fence.is_some_and(|f| f > 0), "the stamped floor's lock is free");
    let _: Option<i64> = conn
        .exec_first("SELECT RELEASE_LOCK(?)", ("stamped",))
        .await
        .expect("unlock");
}

/// Runs `clients` copies of `cycle` for `ROUND`; acquisitions a second.
async fn throughput<F, Fut>(clients: usize, cycle: F) -> f64
where
    F: Fn(usize, Arc<AtomicBool>, Arc<AtomicU64>) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let (stop, count) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicU64::new(0)));
    let tasks: Vec<_> = (0..clients)
        .map(|i| tokio::spawn(cycle(i, stop.clone(), count.clone())))
        .collect();
    tokio::time::sleep(ROUND).await;
    stop.store(true, Ordering::SeqCst);
    // Counted at the stop: waiters that drain afterwards do not count.
    let done = count.load(Ordering::SeqCst);
    for task in tasks {
        task.await.expect("client");
    }
    done as f64 / ROUND.as_secs_f64()
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let fixture = Mysql::start();
    let url = fixture.server.url();
    let pool = mysql_async::Pool::new(url.as_str());
    let mut floor = pool.get_conn().await.expect("connect");
    let mut stamped = pool.get_conn().await.expect("connect");
    let mut peer = Peer::start("mysql", &url);
    let config = MysqlConfig {
        max_connections: 32,
        ..MysqlConfig::new(url.clone())
    };
    let engine = Arc::new(MysqlEngine::connect("mysql", &config).await.expect("connect"));
    let registry = Registry::with_engine("mysql", engine, Settings::default()).expect("registry");
    let lock = registry.locks("bench").get("uncontended");
    lock.lock().await.expect("warm").release().await.expect("warm");
    floor_cycle(&mut floor, "warm").await;
    peer.ask("cycles 10");

    let peer_pid = peer.pid();
    uncontended(
        ("mysql", "uncontended cycle"),
        &[
            Contender::floor("floor (GET_LOCK + RELEASE_LOCK)", Target::AtMost(1.4)),
            Contender::stamped("stamped floor (dlock's statements)", Target::AtMost(1.05)),
            Contender::peer("distributed-lock 0.2", Target::AtMost(1.0), peer_pid),
            Contender::dlock("dlock mysql, write, fenced, FIFO"),
        ],
        (CYCLES, BLOCK),
        fixture.server.pid(),
        async |who, block| {
            for _ in 0..block {
                match who {
                    0 => floor_cycle(&mut floor, "floor").await,
                    1 => stamped_cycle(&mut stamped).await,
                    2 => return Some(peer.cycles(block)),
                    _ => lock.lock().await.expect("lock").release().await.expect("release"),
                }
            }
            None
        },
    )
    .await;

    // Read mode has no floor of its own: its cycle against the same floor.
    let reader = registry.locks("bench").get("reader");
    let times = take_turns(
        (CYCLES, BLOCK),
        async || floor_cycle(&mut floor, "floor").await,
        async || {
            reader
                .read()
                .await
                .expect("read")
                .release()
                .await
                .expect("release")
        },
    )
    .await;
    let read_ratio = median(block_ratios(&times[1], &times[0], BLOCK));
    println!(
        "uncontended read cycle: dlock {:.1?} against the floor's {:.1?}, {read_ratio:.2}× (median block)",
        p50(&times[1]),
        p50(&times[0])
    );
    row(
        "mysql",
        "uncontended read cycle (median block ratio)",
        &format!("{:.1?}", p50(&times[1])),
        "floor (GET_LOCK + RELEASE_LOCK, a write)",
        &format!("{:.1?}", p50(&times[0])),
        read_ratio,
        Target::None,
    );

    println!("contended, {CLIENTS} clients on one lock for {ROUND:?}, acquisitions a second:");
    let floor_rate = throughput(CLIENTS, |_, stop, count| {
        let pool = pool.clone();
        async move {
            let mut conn = pool.get_conn().await.expect("connect");
            while !stop.load(Ordering::SeqCst) {
                floor_cycle(&mut conn, "contended").await;
                count.fetch_add(1, Ordering::SeqCst);
            }
        }
    })
    .await;
    println!("  floor (a connection each)          {floor_rate:>10.0}");
    let dlock_rate = throughput(CLIENTS, |_, stop, count| {
        let lock = registry.locks("bench").get("contended");
        async move {
            while !stop.load(Ordering::SeqCst) {
                lock.lock().await.expect("lock").release().await.expect("release");
                count.fetch_add(1, Ordering::SeqCst);
            }
        }
    })
    .await;
    println!(
        "  dlock mysql (FIFO)                 {dlock_rate:>10.0}  ({:.2}× the floor)",
        dlock_rate / floor_rate
    );
    row(
        "mysql",
        &format!("contended, {CLIENTS} clients, acquisitions/s"),
        &format!("{dlock_rate:.0}"),
        "floor (unfair)",
        &format!("{floor_rate:.0}"),
        dlock_rate / floor_rate,
        Target::None,
    );
    // The pool waits for every connection it lent out to come back.
    drop((floor, stamped));
    pool.disconnect().await.expect("disconnect");
}
