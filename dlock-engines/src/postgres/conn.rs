//! One session of the postgres engine, and the advisory-lock protocol on
//! it: taking a key now or waiting for it, letting it go, downgrading,
//! counting a semaphore's slots, pinging, a held write's transaction; and
//! the book of what the session holds, which the pool reads to pick a
//! connection.

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use dlock_core::Mode;
use dlock_core::kit::{Deferrals, Deferred, EngineError, OwnerId};
use tokio::sync::{Notify, OwnedRwLockWriteGuard, RwLock, watch};
use tokio_postgres::error::SqlState;
use tokio_postgres::types::ToSql;
use tokio_postgres::{Client, Row};
use tokio_postgres_rustls::MakeRustlsConnect;

use super::objects::Objects;
use super::server::{Server, failed};
use super::sql::{ROW_PARAMS, Statements};
use super::want::Want;

/// How long a cancelled wait's answer may take before its session is
/// ended instead: a cancel takes effect in milliseconds, even on a busy
/// machine, unless the server dropped it.
const CANCEL_TAKES: std::time::Duration = std::time::Duration::from_secs(1);

/// What a connection is picked for.
#[derive(Clone, Copy)]
pub(super) enum Use {
    /// A try on this key: not waiting, not holding the key.
    Take(i64),
    /// A wait in the server's queue: holding nothing, doing nothing.
    Wait,
    /// A statement that takes and lets go of nothing (a read, an
    /// operator's control): not waiting, preferably holding nothing, so
    /// that it keeps no holder's session from idling out.
    Look,
}

/// Why a connection ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Closed {
    /// The server ended it for idling past `idle_session_timeout`: the
    /// lease of its holds ran out, as a key's TTL would.
    LeaseRanOut,
    /// Anything else: network, server restart, `pg_terminate_backend`.
    Dropped,
}

/// A statement that changes what a session holds, until its answer is
/// booked. Dropped before that (the core stopped waiting for the call), it
/// has a task let the key go, harmless if it was never taken, so that
/// neither the server nor the book keeps a hold nobody owns. This, not a
/// task per call, keeps the fast path on the caller's task.
pub(super) struct Unbooked {
    conn: Arc<Conn>,
    key: i64,
    mode: Mode,
    pub booked: bool,
}

impl Unbooked {
    pub fn new(conn: &Arc<Conn>, key: i64, mode: Mode) -> Self {
        Unbooked {
            conn: conn.clone(),
            key,
            mode,
            booked: false,
        }
    }
}

impl Drop for Unbooked {
    fn drop(&mut self) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        if self.booked {
            return;
        }
        let (conn, key, mode) = (self.conn.clone(), self.key, self.mode);
        runtime.spawn(async move {
            let _ = conn.let_go(key, mode, true).await;
            conn.rebook(|book| book.trying.remove(&key));
        });
    }
}

/// One session.
pub(super) struct Conn {
    client: Client,
    /// For cancel requests, which open a connection of their own.
    tls: MakeRustlsConnect,
    pub pid: i32,
    statements: Statements,
    book: Mutex<Book>,
    /// Statements that change what the session holds run one at a time, so
    /// that the book and the server's timeout agree.
    order: tokio::sync::Mutex<()>,
    /// Every statement takes a share; a held write's transaction takes it
    /// alone, so that no other hold's statement joins the transaction.
    alone: Arc<RwLock<()>>,
    closed: watch::Receiver<Option<Closed>>,
    /// Ends the session when notified.
    end: Arc<Notify>,
    /// The pool's: told whenever this session's book changes.
    changed: Arc<Notify>,
}

/// What a session holds, as the engine books it.
#[derive(Default)]
pub(super) struct Book {
    /// Held keys and their leases in milliseconds.
    held: HashMap<i64, u64>,
    /// Keys being tried now.
    trying: HashSet<i64>,
    /// Read-only statements in flight: a wait must not queue behind them.
    looking: usize,
    waiting: bool,
    /// The session's `idle_session_timeout`: the shortest lease held, 0 with none.
    timeout: u64,
    /// The rows of held keys, written or to be.
    rows: HashMap<i64, HoldRow>,
}

