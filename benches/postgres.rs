//! dlock's postgres engine against the floor and a peer, in one run, on one
//! PostgreSQL this bench makes and starts on a loopback port.
//!
//! - floor: `pg_advisory_lock` + `pg_advisory_unlock`, prepared, on one open
//!   connection: 2 round trips, no fence, no lease;
//! - stamped floor: the statements dlock's engine sends, on one open
//!   connection: `pg_try_advisory_lock` with `nextval` of a sequence for the
//!   fence and the session's `idle_session_timeout` set to the lease (so a
//!   stalled holder's session ends), then the unlock setting it back;
//! - peer: the `distributed-lock` crate's PostgreSQL lock (0.2, the
//!   madelson/DistributedLock port, on sqlx), built from
//!   `benches/peers/distributed-lock` and driven over a pipe, with a pool
//!   of 32 so its default of 10 is no bottleneck;
//! - dlock: the postgres engine, write mode, fence included, with 32
//!   connections like the peer, and for the handoff also with the default
//!   10 (9 wait in the server's queue, the rest in the process).
//!
//! Uncontended, the three take turns in blocks of `BLOCK` cycles, each
//! going first in turn; ratios are medians over blocks. Handoff: 16
//! clients in one process take one lock in turn; the time from a release
//! to the next acquisition, p50 and p90.
//!
//! ```text
//! cargo bench --bench postgres --features postgres
//! ```

mod common;

use std::sync::Arc;

use dlock::engines::postgres::{PostgresConfig, PostgresEngine};
use dlock::{Registry, Settings};
use dlock_testkit::Fixture;
use dlock_testkit::fixtures::postgres::{PASSWORD, Postgres, USER};
use tokio_postgres::{Client, NoTls, Statement};

use common::{Contender, Handoffs, Peer, Target, row, uncontended};

const CYCLES: usize = 6000;
const BLOCK: usize = 100;
const CLIENTS: usize = 16;
const ROUNDS: usize = 100;

/// Lock + unlock on one connection.
struct Floor {
    client: Client,
    lock: Statement,
    unlock: Statement,
}

impl Floor {
    async fn connect(url: &str) -> Self {
        Self::with(
            url,
            "SELECT pg_advisory_lock($1)",
            "SELECT pg_advisory_unlock($1)",
        )
        .await
    }

    /// The stamped floor.
    async fn stamped(url: &str) -> Self {
        Self::with(
            url,
            "SELECT CASE WHEN got THEN nextval('bench_fence') END, \
               CASE WHEN got THEN set_config('idle_session_timeout', $2, false) END \
             FROM (SELECT pg_try_advisory_lock($1) AS got) AS t",
            "SELECT pg_advisory_unlock($1), set_config('idle_session_timeout', $2, false)",
        )
        .await
    }

    async fn with(url: &str, lock: &str, unlock: &str) -> Self {
        let (client, connection) = tokio_postgres::connect(url, NoTls).await.expect("connect");
        tokio::spawn(connection);
        client
            .batch_execute("CREATE SEQUENCE IF NOT EXISTS bench_fence")
            .await
            .expect("sequence");
        let lock = client.prepare(lock).await.expect("prepare");
        let unlock = client.prepare(unlock).await.expect("prepare");
        Floor { client, lock, unlock }
    }

    async fn cycle(&self, key: i64) {
        self.client.query_one(&self.lock, &[&key]).await.expect("lock");
        self.client
            .query_one(&self.unlock, &[&key])
            .await
            .expect("unlock");
    }

    async fn stamped_cycle(&self, key: i64) {
        let taken = self
            .client
            .query_one(&self.lock, &[&key, &"30000"])
            .await
            .expect("lock");
        assert!(
            taken.get::<_, Option<i64>>(0).is_some(),
            "the stamped floor's lock is free"
        );
        self.client
            .query_one(&self.unlock, &[&key, &"0"])
            .await
            .expect("unlock");
    }
}

