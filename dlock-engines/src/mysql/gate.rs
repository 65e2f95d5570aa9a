//! The gate: one named lock (`GET_LOCK`) per lock, held on a session of
//! its own. A write hold taken at once keeps it for the whole hold, with
//! no row; a waiter's turn takes it for its grant only.
//!
//! A named lock lives as long as its session, and a stopped process keeps
//! its TCP connection open. So the server enforces the lease: a gate
//! session's `wait_timeout` is its lease, and only leases of whole seconds
//! (what `wait_timeout` counts) hold a gate. The watchdog's renewal is a
//! statement on that session; a holder that stops renewing leaves it idle,
//! and the server closes it, freeing the gate. A killed process's sessions
//! close at once.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use dlock_core::LockKey;
use dlock_core::kit::{EngineError, Renewal, Request};
use mysql_async::prelude::{Queryable, ToValue};
use mysql_async::{Conn, Opts, Value};

use super::sql;

/// Idle gate sessions kept per `wait_timeout`, at most.
const KEEP: usize = 32;

/// The gate's name: `GET_LOCK` takes at most 64 characters, so the lock's
/// 128-bit stable hash (two names that collide share a gate: they exclude
/// each other when they need not, never admit two holders of one name).
pub fn name(key: &LockKey) -> String {
    format!("dlock:{:032x}", key.stable_hash())
}

/// A session for gates, with its `wait_timeout`.
pub struct Session {
    conn: Conn,
    timeout: u64,
    idle_since: Instant,
}

impl Session {
    /// Runs a statement of the table on this session; see [`sql::exec`].
    pub async fn exec(
        &mut self,
        statement: &str,
        params: Vec<Value>,
    ) -> Result<(u64, Option<u64>), EngineError> {
        sql::exec(&mut self.conn, statement, params).await
    }

    /// The session itself, for a held write's transaction (`held.rs`).
    pub fn conn(&mut self) -> &mut Conn {
        &mut self.conn
    }

    /// The server's id of this session, which `IS_USED_LOCK` answers.
    pub fn id(&self) -> u32 {
        self.conn.id()
    }

    /// Lets the gate of `key` go; true if this session held it.
    async fn give(&mut self, key: &LockKey) -> Result<bool, EngineError> {
        Ok(self.one(sql::GIVE_GATE, key).await? == Some(1))
    }

    /// Whether this session still holds the gate of `key`, and was asked
    /// to let go; the statement also keeps the session from idling out (the
    /// renewal). Gone if the session is gone, and the gate with it.
    pub async fn renew(&mut self, key: &LockKey) -> Renewal {
        let gate = name(key);
        let answer = self.conn.exec_first(sql::HOLDS_GATE, (&gate, &gate)).await;
        match answer {
            Ok(Some(Some(1_i64))) => Renewal::Held,
            Ok(Some(Some(2))) => Renewal::Revoked,
            _ => Renewal::Gone,
        }
    }

    async fn one(&mut self, statement: &str, key: &LockKey) -> Result<Option<i64>, EngineError> {
        let value: Option<Option<i64>> = self
            .conn
            .exec_first(statement, (name(key),))
            .await
            .map_err(EngineError::failed)?;
        Ok(value.flatten())
    }
}

/// Gate sessions, apart from the engine's pool: each write hold keeps one,
/// and a pool of statements must not wait for holders.
pub struct Sessions {
    opts: Opts,
    idle: Mutex<HashMap<u64, Vec<Session>>>,
}

/// Whether a hold with `lease` can be a gate hold: `wait_timeout` counts
/// whole seconds, so the lease must be whole seconds for the server to end
/// it on time; other leases go through the table.
pub fn can_hold(lease: Duration) -> bool {
    lease >= Duration::from_secs(1) && lease.subsec_nanos() == 0
}

/// The `wait_timeout` of a session for `lease`: whole seconds, rounded up
/// (a session only taking a gate for one grant never idles that long).
fn timeout(lease: Duration) -> u64 {
    lease.as_micros().div_ceil(1_000_000).max(1) as u64
}

impl Sessions {
    pub fn new(opts: Opts) -> Self {
        Sessions {
            opts,
            idle: Mutex::default(),
        }
    }

    /// A session whose `wait_timeout` is `lease`: an idle one that the
    /// server cannot have closed for idling (idle for less than half its
    /// timeout), or a new one; and whether it was reused.
    async fn take(&self, lease: Duration) -> Result<(Session, bool), EngineError> {
        let timeout = timeout(lease);
        let fresh_for = Duration::from_secs(timeout) / 2;
        let reused = {
            let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
            let list = idle.entry(timeout).or_default();
            list.retain(|s| s.idle_since.elapsed() < fresh_for);
            list.pop()
        };
        if let Some(session) = reused {
            return Ok((session, true));
        }
        let mut conn = Conn::new(self.opts.clone()).await.map_err(EngineError::failed)?;
        conn.query_drop(format!(
            "SET SESSION wait_timeout = {timeout}; {}",
            sql::FORGET_EARLIER_ID
        ))
        .await
        .map_err(EngineError::failed)?;
        let session = Session {
            conn,
            timeout,
            idle_since: Instant::now(),
        };
        Ok((session, false))
    }

