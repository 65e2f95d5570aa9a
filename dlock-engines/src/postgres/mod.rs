//! The postgres engine: PostgreSQL's advisory locks, for services that
//! already run PostgreSQL and want no other server.
//!
//! **Keys.** A lock is the 64-bit advisory key `pg_advisory_lock(bigint)`
//! takes: the two halves of [`LockKey::stable_hash`] folded together. Two
//! names whose keys collide (odds about n²/2⁶⁵ for n live names) share one
//! advisory lock: they exclude each other when they need not, and never
//! admit two holders of one name. Other code on the same database using
//! the one-argument advisory functions shares the key space.
//!
//! **Fairness.** PostgreSQL's lock queue is the queue: a newcomer, even a
//! `try`, does not pass a conflicting waiter, and a run of queued readers
//! is granted together. The engine keeps no queue of its own.
//!
//! **Connections.** Advisory locks belong to a session. Holds share a few
//! connections (never two holds of one key on one connection: the session
//! would reenter). A request that must wait sleeps in the server's queue
//! on a connection that holds nothing; at most `max_connections - 1` do so
//! at once and the rest line up in the process. See `pool.rs`, and
//! `conn.rs` for the statements on one session.
//!
//! **Fencing.** Each grant takes `nextval` of one sequence,
//! `<schema>.dlock_fence`, in the statement that takes the lock, after it
//! is granted. The previous holder's token was taken before its unlock, so
//! tokens rise per lock. A sequence never goes back, restarts included: it
//! logs ahead of the values it hands out and resumes past them. The engine
//! creates the sequence on first use, or says which privilege is missing.
//!
//! **Records.** A hold's row in the UNLOGGED table `<schema>.dlock_holds`
//! (group, name, fence, owner digest, label, time granted, lease) names it. A
//! take at once and its unlock stay the bare lock functions, so the
//! uncontended cycle writes nothing: the hold writes its row on its own
//! session once it has lasted 50 ms, and its unlock deletes the row then,
//! in the same statement. A request about to wait in the server's queue
//! writes its row first, and its grant fills it in. `inspect` and `list`
//! read `pg_locks` joined with the rows, so a row counts only while its
//! session holds or waits, and wait for younger holds. The table is made
//! on first use, like the sequence. See `records.rs`.
//!
//! **Lease.** An advisory lock lives as long as its session, and a stopped
//! process (SIGSTOP, a long pause, a hung VM) keeps its TCP connection open,
//! so a plain advisory lock can be held forever (madelson/DistributedLock
//! issue 230). Here the server enforces the lease: each session's
//! `idle_session_timeout` is the shortest lease it holds. The watchdog's
//! renewal is a round trip on the hold's session; a holder that stops
//! renewing leaves its session idle, and the server ends the session, and
//! with it the holds, one lease after the last statement. Holds on one
//! connection share its liveness: in a live process each is renewed or
//! released, and a stopped process loses all of them. When the server ends
//! a session this way the next renewal is refused; any other drop of a
//! connection fires `lost` for every hold on it at once.
//!
//! **Force release and revocation** (`control.rs`). An operator's force
//! release leaves word for each holder in the UNLOGGED table
//! `<schema>.dlock_forced` (advisory key, owner digest, until its lease
//! would have ended), then ends with `pg_terminate_backend` the session of
//! each holder that holds nothing else: no session can unlock another's
//! lock, and ending one that holds other locks too would end their holds.
//! A holder forced out whose session lives on reads the word at its next
//! renewal and lets go. A revocation marks the holds' rows; the renewal,
//! already a round trip on the hold's session, reads its row's mark and
//! word in the same statement. The mark dies with the row, so the next
//! holder never inherits it. Made on first use, like the record table.
//!
//! **PgBouncer.** In transaction pooling mode a client's statements run on
//! whichever server session is free, so an advisory lock stays with a
//! session the client no longer talks to: it is never released by unlock,
//! and another client may reenter it. Startup opens two connections at
//! once and asks each in turn which backend serves it: a backend that
//! serves both means such a pooler, refused with a config error that says
//! so; and each new connection checks that a session setting survives
//! from one statement to the next. Use a direct connection or session
//! pooling (`pool_mode = session`).
//!
//! **Semaphores**: a turnstile lock and a lock per permit (`permits.rs`).
//!
//! **TLS** (rustls) takes libpq's `sslmode` words as `tls_mode`: `prefer`
//! by default, as libpq's; `verify-full` checks the chain and the host
//! name, `verify-ca` the chain alone, and `require` nothing unless a CA
//! file is set. The URL's `sslmode`, `sslrootcert`, `sslcert` and
//! `sslkey` stand in for `tls_mode` and the files. Every connection and
//! cancel request goes through it.
//!
//! ```toml
//! [engines.pg]
//! kind = "postgres"
//! url = "postgres://app:secret@127.0.0.1:5432/app"   # or "host=... user=..."
//! max_connections = 10
//! schema = "public"
//! connect_timeout = "5s"
//! client_name = "billing"                             # application_name
//! tls_mode = "verify-full"                            # or ?sslmode=verify-full in the url
//! tls_ca_file = "/etc/dlock/rds-ca.pem"               # default: the system's roots
//! # tls_cert_file = "client.crt"                      # for clientcert=verify-ca/full
//! # tls_key_file = "client.key"
//! ```

