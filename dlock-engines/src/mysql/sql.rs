//! The mysql engine's table and statements. Every state change is one
//! statement; every time is the server's `UTC_TIMESTAMP(6)`.
//!
//! Mutual exclusion between a write hold taken at once, which holds the
//! lock's gate (`gate.rs`) and writes no row, and holds through the table:
//! each side writes its own mark (the gate, or a committed row), then looks
//! for the other's. A waiter's turn holds the gate while its grant runs and
//! commits; a newcomer's row is confirmed by finding the gate free after
//! its commit (`CONFIRM`), else withdrawn. Since a write hold taken at once
//! reads the table only once it has the gate, at least one of two racing
//! requests sees the other. Within the table, the statements that make a
//! hold read the lock's rows with shared next-key locks (REPEATABLE READ,
//! set on every connection) before inserting into the same range.

use dlock_core::kit::EngineError;
use dlock_core::{LockKey, Mode};
use mysql_async::prelude::Queryable;
use mysql_async::{Conn, Value};

/// The one table: a row per request, waiting (`held = 0`) or holding, in
/// ticket order. `expires` is a holder's lease end, or a waiter's liveness
/// end. `lock_key` is the name, or its hash when it would not fit the index;
/// `name` then keeps the full name, and every lookup compares it. `fence`,
/// `since` and `label` are for records (a permit's fence is read back by
/// its holder too): NULL in rows of older dlock versions, which name their
/// columns and never set them. `revoked`: the
/// holder was asked to let go (`Control::revoke`); the mark dies with the
/// row, so the next holder never inherits it. `slot`: a permit holder's
/// (`permits.rs`), NULL in other rows.
pub const CREATE_TABLE: &str = "CREATE TABLE IF NOT EXISTS dlock_queue (
    ticket BIGINT UNSIGNED NOT NULL AUTO_INCREMENT,
    lock_key VARBINARY(255) NOT NULL,
    name LONGBLOB NULL,
    owner BINARY(16) NOT NULL,
    mode TINYINT UNSIGNED NOT NULL,
    held TINYINT UNSIGNED NOT NULL,
    expires DATETIME(6) NOT NULL,
    fence BIGINT UNSIGNED NULL,
    since DATETIME(6) NULL,
    label VARBINARY(255) NULL,
    revoked TINYINT UNSIGNED NOT NULL DEFAULT 0,
    slot INT UNSIGNED NULL,
    PRIMARY KEY (ticket),
    UNIQUE KEY by_owner (owner),
    KEY by_lock (lock_key, ticket),
    KEY by_expiry (expires)
) ENGINE = InnoDB";

/// Whether each table exists: `dlock_queue`, `dlock_gates`, `dlock_forced`.
pub const TABLES: &str = "SELECT SUM(table_name = 'dlock_queue'), SUM(table_name = 'dlock_gates'), \
     SUM(table_name = 'dlock_forced') FROM information_schema.tables WHERE table_schema = DATABASE()";

/// The columns added since a table was first made, and how a table made
/// by an older dlock gets them (instant on MySQL 8.0.29+ and MariaDB 10.3+).
pub const ADDED_COLUMNS: [(&str, &str, &str); 7] = [
    ("dlock_queue", "fence", "ADD COLUMN fence BIGINT UNSIGNED NULL"),
    ("dlock_queue", "since", "ADD COLUMN since DATETIME(6) NULL"),
    ("dlock_queue", "label", "ADD COLUMN label VARBINARY(255) NULL"),
    (
        "dlock_queue",
        "revoked",
        "ADD COLUMN revoked TINYINT UNSIGNED NOT NULL DEFAULT 0",
    ),
    ("dlock_queue", "slot", "ADD COLUMN slot INT UNSIGNED NULL"),
    (
        "dlock_gates",
        "lease",
        "ADD COLUMN lease BIGINT UNSIGNED NOT NULL DEFAULT 0",
    ),
    (
        "dlock_gates",
        "revoked",
        "ADD COLUMN revoked TINYINT UNSIGNED NOT NULL DEFAULT 0",
    ),
];

/// The tables and columns there are of [`ADDED_COLUMNS`].
pub const COLUMNS: &str = "SELECT table_name, column_name FROM information_schema.columns \
     WHERE table_schema = DATABASE() AND table_name IN ('dlock_queue', 'dlock_gates') \
     AND column_name IN ('fence', 'since', 'label', 'revoked', 'slot', 'lease')";

