//! The mysql engine (MySQL 8, MariaDB 10.6+): a lock table, made fair,
//! fenced and leased by the database's own clock.
//!
//! **The table.** The usual lock table keeps one row per resource (name,
//! owner, a reentrant count, an expiry). Here a row is one request for a
//! resource, held or waiting, in the order of its `AUTO_INCREMENT` ticket:
//! that queue makes it fair (FIFO, a run of queued readers admitted
//! together, writers never starved). Reentrancy stays in the process, so
//! there is no count. Every state change is one statement: see `sql.rs`
//! for each, and for why two grants can never both succeed.
//!
//! **The gate, and a write hold with no row.** Each lock also has a named
//! lock (`GET_LOCK`), its gate (`gate.rs`). A writer (lease in whole
//! seconds) that finds the gate free and no live row for the lock holds
//! the gate for the whole hold, on a session of its own, and writes
//! nothing: one statement to take it, one to let it go. Everything else
//! (readers, waiters) goes through the table, and makes sure no such
//! write hold can miss its row (see `sql.rs`). Dlock versions
//! before the gate do not know it: do not share locks across this change.
//!
//! **The database's clock only.** Every expiry is computed and compared
//! with `UTC_TIMESTAMP(6)` on the server, never the client's clock, so a
//! client whose clock is off (ShedLock issues 231 and 639) changes nothing.
//! A gate hold's lease is its session's `wait_timeout`, also the server's.
//!
//! **Fencing.** The token is `UUID_SHORT()`, drawn while the grant holds
//! the gate, so a later holder of the lock draws a greater one. The server
//! increments it in memory from `(server_id << 56) + (startup time in
//! seconds << 24)`, so it keeps rising across restarts as long as the
//! server's clock does not step back between them, the `server_id` stays
//! (below 256), and fewer than 16 million tokens a second were drawn since
//! the previous start. This costs no write.
//!
//! **Leases and liveness.** A hold's row expires at its lease; the watchdog
//! extends it only while it is live and this owner's. A gate hold lasts
//! while its session is used: the watchdog's renewal is a statement on it,
//! and the server closes a session idle for its `wait_timeout` (the lease),
//! freeing the gate; a killed process's sessions close at once. A waiter's
//! row expires `waiter_ttl` after its last refresh (every third of that);
//! an expired row, holder or waiter, is skipped by every check, as if gone,
//! and a background sweep deletes it. A waiter that finds its row expired
//! joins the queue again at the back.
//!
//! **Semaphores** are rows of the same table, under keys of their own
//! (`permits.rs`).
//!
//! **Records** (`records.rs`): a row also keeps its fence, the time it was
//! granted (or queued) and its label (`client_name`); columns added since
//! (these, and `revoked`) are added at startup to a table an older dlock
//! made (the ALTER privilege, once).
//! A write hold taken at once has no row: it writes its record to
//! `dlock_gates` only once it has lasted 50 ms (`gate_records.rs`), so the
//! uncontended cycle writes nothing more than before, and `inspect` and
//! `list` wait that long for young holds.
//!
//! **Force release and revocation** (`control.rs`). Force release leaves
//! word for each holder in `dlock_forced` (lock, owner digest, until its
//! lease would have ended), deletes the lock's held rows, and ends the
//! session holding its gate (`KILL CONNECTION`) when that session is a
//! write hold's own, which holds nothing else. Revocation marks the held
//! rows, and the gate hold's record. The renewal reads the mark in the
//! statement it already was, and a holder whose row or session is gone
//! reads the word. The mark dies with its row or record, so the next holder
//! never inherits it.
//!
//! **Wake-up.** MySQL has no notifications: waiters poll on the core's
//! schedule, one indexed statement each time. A release in this process
//! wakes this process's waiters for that lock at once.
//!
//! **Relies on** (MySQL 8, MariaDB 10.6+): InnoDB, REPEATABLE READ locking
//! reads, `REPLACE ... SELECT` and `INSERT ... SELECT` from the same table,
//! `DATETIME(6)`, `UTC_TIMESTAMP(6)`, `GET_LOCK` with several named locks
//! per session, `UUID_SHORT()`, the session `wait_timeout`.
//!
//! **TLS** (rustls) takes `tls_mode`: `prefer` by default (TLS where the
//! server offers it, the certificate unchecked), `require`, or
//! `verify-full` (the chain and the host name, against `tls_ca_file` or
//! the Mozilla roots built in). `verify-ca` is refused: mysql_async's
//! rustls build cannot check a chain without the name. A client
//! certificate, for users that `REQUIRE X509`, from `tls_cert_file` and
//! `tls_key_file`.
//!
//! ```toml
//! [engines.db]
//! kind = "mysql"
//! url = "mysql://app@127.0.0.1:3306/app"
//! password_file = "/run/secrets/mysql"   # or the password in the url
//! max_connections = 10
//! waiter_ttl = "3s"
//! connect_timeout = "5s"
//! tls_mode = "verify-full"
//! tls_ca_file = "/etc/dlock/db-ca.pem"
//! # client_name = "billing"  # the label records show; default <host>:<pid>
//! ```