mod config;
mod conn;
mod control;
mod held;
mod objects;
mod permits;
mod pool;
mod records;
mod server;
mod sql;
mod waiter;
mod want;
/// The client crate, whose types held writes take ([`HeldTransaction`]).
pub use tokio_postgres;

use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use dlock_core::kit::{
    Control, Engine, EngineError, Expiry, Facets, Fairness, Fencing, Guarantees, HeldWrites, Inspect,
    Lifecycle, List, LostSignal, PermitControl, Poll, Renewal, Request, Semaphores, async_trait,
};
use dlock_core::{LockKey, LockView, Mode, Only};

use conn::{Conn, Ping};
use permits::Permits;
use pool::Pool;
use waiter::{Stage, Waiter};
use want::{Tag, Want};

pub use config::{PostgresConfig, register};
pub use held::HeldTransaction;

/// The postgres engine. See the [module docs](self).
///
/// Built from config (`kind` in `[engines.<name>]`), or by hand:
///
/// ```no_run
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), dlock::Error> {
/// use std::sync::Arc;
/// use dlock::engines::postgres::{PostgresConfig, PostgresEngine};
///
/// let config = PostgresConfig {
///     max_connections: 10,
///     ..PostgresConfig::new("postgres://app:secret@127.0.0.1:5432/app")
/// };
/// let engine = PostgresEngine::connect("main", &config).await?;
/// dlock::install(dlock::Registry::with_engine("main", Arc::new(engine), Default::default())?)?;
/// # Ok(())
/// # }
/// ```
pub struct PostgresEngine {
    pool: Arc<Pool>,
    address: String,
}

/// What a request keeps: where it stands, and a turn so that its calls
/// never overlap (the rarer ones run on a task of their own and finish
/// even if the core stops waiting).
#[derive(Default)]
struct Hold {
    place: Mutex<Place>,
    turn: tokio::sync::Mutex<()>,
}

#[derive(Default)]
enum Place {
    #[default]
    Free,
    Waiting(Waiter),
    Held {
        conn: Arc<Conn>,
        mode: Mode,
        fence: u64,
    },
}

impl Hold {
    fn of(req: &Request) -> Arc<Hold> {
        req.state_or_init(|| Arc::new(Hold::default())).clone()
    }

    fn place(&self) -> MutexGuard<'_, Place> {
        self.place.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn set(&self, place: Place) {
        *self.place() = place;
    }

    fn held(&self) -> Option<(Arc<Conn>, Mode)> {
        match &*self.place() {
            Place::Held { conn, mode, .. } => Some((conn.clone(), *mode)),
            _ => None,
        }
    }

    /// Runs `work` on its own task, after any earlier call on this request:
    /// a statement sent is always booked, even if the core stops waiting.
    async fn in_turn<T: Send + 'static, F>(
        self: Arc<Self>,
        work: impl FnOnce(Arc<Hold>) -> F,
    ) -> Result<T, EngineError>
    where
        F: Future<Output = Result<T, EngineError>> + Send + 'static,
    {
        let work = work(self.clone());
        let task = tokio::spawn(async move {
            let _turn = self.turn.lock().await;
            work.await
        });
        match task.await {
            Ok(answer) => answer,
            Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            Err(_) => Err(EngineError::failed("the runtime is shutting down")),
        }
    }
}

/// The advisory key of `key`.
fn advisory_key(key: &LockKey) -> i64 {
    let hash = key.stable_hash();
    (hash as u64 ^ (hash >> 64) as u64) as i64
}

