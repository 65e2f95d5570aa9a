//! Writes that land only while the hold is current: the user's statements
//! in one transaction on the session that holds the advisory lock, which
//! first checks, on the server, that the session holds the lock's key
//! (`pg_locks`) and that no force release left word for the hold (the
//! renewal's `ping`). The lock lives as long as the session, and the
//! transaction commits only on it: a session the server ended (a holder
//! paused past its lease, an operator's `pg_terminate_backend`) commits
//! nothing. See `Conn::held_write` for how the session is kept to itself.
//!
//! Statements and their parameters, rather than a transaction handed to
//! the user's code: the session is shared by this process's other holds,
//! which wait while it runs, so only the statements, one after the other,
//! run in it, never the user's own awaits; and the transaction's bounds
//! (begin, check, commit) cannot be moved.

use std::sync::Arc;

use dlock_core::kit::{EngineError, HeldBy, held_by};
use dlock_core::{Error, HeldLock};
use tokio_postgres::types::ToSql;

use super::conn::Conn;
use super::permits::Permit;
use super::{Hold, PostgresEngine, held_on};

/// A hold's writes to PostgreSQL: statements run in one transaction on
/// the session holding the lock, committed only if the hold is still
/// current; a holder paused past its lease, or forced out, writes nothing.
/// A lock's holder (write or read), a permit's and a leader's may write.
///
/// Each statement ends within the hold's lease, or fails (the session's
/// lease is the transaction's `statement_timeout`). One that fails rolls
/// all back, and `commit` answers the engine's error, naming the statement
/// (from 0) and its SQLSTATE; the hold goes on.
///
/// ```no_run
/// # async fn demo() -> Result<(), dlock::Error> {
/// use dlock::engines::postgres::HeldTransaction;
///
/// let guard = dlock::lock("jobs", "import").lock().await?;
/// // Err(Lost) if the hold has ended: then nothing was written.
/// let rows = HeldTransaction::of(&guard)?
///     .execute("UPDATE jobs SET cursor = $1 WHERE name = $2", &[&4096_i64, &"import"])
///     .execute("INSERT INTO audit (job, event) VALUES ($1, 'moved')", &[&"import"])
///     .commit()
///     .await?;
/// assert_eq!(rows.len(), 2); // the rows each statement changed
/// # Ok(())
/// # }
/// ```
pub struct HeldTransaction<'a> {
    held: HeldBy<'a, PostgresEngine>,
    statements: Vec<(&'a str, &'a [&'a (dyn ToSql + Sync)])>,
}

impl<'a> HeldTransaction<'a> {
    /// The held writes of `guard`'s hold; `Unsupported` where it is not on
    /// a postgres engine.
    pub fn of(guard: &'a impl AsRef<HeldLock>) -> Result<Self, Error> {
        let held = held_by(guard.as_ref(), "postgres::HeldTransaction")?;
        Ok(HeldTransaction {
            held,
            statements: Vec::new(),
        })
    }

    /// `statement` with `params` (`$1`, `$2`, ...), as `tokio_postgres`'s
    /// `execute` takes them, after the others.
    pub fn execute(mut self, statement: &'a str, params: &'a [&'a (dyn ToSql + Sync)]) -> Self {
        self.statements.push((statement, params));
        self
    }

    /// Runs the statements, in order, and commits them if the hold is
    /// still current: the rows each changed. `Err(Lost)`, with nothing
    /// applied, otherwise. Sent once: should the answer not come within
    /// `call_timeout`, or the session end before the commit is answered,
    /// the error says so and whether they landed is unknown.
    pub async fn commit(self) -> Result<Vec<u64>, Error> {
        let req = self.held.request();
        let (statements, is_permit) = (self.statements, self.held.is_permit());
        self.held
            .write(async move {
                // In the hold's turn: its own release waits.
                match is_permit {
                    true => {
                        let permit = Permit::of(req);
                        let _turn = permit.turnstile().turn.lock().await;
                        write_on(permit.held_on(), &statements).await
                    }
                    false => {
                        let hold = Hold::of(req);
                        let _turn = hold.turn.lock().await;
                        write_on(held_on(req), &statements).await
                    }
                }
            })
            .await
    }
}

/// The held write on the session a hold lives on, and its key there;
/// none if it no longer has one.
async fn write_on(
    held: Option<(Arc<Conn>, i64)>,
    statements: &[(&str, &[&(dyn ToSql + Sync)])],
) -> Result<Option<Vec<u64>>, EngineError> {
    match held {
        Some((conn, key)) => conn.held_write(key, statements).await,
        None => Ok(None),
    }
}