mod config;
mod control;
mod gate;
mod gate_records;
mod held;
mod permits;
mod records;
mod sql;
mod tls;
/// The client crate, whose types held writes take ([`HeldTransaction`]).
pub use mysql_async;

use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::{Duration, Instant};

use dlock_core::kit::{
    Control, Deferrals, Engine, EngineError, Expiry, Facets, Fairness, Fencing, Guarantees, HeldWrites,
    Inspect, Lifecycle, List, LostSignal, PermitControl, Poll, Renewal, Request, Semaphores, Waiters, Wake,
    Woken, async_trait,
};
use dlock_core::{LockKey, LockView, Mode, Only};
use mysql_async::prelude::{Queryable, ToValue};
use mysql_async::{Pool, Value};

use gate_records::{Hold, Record};
use permits::Permits;

use sql::{key_and_name, mode_code};

pub use config::{MysqlConfig, register};
pub use held::HeldTransaction;

/// How often a waiter with only holders ahead looks again, so that a
/// handoff between processes takes milliseconds, not the core's backed-off
/// poll interval. See [`look_again`].
const NEXT_IN_LINE: Duration = Duration::from_millis(1);

/// When a waiter with `ahead` conflicting waiters before it looks again:
/// the first four of a lock every 1, 2, 3, 4 ms (about 2,000 statements a
/// second in all while the lock is contended, whatever the queue's length),
/// so each is already looking often when its turn comes; the rest on the
/// core's schedule.
fn look_again(ahead: u64) -> Duration {
    match ahead {
        0..=3 => NEXT_IN_LINE * (ahead as u32 + 1),
        _ => Duration::MAX,
    }
}

/// How often expired rows are swept away.
const SWEEP_EVERY: Duration = Duration::from_secs(5);