/// Statements that touch no row but need each privilege the engine uses,
/// so that a missing one shows at startup.
pub const PRIVILEGE_CHECKS: [(&str, &str, &str); 8] = [
    (
        "dlock_queue",
        "INSERT and SELECT",
        "INSERT INTO dlock_queue (lock_key, owner, mode, held, expires, fence, since, label, slot) \
         SELECT lock_key, owner, mode, held, expires, fence, since, label, slot FROM dlock_queue WHERE FALSE",
    ),
    (
        "dlock_queue",
        "UPDATE",
        "UPDATE dlock_queue SET mode = mode WHERE FALSE",
    ),
    ("dlock_queue", "DELETE", "DELETE FROM dlock_queue WHERE FALSE"),
    (
        "dlock_gates",
        "INSERT and SELECT",
        "REPLACE INTO dlock_gates SELECT * FROM dlock_gates WHERE FALSE",
    ),
    (
        "dlock_gates",
        "UPDATE",
        "UPDATE dlock_gates SET revoked = revoked WHERE FALSE",
    ),
    ("dlock_gates", "DELETE", "DELETE FROM dlock_gates WHERE FALSE"),
    (
        "dlock_forced",
        "INSERT and SELECT",
        "REPLACE INTO dlock_forced SELECT * FROM dlock_forced WHERE FALSE",
    ),
    ("dlock_forced", "DELETE", "DELETE FROM dlock_forced WHERE FALSE"),
];

const NOW: &str = "UTC_TIMESTAMP(6)";

/// The records of write holds taken at once (which have no row in
/// `dlock_queue`), one per gate, written only by holds that last (see
/// `gate_records.rs`). A row counts only while session `conn` holds `gate`,
/// so a row left behind by a closed session shows nothing. `owner` is the
/// owner id's digest: nothing here needs the id. `lease` is the hold's, in
/// µs; `revoked` as in `dlock_queue`, and a new hold's record replaces it.
pub const CREATE_GATES: &str = "CREATE TABLE IF NOT EXISTS dlock_gates (
    gate VARBINARY(64) NOT NULL,
    conn BIGINT UNSIGNED NOT NULL,
    lock_key VARBINARY(255) NOT NULL,
    name LONGBLOB NULL,
    owner CHAR(8) CHARACTER SET ascii NOT NULL,
    fence BIGINT UNSIGNED NOT NULL,
    since DATETIME(6) NOT NULL,
    label VARBINARY(255) NOT NULL,
    lease BIGINT UNSIGNED NOT NULL DEFAULT 0,
    revoked TINYINT UNSIGNED NOT NULL DEFAULT 0,
    PRIMARY KEY (gate)
) ENGINE = InnoDB";

/// Holds ended by `Control::force_release`, by lock and owner digest, each
/// kept until its lease would have ended, for its holder to learn why it
/// lost the lock (`Control::forced_out`).
pub const CREATE_FORCED: &str = "CREATE TABLE IF NOT EXISTS dlock_forced (
    lock_key VARBINARY(255) NOT NULL,
    owner CHAR(8) CHARACTER SET ascii NOT NULL,
    until DATETIME(6) NOT NULL,
    PRIMARY KEY (lock_key, owner),
    KEY by_until (until)
) ENGINE = InnoDB";

/// A lasting write hold's record, written only while its session holds the
/// gate. Params: gate, conn, key, name, owner digest, fence, µs since it
/// was taken, label, lease µs, gate, conn.
pub fn record_gate() -> String {
    format!(
        "REPLACE INTO dlock_gates (gate, conn, lock_key, name, owner, fence, since, label, lease) \
         SELECT ?, ?, ?, ?, ?, ?, {NOW} - INTERVAL ? MICROSECOND, ?, ? FROM DUAL WHERE IS_USED_LOCK(?) = ?"
    )
}

/// Removes this session's record of a gate, before it lets the gate go.
/// Param: gate.
pub const UNRECORD_GATE: &str = "DELETE FROM dlock_gates WHERE gate = ? AND conn = CONNECTION_ID()";

/// Removes the records a new session's id names: ids start again at a
/// server restart, so such a record is an earlier session's, and would
/// otherwise pass for this one's once it holds that gate (its owner,
/// fence and revoke mark).
pub const FORGET_EARLIER_ID: &str = "DELETE FROM dlock_gates WHERE conn = CONNECTION_ID()";

/// Removes records whose session no longer holds their gate (it closed).
pub const SWEEP_GATES: &str = "DELETE FROM dlock_gates WHERE NOT (IS_USED_LOCK(gate) <=> conn) LIMIT 1000";