/// The request's first attempt: a try, unless one of this process's
/// requests already waits for the key; if busy and allowed to wait, a waiter.
async fn acquire(pool: Arc<Pool>, hold: Arc<Hold>, want: Want, req: &Request) -> Result<Poll, EngineError> {
    if !pool.waiting.any(&want.key)
        && let Some((conn, fence)) = pool.take_now(&want).await?
    {
        hold.set(Place::Held {
            conn,
            mode: want.mode,
            fence,
        });
        return Ok(Poll::Held(fence));
    }
    if req.try_once {
        return Ok(Poll::Waiting(Box::pin(std::future::pending())));
    }
    let waiter = Waiter::start(pool, hold.clone(), want);
    let entered = waiter.entered().await;
    answer(&hold, &waiter, entered, req.lease)
}

/// The core's answer for a waiter at `stage`.
fn answer(hold: &Hold, waiter: &Waiter, stage: Stage, lease: Duration) -> Result<Poll, EngineError> {
    match stage {
        Stage::Granted(fence) => Ok(Poll::Held(fence)),
        Stage::Failed(message) => {
            hold.set(Place::Free);
            Err(EngineError::failed(message.to_string()))
        }
        Stage::Withdrawn => {
            hold.set(Place::Free);
            Err(EngineError::failed("the wait was withdrawn"))
        }
        Stage::Starting | Stage::Lined | Stage::Queued(_) => Ok(Poll::Waiting(waiter.wake(lease))),
    }
}

#[async_trait]
impl Engine for PostgresEngine {
    fn kind(&self) -> &'static str {
        "postgres"
    }

    fn address(&self) -> String {
        self.address.clone()
    }

    fn guarantees(&self) -> Guarantees {
        Guarantees {
            read: true,
            fairness: Fairness::Fifo,
            fencing: Fencing::Strict,
            expiry: Expiry::Lease,
            lease_unit: Duration::from_millis(1),
            waiter_ttl: None,
        }
    }

    fn facets(&self) -> Facets<'_> {
        Facets {
            semaphores: Some(self),
            inspect: Some(self),
            list: Some(self),
            control: Some(self),
            permit_control: Some(self),
            held_writes: Some(self),
            ..Facets::default()
        }
    }

    async fn downgrade(&self, req: &Request) -> Result<bool, EngineError> {
        let key = advisory_key(&req.key);
        Hold::of(req)
            .in_turn(move |hold| async move {
                let Some((conn, _)) = hold.held() else {
                    return Ok(false);
                };
                let downgraded = conn.downgrade(key).await?;
                if let Place::Held { mode, .. } = &mut *hold.place() {
                    *mode = Mode::Read;
                }
                Ok(downgraded)
            })
            .await
    }
}

#[async_trait]
impl Lifecycle for PostgresEngine {
    /// On the caller's task, unlike the rarer calls: the pool puts the
    /// session right if the core stops waiting.
    async fn acquire(&self, req: &Request) -> Result<Poll, EngineError> {
        let hold = Hold::of(req);
        let _turn = hold.turn.lock().await;
        acquire(self.pool.clone(), hold.clone(), want(req), req).await
    }

    async fn poll(&self, req: &Request) -> Result<Poll, EngineError> {
        let (pool, req) = (self.pool.clone(), req.clone());
        Hold::of(&req)
            .in_turn(|hold| async move {
                let waiter = match &*hold.place() {
                    Place::Held { fence, .. } => return Ok(Poll::Held(*fence)),
                    Place::Waiting(waiter) => Some(waiter.clone()),
                    Place::Free => None,
                };
                let Some(waiter) = waiter else {
                    return acquire(pool, hold.clone(), want(&req), &req).await;
                };
                let stage = match waiter.stage() {
                    // Its turn came if the session no longer sleeps: the answer is on its way.
                    Stage::Queued(conn) if !pool.is_waiting(conn.pid).await? => waiter.settled().await,
                    stage => stage,
                };
                answer(&hold, &waiter, stage, req.lease)
            })
            .await
    }

    async fn cancel(&self, req: &Request) -> Result<(), EngineError> {
        let key = advisory_key(&req.key);
        Hold::of(req)
            .in_turn(move |hold| async move {
                let waiter = match &*hold.place() {
                    Place::Waiting(waiter) => Some(waiter.clone()),
                    _ => None,
                };
                if let Some(waiter) = waiter {
                    waiter.withdraw();
                    waiter.settled().await;
                }
                let held = hold.held();
                hold.set(Place::Free);
                if let Some((conn, mode)) = held {
                    conn.give_back(key, mode).await?;
                }
                Ok(())
            })
            .await
    }

    async fn renew(&self, req: &Request) -> Result<Renewal, EngineError> {
        renewal(held_on(req), || self.release(req)).await
    }