/// The mysql engine. See the [module docs](self).
///
/// Built from config (`kind` in `[engines.<name>]`), or by hand:
///
/// ```no_run
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), dlock::Error> {
/// use std::sync::Arc;
/// use dlock::engines::mysql::{MysqlConfig, MysqlEngine};
///
/// let config = MysqlConfig {
///     max_connections: 10,
///     ..MysqlConfig::new("mysql://app:secret@127.0.0.1:3306/app")
/// };
/// let engine = MysqlEngine::connect("main", &config).await?;
/// dlock::install(dlock::Registry::with_engine("main", Arc::new(engine), Default::default())?)?;
/// # Ok(())
/// # }
/// ```
pub struct MysqlEngine {
    shared: Arc<Shared>,
    address: String,
    waiter_ttl: Duration,
    /// What this engine's rows and records say made them (`client_name`).
    label: Arc<str>,
}

struct Shared {
    pool: Pool,
    /// Sessions for gates, apart from the pool.
    gates: gate::Sessions,
    /// This process's waiters per lock, and how to wake them.
    waiting: Waiters<Vec<u8>>,
    /// Records of gate holds, written once they last.
    records: Deferrals,
}

/// What a request remembers.
struct Mine {
    line: Mutex<Line>,
    /// A write hold taken at once. Locked while its session is used, so
    /// that a held write never finds it out mid-renewal.
    gate: tokio::sync::Mutex<Option<GateHold>>,
    /// A permit's slot, read once it is granted (`permits.rs`).
    slot: OnceLock<u32>,
}

/// A write hold taken at once: the session holding the gate, the token,
/// and its record, written once it lasts.
struct GateHold {
    session: gate::Session,
    fence: u64,
    record: Record,
}

struct Line {
    /// When its row's liveness was last extended.
    refreshed: Instant,
    /// Whether it counts among this process's waiters for the lock.
    counted: bool,
    /// Whether the last look found no waiter ahead: then it tries the
    /// grant at once, and the grant's own check says if its turn came.
    at_head: bool,
}

impl Mine {
    fn of(req: &Request) -> &Mine {
        req.state_or_init(|| Mine {
            line: Mutex::new(Line {
                refreshed: Instant::now(),
                counted: false,
                at_head: false,
            }),
            gate: tokio::sync::Mutex::new(None),
            slot: OnceLock::new(),
        })
    }

    fn line(&self) -> std::sync::MutexGuard<'_, Line> {
        self.line.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A write hold taken at once, taken out of the request.
    async fn take_gate(req: &Request) -> Option<GateHold> {
        let waiting = req.state::<Mine>()?;
        waiting.gate.lock().await.take()
    }

    async fn keep_gate(req: &Request, hold: GateHold) {
        *Mine::of(req).gate.lock().await = Some(hold);
    }
}

impl MysqlEngine {
    /// The first row of a read.
    async fn first<T: mysql_async::prelude::FromRow + Send + 'static>(
        &self,
        statement: &str,
        params: Vec<Value>,
    ) -> Result<Option<T>, EngineError> {
        let mut conn = self.shared.pool.get_conn().await.map_err(EngineError::failed)?;
        conn.exec_first(statement, params)
            .await
            .map_err(EngineError::failed)
    }

    /// A hold through the table taken at once: its row, confirmed by
    /// finding the gate free once the row is committed, else withdrawn.
    async fn take_now(
        &self,
        req: &Request,
        key: &[u8],
        name: &Option<Vec<u8>>,
    ) -> Result<Option<u64>, EngineError> {
        let (mode, gate) = (mode_code(req.mode).to_value(), gate::name(&req.key).to_value());
        let params = vec![
            key.to_value(),
            name.to_value(),
            owner(req),
            mode.clone(),
            micros(req.lease),
            self.label(),
            key.to_value(),
            name.to_value(),
            mode,
            gate.clone(),
        ];
        if self.run(&sql::take_now(), params).await?.0 == 0 {
            return Ok(None);
        }
        if let (1, Some(fence)) = self.run(sql::CONFIRM, vec![owner(req), gate]).await? {
            return Ok(Some(fence));
        }
        self.run(sql::FORGET, vec![owner(req)]).await?;
        Ok(None)
    }

    /// Runs one statement on a pooled connection; see [`sql::exec`].
    async fn run(&self, statement: &str, params: Vec<Value>) -> Result<(u64, Option<u64>), EngineError> {
        let mut conn = self.shared.pool.get_conn().await.map_err(EngineError::failed)?;
        sql::exec(&mut conn, statement, params).await
    }

    /// A write hold taken at once (see [`gate::Sessions::hold`]); its
    /// session stays with the request.
    async fn take_alone(
        &self,
        req: &Request,
        key: &[u8],
        name: &Option<Vec<u8>>,
    ) -> Result<Option<u64>, EngineError> {
        let params = vec![key.to_value(), name.to_value()];
        let Some((session, fence)) = self.shared.gates.hold(req, params).await? else {
            return Ok(None);
        };
        let hold = Hold {
            lock: req.key.clone(),
            conn: session.id(),
            owner: req.owner,
            fence,
            label: self.label.clone(),
            lease: req.lease,
        };
        let record = Record::later(&self.shared.records, self.shared.pool.clone(), hold);
        Mine::keep_gate(
            req,
            GateHold {
                session,
                fence,
                record,
            },
        )
        .await;
        Ok(Some(fence))
    }

    /// Lets a write hold taken at once go: its record first, if written.
    async fn let_go(&self, req: &Request, hold: GateHold) -> Result<bool, EngineError> {
        let mut session = hold.session;
        if hold.record.stop().await {
            session
                .exec(sql::UNRECORD_GATE, vec![gate::name(&req.key).to_value()])
                .await?;
        }
        self.shared.gates.let_go(session, &req.key).await
    }

    /// The label, as a statement's parameter.
    fn label(&self) -> Value {
        self.label.as_bytes().to_value()
    }

    /// Wakes when this process lets the lock go (or downgrades it), or
    /// after `after`.
    fn wake(&self, lock_key: &[u8], after: Duration) -> Wake {
        let released = self.shared.waiting.woken(&lock_key.to_vec());
        Box::pin(async move {
            let timer = async {
                match tokio::time::Instant::now().checked_add(after) {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                () = released => {}
                () = timer => {}
            }
            Woken::Retry
        })
    }

    async fn enqueue(&self, req: &Request) -> Result<(), EngineError> {
        let (key, name) = key_and_name(&req.key);
        let params = vec![
            key.to_value(),
            name.to_value(),
            owner(req),
            mode_code(req.mode).to_value(),
            micros(self.waiter_ttl),
            self.label(),
        ];
        self.run(&sql::enqueue(), params).await?;
        Mine::of(req).line().refreshed = Instant::now();
        Ok(())
    }

    /// A waiter whose row expired (it was dropped as dead) joins again, at the back.
    async fn rejoin(&self, req: &Request) -> Result<(), EngineError> {
        self.run(sql::FORGET, vec![owner(req)]).await?;
        Mine::of(req).line().at_head = false;
        self.enqueue(req).await
    }

    /// Counts the request among this process's waiters for its lock.
    fn start_waiting(&self, req: &Request, lock_key: &[u8]) {
        let mut line = Mine::of(req).line();
        if !line.counted {
            line.counted = true;
            self.shared.waiting.join(&lock_key.to_vec());
        }
    }

    /// Counts it out of the waiters woken at `wake_key`, once.
    fn stop_waiting(&self, req: &Request, wake_key: &[u8]) {
        let Some(waiting) = req.state::<Mine>() else {
            return;
        };
        let mut line = waiting.line();
        if line.counted {
            line.counted = false;
            self.shared.waiting.leave(&wake_key.to_vec());
        }
    }
}

fn owner(req: &Request) -> Value {
    req.owner.as_u128().to_be_bytes().to_vec().to_value()
}

/// `sql::extend`'s parameters for a hold's row.
fn extend_held(req: &Request) -> Vec<Value> {
    vec![micros(req.lease), owner(req), 1u8.to_value()]
}

fn micros(d: Duration) -> Value {
    (d.as_micros() as u64).to_value()
}

/// Deletes long-expired rows now and then, while the engine lives.
async fn sweep(shared: Weak<Shared>) {
    loop {
        tokio::time::sleep(SWEEP_EVERY).await;
        let Some(shared) = shared.upgrade() else { return };
        if let Ok(mut conn) = shared.pool.get_conn().await {
            let _ = conn.exec_drop(sql::sweep(), ()).await;
            let _ = conn.exec_drop(sql::SWEEP_GATES, ()).await;
        }
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(self.pool.clone().disconnect());
        }
    }
}

