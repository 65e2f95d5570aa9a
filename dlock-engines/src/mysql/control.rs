//! An operator's control of a lock or a semaphore's permits: force release
//! and revocation. A permit is a row, reached as a lock's row is.
//!
//! A hold through the table is a row: force release deletes it, and
//! revocation marks it, for the renewal to read. A write hold taken at
//! once is its gate, held by a session of its own (`gate.rs`) that holds
//! nothing else: force release ends that session (`KILL CONNECTION`),
//! which lets the gate go and no other lock's hold, and revocation marks
//! the hold's record in `dlock_gates`. Both find such a hold by its
//! record, so a hold too young to have one is waited for, as records are;
//! a gate held with no record even then (a waiter's grant holds it a
//! moment; another client's lock) is left alone.
//!
//! Before it ends any hold, force release leaves word for its holder in
//! `dlock_forced` (lock, owner digest, until its lease would have ended),
//! pruning word that has expired: the holder, finding at its next renewal
//! that its row or session is gone, asks there why (`forced_out`).

use dlock_core::kit::{EngineError, RECORD_WAIT, Request};
use dlock_core::{LockKey, Only};
use mysql_async::prelude::{Queryable, ToValue};
use mysql_async::{Conn, Pool, Value};

use super::gate;
use super::permits::Range;
use super::records::digest;
use super::sql::{self, key_and_name};

/// A write hold taken at once, as its record tells.
struct GateHold {
    /// The id of its session.
    conn: u64,
    owner: String,
    lease_micros: u64,
    fence: u64,
}

/// A hold through the table, as its row tells.
struct RowHold {
    owner: Vec<u8>,
    left_micros: i64,
    fence: u64,
}

/// Marks the holders of `key` that `only` admits revoked: two round trips
/// (three if its gate is held with no record yet), and one more per kind of
/// hold found. Each mark names its hold's owner, so a hold that came in
/// since is not marked.
pub(super) async fn revoke(
    pool: &Pool,
    key: &LockKey,
    permits: Option<u32>,
    only: &Only,
) -> Result<u32, EngineError> {
    let mut conn = pool.get_conn().await.map_err(EngineError::failed)?;
    let (gated, rows) = holds(&mut conn, key, permits, only).await?;
    if let Some(hold) = &gated {
        let params = vec![gate::name(key).to_value(), hold.owner.to_value()];
        sql::exec(&mut conn, sql::REVOKE_GATE, params).await?;
    }
    if !rows.is_empty() {
        let owners: Vec<Value> = rows.iter().map(|row| row.owner.to_value()).collect();
        sql::exec(&mut conn, &sql::revoke(owners.len()), owners).await?;
    }
    Ok(u32::from(gated.is_some()) + rows.len() as u32)
}

/// Forces the holders of `key` that `only` admits out: two round trips to
/// find them (three if its gate is held with no record yet), then two to
/// leave word and one per kind of hold found to end them. The holds ended.
/// A row is ended by its owner id, so a hold that came in since is left
/// alone; a gate's session is ended by its id, one round trip after it was
/// read, and holds nothing else.
pub(super) async fn force_release(
    pool: &Pool,
    key: &LockKey,
    permits: Option<u32>,
    only: &Only,
) -> Result<u32, EngineError> {
    let mut conn = pool.get_conn().await.map_err(EngineError::failed)?;
    let (gated, rows) = holds(&mut conn, key, permits, only).await?;
    let lock_key = key_and_name(key).0;
    let mut word = Vec::new();
    for row in &rows {
        word.extend([
            lock_key.to_value(),
            digest(&row.owner).to_value(),
            row.left_micros.to_value(),
        ]);
    }
    if let Some(hold) = &gated {
        word.extend([
            lock_key.to_value(),
            hold.owner.to_value(),
            hold.lease_micros.to_value(),
        ]);
    }
    if word.is_empty() {
        return Ok(0);
    }
    sql::exec(&mut conn, &sql::prune_forced(), Vec::new()).await?;
    sql::exec(&mut conn, &sql::force(word.len() / 3), word).await?;
    let mut ended = 0;
    if !rows.is_empty() {
        let owners: Vec<Value> = rows.into_iter().map(|row| row.owner.to_value()).collect();
        ended += sql::exec(&mut conn, &sql::end_holds(owners.len()), owners)
            .await?
            .0;
    }
    if let Some(hold) = gated {
        match conn.query_drop(format!("KILL CONNECTION {}", hold.conn)).await {
            Ok(()) => ended += 1,
            // 1094: no such session: it let go and closed meanwhile.
            Err(mysql_async::Error::Server(e)) if e.code == 1094 => {}
            Err(e) => return Err(EngineError::failed(e)),
        }
    }
    Ok(ended as u32)
}

