//! Writes that land only while the hold is current: the user's statements
//! in one transaction that first checks the hold, with the renewal's own
//! statement, on the server:
//!
//! - A write hold taken at once (the gate, no row) writes on the session
//!   that holds the gate, which first checks that it still does
//!   (`IS_USED_LOCK(gate) = CONNECTION_ID()`). The gate lives as long as
//!   the session, whose `wait_timeout` is the lease: a holder paused past
//!   it finds its session closed by the server, the gate free and nothing
//!   applied; so does one forced out (`KILL CONNECTION`).
//! - A hold through the table (a reader, a writer granted after waiting, a
//!   lease not in whole seconds, a permit) writes on a gate session of its
//!   own (`wait_timeout` the lease), which first extends the hold's row if
//!   live and this owner's: the row stays locked until the commit, so a
//!   force release waits for it. A lock's hold holds the lock's gate
//!   meanwhile, as a grant does, taken only while its row is live: a write
//!   hold taken at once reads the table without locks, and only the gate
//!   keeps it out until the commit. A permit's grants read the row under
//!   locks, so its row's lock is enough.
//!
//! Statements and their parameters, rather than a transaction handed to
//! the user's code, as for postgres: the transaction's bounds (begin,
//! check, commit) cannot be moved, and no await of the user's runs on the
//! holding session.

use dlock_core::kit::{EngineError, HeldBy, held_by};
use dlock_core::{Error, HeldLock};
use mysql_async::prelude::Queryable;
use mysql_async::{Conn, Params, TxOpts, Value};

use super::{Mine, MysqlEngine, extend_held, gate, owner, sql};

/// A hold's writes to MySQL or MariaDB: statements run in one transaction,
/// committed only if the hold is still current; a holder paused past its
/// lease, or forced out, writes nothing. A lock's holder (write or read), a
/// permit's and a leader's may write.
///
/// A statement that fails rolls all back, and `commit` answers the
/// engine's error, naming the statement (from 0) and the server's error;
/// the hold goes on. The statements share the hold's lease: a session left
/// idle that long in the transaction is closed by the server, rolling it
/// back.
///
/// ```no_run
/// # async fn demo() -> Result<(), dlock::Error> {
/// use dlock::engines::mysql::HeldTransaction;
///
/// let guard = dlock::lock("jobs", "import").lock().await?;
/// // Err(Lost) if the hold has ended: then nothing was written.
/// let rows = HeldTransaction::of(&guard)?
///     .exec("UPDATE jobs SET cursor = ? WHERE name = ?", (4096, "import"))
///     .exec("INSERT INTO audit (job, event) VALUES (?, 'moved')", ("import",))
///     .commit()
///     .await?;
/// assert_eq!(rows.len(), 2); // the rows each statement changed
/// # Ok(())
/// # }
/// ```
pub struct HeldTransaction<'a> {
    held: HeldBy<'a, MysqlEngine>,
    statements: Vec<(&'a str, Params)>,
}

impl<'a> HeldTransaction<'a> {
    /// The held writes of `guard`'s hold; `Unsupported` where it is not on
    /// a mysql engine.
    pub fn of(guard: &'a impl AsRef<HeldLock>) -> Result<Self, Error> {
        let held = held_by(guard.as_ref(), "mysql::HeldTransaction")?;
        Ok(HeldTransaction {
            held,
            statements: Vec::new(),
        })
    }

    /// `statement` with `params` (`?`, or named), as `mysql_async`'s
    /// `exec_drop` takes them, after the others.
    pub fn exec(mut self, statement: &'a str, params: impl Into<Params>) -> Self {
        self.statements.push((statement, params.into()));
        self
    }

    /// Runs the statements, in order, and commits them if the hold is
    /// still current: the rows each changed. `Err(Lost)`, with nothing
    /// applied, otherwise. Sent once: should the answer not come within
    /// `call_timeout`, or the session end before the commit is answered,
    /// the error says so and whether they landed is unknown.
    pub async fn commit(self) -> Result<Vec<u64>, Error> {
        let engine = self.held.store();
        let req = self.held.request();
        let (statements, permit) = (self.statements, self.held.is_permit());
        self.held
            .write(async move {
                // Kept while it writes: a renewal waits, and never finds the
                // hold out.
                let mut gate_hold = Mine::of(req).gate.lock().await;
                if let Some(hold) = gate_hold.as_mut() {
                    let check = Check::Gate(gate::name(&req.key));
                    return transaction(hold.session.conn(), check, &statements, true).await;
                }
                drop(gate_hold);
                let check = Check::Row(extend_held(req));
                let gates = &engine.shared.gates;
                if permit {
                    let mut session = gates.session(req.lease).await?;
                    let written = transaction(session.conn(), check, &statements, false).await;
                    if written.is_ok() {
                        gates.give_back(session);
                    }
                    return written;
                }
                let Some(mut session) = gates.held_gate(req, owner(req)).await? else {
                    return Ok(None);
                };
                let written = transaction(session.conn(), check, &statements, false).await;
                // A failure closes the session, and lets the gate go with it.
                let _ = gates.let_go(session, &req.key).await;
                written
            })
            .await
    }
}

/// How a transaction checks the hold first.
enum Check {
    /// This session holds the gate (its name), as the renewal of a gate
    /// hold asks.
    Gate(String),
    /// The hold's row, extended as its renewal does (`sql::extend`).
    Row(Vec<Value>),
}

/// `statements` in one transaction on `conn`, committed if `check`, run
/// first in it, finds the hold current: the rows each changed; `None`, with
/// nothing applied, if not. `own`: the session is the hold's own (a gate
/// hold), so its end before the commit is the hold's end too.
async fn transaction(
    conn: &mut Conn,
    check: Check,
    statements: &[(&str, Params)],
    own: bool,
) -> Result<Option<Vec<u64>>, EngineError> {
    // A session that ends before the commit is sent applies nothing.
    let ended = |e: mysql_async::Error| match own && e.is_fatal() {
        true => Ok(None),
        false => Err(EngineError::failed(e)),
    };
    let mut tx = match conn.start_transaction(TxOpts::default()).await {
        Ok(tx) => tx,
        Err(e) => return ended(e),
    };
    let held = match check {
        Check::Gate(gate) => tx
            .exec_first(sql::HOLDS_GATE, (&gate, &gate))
            .await
            .map(|held: Option<Option<i64>>| matches!(held.flatten(), Some(1 | 2))),
        Check::Row(params) => tx
            .exec_drop(sql::extend(), params)
            .await
            .map(|()| tx.affected_rows() == 1),
    };
    match held {
        Ok(true) => {}
        Ok(false) => {
            let _ = tx.rollback().await;
            return Ok(None);
        }
        Err(e) if e.is_fatal() => return ended(e),
        Err(e) => {
            let _ = tx.rollback().await;
            return Err(EngineError::failed(e));
        }
    }
    let mut changed = Vec::with_capacity(statements.len());
    for (index, (statement, params)) in statements.iter().enumerate() {
        match tx.exec_drop(*statement, params.clone()).await {
            Ok(()) => changed.push(tx.affected_rows()),
            Err(e) if e.is_fatal() => return ended(e),
            Err(e) => {
                let _ = tx.rollback().await;
                return Err(EngineError::failed(format!("statement {index}: {e}")));
            }
        }
    }
    match tx.commit().await {
        Ok(()) => Ok(Some(changed)),
        Err(e) if e.is_fatal() => Err(EngineError::failed(format!(
            "the session ended before the commit was answered: whether it landed is unknown ({e})"
        ))),
        Err(e) => Err(EngineError::failed(e)),
    }
}