/// A write hold taken at once, on a gate session: the gate, if free and
/// no live row (holder or waiter) exists for the lock. Params: gate, key,
/// name. NULL: the gate is busy; 0: taken, but rows exist, so it must be
/// let go; else the fencing token. `IF` runs `GET_LOCK` first and the read
/// only once it is taken, so the read sees every row committed before the
/// gate was taken (InnoDB opens a statement's read view at its first read).
pub fn take_alone() -> String {
    format!(
        "SELECT IF(GET_LOCK(?, 0) = 1, \
           IF(EXISTS(SELECT 1 FROM dlock_queue WHERE lock_key = ? AND name <=> ? AND expires > {NOW}), 0, UUID_SHORT()), \
           NULL)"
    )
}

/// The gate, for a waiter's turn. Param: gate. NULL if busy, else the
/// fencing token, drawn while the gate is held.
pub const TAKE_GATE: &str = "SELECT IF(GET_LOCK(?, 0) = 1, UUID_SHORT(), NULL)";

/// The gate, for a held write of a hold through the table (`held.rs`),
/// only while the hold's row is live: 1 once taken, waiting up to the
/// seconds given; 0 if still busy then; 2 if the row is not live. Params:
/// owner, gate, seconds.
pub fn await_gate() -> String {
    format!(
        "SELECT IF(EXISTS (SELECT 1 FROM dlock_queue WHERE owner = ? AND held = 1 AND expires > {NOW}), \
           GET_LOCK(?, ?), 2)"
    )
}

/// Lets the gate go. Param: gate. 1 if this session held it.
pub const GIVE_GATE: &str = "SELECT RELEASE_LOCK(?)";

/// Whether this session still holds the gate (1), and was asked to let go
/// (2); it also keeps the session from going idle (the lease). Params:
/// gate, gate.
pub const HOLDS_GATE: &str = "SELECT (IS_USED_LOCK(?) = CONNECTION_ID()) \
     * (1 + COALESCE((SELECT revoked FROM dlock_gates WHERE gate = ? AND conn = CONNECTION_ID()), 0))";

/// A read hold, made by a write hold taken at once that downgrades (it
/// holds the gate meanwhile), keeping its fence. Params: key, name, owner,
/// lease µs, fence, label.
pub fn hold_read() -> String {
    format!(
        "INSERT INTO dlock_queue (lock_key, name, owner, mode, held, expires, fence, since, label) \
         VALUES (?, ?, ?, 1, 1, {NOW} + INTERVAL ? MICROSECOND, ?, {NOW}, ?)"
    )
}

/// Takes the lock at once if no live request conflicts, holder or waiter
/// (so a newcomer never passes the queue), and the gate looks free. Params:
/// key, name, owner, mode, lease µs, label, key, name, mode, gate. Inserts
/// one row or none; a row counts only once `CONFIRM` finds the gate free.
pub fn take_now() -> String {
    format!(
        "INSERT INTO dlock_queue (lock_key, name, owner, mode, held, expires, since, label) \
         SELECT ?, ?, ?, ?, 1, {NOW} + INTERVAL ? MICROSECOND, {NOW}, ? FROM DUAL \
         WHERE NOT EXISTS (SELECT 1 FROM dlock_queue \
           WHERE lock_key = ? AND name <=> ? AND expires > {NOW} AND (mode = 0 OR ? = 0)) \
         AND IS_FREE_LOCK(?) = 1"
    )
}

/// After `take_now` committed a row: if the gate is free, so that any
/// later taker of the gate reads the row (and one that held it meanwhile
/// has let it go), the token is drawn into the row and comes back as the
/// insert id (`LAST_INSERT_ID(expr)`); no row changed if the gate is taken:
/// the row is withdrawn. Params: owner, gate.
pub const CONFIRM: &str =
    "UPDATE dlock_queue SET fence = LAST_INSERT_ID(UUID_SHORT()) WHERE owner = ? AND IS_FREE_LOCK(?) = 1";

/// Joins the queue. Params: key, name, owner, mode, liveness µs, label.
pub fn enqueue() -> String {
    format!(
        "INSERT INTO dlock_queue (lock_key, name, owner, mode, held, expires, since, label) \
         VALUES (?, ?, ?, ?, 0, {NOW} + INTERVAL ? MICROSECOND, {NOW}, ?)"
    )
}