/// The row of a hold in the record table.
enum HoldRow {
    /// Written with the grant, after a wait.
    Written,
    /// A hold taken at once writes it once it has lasted.
    Later(Deferred),
}

impl Book {
    pub fn fits(&self, used: Use) -> bool {
        match used {
            Use::Take(key) => !self.waiting && !self.held.contains_key(&key) && !self.trying.contains(&key),
            Use::Wait => !self.waiting && self.held.is_empty() && self.trying.is_empty() && self.looking == 0,
            Use::Look => !self.waiting,
        }
    }

    /// Lower is better: tries pack onto sessions that already hold (keeping
    /// empty ones for waits) but spread while one is busy; looks go where
    /// nothing is held.
    pub fn rank(&self, used: Use) -> (usize, usize) {
        match used {
            Use::Take(_) => (self.trying.len(), usize::MAX - self.held.len()),
            Use::Wait | Use::Look => (self.held.len(), self.trying.len()),
        }
    }

    /// Whether this best pick is as good as a new connection.
    pub fn idle_for(&self, used: Use) -> bool {
        match used {
            Use::Take(_) => self.trying.is_empty(),
            Use::Wait => true,
            Use::Look => self.held.is_empty(),
        }
    }

    pub fn mark(&mut self, used: Use) {
        match used {
            Use::Take(key) => {
                self.trying.insert(key);
            }
            Use::Wait => self.waiting = true,
            Use::Look => self.looking += 1,
        }
    }

    pub fn unmark(&mut self, used: Use) {
        match used {
            Use::Take(key) => {
                self.trying.remove(&key);
            }
            Use::Wait => self.waiting = false,
            Use::Look => self.looking -= 1,
        }
    }

    /// The timeout the session needs with `extra` held too.
    fn timeout_with(&self, extra: Option<u64>) -> u64 {
        self.held.values().copied().chain(extra).min().unwrap_or(0)
    }

    /// The timeout the session needs once `key` is let go.
    fn timeout_without(&self, key: i64) -> u64 {
        let rest = self.held.iter().filter(|(k, _)| **k != key);
        rest.map(|(_, lease)| *lease).min().unwrap_or(0)
    }
}

