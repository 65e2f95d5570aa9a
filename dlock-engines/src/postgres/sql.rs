//! The statements of the postgres engine, prepared once per connection so
//! that each is one round trip. Every grant takes its fence from the
//! sequence in the same statement, after the lock: the subquery in `FROM`
//! holds volatile calls, so PostgreSQL runs it first and does not fold it.
//!
//! A take at once and its unlock are the bare lock functions: an
//! uncontended cycle writes nothing. Such a hold writes its row in the
//! record table only once it has lasted (`record`, see `conn.rs`), and its
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
/// for a lock), owner digest and lease in milliseconds.
pub(super) const ROW_PARAMS: usize = 6;

/// One connection's prepared statements.
pub(super) struct Statements {
    /// `pg_try_advisory_lock[_shared]($1)`: the fence, or NULL when busy.
    try_take: [Statement; 2],
    /// The same, also setting the timeout to `$2` if granted.
    try_take_setting: [Statement; 2],
    /// Writes the row of a hold taken at once with fence `$7`, granted
    /// `$8` microseconds ago.
    pub record: Statement,
    /// Writes a waiting request's row before it waits, so that records
    /// show it in line; its grant overwrites it.
    pub line_up: Statement,
    /// `pg_advisory_lock[_shared]($1)`, waiting in the server's queue; sets
    /// the timeout to `$7` once granted.
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
    /// The renewal: a round trip on the session, which keeps it from
    /// idling out, reading the row of its hold on key `$1`: whether its
    /// holder was asked to let go, and whether it was forced out. No row
    /// (a hold too young to have one): neither.
    pub ping: Statement,
    /// Whether this session holds key `$1`, as `pg_locks` says: a held
    /// write's check, beside `ping`.
    pub holds: Statement,
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
    /// Marks the rows of the holds of key `$1` revoked, those [`ONLY`]
    /// admits: how many, and how many holds the key has (those with no row
    /// yet are not marked).
    pub revoke: Statement,
    /// Leaves word for each holder of key `$1` that [`ONLY`] admits that it
    /// is forced out, until its lease would end, and prunes word that has expired: how
    /// many, and how many holds the key has. A holder learns it at its
    /// next renewal, and lets go then, unless `end_forced` ends its session.
    pub force: Statement,
    /// Ends the sessions of the holders of key `$1` forced out that hold
    /// nothing else (so no other lock's hold ends), but this one's: how
    /// many. Waits up to a second for each to end, so that the lock is free
    /// once this answers.
    pub end_forced: Statement,
    /// Whether the holder of key `$1` with owner digest `$2` is forced out.
    pub forced_out: Statement,
}

/// This database's advisory locks of the one-number form, each with its
/// key as `pg_advisory_lock` takes it.
const ADVISORY: &str = "(SELECT (classid::int8 << 32) | objid::int8 AS key, pid, granted, mode, waitstart \
     FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 1 \
     AND database = (SELECT oid FROM pg_database WHERE datname = current_database())) AS l";

/// The holds an operator's act is for, by row `h`: with fence `$2`, and
/// owner digest `$3`, where each is given.
const ONLY: &str = "AND ($2::int8 IS NULL OR h.fence = $2) AND ($3::text IS NULL OR h.owner = $3)";

/// How many sessions hold key `$1`.
const HOLDERS: &str = "(SELECT count(*) FROM (SELECT (classid::int8 << 32) | objid::int8 AS key \
     FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 1 AND granted \
     AND database = (SELECT oid FROM pg_database WHERE datname = current_database())) AS k WHERE k.key = $1)";

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
        let forced = &objects.forced;
        let upsert = |rows: &str| {
            format!(
                "INSERT INTO {holds} (key, pid, grp, name, permits, fence, owner, label, since, lease) {rows} \
                 ON CONFLICT (key, pid) DO UPDATE SET grp = excluded.grp, name = excluded.name, \
                 permits = excluded.permits, fence = excluded.fence, owner = excluded.owner, \
                 label = excluded.label, since = excluded.since, lease = excluded.lease, \
                 revoked = false RETURNING fence"
            )
        };
        let row = |fence: &str, since: &str| {
            format!("$1, {pid}, $2, $3, $4::int4, {fence}, $5, {label}, {since}, $6::int8")
        };
        let (now, granted) = (
            "clock_timestamp()",
            "clock_timestamp() - $8::int8 * interval '1 microsecond'",
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
            upsert(&format!("VALUES ({})", row("$7::int8", granted))),
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
            format!(
                "SELECT h.revoked, f.key IS NOT NULL FROM {holds} AS h \
                 LEFT JOIN {forced} AS f ON f.key = h.key AND f.owner = h.owner \
                 WHERE h.key = $1 AND h.pid = {pid}"
            ),
            format!(
                "SELECT EXISTS (SELECT 1 FROM {ADVISORY} WHERE l.key = $1 AND l.pid = {pid} AND l.granted)"
            ),
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
            // A row counts once it records its grant (a waiting request's
            // has no fence): the grant's write would clear an earlier mark.
            format!(
                "WITH asked AS (UPDATE {holds} AS h SET revoked = true FROM {ADVISORY} \
                 WHERE l.key = h.key AND l.pid = h.pid AND l.granted AND h.key = $1 \
                 AND h.fence IS NOT NULL {ONLY} RETURNING 1) \
                 SELECT (SELECT count(*) FROM asked), {HOLDERS}"
            ),
            // Word of an earlier force on this key is left to the next
            // prune: a statement must not both delete and insert one row.
            format!(
                "WITH held AS (SELECT h.owner, h.lease FROM {ADVISORY} \
                 JOIN {holds} AS h ON h.key = l.key AND h.pid = l.pid \
                 WHERE l.key = $1 AND l.granted AND h.fence IS NOT NULL {ONLY}), \
                 told AS (INSERT INTO {forced} (key, owner, until) \
                 SELECT $1, owner, clock_timestamp() + lease * interval '1 millisecond' FROM held \
                 ON CONFLICT (key, owner) DO NOTHING), \
                 pruned AS (DELETE FROM {forced} WHERE until < clock_timestamp() AND key <> $1) \
                 SELECT (SELECT count(*) FROM held), {HOLDERS}"
            ),
            // Never its own session: it answers this statement.
            format!(
                "SELECT count(*) FILTER (WHERE pg_terminate_backend(l.pid, 1000)) FROM {ADVISORY} \
                 JOIN {holds} AS h ON h.key = l.key AND h.pid = l.pid \
                 JOIN {forced} AS f ON f.key = h.key AND f.owner = h.owner \
                 WHERE l.key = $1 AND l.granted AND l.pid <> pg_backend_pid() \
                 AND NOT EXISTS (SELECT 1 FROM pg_locks AS o WHERE o.pid = l.pid AND o.locktype = 'advisory' \
                 AND NOT (o.objsubid = 1 AND ((o.classid::int8 << 32) | o.objid::int8) = $1))"
            ),
            format!(
                "SELECT EXISTS (SELECT 1 FROM {forced} WHERE key = $1 AND owner = $2 \
                 AND until > clock_timestamp())"
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
            holds: next(),
            waiting: next(),
            count_take: next(),
            count_give: next(),
            count_in_use: next(),
            inspect: next(),
            list: next(),
            revoke: next(),
            force: next(),
            end_forced: next(),
            forced_out: next(),
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
