//! An operator's control of a lock, or of a permit (its slot's advisory
//! lock, with a row as a lock's hold has): force release and revocation.
//!
//! No session can unlock another's advisory lock, and holds share
//! sessions (`pool.rs`), so ending a holder's session could end other
//! locks' holds too. So force release first leaves word for each holder,
//! in `dlock_forced`, that it is forced out (until its lease would have
//! ended), then ends the session of each holder that holds nothing else,
//! which frees the lock at once. A holder whose session holds other locks
//! learns it at its next renewal, and lets go then: its lock is free a
//! third of a lease later, and its other holds go on.
//!
//! A revocation marks the holds' rows in `dlock_holds`; the renewal reads
//! the mark. Both reach a hold through its row, so a hold too young to
//! have written one ([`RECORD_AFTER`](dlock_core::kit::RECORD_AFTER)) is
//! waited for, as records are. A hold with no row even then (another
//! client's) is neither asked nor forced out.

use dlock_core::Only;
use dlock_core::kit::{EngineError, OwnerId, RECORD_WAIT};
use tokio_postgres::Statement;

use super::pool::Pool;
use super::sql::Statements;

/// Marks the holders of advisory key `key` that `only` admits revoked: one round trip,
/// two if a hold is too young to have its row.
pub(super) async fn revoke(pool: &Pool, key: i64, only: &Only) -> Result<u32, EngineError> {
    each_holder(pool, key, only, |s| &s.revoke).await
}

/// Forces the holders of advisory key `key` (a lock's, or a permit
/// slot's) that `only` admits out: a round trip to
/// leave word (two if a hold is too young to have its row), one to end the
/// sessions that hold nothing else. The holds forced out, whether ended
/// now or at their holder's next renewal. Each statement picks holds by
/// their rows as it runs, so a hold that came in since is not admitted.
pub(super) async fn force_release(pool: &Pool, key: i64, only: &Only) -> Result<u32, EngineError> {
    let forced = each_holder(pool, key, only, |s| &s.force).await?;
    if forced > 0 {
        pool.one(|s| &s.end_forced, &[&key]).await?;
    }
    Ok(forced)
}

/// Whether the hold of `owner` on advisory key `key` was forced out: one
/// round trip.
pub(super) async fn forced_out(pool: &Pool, key: i64, owner: OwnerId) -> Result<bool, EngineError> {
    Ok(pool
        .one(|s| &s.forced_out, &[&key, &owner.digest()])
        .await?
        .get(0))
}

/// Runs `pick`'s statement, which does its work on each holder of `key`
/// with a row that `only` admits and answers how many, and how many
/// holders there are; once more after [`RECORD_WAIT`] if some had no row
/// and every hold was meant (a hold with no row yet was never shown, so
/// no fence or owner names it). It must be harmless to run twice.
async fn each_holder(
    pool: &Pool,
    key: i64,
    only: &Only,
    pick: fn(&Statements) -> &Statement,
) -> Result<u32, EngineError> {
    let fence = only.fence.map(|fence| fence as i64);
    let mut waited = !only.is_any();
    loop {
        let row = pool.one(pick, &[&key, &fence, &only.owner]).await?;
        let (done, holders): (i64, i64) = (row.get(0), row.get(1));
        if done < holders && !waited {
            waited = true;
            tokio::time::sleep(RECORD_WAIT).await;
            continue;
        }
        return Ok(done as u32);
    }
}
