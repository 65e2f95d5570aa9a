//! The statements of the postgres engine, prepared once per connection so
//! that each is one round trip. Every grant takes its fence from the
//! sequence in the same statement, after the lock: the subquery in `FROM`
//! holds volatile calls, so PostgreSQL runs it first and does not fold it.
//!
//! Every grant also writes the hold's row in the record table, and every
//! unlock deletes it, in the same statement: still one round trip. A take
//! is an `INSERT` fed by a CTE around the lock function, which PostgreSQL
//! runs once and in full (it holds volatile calls), so the row is written
//! only if the lock was granted. The session's pid and the label are
//! literals, the statements being the session's own.

use dlock_core::Mode;
use tokio_postgres::{Client, Error, Statement};

use super::objects::{Objects, quote_literal};

/// `idle_session_timeout` is the server-side lease (see the module docs);
/// parameter `n` sets it, in milliseconds, as text.
fn set_timeout(n: usize) -> String {
    format!("set_config('idle_session_timeout', ${n}, false)")
}

/// The take statements' parameters: the key, then the row's group, name,
/// count (NULL for a lock) and owner digest.
pub(super) const TAKE_PARAMS: usize = 5;

/// One connection's prepared statements.
pub(super) struct Statements {
    /// `pg_try_advisory_lock[_shared]($1)`: the fence, or no row when busy.
    try_take: [Statement; 2],
    /// The same, also setting the timeout to `$6` if granted.
    try_take_setting: [Statement; 2],
    /// Writes a waiting request's row before it waits, so that records
    /// show it in line; its grant overwrites it.
    pub line_up: Statement,
    /// `pg_advisory_lock[_shared]($1)`, waiting in the server's queue; sets
    /// the timeout to `$6` once granted.
    wait_take: [Statement; 2],
    /// `pg_advisory_unlock[_shared]($1)`: true if it was held.
    give_back: [Statement; 2],
    /// The same, also setting the timeout to `$2`.
    give_back_setting: [Statement; 2],
    /// Takes the shared lock over the exclusive one, then lets the exclusive
    /// go: the server grants a holder's own request ahead of its queue.
    /// The row stays: the mode is read from `pg_locks`.
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
    /// Every hold and wait on the keys `$1`, with its row if it has one
    /// (see `records.rs` for the columns).
    pub inspect: Statement,
    /// Every hold and wait with a row of group `$1`.
    pub list: Statement,
}

/// This database's advisory locks of the one-number form, each with its
/// key as `pg_advisory_lock` takes it.
const ADVISORY: &str = "(SELECT (classid::int8 << 32) | objid::int8 AS key, pid, granted, mode, waitstart \
     FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 1 \
     AND database = (SELECT oid FROM pg_database WHERE datname = current_database())) AS l";

/// What `records.rs` reads of a lock and its row `h`.
const SEEN: &str = "l.key, l.granted, l.mode = 'ShareLock', h.fence, h.owner, \
     coalesce(h.since, l.waitstart) AS since, h.name, h.permits";

fn index(mode: Mode) -> usize {
    match mode {
        Mode::Write => 0,
        Mode::Read => 1,
    }
}

impl Statements {
    /// Prepares them all, pipelined, for the session `pid`, whose rows
    /// carry `label`.
    pub async fn prepare(client: &Client, objects: &Objects, pid: i32, label: &str) -> Result<Self, Error> {
        let (fence, holds, label) = (&objects.fence, &objects.holds, quote_literal(label));
        let upsert = |rows: &str| {
            format!(
                "INSERT INTO {holds} (key, pid, grp, name, permits, fence, owner, label) {rows} \
                 ON CONFLICT (key, pid) DO UPDATE SET grp = excluded.grp, name = excluded.name, \
                 permits = excluded.permits, fence = excluded.fence, owner = excluded.owner, \
                 label = excluded.label, since = excluded.since RETURNING fence"
            )
        };
        let row = |fence: &str| format!("$1, {pid}, $2, $3, $4::int4, {fence}, $5, {label}");
        let take = |function: &str, set: &str| {
            upsert(&format!(
                "WITH t AS (SELECT CASE WHEN got THEN nextval({fence}) END AS fence{set} \
                 FROM (SELECT {function}($1) AS got) AS t) SELECT {} FROM t WHERE fence IS NOT NULL",
                row("fence")
            ))
        };
        // The timeout comes after a take's own parameters, or after the key.
        let (set_taking, set_giving) = (set_timeout(TAKE_PARAMS + 1), format!(", {}", set_timeout(2)));
        let set_if_got = format!(", CASE WHEN got THEN {set_taking} END");
        let wait = |function: &str| {
            upsert(&format!(
                "WITH t AS (SELECT nextval({fence}) AS fence, {set_taking} FROM (SELECT {function}($1)) AS t) \
                 SELECT {} FROM t",
                row("fence")
            ))
        };
        let give = |function: &str, set: &str| {
            format!(
                "WITH d AS (DELETE FROM {holds} WHERE key = $1 AND pid = {pid}) SELECT {function}($1){set}"
            )
        };
        let texts = [
            take("pg_try_advisory_lock", ""),
            take("pg_try_advisory_lock_shared", ""),
            take("pg_try_advisory_lock", &set_if_got),
            take("pg_try_advisory_lock_shared", &set_if_got),
            upsert(&format!("VALUES ({})", row("NULL::int8"))),
            wait("pg_advisory_lock"),
            wait("pg_advisory_lock_shared"),
            give("pg_advisory_unlock", ""),
            give("pg_advisory_unlock_shared", ""),
            give("pg_advisory_unlock", &set_giving),
            give("pg_advisory_unlock_shared", &set_giving),
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
            // A hold with no row (another client's, or one being granted)
            // is named by its session's application_name.
            format!(
                "SELECT {SEEN}, coalesce(h.label, a.application_name) FROM {ADVISORY} \
                 LEFT JOIN {holds} AS h ON h.key = l.key AND h.pid = l.pid \
                 LEFT JOIN pg_stat_activity AS a ON a.pid = l.pid \
                 WHERE l.key = ANY($1) ORDER BY l.granted DESC, since, l.pid"
            ),
            // A row counts only while its session holds or waits.
            format!(
                "SELECT {SEEN}, h.label FROM {holds} AS h JOIN {ADVISORY} ON l.key = h.key AND l.pid = h.pid \
                 WHERE h.grp = $1 ORDER BY l.granted DESC, since, l.pid"
            ),
        ];
        let prepared = futures_util::future::try_join_all(texts.iter().map(|t| client.prepare(t))).await?;
        let mut s = prepared.into_iter();
        let mut next = || s.next().expect("one statement per text");
        Ok(Statements {
            try_take: [next(), next()],
            try_take_setting: [next(), next()],
            line_up: next(),
            wait_take: [next(), next()],
            give_back: [next(), next()],
            give_back_setting: [next(), next()],
            downgrade: next(),
            ping: next(),
            waiting: next(),
            count_take: next(),
            count_give: next(),
            count_in_use: next(),
            inspect: next(),
            list: next(),
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