impl MysqlEngine {
    /// Withdraws a request of a lock or a semaphore, whose waiters are
    /// woken at `wake_key`.
    async fn withdraw(&self, req: &Request, wake_key: Vec<u8>) -> Result<(), EngineError> {
        self.stop_waiting(req, &wake_key);
        if let Some(hold) = Mine::take_gate(req).await {
            self.let_go(req, hold).await?;
        }
        self.run(sql::FORGET, vec![owner(req)]).await?;
        self.shared.waiting.wake(&wake_key);
        Ok(())
    }

    /// A gate hold: a statement on its session, which also keeps the
    /// session from idling out; a row: its expiry moved on. Either reads
    /// whether the holder was asked to let go, in the same statement.
    async fn renewing(&self, req: &Request) -> Result<Renewal, EngineError> {
        let mut gate = Mine::of(req).gate.lock().await;
        if let Some(hold) = gate.as_mut() {
            let renewal = hold.session.renew(&req.key).await;
            if renewal == Renewal::Gone
                && let Some(hold) = gate.take()
            {
                // Its record, if written, shows nothing once the gate is gone.
                hold.record.stop().await;
            }
            return Ok(renewal);
        }
        drop(gate);
        Ok(match self.run(&sql::extend(), extend_held(req)).await? {
            (1, None) => Renewal::Held,
            (1, Some(_)) => Renewal::Revoked,
            _ => Renewal::Gone,
        })
    }

