//! The `distributed-lock` crate's PostgreSQL lock, as a peer for
//! benches/postgres.rs. Reads commands on stdin, answers one line each:
//!
//! - `cycles N`: N uncontended acquire + release cycles on one lock;
//!   answers `ns <total>`;
//! - `handoff CLIENTS ROUNDS`: CLIENTS tasks take one lock ROUNDS times each;
//!   answers `handoffs_ns <each time from a release to the next acquisition>`.
//!
//! Usage: `distributed-lock-pg-peer <postgres://...>`

use std::sync::{Arc, Mutex};
use std::time::Instant;

use distributed_lock_core::traits::{DistributedLock, LockHandle, LockProvider};
use distributed_lock_postgres::PostgresLockProvider;
use sqlx::postgres::PgPoolOptions;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let url = std::env::args().nth(1).expect("usage: distributed-lock-pg-peer <postgres://...>");
    // A pool large enough for every client, so its default of 10 is no bottleneck.
    let pool = PgPoolOptions::new().max_connections(32).connect(&url).await.expect("connect");
    let provider = Arc::new(PostgresLockProvider::builder().pool(pool).build().await.expect("provider"));
    let mut lines = BufReader::new(tokio::io::stdin()).lines();
    let mut out = tokio::io::stdout();
    while let Some(line) = lines.next_line().await.expect("stdin") {
        let words: Vec<&str> = line.split_whitespace().collect();
        let answer = match words.as_slice() {
            ["cycles", n] => {
                let lock = provider.create_lock("bench-uncontended");
                let started = Instant::now();
                for _ in 0..n.parse::<usize>().expect("count") {
                    lock.acquire(None).await.expect("acquire").release().await.expect("release");
                }
                format!("ns {}", started.elapsed().as_nanos())
            }
            ["handoff", clients, rounds] => {
                let handoffs = handoff(&provider, clients.parse().expect("clients"), rounds.parse().expect("rounds")).await;
                let list: Vec<String> = handoffs.iter().map(u128::to_string).collect();
                format!("handoffs_ns {}", list.join(" "))
            }
            _ => panic!("unknown command {line:?}"),
        };
        out.write_all(format!("{answer}\n").as_bytes()).await.expect("stdout");
        out.flush().await.expect("stdout");
    }
}

async fn handoff(provider: &Arc<PostgresLockProvider>, clients: usize, rounds: usize) -> Vec<u128> {
    let released: Arc<Mutex<Option<Instant>>> = Arc::default();
    let handoffs: Arc<Mutex<Vec<u128>>> = Arc::default();
    let tasks: Vec<_> = (0..clients)
        .map(|_| {
            let lock = provider.create_lock("bench-handoff");
            let (released, handoffs) = (released.clone(), handoffs.clone());
            tokio::spawn(async move {
                for _ in 0..rounds {
                    let handle = lock.acquire(None).await.expect("acquire");
                    if let Some(at) = released.lock().unwrap().take() {
                        handoffs.lock().unwrap().push(at.elapsed().as_nanos());
                    }
                    *released.lock().unwrap() = Some(Instant::now());
                    handle.release().await.expect("release");
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.expect("client");
    }
    Arc::try_unwrap(handoffs).expect("done").into_inner().unwrap()
}
