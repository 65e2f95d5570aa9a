//! A permit's slot. Once admitted, a permit holder puts the key
//! `<lock path>%slots/<i>` (`0 <= i < count`) on its session's lease,
//! valued with its own key's name. A slot is free when its key is absent,
//! or names a key that is no longer among the first `count` (a holder
//! forced out, whose slot key lives on with its lease): a claim compares
//! the slot key's revision, so two holders never take one slot. The slot
//! key goes with its holder's key, in its release's transaction or with
//! its lease. The fence stays the holder's key's create revision, which
//! rises across a slot's holders as it does across the lock's.

use std::collections::HashSet;

use dlock_core::kit::EngineError;
use etcd_client::{Compare, CompareOp, GetOptions, KeyValue, PutOptions, SortOrder, SortTarget, Txn, TxnOp};

use super::gets;
use super::session::Session;

/// Claims tried before giving up: each lost one names a slot free at a
/// revision after the one that beat it.
const ATTEMPTS: usize = 8;

/// Where a semaphore's slot keys live, beside its line (`<path>%permits/`).
pub(crate) fn prefix(path: &str) -> String {
    format!("{path}%slots/")
}

/// The admitted holder `key`, created at `created`, on a semaphore of
/// `count` whose line is under `line`: takes a free slot under `slots`,
/// trying `guess` first. `None`: its key is gone.
pub(crate) async fn claim(
    session: &Session,
    slots: &str,
    line: &str,
    (key, created): (&str, i64),
    count: u32,
    guess: u32,
) -> Result<Option<u32>, EngineError> {
    // The slot to claim, and its key's revision when found stale (`None`: absent).
    let mut target = (guess.min(count.saturating_sub(1)), None);
    let first_count = GetOptions::new()
        .with_prefix()
        .with_sort(SortTarget::Create, SortOrder::Ascend)
        .with_limit(i64::from(count));
    for _ in 0..ATTEMPTS {
        let (slot, seen) = target;
        let slot_key = format!("{slots}{slot}");
        let free = match seen {
            None => Compare::create_revision(slot_key.as_str(), CompareOp::Equal, 0),
            Some(revision) => Compare::mod_revision(slot_key.as_str(), CompareOp::Equal, revision),
        };
        let txn = Txn::new()
            .when([Compare::create_revision(key, CompareOp::Equal, created), free])
            .and_then([TxnOp::put(
                slot_key.as_str(),
                key,
                Some(PutOptions::new().with_lease(session.lease)),
            )])
            .or_else([
                TxnOp::get(key, None),
                TxnOp::get(slots, Some(GetOptions::new().with_prefix())),
                TxnOp::get(line, Some(first_count.clone())),
            ]);
        let answer = session.txn(txn).await?;
        if answer.succeeded() {
            return Ok(Some(slot));
        }
        let [mut mine, mut taken, mut holders] = <[_; 3]>::try_from(gets(answer))
            .map_err(|_| EngineError::failed("etcd answered other than three reads"))?;
        if mine
            .take_kvs()
            .first()
            .is_none_or(|kv| kv.create_revision() != created)
        {
            return Ok(None);
        }
        let holders: HashSet<Vec<u8>> = holders
            .take_kvs()
            .into_iter()
            .map(|kv| kv.key().to_vec())
            .collect();
        let taken = taken.take_kvs();
        // A claim whose answer was lost, then repeated: ours already.
        if let Some(slot) = taken
            .iter()
            .find(|kv| kv.value() == key.as_bytes())
            .and_then(|kv| number(slots, kv))
        {
            return Ok(Some(slot));
        }
        target = free_slot(slots, count, &taken, &holders)
            .ok_or_else(|| EngineError::failed(format!("no free slot among {count} permits")))?;
    }
    Err(EngineError::failed("slot claims kept colliding"))
}

/// The lowest slot free in `taken`: absent, or (with its key's revision)
/// naming a key not among `holders`.
fn free_slot(
    slots: &str,
    count: u32,
    taken: &[KeyValue],
    holders: &HashSet<Vec<u8>>,
) -> Option<(u32, Option<i64>)> {
    (0..count).find_map(
        |slot| match taken.iter().find(|kv| number(slots, kv) == Some(slot)) {
            None => Some((slot, None)),
            Some(kv) if !holders.contains(kv.value()) => Some((slot, Some(kv.mod_revision()))),
            Some(_) => None,
        },
    )
}

/// The slot a slot key under `slots` names.
pub(crate) fn number(slots: &str, kv: &KeyValue) -> Option<u32> {
    kv.key()
        .strip_prefix(slots.as_bytes())
        .and_then(|n| std::str::from_utf8(n).ok()?.parse().ok())
}

/// The slot each holder key has, from the slot keys under `slots`.
pub(crate) fn of_holders<'a>(slots: &'a str, taken: &'a [KeyValue]) -> impl Fn(&[u8]) -> Option<u32> + 'a {
    move |holder| {
        taken
            .iter()
            .find(|kv| kv.value() == holder)
            .and_then(|kv| number(slots, kv))
    }
}