    /// Lets go of a hold of a lock or a permit, whose waiters are woken at
    /// `key`.
    async fn let_go_woken(&self, req: &Request, key: Vec<u8>) -> Result<bool, EngineError> {
        if let Some(hold) = Mine::take_gate(req).await {
            // A failed statement means the session is gone, and the gate with it.
            let released = self.let_go(req, hold).await.unwrap_or(false);
            self.shared.waiting.wake(&key);
            return Ok(released);
        }
        let (released, _) = self.run(&sql::release(), vec![owner(req)]).await?;
        self.shared.waiting.wake(&key);
        if released == 1 {
            return Ok(true);
        }
        // Expired: its row may linger; it is no longer this owner's hold.
        self.run(sql::FORGET, vec![owner(req)]).await?;
        Ok(false)
    }
}

#[async_trait]
impl Engine for MysqlEngine {
    fn kind(&self) -> &'static str {
        "mysql"
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
            waiter_ttl: Some(self.waiter_ttl),
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

    /// A gate hold writes its read hold's row while it still holds the
    /// gate, then lets the gate go.
    async fn downgrade(&self, req: &Request) -> Result<bool, EngineError> {
        let (key, name) = key_and_name(&req.key);
        let downgraded = match Mine::take_gate(req).await {
            Some(mut hold) => {
                let params = vec![
                    key.to_value(),
                    name.to_value(),
                    owner(req),
                    micros(req.lease),
                    hold.fence.to_value(),
                    self.label(),
                ];
                hold.session.exec(&sql::hold_read(), params).await?;
                self.let_go(req, hold).await?;
                true
            }
            None => self.run(&sql::downgrade(), vec![owner(req)]).await?.0 == 1,
        };
        self.shared.waiting.wake(&key);
        Ok(downgraded)
    }
}

#[async_trait]
impl Lifecycle for MysqlEngine {
    /// Takes the lock at once if nothing live conflicts: a writer whose
    /// lease is whole seconds by the gate alone, others by a confirmed row;
    /// else joins the queue.
    /// While this process already waits for the lock, a newcomer skips the
    /// try: it could only be refused.
    async fn acquire(&self, req: &Request) -> Result<Poll, EngineError> {
        let (key, name) = key_and_name(&req.key);
        if !self.shared.waiting.any(&key) {
            let taken = match req.mode {
                Mode::Write if gate::can_hold(req.lease) => self.take_alone(req, &key, &name).await?,
                _ => self.take_now(req, &key, &name).await?,
            };
            if let Some(fence) = taken {
                return Ok(Poll::Held(fence));
            }
        }
        if req.try_once {
            return Ok(Poll::Waiting(Box::pin(std::future::pending())));
        }
        self.start_waiting(req, &key);
        self.enqueue(req).await?;
        // Soon, to learn where it stands.
        Ok(Poll::Waiting(self.wake(&key, NEXT_IN_LINE)))
    }