    async fn release(&self, req: &Request) -> Result<bool, EngineError> {
        let hold = Hold::of(req);
        let _turn = hold.turn.lock().await;
        let held = hold.held();
        hold.set(Place::Free);
        match held {
            Some((conn, mode)) => conn.give_back(advisory_key(&req.key), mode).await,
            None => Ok(false),
        }
    }

    fn lost(&self, req: &Request) -> Option<LostSignal> {
        Some(Box::pin(held_on(req)?.0.dropped()))
    }
}

impl Semaphores for PostgresEngine {
    fn permits(&self, count: u32) -> Box<dyn Lifecycle + '_> {
        Box::new(Permits { engine: self, count })
    }

    fn slots(&self) -> bool {
        true
    }
}

#[async_trait]
impl Inspect for PostgresEngine {
    fn shows_fences(&self) -> bool {
        true
    }

    async fn inspect(&self, key: &LockKey, permits: Option<u32>) -> Result<LockView, EngineError> {
        records::inspect(&self.pool, key, permits).await
    }
}

#[async_trait]
impl List for PostgresEngine {
    async fn list(&self, group: &str) -> Result<Vec<LockView>, EngineError> {
        records::list(&self.pool, group).await
    }
}

#[async_trait]
impl Control for PostgresEngine {
    /// Asked under the key the hold was on: a permit's (the only hold with
    /// a slot), its slot's.
    async fn forced_out(&self, req: &Request) -> Result<bool, EngineError> {
        let key = match req.slot {
            Some(slot) => permits::Keys::of(&req.key).slot(slot),
            None => advisory_key(&req.key),
        };
        control::forced_out(&self.pool, key, req.owner).await
    }

    async fn force_release(&self, key: &LockKey, only: &Only) -> Result<u32, EngineError> {
        control::force_release(&self.pool, advisory_key(key), only).await
    }

    async fn revoke(&self, key: &LockKey, only: &Only) -> Result<u32, EngineError> {
        control::revoke(&self.pool, advisory_key(key), only).await
    }
}

/// A permit is its slot's advisory lock, with a row as a lock's hold has:
/// the lock's statements reach it, slot by slot.
#[async_trait]
impl PermitControl for PostgresEngine {
    async fn force_release_permits(
        &self,
        key: &LockKey,
        count: u32,
        only: &Only,
    ) -> Result<u32, EngineError> {
        let keys = permits::Keys::of(key);
        let mut forced = 0;
        for slot in 0..count {
            forced += control::force_release(&self.pool, keys.slot(slot), only).await?;
        }
        Ok(forced)
    }

    async fn revoke_permits(&self, key: &LockKey, count: u32, only: &Only) -> Result<u32, EngineError> {
        let keys = permits::Keys::of(key);
        let mut asked = 0;
        for slot in 0..count {
            asked += control::revoke(&self.pool, keys.slot(slot), only).await?;
        }
        Ok(asked)
    }
}

impl HeldWrites for PostgresEngine {
    fn store(&self) -> &(dyn std::any::Any + Send + Sync) {
        self
    }
}

/// The session a lock's hold lives on, and its advisory key there.
fn held_on(req: &Request) -> Option<(Arc<Conn>, i64)> {
    Hold::of(req)
        .held()
        .map(|(conn, _)| (conn, advisory_key(&req.key)))
}

/// A renewal of a hold or a permit on the session it lives on (`held`);
/// one forced out is let go too (`release`), so its session is free.
async fn renewal<F: Future<Output = Result<bool, EngineError>>>(
    held: Option<(Arc<Conn>, i64)>,
    release: impl FnOnce() -> F,
) -> Result<Renewal, EngineError> {
    let Some((conn, key)) = held else {
        return Ok(Renewal::Gone);
    };
    Ok(match conn.ping(key).await? {
        Ping::Held => Renewal::Held,
        Ping::Revoked => Renewal::Revoked,
        Ping::Forced => {
            release().await?;
            Renewal::Gone
        }
        Ping::Gone => Renewal::Gone,
    })
}

fn want(req: &Request) -> Want {
    Want {
        key: advisory_key(&req.key),
        mode: req.mode,
        lease_ms: req.lease.as_millis().max(1) as u64,
        tag: Tag::of(req, None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_fold_the_stable_hash() {
        let key = |g: &str, n: &str| advisory_key(&LockKey::new(g, n).unwrap());
        assert_eq!(key("order", "42"), key("order", "42"));
        assert_ne!(key("g:a", "b"), key("g", "a:b"));
        // Pinned: a release that changed it would let old and new processes both hold.
        assert_eq!(key("order", "42"), -5132300032755931345);
    }
}