async fn dlock_handoffs(registry: &Registry) -> Arc<Handoffs> {
    let handoffs = Arc::new(Handoffs::default());
    let tasks: Vec<_> = (0..CLIENTS)
        .map(|_| {
            let (lock, handoffs) = (registry.locks("bench").get("handoff"), handoffs.clone());
            tokio::spawn(async move {
                for _ in 0..ROUNDS {
                    let guard = lock.lock().await.expect("lock");
                    handoffs.entered();
                    handoffs.leaving();
                    guard.release().await.expect("release");
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.expect("client");
    }
    handoffs
}

/// The same with a connection of its own per client, blocking in
/// `pg_advisory_lock`: what the server alone costs.
async fn floor_handoffs(url: &str) -> Arc<Handoffs> {
    let handoffs = Arc::new(Handoffs::default());
    let mut tasks = Vec::new();
    for _ in 0..CLIENTS {
        let (floor, handoffs) = (Floor::connect(url).await, handoffs.clone());
        tasks.push(tokio::spawn(async move {
            for _ in 0..ROUNDS {
                floor.client.query_one(&floor.lock, &[&2i64]).await.expect("lock");
                handoffs.entered();
                handoffs.leaving();
                floor
                    .client
                    .query_one(&floor.unlock, &[&2i64])
                    .await
                    .expect("unlock");
            }
        }));
    }
    for task in tasks {
        task.await.expect("client");
    }
    handoffs
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let fixture = Postgres::start();
    let port = fixture.server.port;
    let url = format!("postgres://{USER}:{PASSWORD}@127.0.0.1:{port}/postgres");
    let floor = Floor::connect(&url).await;
    let stamped = Floor::stamped(&url).await;
    let mut peer = Peer::start("postgres", &url);
    let config = PostgresConfig {
        max_connections: 32,
        ..PostgresConfig::new(url.clone())
    };
    let engine = PostgresEngine::connect("postgres", &config)
        .await
        .expect("connect");
    let registry =
        Registry::with_engine("postgres", Arc::new(engine), Settings::default()).expect("registry");
    let lock = registry.locks("bench").get("uncontended");
    lock.lock().await.expect("warm").release().await.expect("warm");
    peer.ask("cycles 10");

    let peer_pid = peer.pid();
    uncontended(
        ("postgres", "uncontended cycle"),
        &[
            Contender::floor("floor (pg_advisory_lock + unlock)", Target::AtMost(1.05)),
            Contender::stamped("stamped floor (dlock's statements)", Target::AtMost(1.05)),
            Contender::peer("distributed-lock 0.2", Target::AtMost(1.0), peer_pid),
            Contender::dlock("dlock postgres, write, fenced"),
        ],
        (CYCLES, BLOCK),
        fixture.server.pid(),
        async |who, block| {
            for _ in 0..block {
                match who {
                    0 => floor.cycle(1).await,
                    1 => stamped.stamped_cycle(3).await,
                    2 => return Some(peer.cycles(block)),
                    _ => lock.lock().await.expect("lock").release().await.expect("release"),
                }
            }
            None
        },
    )
    .await;

    println!("handoff, {CLIENTS} clients on one lock, {ROUNDS} rounds each, release → next acquisition:");
    let floor = floor_handoffs(&url).await;
    println!("  floor (a connection each)          {}", floor.summary());
    let peer_times: Vec<f64> = peer
        .ask(&format!("handoff {CLIENTS} {ROUNDS}"))
        .into_iter()
        .map(|n| n as f64)
        .collect();
    let peer_handoffs = Handoffs::of(peer_times);
    println!("  distributed-lock 0.2               {}", peer_handoffs.summary());
    let ours = dlock_handoffs(&registry).await;
    println!("  dlock postgres (32 connections)    {}", ours.summary());
    let default_engine = dlock_testkit::engine(&fixture).await;
    let default = Registry::with_engine("postgres", default_engine, Settings::default()).expect("registry");
    println!(
        "  dlock postgres (default, 10)       {}",
        dlock_handoffs(&default).await.summary()
    );
    for (against, theirs) in [
        ("floor (a connection each)", &*floor),
        ("distributed-lock 0.2", &peer_handoffs),
    ] {
        row(
            "postgres",
            &format!("handoff p50, {CLIENTS} clients"),
            &ours.p50_micros(),
            against,
            &theirs.p50_micros(),
            ours.p50() / theirs.p50(),
            Target::None,
        );
    }
}