/// The holds that `only` admits of the lock `key`, its gate's and its
/// rows', or with `permits`, of the semaphore's rows (a semaphore has no
/// gate).
async fn holds(
    conn: &mut Conn,
    key: &LockKey,
    permits: Option<u32>,
    only: &Only,
) -> Result<(Option<GateHold>, Vec<RowHold>), EngineError> {
    let gated = match permits {
        None => gate_hold(conn, key).await?,
        Some(_) => None,
    };
    let gated = gated.filter(|hold| only.admits(Some(hold.fence), Some(&hold.owner)));
    let mut rows = row_holds(conn, key, permits).await?;
    rows.retain(|row| only.admits(Some(row.fence), digest(&row.owner).as_deref()));
    Ok((gated, rows))
}

/// Whether `req`'s hold was forced out: one round trip.
pub(super) async fn forced_out(pool: &Pool, req: &Request) -> Result<bool, EngineError> {
    let mut conn = pool.get_conn().await.map_err(EngineError::failed)?;
    let params = (key_and_name(&req.key).0, req.owner.digest());
    let forced: Option<u8> = conn
        .exec_first(sql::forced_out(), params)
        .await
        .map_err(EngineError::failed)?;
    Ok(forced == Some(1))
}

/// The write hold taken at once on `key`, if its session holds the gate
/// and it wrote its record; once more after [`RECORD_WAIT`] if the gate is
/// held with no record.
async fn gate_hold(conn: &mut Conn, key: &LockKey) -> Result<Option<GateHold>, EngineError> {
    let gate = gate::name(key);
    let mut waited = false;
    loop {
        type Columns = (Option<u64>, Option<u64>, Option<String>, Option<u64>, Option<u64>);
        let row: Option<Columns> = conn
            .exec_first(sql::GATE_HOLD, (&gate, &gate))
            .await
            .map_err(EngineError::failed)?;
        match row {
            Some((Some(_), Some(conn), Some(owner), Some(lease_micros), Some(fence))) => {
                return Ok(Some(GateHold {
                    conn,
                    owner,
                    lease_micros,
                    fence,
                }));
            }
            Some((Some(_), ..)) if !waited => {
                waited = true;
                tokio::time::sleep(RECORD_WAIT).await;
            }
            _ => return Ok(None),
        }
    }
}

/// The live holds through the table of the lock `key`, or with `permits`
/// of the semaphore's rows of that count.
async fn row_holds(
    conn: &mut Conn,
    key: &LockKey,
    permits: Option<u32>,
) -> Result<Vec<RowHold>, EngineError> {
    let (lock_key, name) = match permits {
        None => key_and_name(key),
        Some(count) => {
            let range = Range::of(key, count);
            (range.key, range.name)
        }
    };
    let rows: Vec<(Vec<u8>, i64, u64)> = conn
        .exec(sql::holds(), (lock_key, name))
        .await
        .map_err(EngineError::failed)?;
    let holds = rows.into_iter().map(|(owner, left_micros, fence)| RowHold {
        owner,
        left_micros,
        fence,
    });
    Ok(holds.collect())
}
