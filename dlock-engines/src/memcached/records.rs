//! Records. A hold's item value carries its owner, when it was granted and
//! the process's label (see `item_value`), and memcached tells the seconds
//! it has left: one round trip reads a lock's item, or a semaphore's count
//! and slots. The fence is not there: it is taken after the item is
//! written, in the same round trip. memcached keeps no queue, so no
//! waiters show, and it cannot list its keys short of walking the whole
//! cache (`lru_crawler metadump`), so there is no listing.

use std::fmt::Write as _;
use std::time::{Duration, SystemTime};

use dlock_core::kit::EngineError;
use dlock_core::{HolderRecord, LockKey, LockView, Mode};

use super::permits::{base_key, count_of};
use super::{MemcachedEngine, item_key, owner_of};

pub(super) async fn inspect(
    engine: &MemcachedEngine,
    key: &LockKey,
    permits: Option<u32>,
) -> Result<LockView, EngineError> {
    let holders = match permits {
        None => holders(engine, &[item_key(key)]).await?,
        Some(n) => return semaphore(engine, key, n).await,
    };
    Ok(view(key, None, holders))
}

/// A semaphore's slots, read for the count its items agree on: the one
/// asked for, unless the count item says another.
async fn semaphore(engine: &MemcachedEngine, key: &LockKey, asked: u32) -> Result<LockView, EngineError> {
    let base = base_key(key);
    let command = format!("mg {base}#n v\r\n");
    let count = engine.call(command.as_bytes(), 1).await?.remove(0);
    let n = count.value.as_deref().and_then(count_of).unwrap_or(asked);
    let slots: Vec<String> = (0..n).map(|slot| format!("{base}#{slot}")).collect();
    let mut holders = holders(engine, &slots).await?;
    for (slot, holder) in &mut holders {
        holder.slot = Some(*slot as u32);
    }
    Ok(view(key, Some(n), holders))
}

/// The holders of `items`, in one round trip, each with its item's place
/// in `items`.
async fn holders(
    engine: &MemcachedEngine,
    items: &[String],
) -> Result<Vec<(usize, HolderRecord)>, EngineError> {
    let mut command = String::new();
    for item in items {
        let _ = write!(command, "mg {item} v t\r\n");
    }
    let replies = engine.call(command.as_bytes(), items.len()).await?;
    let now = SystemTime::now();
    Ok(replies
        .iter()
        .enumerate()
        .filter_map(|(place, found)| {
            let left = found.flag('t').and_then(|t| t.parse().ok());
            Some((place, holder(found.value.as_deref()?, left, now)))
        })
        .collect())
}

fn view(key: &LockKey, permits: Option<u32>, holders: Vec<(usize, HolderRecord)>) -> LockView {
    LockView {
        group: key.group().to_owned(),
        name: key.name().to_owned(),
        permits,
        holders: holders.into_iter().map(|(_, holder)| holder).collect(),
        waiters: Vec::new(),
    }
}

/// The record of an item valued `value` with `left` seconds to live (none
/// if it has no end); a field its value does not tell is `None`.
fn holder(value: &[u8], left: Option<u64>, now: SystemTime) -> HolderRecord {
    let head = value.split(|b| *b == 0).next().unwrap_or_default();
    let mut fields = std::str::from_utf8(head)
        .unwrap_or_default()
        .splitn(3, ' ')
        .skip(1);
    let since = fields
        .next()
        .and_then(|ms| ms.parse().ok())
        .map(|ms| SystemTime::UNIX_EPOCH + Duration::from_millis(ms));
    HolderRecord {
        label: fields.next().map(str::to_owned),
        mode: Mode::Write,
        fence: None,
        since,
        // The item's end: when the lock is free unless renewed.
        lease_ends: left.map(|left| now + Duration::from_secs(left)),
        owner: owner_of(value).map(|owner| owner.digest()),
        ..HolderRecord::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use dlock_core::kit::Request;

    #[test]
    fn a_record_reads_back_what_the_value_carries_and_no_owner_id() {
        let req = Request::new(
            LockKey::new("g", "n\0odd").unwrap(),
            Mode::Write,
            Duration::from_secs(5),
        );
        let value = super::super::item_value(&req, "billing host:42");
        let now = SystemTime::now();
        let record = holder(&value, Some(7), now);
        assert_eq!(record.label.as_deref(), Some("billing host:42"));
        assert_eq!(record.owner, Some(req.owner.digest()));
        assert_eq!(record.lease_ends, Some(now + Duration::from_secs(7)));
        let since = record.since.expect("since");
        assert!(since <= now && since + Duration::from_secs(5) > now, "{since:?}");
        assert!(!format!("{record:?}").contains(&req.owner.to_string()));
        let foreign = holder(b"not dlock's", None, now);
        assert_eq!(
            (foreign.label, foreign.owner, foreign.lease_ends),
            (None, None, None)
        );
    }
}