    /// Runs `statement`, which takes the gate, on a session for `req`: its
    /// one value, NULL if the gate was busy. A reused session the server
    /// has closed meanwhile (a restart) is replaced once.
    async fn take_with(
        &self,
        req: &Request,
        statement: &str,
        params: Vec<Value>,
    ) -> Result<(Session, Option<u64>), EngineError> {
        let mut retried = false;
        loop {
            let (mut session, reused) = self.take(req.lease).await?;
            match session
                .conn
                .exec_first::<Option<u64>, _, _>(statement, params.clone())
                .await
            {
                Ok(value) => return Ok((session, value.flatten())),
                Err(_) if reused && !retried => retried = true,
                Err(e) => return Err(EngineError::failed(e)),
            }
        }
    }

    /// A write hold taken at once: the gate, if free and no live row exists
    /// for the lock (`sql::take_alone`; `table` = its key and name). The
    /// session that holds it, and the token.
    pub async fn hold(
        &self,
        req: &Request,
        table: Vec<Value>,
    ) -> Result<Option<(Session, u64)>, EngineError> {
        let params = std::iter::once(name(&req.key).to_value()).chain(table).collect();
        let (session, taken) = self.take_with(req, &sql::take_alone(), params).await?;
        match taken {
            Some(fence) if fence > 0 => return Ok(Some((session, fence))),
            // Taken, but the table has rows: they go first.
            Some(_) => {
                self.let_go(session, &req.key).await?;
            }
            None => self.give_back(session),
        }
        Ok(None)
    }

    /// One grant through the table: `statement` runs while a session holds
    /// the gate, and commits before the gate is let go; its first parameter
    /// is the token, then `params`. The token if it changed a row; `None`
    /// if the gate was busy or the grant refused. On an error the session
    /// is dropped: closing it lets the gate go.
    pub async fn grant(
        &self,
        req: &Request,
        statement: &str,
        params: Vec<Value>,
    ) -> Result<Option<u64>, EngineError> {
        let gate = vec![name(&req.key).to_value()];
        let (mut session, fence) = self.take_with(req, sql::TAKE_GATE, gate).await?;
        let Some(fence) = fence else {
            self.give_back(session);
            return Ok(None);
        };
        let params = std::iter::once(fence.to_value()).chain(params).collect();
        let (changed, _) = session.exec(statement, params).await?;
        self.let_go(session, &req.key).await?;
        Ok((changed > 0).then_some(fence))
    }

    /// A session for a held write of a permit (`held.rs`): its
    /// `wait_timeout` is the lease, so the server ends a transaction left
    /// idle that long.
    pub async fn session(&self, lease: Duration) -> Result<Session, EngineError> {
        Ok(self.take(lease).await?.0)
    }

    /// A session holding the gate of `req`'s lock, for a held write of a
    /// hold through the table (`held.rs`), as a grant holds it: no other
    /// request becomes a holder meanwhile. Taken only while the hold's row
    /// (`owner`) is live, waiting up to a lease for a grant or another held
    /// write to let it go. `None` if the row is not live.
    pub async fn held_gate(&self, req: &Request, owner: Value) -> Result<Option<Session>, EngineError> {
        let wait = timeout(req.lease);
        let params = vec![owner, name(&req.key).to_value(), wait.to_value()];
        let (session, taken) = self.take_with(req, &sql::await_gate(), params).await?;
        match taken {
            Some(1) => Ok(Some(session)),
            Some(2) => {
                self.give_back(session);
                Ok(None)
            }
            Some(0) => {
                self.give_back(session);
                Err(EngineError::failed(format!(
                    "the lock's gate stayed busy for {wait} s"
                )))
            }
            // GET_LOCK's NULL: the session was killed while it waited.
            _ => Err(EngineError::failed("the lock's gate could not be taken")),
        }
    }

    /// Lets the gate of `key` go; true if `session` held it. Only then is
    /// the session kept for the next hold: one that did not is dropped.
    pub async fn let_go(&self, mut session: Session, key: &LockKey) -> Result<bool, EngineError> {
        let held = session.give(key).await?;
        if held {
            self.give_back(session);
        }
        Ok(held)
    }

    /// Keeps a session that holds no gate for the next hold.
    pub fn give_back(&self, mut session: Session) {
        session.idle_since = Instant::now();
        let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        let list = idle.entry(session.timeout).or_default();
        if list.len() < KEEP {
            list.push(session);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_whole_seconds_hold_a_gate_and_timeouts_round_up() {
        assert!(can_hold(Duration::from_secs(1)) && can_hold(Duration::from_secs(30)));
        assert!(!can_hold(Duration::from_millis(100)) && !can_hold(Duration::from_millis(1500)));
        assert_eq!(timeout(Duration::from_millis(1)), 1);
        assert_eq!(timeout(Duration::from_secs(1)), 1);
        assert_eq!(timeout(Duration::from_millis(1001)), 2);
        assert_eq!(timeout(Duration::from_secs(30)), 30);
    }

    #[test]
    fn gate_names_fit_get_lock() {
        let long = "n".repeat(10_000);
        let key = LockKey::new("g", long.as_str()).unwrap();
        assert!(name(&key).len() <= 64);
        assert_ne!(name(&key), name(&LockKey::new("g", "n").unwrap()));
    }
}
