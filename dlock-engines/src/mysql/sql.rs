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
/// `name` then keeps the full name, and every lookup compares it.
pub const CREATE_TABLE: &str = "CREATE TABLE IF NOT EXISTS dlock_queue (
    ticket BIGINT UNSIGNED NOT NULL AUTO_INCREMENT,
    lock_key VARBINARY(255) NOT NULL,
    name LONGBLOB NULL,
    owner BINARY(16) NOT NULL,
    mode TINYINT UNSIGNED NOT NULL,
    held TINYINT UNSIGNED NOT NULL,
    expires DATETIME(6) NOT NULL,
    PRIMARY KEY (ticket),
    UNIQUE KEY by_owner (owner),
    KEY by_lock (lock_key, ticket),
    KEY by_expiry (expires)
) ENGINE = InnoDB";

pub const TABLE_EXISTS: &str = "SELECT COUNT(*) FROM information_schema.tables WHERE table_schema = DATABASE() AND table_name = 'dlock_queue'";

/// Statements that touch no row but need each privilege the engine uses,
/// so that a missing one shows at startup.
pub const PRIVILEGE_CHECKS: [(&str, &str); 3] = [
    (
        "INSERT and SELECT",
        "INSERT INTO dlock_queue (lock_key, owner, mode, held, expires) \
         SELECT lock_key, owner, mode, held, expires FROM dlock_queue WHERE FALSE",
    ),
    ("UPDATE", "UPDATE dlock_queue SET mode = mode WHERE FALSE"),
    ("DELETE", "DELETE FROM dlock_queue WHERE FALSE"),
];

const NOW: &str = "UTC_TIMESTAMP(6)";

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

/// Lets the gate go. Param: gate. 1 if this session held it.
pub const GIVE_GATE: &str = "SELECT RELEASE_LOCK(?)";

/// Whether this session still holds the gate; it also keeps the session
/// from going idle (the lease). Param: gate.
pub const HOLDS_GATE: &str = "SELECT IS_USED_LOCK(?) = CONNECTION_ID()";

/// A read hold, made by a write hold taken at once that downgrades (it
/// holds the gate meanwhile). Params: key, name, owner, lease µs.
pub fn hold_read() -> String {
    format!(
        "INSERT INTO dlock_queue (lock_key, name, owner, mode, held, expires) \
         VALUES (?, ?, ?, 1, 1, {NOW} + INTERVAL ? MICROSECOND)"
    )
}

/// Takes the lock at once if no live request conflicts, holder or waiter
/// (so a newcomer never passes the queue), and the gate looks free. Params:
/// key, name, owner, mode, lease µs, key, name, mode, gate. Inserts one row
/// or none; a row counts only once `CONFIRM` finds the gate free.
pub fn take_now() -> String {
    format!(
        "INSERT INTO dlock_queue (lock_key, name, owner, mode, held, expires) \
         SELECT ?, ?, ?, ?, 1, {NOW} + INTERVAL ? MICROSECOND FROM DUAL \
         WHERE NOT EXISTS (SELECT 1 FROM dlock_queue \
           WHERE lock_key = ? AND name <=> ? AND expires > {NOW} AND (mode = 0 OR ? = 0)) \
         AND IS_FREE_LOCK(?) = 1"
    )
}

/// After `take_now` committed a row: the token if the gate is free, so any
/// later taker of the gate reads the row (and one that held it meanwhile
/// has let it go); NULL if it is taken: the row is withdrawn. Param: gate.
pub const CONFIRM: &str = "SELECT IF(IS_FREE_LOCK(?) = 1, UUID_SHORT(), NULL)";

/// Joins the queue. Params: key, name, owner, mode, liveness µs.
pub fn enqueue() -> String {
    format!(
        "INSERT INTO dlock_queue (lock_key, name, owner, mode, held, expires) \
         VALUES (?, ?, ?, ?, 0, {NOW} + INTERVAL ? MICROSECOND)"
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
/// held one. Params: lease µs, owner. Affects 2 rows when granted, none
/// otherwise. Run under the gate.
pub fn take_turn() -> String {
    format!(
        "REPLACE INTO dlock_queue (lock_key, name, owner, mode, held, expires) \
         SELECT me.lock_key, me.name, me.owner, me.mode, 1, {NOW} + INTERVAL ? MICROSECOND \
         FROM dlock_queue me \
         WHERE me.owner = ? AND me.held = 0 AND me.expires > {NOW} \
           AND NOT EXISTS (SELECT 1 FROM dlock_queue other \
             WHERE other.lock_key = me.lock_key AND other.name <=> me.name AND other.owner <> me.owner \
               AND other.expires > {NOW} AND (other.held = 1 OR other.ticket < me.ticket) \
               AND (other.mode = 0 OR me.mode = 0))"
    )
}

/// Extends a live row of this owner, holding (`held` = 1) or waiting (0).
/// Params: µs, owner, held. One row if it was still live.
pub fn extend() -> String {
    format!(
        "UPDATE dlock_queue SET expires = {NOW} + INTERVAL ? MICROSECOND \
         WHERE owner = ? AND held = ? AND expires > {NOW}"
    )
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

/// Runs one statement; one the server rolled back for a reason of its own
/// (a deadlock, a lock wait, a failed read of the AUTO_INCREMENT counter)
/// is run again. Rows affected, and the ticket of an inserted row.
pub async fn exec(
    conn: &mut Conn,
    statement: &str,
    params: Vec<Value>,
) -> Result<(u64, Option<u64>), EngineError> {
    let mut attempts: u64 = 0;
    loop {
        match conn.exec_drop(statement, params.clone()).await {
            Ok(()) => return Ok((conn.affected_rows(), conn.last_insert_id())),
            // 1213: chosen as a deadlock victim, rolled back; 1205: lock
            // wait timeout; 1467: InnoDB could not read the counter (seen
            // once on MariaDB 10.11 under the full suite), nothing written.
            Err(mysql_async::Error::Server(e)) if [1213, 1205, 1467].contains(&e.code) && attempts < 20 => {
                attempts += 1;
                // Apart, and more so each time: victims retried at once
                // meet again (16 permit requests on one semaphore
                // deadlocked a release 9 times running).
                let spread = (dlock_core::kit::OwnerId::random().as_u128() % 1000) as u64;
                tokio::time::sleep(std::time::Duration::from_micros(attempts * (500 + spread))).await;
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
