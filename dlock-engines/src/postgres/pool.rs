//! The postgres engine's connections. An advisory lock belongs to the
//! session that took it, so a hold lives on one connection; the pool books
//! which keys each connection holds and never lets one take a key twice (the
//! session would reenter, and two tasks would share one hold).
//!
//! Three uses, never mixed on one connection at a time:
//! - short statements (try, unlock, ping) go to any connection that is not
//!   waiting, many holds packed on few connections;
//! - a request that must wait in the server's queue gets a connection that
//!   holds nothing, and blocks it until granted (then it is a holder's);
//! - at most `max - 1` connections wait at once, so one always stays free
//!   for short statements.

use std::sync::{Arc, Mutex, MutexGuard};

use dlock_core::kit::{Deferrals, EngineError, RECORD_AFTER, Waiters};
use tokio::sync::{Notify, Semaphore, oneshot};
use tokio_postgres::Row;
use tokio_postgres::types::ToSql;

use super::conn::{Conn, Unbooked, Use};
use super::objects::Objects;
use super::server::{Server, failed};
use super::sql::Statements;
use super::want::Want;

pub(super) struct Pool {
    server: Arc<Server>,
    objects: Arc<Objects>,
    /// What every row of this process says it is.
    label: Arc<str>,
    max: usize,
    conns: Arc<Mutex<Conns>>,
    /// A connection opened, closed, stopped waiting or let a key go.
    pub changed: Arc<Notify>,
    /// Permits to wait in the server's queue, `max - 1`, handed out in order.
    pub waits: Arc<Semaphore>,
    /// This process's waiting requests per key, in line or queued.
    pub waiting: Waiters<i64>,
    /// Rows of holds taken at once, written once they last.
    rows: Deferrals,
}

#[derive(Default)]
struct Conns {
    open: Vec<Arc<Conn>>,
    opening: usize,
}

impl Pool {
    pub fn new(server: Arc<Server>, objects: Objects, label: String, max: usize) -> Self {
        Pool {
            server,
            objects: Arc::new(objects),
            label: label.into(),
            max,
            conns: Arc::default(),
            changed: Arc::new(Notify::new()),
            waits: Arc::new(Semaphore::new(max - 1)),
            waiting: Waiters::default(),
            rows: Deferrals::new(RECORD_AFTER),
        }
    }