    /// One plain indexed read says where the waiter stands. Only when its
    /// turn has come does it try the grant (under the gate); near the head
    /// of the line it looks again soon (the first four waiters every 1 to
    /// 4 ms), else on the core's schedule. Every third of the waiter ttl
    /// the row's liveness is extended; a row found expired joins the queue
    /// again.
    async fn poll(&self, req: &Request) -> Result<Poll, EngineError> {
        let (key, _) = key_and_name(&req.key);
        let waiting = Mine::of(req);
        let ahead = if waiting.line().at_head {
            0
        } else {
            let line: Option<(u64, u64)> = self.first(&sql::line(), vec![owner(req)]).await?;
            let Some((_holders, ahead)) = line else {
                self.rejoin(req).await?;
                return Ok(Poll::Waiting(self.wake(&key, NEXT_IN_LINE)));
            };
            ahead
        };
        if ahead == 0
            && let Some(fence) = self
                .shared
                .gates
                .grant(req, &sql::take_turn(), vec![micros(req.lease), owner(req)])
                .await?
        {
            self.stop_waiting(req, &key);
            return Ok(Poll::Held(fence));
        }
        waiting.line().at_head = ahead == 0;
        if waiting.line().refreshed.elapsed() >= self.waiter_ttl / 3 {
            let params = vec![micros(self.waiter_ttl), owner(req), 0u8.to_value()];
            if self.run(&sql::extend(), params).await?.0 == 1 {
                waiting.line().refreshed = Instant::now();
            } else {
                self.rejoin(req).await?;
            }
        }
        Ok(Poll::Waiting(self.wake(&key, look_again(ahead))))
    }

    async fn cancel(&self, req: &Request) -> Result<(), EngineError> {
        self.withdraw(req, key_and_name(&req.key).0).await
    }

    async fn renew(&self, req: &Request) -> Result<Renewal, EngineError> {
        self.renewing(req).await
    }

    async fn release(&self, req: &Request) -> Result<bool, EngineError> {
        self.let_go_woken(req, key_and_name(&req.key).0).await
    }

    /// No signal of its own: a failed renewal tells the core.
    fn lost(&self, _req: &Request) -> Option<LostSignal> {
        None
    }
}

impl Semaphores for MysqlEngine {
    fn permits(&self, count: u32) -> Box<dyn Lifecycle + '_> {
        Box::new(Permits { engine: self, count })
    }

    fn slots(&self) -> bool {
        true
    }
}

#[async_trait]
impl Inspect for MysqlEngine {
    fn shows_fences(&self) -> bool {
        true
    }

    async fn inspect(&self, key: &LockKey, permits: Option<u32>) -> Result<LockView, EngineError> {
        records::inspect(&self.shared.pool, key, permits).await
    }
}

#[async_trait]
impl List for MysqlEngine {
    async fn list(&self, group: &str) -> Result<Vec<LockView>, EngineError> {
        records::list(&self.shared.pool, group).await
    }
}

#[async_trait]
impl Control for MysqlEngine {
    async fn forced_out(&self, req: &Request) -> Result<bool, EngineError> {
        control::forced_out(&self.shared.pool, req).await
    }

    async fn force_release(&self, key: &LockKey, only: &Only) -> Result<u32, EngineError> {
        let forced = control::force_release(&self.shared.pool, key, None, only).await?;
        self.shared.waiting.wake(&key_and_name(key).0);
        Ok(forced)
    }

    async fn revoke(&self, key: &LockKey, only: &Only) -> Result<u32, EngineError> {
        control::revoke(&self.shared.pool, key, None, only).await
    }
}

#[async_trait]
impl PermitControl for MysqlEngine {
    async fn force_release_permits(
        &self,
        key: &LockKey,
        count: u32,
        only: &Only,
    ) -> Result<u32, EngineError> {
        let forced = control::force_release(&self.shared.pool, key, Some(count), only).await?;
        self.shared.waiting.wake(&permits::Range::of(key, 0).low);
        Ok(forced)
    }

    async fn revoke_permits(&self, key: &LockKey, count: u32, only: &Only) -> Result<u32, EngineError> {
        control::revoke(&self.shared.pool, key, Some(count), only).await
    }
}

impl HeldWrites for MysqlEngine {
    fn store(&self) -> &(dyn std::any::Any + Send + Sync) {
        self
    }
}