impl Conn {
    /// The one row of the statement `pick` chooses.
    pub async fn query_one(
        &self,
        pick: impl FnOnce(&Statements) -> &tokio_postgres::Statement,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Row, EngineError> {
        let _share = self.alone.read().await;
        self.client
            .query_one(pick(&self.statements), params)
            .await
            .map_err(failed)
    }

    /// Every row of the statement `pick` chooses.
    pub async fn query(
        &self,
        pick: impl FnOnce(&Statements) -> &tokio_postgres::Statement,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Vec<Row>, EngineError> {
        let _share = self.alone.read().await;
        self.client
            .query(pick(&self.statements), params)
            .await
            .map_err(failed)
    }

    /// Opens one connection: session settings that could end a wait or a hold
    /// behind dlock's back are reset, rows of sessions gone are swept, and the
    /// statements prepared.
    pub async fn open(
        server: &Server,
        objects: &Objects,
        label: &str,
        pool_changed: &Arc<Notify>,
    ) -> Result<Arc<Conn>, EngineError> {
        let (client, connection) = server.connect().await.map_err(failed)?;
        let (closed_tx, closed) = watch::channel(None);
        let changed = pool_changed.clone();
        let end = Arc::new(Notify::new());
        let ended = end.clone();
        tokio::spawn(async move {
            let cause = tokio::select! {
                done = connection => match done {
                    Err(e) if e.code() == Some(&SqlState::IDLE_SESSION_TIMEOUT) => Closed::LeaseRanOut,
                    _ => Closed::Dropped,
                },
                // Dropping the connection closes the socket: the server
                // ends the session, and with it anything it holds.
                () = ended.notified() => Closed::Dropped,
            };
            closed_tx.send_replace(Some(cause));
            changed.notify_waiters();
        });
        let marker = format!("{:x}", OwnerId::random().as_u128());
        // Only rows of pids no backend has: a live pid's rows are its own to
        // overwrite or delete.
        client
            .batch_execute(&format!(
                "SET idle_session_timeout = 0; SET lock_timeout = 0; SET statement_timeout = 0; \
                     SET idle_in_transaction_session_timeout = 0; SET dlock.session = '{marker}'; \
                     DELETE FROM {} WHERE pid NOT IN (SELECT pid FROM pg_stat_activity)",
                objects.holds
            ))
            .await
            .map_err(failed)?;
        let row = client
            .query_one(
                "SELECT pg_backend_pid(), current_setting('dlock.session', true)",
                &[],
            )
            .await
            .map_err(failed)?;
        if row.get::<_, Option<String>>(1).as_deref() != Some(marker.as_str()) {
            return Err(EngineError::failed(
                "the connection does not keep its session from one statement to the next \
                     (PgBouncer in transaction pooling mode?): advisory locks need a direct connection \
                     or session pooling",
            ));
        }
        let pid = row.get(0);
        let statements = Statements::prepare(&client, objects, pid, label)
            .await
            .map_err(failed)?;
        Ok(Arc::new(Conn {
            pid,
            client,
            tls: server.tls.clone(),
            statements,
            book: Mutex::default(),
            order: tokio::sync::Mutex::new(()),
            alone: Arc::default(),
            closed,
            end,
            changed: pool_changed.clone(),
        }))
    }

    pub fn book(&self) -> MutexGuard<'_, Book> {
        self.book.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Changes the book and tells those waiting for a connection.
    pub fn rebook<T>(&self, change: impl FnOnce(&mut Book) -> T) -> T {
        let changed = change(&mut self.book());
        self.changed.notify_waiters();
        changed
    }

    pub fn closed(&self) -> Option<Closed> {
        *self.closed.borrow()
    }

    /// Resolves when the connection drops for any reason but its lease
    /// running out (renewal reports that one).
    pub fn dropped(&self) -> impl Future<Output = ()> + Send + 'static {
        let mut closed = self.closed.clone();
        async move {
            if closed.wait_for(|c| *c == Some(Closed::Dropped)).await.is_err() {
                std::future::pending::<()>().await;
            }
        }
    }

    /// Runs a statement on `key`, with the session's new timeout if it sets one.
    async fn on_key(
        &self,
        statement: &tokio_postgres::Statement,
        key: i64,
        timeout: Option<u64>,
    ) -> Result<tokio_postgres::Row, tokio_postgres::Error> {
        let _share = self.alone.read().await;
        match timeout {
            Some(ms) => self.client.query_one(statement, &[&key, &ms.to_string()]).await,
            None => self.client.query_one(statement, &[&key]).await,
        }
    }

    /// Runs a statement writing the row of `want`, with the session's new
    /// timeout if it sets one: the fence if granted.
    async fn on_want(
        &self,
        statement: &tokio_postgres::Statement,
        want: &Want,
        timeout: Option<u64>,
    ) -> Result<Option<u64>, tokio_postgres::Error> {
        let tag = &want.tag;
        let (group, name, permits) = (tag.key.group(), tag.key.name(), tag.permits.map(|n| n as i32));
        let (lease, ms) = (want.lease_ms as i64, timeout.unwrap_or_default().to_string());
        let params: [&(dyn ToSql + Sync); ROW_PARAMS + 1] =
            [&want.key, &group, &name, &permits, &tag.owner, &lease, &ms];
        let count = ROW_PARAMS + usize::from(timeout.is_some());
        let _share = self.alone.read().await;
        let row = self.client.query_opt(statement, &params[..count]).await?;
        Ok(row.and_then(|row| row.get::<_, Option<i64>>(0)).map(|f| f as u64))
    }

    /// `pg_try_advisory_lock[_shared]` on a connection picked for this key.
    pub async fn try_take(&self, want: &Want) -> Result<Option<u64>, tokio_postgres::Error> {
        let _order = self.order.lock().await;
        let (current, wanted) = {
            let book = self.book();
            (book.timeout, book.timeout_with(Some(want.lease_ms)))
        };
        let setting = wanted != current;
        let statement = self.statements.try_take(want.mode, setting);
        let answer = self.on_key(statement, want.key, setting.then_some(wanted)).await;
        self.rebook(|book| {
            // A failure keeps the key marked until it is let go (`Unbooked`),
            // so that no other take of it runs here meanwhile.
            let fence = answer?.get::<_, Option<i64>>(0).map(|f| f as u64);
            book.trying.remove(&want.key);
            if fence.is_some() {
                book.held.insert(want.key, want.lease_ms);
                book.timeout = wanted;
            }
            Ok(fence)
        })
    }

    /// Writes the row of `want`, held with `fence` since now, once the hold
    /// has lasted [`RECORD_AFTER`], unless let go before (`let_go` waits
    /// for a write under way). On this session, whose statements carry its
    /// pid: no other connection is needed, and a session gone writes none.
    pub fn record_later(self: &Arc<Self>, rows: &Deferrals, want: &Want, fence: u64) {
        let (conn, key, tag, taken) = (self.clone(), want.key, want.tag.clone(), Instant::now());
        let lease = want.lease_ms as i64;
        let row = rows.after(async move {
            let (group, name, permits) = (tag.key.group(), tag.key.name(), tag.permits.map(|n| n as i32));
            let (fence, micros) = (fence as i64, taken.elapsed().as_micros() as i64);
            let params: [&(dyn ToSql + Sync); ROW_PARAMS + 2] =
                [&key, &group, &name, &permits, &tag.owner, &lease, &fence, &micros];
            let _share = conn.alone.read().await;
            // A failed statement may still have written: deleting is harmless.
            match conn.client.execute(&conn.statements.record, &params).await {
                Ok(written) => written > 0,
                Err(_) => true,
            }
        });
        self.book().rows.insert(key, HoldRow::Later(row));
    }

    /// `pg_advisory_lock[_shared]` on a connection picked for waiting: in
    /// the server's queue until granted (the fence) or `stop` resolves
    /// first (`None`).
    ///
    /// A stop cancels the statement on the server. The server may act on a
    /// cancel late, on whatever statement the session runs next: an unlock,
    /// or a take whose lock is granted before the error (an advisory lock
    /// outlives its statement's error). Either would leave a lock no one
    /// books. So the session is used again only if the wait itself was
    /// cancelled, which spends the cancel, and after an unlock of the key,
    /// since the cancel may have struck just after the grant. Otherwise
    /// (the grant came first, or no answer within [`CANCEL_TAKES`]) the
    /// session stays marked waiting, so nothing else runs on it, and ends;
    /// that lets go of a grant too, and a statement still in the server's
    /// queue ends once granted.
    ///
    /// The request's row is written first, so that records show it in line.
    pub async fn wait_take(
        &self,
        want: &Want,
        stop: impl Future<Output = ()>,
    ) -> Result<Option<u64>, tokio_postgres::Error> {
        let (key, mode, lease_ms) = (want.key, want.mode, want.lease_ms);
        let _order = self.order.lock().await;
        if let Err(e) = self.on_want(&self.statements.line_up, want, None).await {
            self.rebook(|book| book.waiting = false);
            return Err(e);
        }
        let answer = self.on_want(self.statements.wait_take(mode), want, Some(lease_ms));
        tokio::pin!(answer);
        let answer = tokio::select! {
            // The statement first: polled, it is sent before any cancel.
            biased;
            answer = &mut answer => answer,
            () = stop => {
                // A failed cancel leaves the statement to finish on its own.
                // Bounded: over TLS it waits for the server's answers.
                let token = self.client.cancel_token();
                let _ = tokio::time::timeout(CANCEL_TAKES, token.cancel_query(self.tls.clone())).await;
                // A cancel that reached the session before the statement
                // did is dropped, and the statement waits its turn: the
                // session then ends rather than keep the waiter.
                let answer = tokio::time::timeout(CANCEL_TAKES, answer).await;
                let spent = matches!(answer, Ok(Err(e)) if e.code() == Some(&SqlState::QUERY_CANCELED));
                let undone =
                    spent && self.on_key(self.statements.give_back(mode, true, true), key, Some(0)).await.is_ok();
                if undone {
                    self.rebook(|book| {
                        book.waiting = false;
                        book.timeout = 0;
                    });
                } else {
                    self.end.notify_one();
                }
                return Ok(None);
            }
        };
        match answer {
            Ok(fence) => Ok(self.rebook(|book| {
                book.waiting = false;
                book.held.insert(key, lease_ms);
                book.rows.insert(key, HoldRow::Written);
                book.timeout = lease_ms;
                fence
            })),
            // Whether the lock was taken before the error is unknown.
            Err(e) => {
                self.end.notify_one();
                Err(e)
            }
        }
    }

    /// `pg_advisory_unlock[_shared]`: whether the session held it. A closed
    /// connection holds nothing any more.
    pub async fn give_back(self: &Arc<Self>, key: i64, mode: Mode) -> Result<bool, EngineError> {
        self.let_go(key, mode, false).await
    }

    /// `give_back`, also setting the timeout and deleting any row if
    /// `reset` (after a statement whose effect on them is unknown). A row
    /// written goes first.
    async fn let_go(self: &Arc<Self>, key: i64, mode: Mode, reset: bool) -> Result<bool, EngineError> {
        let mut unbooked = Unbooked::new(self, key, mode);
        let row = self.book().rows.remove(&key);
        let recorded = reset
            || match row {
                Some(HoldRow::Written) => true,
                Some(HoldRow::Later(row)) => row.stop().await,
                None => false,
            };
        let _order = self.order.lock().await;
        let (current, wanted) = {
            let book = self.book();
            (book.timeout, book.timeout_without(key))
        };
        let setting = reset || wanted != current;
        let statement = self.statements.give_back(mode, setting, recorded);
        let answer = self.on_key(statement, key, setting.then_some(wanted)).await;
        self.rebook(|book| {
            book.held.remove(&key);
            if answer.is_ok() {
                book.timeout = wanted;
            }
        });
        unbooked.booked = true;
        match answer {
            Ok(row) => Ok(row.get(0)),
            Err(_) if self.client.is_closed() => Ok(false),
            Err(e) => Err(failed(e)),
        }
    }

    /// Turns the exclusive hold on `key` into a shared one in one statement.
    pub async fn downgrade(&self, key: i64) -> Result<bool, EngineError> {
        let _order = self.order.lock().await;
        let _share = self.alone.read().await;
        match self.client.query_one(&self.statements.downgrade, &[&key]).await {
            Ok(row) => Ok(row.get(1)),
            Err(_) if self.client.is_closed() => Ok(false),
            Err(e) => Err(failed(e)),
        }
    }

    /// Takes (`take`) or gives back a share of semaphore number `number`'s
    /// count on this session, beside a permit it holds.
    pub async fn count(&self, number: i32, count: u32, take: bool) -> Result<(), EngineError> {
        let statement = if take {
            &self.statements.count_take
        } else {
            &self.statements.count_give
        };
        let count = count as i32;
        let _share = self.alone.read().await;
        match self.client.query_one(statement, &[&number, &count]).await {
            Ok(_) => Ok(()),
            Err(_) if self.client.is_closed() => Ok(()),
            Err(e) => Err(failed(e)),
        }
    }

    /// One round trip on the session of the hold on `key`: what became of it.
    pub async fn ping(&self, key: i64) -> Result<Ping, EngineError> {
        let _share = self.alone.read().await;
        match self.client.query_opt(&self.statements.ping, &[&key]).await {
            Ok(row) => Ok(pinged(row)),
            Err(_) if self.client.is_closed() => Ok(Ping::Gone),
            Err(e) => Err(failed(e)),
        }
    }

    /// A held write (`held.rs`): `statements`, in order, in one
    /// transaction on this session, which first checks that the session
    /// holds `key` (`pg_locks`) and that its holder was not forced out (the
    /// renewal's `ping`, in the transaction). Rows each changed; `None`,
    /// with nothing applied, if it no longer holds, or if the session
    /// ended before the commit was sent. Meanwhile no other statement runs
    /// on the session; each statement, and each pause between them, ends
    /// within the session's lease (`idle_session_timeout`, set as the
    /// transaction's `statement_timeout` and idle timeout), so that a held
    /// write never keeps the session, and its holds, past it.
    pub async fn held_write(
        self: &Arc<Self>,
        key: i64,
        statements: &[(&str, &[&(dyn ToSql + Sync)])],
    ) -> Result<Option<Vec<u64>>, EngineError> {
        let open = Open {
            conn: self.clone(),
            alone: Some(self.alone.clone().write_owned().await),
        };
        let key: &[&(dyn ToSql + Sync)] = &[&key];
        // Pipelined, in this order: one round trip.
        let checked = tokio::try_join!(
            self.client.batch_execute(BEGIN_BOUNDED),
            self.client.query_one(&self.statements.holds, key),
            self.client.query_opt(&self.statements.ping, key),
        );
        let held = match checked {
            Ok((_, holds, ping)) => holds.get::<_, bool>(0) && pinged(ping) != Ping::Forced,
            Err(e) if self.ended(&e) => false,
            Err(e) => {
                open.rollback().await;
                return Err(failed(e));
            }
        };
        if !held {
            open.rollback().await;
            return Ok(None);
        }
        let mut changed = Vec::with_capacity(statements.len());
        for (index, (statement, params)) in statements.iter().enumerate() {
            match self.client.execute(*statement, params).await {
                Ok(rows) => changed.push(rows),
                // No commit was sent: the server rolled it all back.
                Err(e) if self.ended(&e) => return Ok(None),
                Err(e) => {
                    open.rollback().await;
                    return Err(EngineError::failed(format!("statement {index}: {}", failed(e))));
                }
            }
        }
        let committed = self.client.batch_execute("COMMIT").await;
        drop(open.done());
        match committed {
            Ok(()) => Ok(Some(changed)),
            Err(e) if self.ended(&e) => Err(EngineError::failed(
                "the session ended before the commit was answered: whether it landed is unknown",
            )),
            Err(e) => Err(failed(e)),
        }
    }

    /// Whether `error` says the session is over: closed, or ended by the
    /// server for its idle timeout (the lease), whose FATAL can come as the
    /// answer to a request sent before the client saw the socket close.
    fn ended(&self, error: &tokio_postgres::Error) -> bool {
        self.client.is_closed() || error.code() == Some(&SqlState::IDLE_SESSION_TIMEOUT)
    }
}

/// Opens a held write's transaction, each statement and idle moment of it
/// bounded by the session's lease.
const BEGIN_BOUNDED: &str = "BEGIN; SELECT \
     set_config('statement_timeout', current_setting('idle_session_timeout'), true), \
     set_config('idle_in_transaction_session_timeout', current_setting('idle_session_timeout'), true)";

/// A held write's open transaction, which has the session to itself. Left
/// without a commit or a rollback (the caller stopped waiting), it is rolled
/// back on a task of its own before the session is shared again.
struct Open {
    conn: Arc<Conn>,
    alone: Option<OwnedRwLockWriteGuard<()>>,
}

impl Open {
    async fn rollback(self) {
        let _ = self.conn.client.batch_execute("ROLLBACK").await;
        drop(self.done());
    }

    /// The session, shared again.
    fn done(mut self) -> Option<OwnedRwLockWriteGuard<()>> {
        self.alone.take()
    }
}

impl Drop for Open {
    fn drop(&mut self) {
        let Some(alone) = self.alone.take() else {
            return;
        };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let conn = self.conn.clone();
        runtime.spawn(async move {
            let _ = conn.client.batch_execute("ROLLBACK").await;
            drop(alone);
        });
    }
}

/// What the renewal's `ping` row says of a hold.
fn pinged(row: Option<Row>) -> Ping {
    match row.map(|row| (row.get(0), row.get(1))) {
        None | Some((false, false)) => Ping::Held,
        Some((_, true)) => Ping::Forced,
        Some((true, false)) => Ping::Revoked,
    }
}

/// What a ping learns of a hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Ping {
    Held,
    /// Held, and its holder was asked to let go.
    Revoked,
    /// Forced out, its session kept (it holds other locks too): the holder
    /// lets go.
    Forced,
    /// The session, and so the hold, is gone.
    Gone,
}
