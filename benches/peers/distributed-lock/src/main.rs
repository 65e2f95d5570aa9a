//! The `distributed-lock` crate's PostgreSQL or MySQL lock, or its Redis
//! semaphore, as a peer for benches/postgres.rs, benches/mysql.rs and
//! benches/semaphore.rs. Reads commands on stdin, answers one line each:
//!
//! - `cycles N` (postgres, mysql): N uncontended acquire + release cycles
//!   on one lock; answers `ns <total>`;
//! - `handoff CLIENTS ROUNDS` (postgres, mysql): CLIENTS tasks take one lock
//!   ROUNDS times each; answers `handoffs_ns <each time from a release to
//!   the next acquisition>`;
//! - `permit-cycles N PERMITS` (redis): N uncontended acquire + release
//!   cycles of a permit of a semaphore of PERMITS; answers `ns <total>`;
//! - `permit-rate CLIENTS PERMITS HOLD_MS RUN_MS` (redis): CLIENTS tasks
//!   take a permit of a semaphore of PERMITS and hold it HOLD_MS, again
//!   and again for RUN_MS; answers `per_s <acquisitions a second> <the
//!   fewest one task made> <the most>`.
//!
//! Usage: `distributed-lock-peer postgres|mysql|redis <url>`

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use distributed_lock_core::traits::{
    DistributedLock, DistributedSemaphore, LockHandle, LockProvider, SemaphoreProvider,
};
use distributed_lock_mysql::MySqlLockProvider;
use distributed_lock_postgres::PostgresLockProvider;
use distributed_lock_redis::RedisLockProvider;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

/// A pool large enough for every client, so the default of 10 is no bottleneck.
const CONNECTIONS: u32 = 32;

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let mut args = std::env::args().skip(1);
    let (kind, url) = (args.next(), args.next());
    let (Some(kind), Some(url)) = (kind, url) else {
        panic!("usage: distributed-lock-peer postgres|mysql|redis <url>");
    };
    match kind.as_str() {
        "postgres" => {
            let pool = sqlx::postgres::PgPoolOptions::new()
                .max_connections(CONNECTIONS)
                .connect(&url)
                .await;
            let provider = PostgresLockProvider::builder()
                .pool(pool.expect("connect"))
                .build()
                .await;
            serve(Arc::new(provider.expect("provider")), None).await
        }
        "mysql" => {
            let pool = sqlx::mysql::MySqlPoolOptions::new()
                .max_connections(CONNECTIONS)
                .connect(&url)
                .await;
            let provider = MySqlLockProvider::builder()
                .pool(pool.expect("connect"))
                .build()
                .await;
            // Its wait-forever (`None`) sends GET_LOCK(name, NULL), which
            // MariaDB answers with NULL and the crate fails to decode.
            serve(
                Arc::new(provider.expect("provider")),
                Some(Duration::from_secs(60)),
            )
            .await
        }
        "redis" => {
            let provider = RedisLockProvider::builder().url(url).build().await;
            serve_permits(provider.expect("provider")).await
        }
        other => panic!("unknown kind {other:?}"),
    }
}

/// One answer line per command line of stdin.
async fn answer_each(mut answer: impl AsyncFnMut(&[&str]) -> String) {
    let mut lines = BufReader::new(tokio::io::stdin()).lines();
    let mut out = tokio::io::stdout();
    while let Some(line) = lines.next_line().await.expect("stdin") {
        let words: Vec<&str> = line.split_whitespace().collect();
        let answer = answer(&words).await;
        out.write_all(format!("{answer}\n").as_bytes())
            .await
            .expect("stdout");
        out.flush().await.expect("stdout");
    }
}

async fn serve_permits(provider: RedisLockProvider) {
    answer_each(async |words| match words {
        ["permit-cycles", n, permits] => {
            let semaphore = provider.create_semaphore("bench-permits", permits.parse().expect("permits"));
            let started = Instant::now();
            for _ in 0..n.parse::<usize>().expect("count") {
                semaphore
                    .acquire(None)
                    .await
                    .expect("acquire")
                    .release()
                    .await
                    .expect("release");
            }
            format!("ns {}", started.elapsed().as_nanos())
        }
        ["permit-rate", clients, permits, hold_ms, run_ms] => {
            let number = |word: &str| word.parse::<u64>().expect("number");
            let semaphore = Arc::new(provider.create_semaphore("bench-rate", number(permits) as u32));
            let (hold, run) = (
                Duration::from_millis(number(hold_ms)),
                Duration::from_millis(number(run_ms)),
            );
            let started = Instant::now();
            let tasks: Vec<_> = (0..number(clients))
                .map(|_| {
                    let semaphore = semaphore.clone();
                    tokio::spawn(async move {
                        let mut done = 0u64;
                        while started.elapsed() < run {
                            let permit = semaphore.acquire(None).await.expect("acquire");
                            tokio::time::sleep(hold).await;
                            permit.release().await.expect("release");
                            done += 1;
                        }
                        done
                    })
                })
                .collect();
            let mut each = Vec::new();
            for task in tasks {
                each.push(task.await.expect("client"));
            }
            let per_s = each.iter().sum::<u64>() as f64 / started.elapsed().as_secs_f64();
            let (fewest, most) = (
                each.iter().min().expect("a task"),
                each.iter().max().expect("a task"),
            );
            format!("per_s {} {fewest} {most}", per_s as u64)
        }
        _ => panic!("unknown command {words:?}"),
    })
    .await
}

async fn serve<P>(provider: Arc<P>, wait: Option<Duration>)
where
    P: LockProvider + Send + Sync + 'static,
    P::Lock: Send + Sync + 'static,
{
    answer_each(async |words| match words {
        ["cycles", n] => {
            let lock = provider.create_lock("bench-uncontended");
            let started = Instant::now();
            for _ in 0..n.parse::<usize>().expect("count") {
                lock.acquire(wait)
                    .await
                    .expect("acquire")
                    .release()
                    .await
                    .expect("release");
            }
            format!("ns {}", started.elapsed().as_nanos())
        }
        ["handoff", clients, rounds] => {
            let clients = clients.parse().expect("clients");
            let handoffs = handoff(&provider, wait, clients, rounds.parse().expect("rounds")).await;
            let list: Vec<String> = handoffs.iter().map(u128::to_string).collect();
            format!("handoffs_ns {}", list.join(" "))
        }
        _ => panic!("unknown command {words:?}"),
    })
    .await
}

async fn handoff<P>(provider: &Arc<P>, wait: Option<Duration>, clients: usize, rounds: usize) -> Vec<u128>
where
    P: LockProvider + Send + Sync + 'static,
    P::Lock: Send + Sync + 'static,
{
    let released: Arc<Mutex<Option<Instant>>> = Arc::default();
    let handoffs: Arc<Mutex<Vec<u128>>> = Arc::default();
    let tasks: Vec<_> = (0..clients)
        .map(|_| {
            let lock = provider.create_lock("bench-handoff");
            let (released, handoffs) = (released.clone(), handoffs.clone());
            tokio::spawn(async move {
                for _ in 0..rounds {
                    let handle = lock.acquire(wait).await.expect("acquire");
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