/// Where a live waiter stands, by a plain read: the live holders it
/// conflicts with, and the live conflicting waiters ahead of it. No row:
/// the waiter's own row is gone or expired. Param: owner.
pub fn line() -> String {
    format!(
        "SELECT COALESCE(SUM(other.held = 1), 0), COALESCE(SUM(other.held = 0), 0) \
         FROM dlock_queue me LEFT JOIN dlock_queue other \
           ON other.lock_key = me.lock_key AND other.name <=> me.name AND other.owner <> me.owner \
           AND other.expires > {NOW} AND (other.held = 1 OR other.ticket < me.ticket) \
           AND (other.mode = 0 OR me.mode = 0) \
         WHERE me.owner = ? AND me.held = 0 AND me.expires > {NOW} \
         GROUP BY me.ticket"
    )
}

/// A live waiter whose turn has come (no live conflicting holder, no live
/// conflicting waiter ahead) becomes a holder: REPLACE swaps its row for a
/// held one, with the token drawn with the gate and the time granted.
/// Params: fence, lease µs, owner. Affects 2 rows when granted, none
/// otherwise. Run under the gate.
pub fn take_turn() -> String {
    format!(
        "REPLACE INTO dlock_queue (fence, lock_key, name, owner, mode, held, expires, since, label) \
         SELECT ?, me.lock_key, me.name, me.owner, me.mode, 1, {NOW} + INTERVAL ? MICROSECOND, {NOW}, me.label \
         FROM dlock_queue me \
         WHERE me.owner = ? AND me.held = 0 AND me.expires > {NOW} \
           AND NOT EXISTS (SELECT 1 FROM dlock_queue other \
             WHERE other.lock_key = me.lock_key AND other.name <=> me.name AND other.owner <> me.owner \
               AND other.expires > {NOW} AND (other.held = 1 OR other.ticket < me.ticket) \
               AND (other.mode = 0 OR me.mode = 0))"
    )
}

/// Extends a live row of this owner, holding (`held` = 1) or waiting (0).
/// Params: µs, owner, held. One row if it was still live; its `revoked`
/// comes back as the insert id (none if 0).
pub fn extend() -> String {
    format!(
        "UPDATE dlock_queue SET expires = {NOW} + INTERVAL ? MICROSECOND, revoked = LAST_INSERT_ID(revoked) \
         WHERE owner = ? AND held = ? AND expires > {NOW}"
    )
}

/// Marks the live holds of `n` owners revoked. Params: the owner ids.
pub fn revoke(n: usize) -> String {
    format!(
        "UPDATE dlock_queue SET revoked = 1 WHERE held = 1 AND expires > {NOW} AND owner IN ({})",
        vec!["?"; n].join(", ")
    )
}

/// Marks a gate hold's record revoked, if its session holds the gate and
/// it is still the owner's. Params: gate, owner digest.
pub const REVOKE_GATE: &str =
    "UPDATE dlock_gates SET revoked = 1 WHERE gate = ? AND conn = IS_USED_LOCK(gate) AND owner = ?";

/// A lock's live holds: owner, µs until the lease ends, and fence. Params:
/// key, name.
pub fn holds() -> String {
    format!(
        "SELECT owner, TIMESTAMPDIFF(MICROSECOND, {NOW}, expires), fence FROM dlock_queue \
         WHERE lock_key = ? AND name <=> ? AND held = 1 AND expires > {NOW}"
    )
}

/// The session holding a gate, and the owner digest, lease µs and fence of
/// the hold's record if it wrote one. Params: gate, gate.
pub const GATE_HOLD: &str = "SELECT IS_USED_LOCK(?), g.conn, g.owner, g.lease, g.fence FROM (SELECT 1) one \
     LEFT JOIN dlock_gates g ON g.gate = ? AND g.conn = IS_USED_LOCK(g.gate)";

/// Removes word of holds forced out whose lease has ended.
pub fn prune_forced() -> String {
    format!("DELETE FROM dlock_forced WHERE until < {NOW} LIMIT 1000")
}

/// Leaves word for `n` holders forced out: `(key, owner digest, lease µs
/// left)` each.
pub fn force(n: usize) -> String {
    let row = format!("(?, ?, {NOW} + INTERVAL ? MICROSECOND)");
    format!(
        "REPLACE INTO dlock_forced (lock_key, owner, until) VALUES {}",
        vec![row; n].join(", ")
    )
}

/// Ends the holds of `n` owners, if still held.
pub fn end_holds(n: usize) -> String {
    format!(
        "DELETE FROM dlock_queue WHERE held = 1 AND owner IN ({})",
        vec!["?"; n].join(", ")
    )
}

/// Whether a holder was forced out. Params: key, owner digest.
pub fn forced_out() -> String {
    format!("SELECT EXISTS (SELECT 1 FROM dlock_forced WHERE lock_key = ? AND owner = ? AND until > {NOW})")
}

