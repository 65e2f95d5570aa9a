//! The statements of the postgres engine, prepared once per connection so
//! that each is one round trip. Every grant takes its fence from the
//! sequence in the same statement, after the lock: the subquery in `FROM`
//! holds volatile calls, so PostgreSQL runs it first and does not fold it.

use dlock_core::Mode;
use tokio_postgres::{Client, Error, Statement};

/// `idle_session_timeout` is the server-side lease (see the module docs);
/// `$2` sets it, in milliseconds, as text.
const SET_TIMEOUT: &str = "set_config('idle_session_timeout', $2, false)";

/// One connection's prepared statements.
pub(super) struct Statements {
    /// `pg_try_advisory_lock[_shared]($1)`: the fence, or NULL when busy.
    try_take: [Statement; 2],
    /// The same, also setting the timeout to `$2` if granted.
    try_take_setting: [Statement; 2],
    /// `pg_advisory_lock[_shared]($1)`, waiting in the server's queue; sets
    /// the timeout to `$2` once granted.
    wait_take: [Statement; 2],
    /// `pg_advisory_unlock[_shared]($1)`: true if it was held.
    give_back: [Statement; 2],
    /// The same, also setting the timeout to `$2`.
    give_back_setting: [Statement; 2],
    /// Takes the shared lock over the exclusive one, then lets the exclusive
    /// go: the server grants a holder's own request ahead of its queue.
    pub downgrade: Statement,
    pub ping: Statement,
    /// Whether backend `$1` sleeps in a lock queue.
    pub waiting: Statement,
    /// A semaphore's count, `pg_advisory_lock_shared($1, $2)` in the
    /// two-number form: taken with a permit, given back with it.
    pub count_take: Statement,
    pub count_give: Statement,
    /// The greatest other count `$2` held with semaphore number `$1` in
    /// this database, if any.
    pub count_in_use: Statement,
}

fn index(mode: Mode) -> usize {
    match mode {
        Mode::Write => 0,
        Mode::Read => 1,
    }
}

impl Statements {
    /// Prepares them all, pipelined; `fence` is the sequence as a quoted literal.
    pub async fn prepare(client: &Client, fence: &str) -> Result<Self, Error> {
        let take = |function: &str, set: &str| {
            format!(
                "SELECT CASE WHEN got THEN nextval({fence}) END{set} FROM (SELECT {function}($1) AS got) AS t"
            )
        };
        let set_if_got = format!(", CASE WHEN got THEN {SET_TIMEOUT} END");
        let wait = |function: &str| {
            format!("SELECT nextval({fence}), {SET_TIMEOUT} FROM (SELECT {function}($1)) AS t")
        };
        let give = |function: &str, set: &str| format!("SELECT {function}($1){set}");
        let set = format!(", {SET_TIMEOUT}");
        let texts = [
            take("pg_try_advisory_lock", ""),
            take("pg_try_advisory_lock_shared", ""),
            take("pg_try_advisory_lock", &set_if_got),
            take("pg_try_advisory_lock_shared", &set_if_got),
            wait("pg_advisory_lock"),
            wait("pg_advisory_lock_shared"),
            give("pg_advisory_unlock", ""),
            give("pg_advisory_unlock_shared", ""),
            give("pg_advisory_unlock", &set),
            give("pg_advisory_unlock_shared", &set),
            "SELECT pg_advisory_lock_shared($1), pg_advisory_unlock($1)".to_owned(),
            "SELECT 1".to_owned(),
            "SELECT coalesce(bool_or(wait_event_type = 'Lock'), false) FROM pg_stat_get_activity($1)"
                .to_owned(),
            "SELECT pg_advisory_lock_shared($1::int4, $2::int4)".to_owned(),
            "SELECT pg_advisory_unlock_shared($1::int4, $2::int4)".to_owned(),
            "SELECT max(objid::int8) FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 2 \
             AND granted AND classid = $1::int4::oid AND objid <> $2::int4::oid \
             AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
                .to_owned(),
        ];
        let prepared = futures_util::future::try_join_all(texts.iter().map(|t| client.prepare(t))).await?;
        let mut s = prepared.into_iter();
        let mut next = || s.next().expect("one statement per text");
        Ok(Statements {
            try_take: [next(), next()],
            try_take_setting: [next(), next()],
            wait_take: [next(), next()],
            give_back: [next(), next()],
            give_back_setting: [next(), next()],
            downgrade: next(),
            ping: next(),
            waiting: next(),
            count_take: next(),
            count_give: next(),
            count_in_use: next(),
        })
    }

    pub fn try_take(&self, mode: Mode, setting: bool) -> &Statement {
        let set = if setting {
            &self.try_take_setting
        } else {
            &self.try_take
        };
        &set[index(mode)]
    }

    pub fn wait_take(&self, mode: Mode) -> &Statement {
        &self.wait_take[index(mode)]
    }

    pub fn give_back(&self, mode: Mode, setting: bool) -> &Statement {
        let set = if setting {
            &self.give_back_setting
        } else {
            &self.give_back
        };
        &set[index(mode)]
    }
}
