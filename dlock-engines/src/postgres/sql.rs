//! The statements of the postgres engine, prepared once per connection so
//! that each is one round trip. Every grant takes its fence from the
//! sequence in the same statement, after the lock: the subquery in `FROM`
//! holds volatile calls, so PostgreSQL runs it first and does not fold it.
//!
//! A take at once and its unlock are the bare lock functions: an
//! uncontended cycle writes nothing. Such a hold writes its row in the
//! record table only once it has lasted (`record`, see `pool.rs`), and its
//! unlock deletes the row then. A request about to wait writes its row
//! first, and its grant fills it in, in the statement that waits: an
//! `INSERT` fed by a CTE around the lock function. The session's pid and
//! the label are literals, the statements being the session's own.

use dlock_core::Mode;
use tokio_postgres::{Client, Error, Statement};

use super::objects::{Objects, quote_literal};

/// `idle_session_timeout` is the server-side lease (see the module docs);
/// parameter `n` sets it, in milliseconds, as text.
fn set_timeout(n: usize) -> String {
    format!("set_config('idle_session_timeout', ${n}, false)")
}

/// A row's parameters: the key, then the row's group, name, count (NULL
/// for a lock) and owner digest.
pub(super) const ROW_PARAMS: usize = 5;

/// One connection's prepared statements.
pub(super) struct Statements {
    /// `pg_try_advisory_lock[_shared]($1)`: the fence, or NULL when busy.
    try_take: [Statement; 2],
    /// The same, also setting the timeout to `$2` if granted.
    try_take_setting: [Statement; 2],
    /// Writes the row of a hold taken at once with fence `$6`, granted
    /// `$7` microseconds ago.
    pub record: Statement,
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
    /// `give_back` and `give_back_setting`, deleting the hold's row first.
    give_back_recorded: [Statement; 2],
    give_back_recorded_setting: [Statement; 2],
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
                "INSERT INTO {holds} (key, pid, grp, name, permits, fence, owner, label, since) {rows} \
                 ON CONFLICT (key, pid) DO UPDATE SET grp = excluded.grp, name = excluded.name, \
                 permits = excluded.permits, fence = excluded.fence, owner = excluded.owner, \
                 label = excluded.label, since = excluded.since RETURNING fence"
            )
        };
        let row =
            |fence: &str, since: &str| format!("$1, {pid}, $2, $3, $4::int4, {fence}, $5, {label}, {since}");
        let (now, granted) = (
            "clock_timestamp()",
            "clock_timestamp() - $7::int8 * interval '1 microsecond'",
        );
        let take = |function: &str, set: &str| {
            format!(
                "SELECT CASE WHEN got THEN nextval({fence}) END{set} FROM (SELECT {function}($1) AS got) AS t"
            )
        };
        let set_if_got = format!(", CASE WHEN got THEN {} END", set_timeout(2));
        // The timeout comes after the row's parameters.
        let wait = |function: &str| {
            upsert(&format!(
                "WITH t AS (SELECT nextval({fence}) AS fence, {} FROM (SELECT {function}($1)) AS t) \
                 SELECT {} FROM t",
                set_timeout(ROW_PARAMS + 1),
                row("fence", now)
            ))
        };
        // The delete commits after the unlock takes effect, harmlessly: a
        // row counts only while its pid holds, and this session's next
        // statement comes after the commit.
        let give = |function: &str, set: &str, recorded: bool| {
            if recorded {
                format!(
                    "WITH d AS (DELETE FROM {holds} WHERE key = $1 AND pid = {pid}) SELECT {function}($1){set}"
                )
            } else {
                format!("SELECT {function}($1){set}")
            }
        };
        let set = format!(", {}", set_timeout(2));
        let texts = [
            take("pg_try_advisory_lock", ""),
            take("pg_try_advisory_lock_shared", ""),
            take("pg_try_advisory_lock", &set_if_got),
            take("pg_try_advisory_lock_shared", &set_if_got),
            upsert(&format!("VALUES ({})", row("$6::int8", granted))),
            upsert(&format!("VALUES ({})", row("NULL::int8", now))),
            wait("pg_advisory_lock"),
            wait("pg_advisory_lock_shared"),
            give("pg_advisory_unlock", "", false),
            give("pg_advisory_unlock_shared", "", false),
            give("pg_advisory_unlock", &set, false),
            give("pg_advisory_unlock_shared", &set, false),
            give("pg_advisory_unlock", "", true),
            give("pg_advisory_unlock_shared", "", true),
            give("pg_advisory_unlock", &set, true),
            give("pg_advisory_unlock_shared", &set, true),
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
            record: next(),
            line_up: next(),
            wait_take: [next(), next()],
            give_back: [next(), next()],
            give_back_setting: [next(), next()],
            give_back_recorded: [next(), next()],
            give_back_recorded_setting: [next(), next()],
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

    /// Deleting the hold's row first if `recorded`.
    pub fn give_back(&self, mode: Mode, setting: bool, recorded: bool) -> &Statement {
        let set = match (recorded, setting) {
            (false, false) => &self.give_back,
            (false, true) => &self.give_back_setting,
            (true, false) => &self.give_back_recorded,
            (true, true) => &self.give_back_recorded_setting,
        };
        &set[index(mode)]
    }
}