/// Lets a live hold go. Param: owner. One row if it was still held.
pub fn release() -> String {
    format!("DELETE FROM dlock_queue WHERE owner = ? AND held = 1 AND expires > {NOW}")
}

/// Removes whatever this owner has, live or not. Param: owner.
pub const FORGET: &str = "DELETE FROM dlock_queue WHERE owner = ?";

/// A live write hold becomes a read hold. Param: owner.
pub fn downgrade() -> String {
    format!("UPDATE dlock_queue SET mode = 1 WHERE owner = ? AND held = 1 AND mode = 0 AND expires > {NOW}")
}

/// Removes rows whose lease or liveness ended a while ago; nothing waits on
/// them (every check skips expired rows), this only keeps the table small.
pub fn sweep() -> String {
    format!("DELETE FROM dlock_queue WHERE expires < {NOW} - INTERVAL 1 SECOND LIMIT 1000")
}

/// How long a statement the server keeps rolling back is tried again.
/// Takers of one semaphore deadlock by design (each reads the range under
/// shared locks, then inserts into it), so under 32 contenders on a busy
/// machine a victim can lose dozens of times running; a count of tries
/// gave up after 210 ms (the fault suite's flash sale of permits).
const ROLLED_BACK_FOR: std::time::Duration = std::time::Duration::from_secs(5);

/// Runs one statement; one the server rolled back for a reason of its own
/// (a deadlock, a lock wait, a failed read of the AUTO_INCREMENT counter)
/// is run again, for up to [`ROLLED_BACK_FOR`]. Rows affected, and the
/// ticket of an inserted row.
pub async fn exec(
    conn: &mut Conn,
    statement: &str,
    params: Vec<Value>,
) -> Result<(u64, Option<u64>), EngineError> {
    let started = std::time::Instant::now();
    let mut ceiling = std::time::Duration::from_millis(1);
    loop {
        match conn.exec_drop(statement, params.clone()).await {
            Ok(()) => return Ok((conn.affected_rows(), conn.last_insert_id())),
            // 1213: chosen as a deadlock victim, rolled back; 1205: lock
            // wait timeout; 1467: InnoDB could not read the counter (seen
            // once on MariaDB 10.11 under the full suite), nothing written.
            Err(mysql_async::Error::Server(e))
                if [1213, 1205, 1467].contains(&e.code) && started.elapsed() < ROLLED_BACK_FOR =>
            {
                // A random pause below a ceiling that doubles up to 64 ms:
                // victims retried at once, or in step, meet again.
                let pause = dlock_core::kit::OwnerId::random().as_u128() % ceiling.as_micros();
                tokio::time::sleep(std::time::Duration::from_micros(pause as u64)).await;
                ceiling = (ceiling * 2).min(std::time::Duration::from_millis(64));
            }
            Err(e) => return Err(EngineError::failed(e)),
        }
    }
}

/// The widest readable key; longer names are hashed.
pub const MAX_KEY: usize = 255;

/// The lock's `lock_key` and, when that is a hash, the full `name`. A
/// readable key is 0x01, the group's length, the group and the name; a
/// hashed one is 0x02 and the 128-bit stable hash.
pub fn key_and_name(key: &LockKey) -> (Vec<u8>, Option<Vec<u8>>) {
    let (group, name) = (key.group().as_bytes(), key.name().as_bytes());
    let mut full = Vec::with_capacity(2 + group.len() + name.len());
    full.push(1);
    full.push(group.len() as u8);
    full.extend_from_slice(group);
    full.extend_from_slice(name);
    if full.len() <= MAX_KEY {
        return (full, None);
    }
    let mut hashed = vec![2];
    hashed.extend_from_slice(&key.stable_hash().to_be_bytes());
    (hashed, Some(full))
}

pub fn mode_code(mode: Mode) -> u8 {
    match mode {
        Mode::Write => 0,
        Mode::Read => 1,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_keys_are_readable_long_ones_hashed_with_the_full_name_kept() {
        let (key, name) = key_and_name(&LockKey::new("order", "42").unwrap());
        assert_eq!(key, b"\x01\x05order42");
        assert_eq!(name, None);
        let long = "n".repeat(300);
        let (key, name) = key_and_name(&LockKey::new("g", long.as_str()).unwrap());
        assert_eq!((key.len(), key[0]), (17, 2));
        assert!(name.unwrap().ends_with(long.as_bytes()));
        // The group's length keeps the boundary: ("ga", "b") is not ("g", "ab").
        let split = |g: &str, n: &str| key_and_name(&LockKey::new(g, n).unwrap()).0;
        assert_ne!(split("ga", "b"), split("g", "ab"));
    }
}