    fn conns(&self) -> MutexGuard<'_, Conns> {
        lock(&self.conns)
    }

    /// Tries `want` once on a connection that may take it: the connection
    /// and the fence if granted.
    pub async fn take_now(&self, want: &Want) -> Result<Option<(Arc<Conn>, u64)>, EngineError> {
        let conn = self
            .pick(Use::Take(want.key))
            .await?
            .expect("a take waits for a connection");
        let mut unbooked = Unbooked::new(&conn, want.key, want.mode);
        let fence = conn.try_take(want).await;
        // A failed statement may have taken the lock all the same (an
        // advisory lock outlives its statement's error): let it go then.
        unbooked.booked = fence.is_ok();
        let Some(fence) = fence.map_err(failed)? else {
            return Ok(None);
        };
        conn.record_later(&self.rows, want, fence);
        Ok(Some((conn, fence)))
    }

    /// Opens the first connection, proving the server answers and the
    /// session survives between statements.
    pub async fn open_one(&self) -> Result<(), EngineError> {
        self.look().await.map(drop)
    }

    /// A connection that holds nothing, marked waiting; `None` if every
    /// connection holds something and no more may open.
    pub async fn for_waiting(&self) -> Result<Option<Arc<Conn>>, EngineError> {
        self.pick(Use::Wait).await
    }

    /// Another count than `count` in use with semaphore number `number`.
    pub async fn count_in_use(&self, number: i32, count: u32) -> Result<Option<u32>, EngineError> {
        let row = self.one(|s| &s.count_in_use, &[&number, &(count as i32)]).await?;
        Ok(row.get::<_, Option<i64>>(0).map(|n| n as u32))
    }

    /// The one row of the statement `pick` chooses, on a connection picked
    /// to look (`Use::Look`).
    pub async fn one(
        &self,
        pick: impl FnOnce(&Statements) -> &tokio_postgres::Statement,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Row, EngineError> {
        self.look().await?.0.query_one(pick, params).await
    }

    /// Every row of the statement `pick` chooses, on a connection picked
    /// to look.
    pub async fn all(
        &self,
        pick: impl FnOnce(&Statements) -> &tokio_postgres::Statement,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Vec<Row>, EngineError> {
        self.look().await?.0.query(pick, params).await
    }

    /// Whether backend `pid` sleeps in a lock queue.
    pub async fn is_waiting(&self, pid: i32) -> Result<bool, EngineError> {
        Ok(self.one(|s| &s.waiting, &[&pid]).await?.get(0))
    }

    /// A connection for a read-only statement, marked looking until dropped.
    async fn look(&self) -> Result<Looking, EngineError> {
        let conn = self.pick(Use::Look).await?;
        Ok(Looking(conn.expect("a look waits for a connection")))
    }

    /// The best connection for `used`, opening one if that is better and
    /// allowed. With none to be had, a wait gets `None`; the rest wait for one.
    async fn pick(&self, used: Use) -> Result<Option<Arc<Conn>>, EngineError> {
        loop {
            let changed = self.changed.notified();
            let open = {
                let mut conns = self.conns();
                conns.open.retain(|c| c.closed().is_none());
                let may_open = conns.open.len() + conns.opening < self.max;
                let best = conns
                    .open
                    .iter()
                    .filter(|c| c.book().fits(used))
                    .min_by_key(|c| c.book().rank(used));
                match best {
                    Some(conn) if !may_open || conn.book().idle_for(used) => {
                        conn.book().mark(used);
                        return Ok(Some(conn.clone()));
                    }
                    _ if may_open => {
                        conns.opening += 1;
                        true
                    }
                    _ if matches!(used, Use::Wait) => return Ok(None),
                    _ => false,
                }
            };
            if !open {
                changed.await;
                continue;
            }
            let opened = self.open_one_more(used).await;
            let marked = opened
                .unwrap_or_else(|_| Err(EngineError::failed("opening a connection: its task ended")))?;
            return Ok(Some(marked.keep()));
        }
    }

    /// Opens a connection into the pool, marked for `used`, counted in
    /// `opening` until then. A task of its own, so that a pick given up
    /// midway (a status check cut short by the grant it watched for) still
    /// adds it: a connect, authentication included, costs too much to throw
    /// away. The whole open is bounded by the connect timeout.
    fn open_one_more(&self, used: Use) -> oneshot::Receiver<Result<Marked, EngineError>> {
        let (server, objects, label) = (self.server.clone(), self.objects.clone(), self.label.clone());
        let (conns, changed) = (self.conns.clone(), self.changed.clone());
        let (answer, opened) = oneshot::channel();
        tokio::spawn(async move {
            let _counted = Opening(conns.clone(), changed.clone());
            let limit = server.config.get_connect_timeout().copied().unwrap_or(OPEN_TAKES);
            let conn =
                match tokio::time::timeout(limit, Conn::open(&server, &objects, &label, &changed)).await {
                    Ok(conn) => conn,
                    Err(_) => Err(EngineError::failed(format!(
                        "opening a connection took over {limit:?}"
                    ))),
                };
            let marked = conn.map(|conn| {
                let mut list = lock(&conns);
                conn.book().mark(used);
                list.open.push(conn.clone());
                Marked {
                    conn,
                    used,
                    kept: false,
                }
            });
            // Sent back unless the pick was given up; a `Marked` nobody
            // keeps gives its mark back when dropped.
            let _ = answer.send(marked);
        });
        opened
    }
}

/// The bound on opening a connection with no connect timeout set.
const OPEN_TAKES: std::time::Duration = std::time::Duration::from_secs(10);

/// A connection being opened: counted in `opening` until this drops, when
/// the open ended, however (a panic or the runtime's end included).
struct Opening(Arc<Mutex<Conns>>, Arc<Notify>);

impl Drop for Opening {
    fn drop(&mut self) {
        lock(&self.0).opening -= 1;
        self.1.notify_waiters();
    }
}

/// A new connection, marked for the pick that opened it. Dropped before
/// that pick keeps it (the pick was given up), it gives the mark back.
struct Marked {
    conn: Arc<Conn>,
    used: Use,
    kept: bool,
}

impl Marked {
    fn keep(mut self) -> Arc<Conn> {
        self.kept = true;
        self.conn.clone()
    }
}

impl Drop for Marked {
    fn drop(&mut self) {
        if !self.kept {
            self.conn.rebook(|book| book.unmark(self.used));
        }
    }
}

fn lock(conns: &Mutex<Conns>) -> MutexGuard<'_, Conns> {
    conns.lock().unwrap_or_else(|e| e.into_inner())
}

/// A connection picked for a read-only statement: it counts as looking
/// (no wait queues behind it) until this is dropped, however the
/// statement ends.
struct Looking(Arc<Conn>);

impl Drop for Looking {
    fn drop(&mut self) {
        self.0.rebook(|book| book.unmark(Use::Look));
    }
}
