//! Who holds and who waits, from `pg_locks` joined with the record table.
//!
//! The server's lock table is the truth: a hold or a wait shows while
//! `pg_locks` has its session on its key, and its row adds the fence, the
//! owner digest, the label and the time granted. A hold taken at once
//! writes its row only once it has lasted `kit::RECORD_AFTER` (`conn.rs`),
//! so readers wait [`RECORD_WAIT`] for younger holds: `inspect` when it
//! sees a hold with no row, `list` always, since a hold with no row cannot
//! be found by group. A row whose session no longer holds or waits is
//! ignored: the session ended (its rows are swept when a connection opens)
//! or the row is being deleted by an unlock.
//!
//! What cannot show: requests lined up inside a process (the pool's
//! `Stage::Lined`), which have no session in the server's queue yet; and,
//! in a listing, holds with no row (another client's), whose name the
//! advisory key's hash does not give back. The waiters' order is the time
//! they joined: PostgreSQL does not expose its queue's.

use std::collections::BTreeMap;
use std::time::SystemTime;

use dlock_core::kit::{EngineError, RECORD_WAIT};
use dlock_core::{HolderRecord, LockKey, LockView, Mode, WaiterRecord};
use tokio_postgres::Row;

use super::advisory_key;
use super::permits::Keys;
use super::pool::Pool;
use super::server::failed;

/// One lock or wait in `pg_locks`, with its row's fields if it has one.
struct Seen {
    key: i64,
    granted: bool,
    mode: Mode,
    /// Only once its row records the grant: a waiting request's row has none.
    fence: Option<u64>,
    owner: Option<String>,
    since: Option<SystemTime>,
    name: Option<String>,
    permits: Option<u32>,
    label: Option<String>,
}

impl Seen {
    /// The columns of the `inspect` and `list` statements.
    fn read(row: &Row) -> Result<Seen, tokio_postgres::Error> {
        Ok(Seen {
            key: row.try_get(0)?,
            granted: row.try_get(1)?,
            mode: if row.try_get(2)? { Mode::Read } else { Mode::Write },
            fence: row.try_get::<_, Option<i64>>(3)?.map(|f| f as u64),
            owner: row.try_get(4)?,
            since: row.try_get(5)?,
            name: row.try_get(6)?,
            permits: row.try_get::<_, Option<i32>>(7)?.map(|n| n as u32),
            label: row.try_get(8)?,
        })
    }

    fn holder(self) -> HolderRecord {
        let granted = self.fence.is_some();
        HolderRecord {
            label: self.label,
            mode: self.mode,
            fence: self.fence,
            since: self.since.filter(|_| granted),
            // The hold ends with its session; the session's idle timeout
            // is not visible to others.
            lease_ends: None,
            owner: self.owner,
            ..HolderRecord::default()
        }
    }

    fn waiter(self) -> WaiterRecord {
        WaiterRecord {
            label: self.label,
            mode: self.mode,
            since: self.since,
            owner: self.owner,
        }
    }
}

/// Lock or semaphore `key`, in one statement, or two if a hold has no row
/// yet: a hold still with none after [`RECORD_WAIT`] writes none (another
/// client's).
pub(super) async fn inspect(
    pool: &Pool,
    key: &LockKey,
    permits: Option<u32>,
) -> Result<LockView, EngineError> {
    let (keys, semaphore) = match permits {
        None => (vec![advisory_key(key)], None),
        Some(count) => {
            let keys = Keys::of(key);
            let slots = (0..count).map(|slot| keys.slot(slot));
            (std::iter::once(keys.turnstile).chain(slots).collect(), Some(keys))
        }
    };
    let mut waited = false;
    loop {
        let rows = pool.all(|s| &s.inspect, &[&keys]).await?;
        let seen = rows
            .iter()
            .map(Seen::read)
            .collect::<Result<Vec<_>, _>>()
            .map_err(failed)?;
        if !waited && seen.iter().any(|s| s.granted && s.fence.is_none()) {
            waited = true;
            tokio::time::sleep(RECORD_WAIT).await;
            continue;
        }
        return Ok(view(key.group(), key.name(), permits, semaphore.as_ref(), seen));
    }
}

/// Every lock and semaphore of `group` that someone holds or waits for,
/// in one statement, once holds taken just before have written their rows.
pub(super) async fn list(pool: &Pool, group: &str) -> Result<Vec<LockView>, EngineError> {
    tokio::time::sleep(RECORD_WAIT).await;
    let rows = pool.all(|s| &s.list, &[&group]).await?;
    let mut by_lock: BTreeMap<(String, Option<u32>), Vec<Seen>> = BTreeMap::new();
    for row in &rows {
        let seen = Seen::read(row).map_err(failed)?;
        let lock = (seen.name.clone().unwrap_or_default(), seen.permits);
        by_lock.entry(lock).or_default().push(seen);
    }
    let views = by_lock.into_iter().map(|((name, permits), seen)| {
        // A row's group and name made a key once, so they make one again.
        let keys = permits.and_then(|_| Some(Keys::of(&LockKey::new(group, name.as_str()).ok()?)));
        view(group, &name, permits, keys.as_ref(), seen)
    });
    Ok(views.collect())
}

/// The view of one lock from its locks in `pg_locks`, holders first, then
/// waiters in the order they joined. A semaphore (`keys`) holds its slots'
/// locks, each holder's slot the one its key is; its turnstile is its
/// line: its holder waits for a slot, first.
fn view(group: &str, name: &str, permits: Option<u32>, keys: Option<&Keys>, seen: Vec<Seen>) -> LockView {
    let turnstile = keys.map(|keys| keys.turnstile);
    let slot_of = |key: i64| {
        let keys = keys?;
        (0..permits?).find(|&slot| keys.slot(slot) == key)
    };
    let mut view = LockView {
        group: group.to_owned(),
        name: name.to_owned(),
        permits,
        holders: Vec::new(),
        waiters: Vec::new(),
    };
    for seen in seen {
        if seen.granted && Some(seen.key) != turnstile {
            let slot = slot_of(seen.key);
            view.holders.push(HolderRecord {
                slot,
                ..seen.holder()
            });
        } else {
            view.waiters.push(seen.waiter());
        }
    }
    view
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seen(key: i64, granted: bool, fence: Option<u64>) -> Seen {
        Seen {
            key,
            granted,
            mode: Mode::Write,
            fence,
            owner: Some("0badcafe".to_owned()),
            since: Some(SystemTime::UNIX_EPOCH),
            name: Some("n".to_owned()),
            permits: Some(2),
            label: Some("app".to_owned()),
        }
    }

    #[test]
    fn a_semaphores_turnstile_is_its_line_and_a_grant_without_its_row_has_no_fence_or_time() {
        let keys = Keys::of(&LockKey::new("g", "n").unwrap());
        let seen = vec![
            seen(keys.slot(1), true, Some(7)),
            seen(keys.turnstile, true, Some(5)),
            seen(keys.slot(0), true, None),
            seen(keys.turnstile, false, None),
        ];
        let view = view("g", "n", Some(2), Some(&keys), seen);
        assert_eq!(view.holders.len(), 2, "{view:?}");
        assert_eq!(
            (view.holders[0].fence, view.holders[0].since, view.holders[0].slot),
            (Some(7), Some(SystemTime::UNIX_EPOCH), Some(1))
        );
        assert_eq!(
            (view.holders[1].fence, view.holders[1].since, view.holders[1].slot),
            (None, None, Some(0))
        );
        assert_eq!(
            view.waiters.len(),
            2,
            "the turnstile's holder, then its waiter: {view:?}"
        );
    }
}
