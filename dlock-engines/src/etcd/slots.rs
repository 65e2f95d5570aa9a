//! A permit's slot. Once admitted, a permit holder puts the key
//! `<lock path>%slots/<i>` (`0 <= i < count`) on its session's lease,
//! valued with its own key's name. A slot is free when its key is absent,
//! or names a key that is no longer among the first `count` (a holder
//! forced out, whose slot key lives on with its lease): a claim compares
//! the slot key's revision, so two holders never take one slot. The slot
//! key goes with its holder's key, in its release's transaction or with
//! its lease. The fence stays the holder's key's create revision, which
//! rises across a slot's holders as it does across the lock's.
//!
//! A request puts slot 0's key, if absent, in the transaction that puts
//! its own key ([`first`]): admitted by that transaction's read, it holds
//! slot 0 with no round trip more (no reader takes a slot naming a key
//! among the first `count`). Put by a waiter, the slot is free to others
//! by the rule above, and the waiter, once admitted, keeps it only if it
//! still names its key.

use std::collections::HashSet;

use dlock_core::kit::EngineError;
use etcd_client::{
    Compare, CompareOp, GetOptions, KeyValue, PutOptions, SortOrder, SortTarget, Txn, TxnOp, TxnOpResponse,
    TxnResponse,
};

use super::gets;
use super::session::Session;

/// Claims tried before giving up: each lost one names a slot free at a
/// revision after the one that beat it.
const ATTEMPTS: usize = 8;

/// Where a semaphore's slot keys live, beside its line (`<path>%permits/`).
pub(crate) fn prefix(path: &str) -> String {
    format!("{path}%slots/")
}

/// The operation that puts slot 0's key under `slots` for `key`, if
/// absent, beside the put of `key` on `lease`.
pub(crate) fn first(slots: &str, key: &str, lease: i64) -> TxnOp {
    let slot = format!("{slots}0");
    TxnOp::txn(
        Txn::new()
            .when([Compare::create_revision(slot.as_str(), CompareOp::Equal, 0)])
            .and_then([TxnOp::put(slot, key, Some(PutOptions::new().with_lease(lease)))]),
    )
}

/// Whether [`first`] put the slot, from the answer it was part of.
pub(crate) fn put_first(answer: &TxnResponse) -> bool {
    answer.op_responses().into_iter().any(|op| match op {
        TxnOpResponse::Txn(inner) => inner.succeeded(),
        _ => false,
    })
}

/// What a claim compares: a slot's key absent, found stale at a revision,
/// or naming this request's key already.
enum Target {
    Absent(u32),
    Stale(u32, i64),
    Ours(u32),
}

/// The admitted holder `key`, created at `created`, on a semaphore of
/// `count` whose line is under `line`: takes a free slot under `slots`,
/// first checking `ours` (a slot it put as it queued), else trying
/// `guess`. `None`: its key is gone.
pub(crate) async fn claim(
    session: &Session,
    slots: &str,
    line: &str,
    (key, created): (&str, i64),
    count: u32,
    (ours, guess): (Option<u32>, u32),
) -> Result<Option<u32>, EngineError> {
    let mut target = match ours {
        Some(slot) => Target::Ours(slot),
        None => Target::Absent(guess.min(count.saturating_sub(1))),
    };
    let first_count = GetOptions::new()
        .with_prefix()
        .with_sort(SortTarget::Create, SortOrder::Ascend)
        .with_limit(i64::from(count));
    for _ in 0..ATTEMPTS {
        let (slot, free) = match target {
            Target::Absent(slot) => (
                slot,
                Compare::create_revision(format!("{slots}{slot}"), CompareOp::Equal, 0),
            ),
            Target::Stale(slot, seen) => (
                slot,
                Compare::mod_revision(format!("{slots}{slot}"), CompareOp::Equal, seen),
            ),
            Target::Ours(slot) => (
                slot,
                Compare::value(format!("{slots}{slot}"), CompareOp::Equal, key),
            ),
        };
        let take = TxnOp::put(
            format!("{slots}{slot}"),
            key,
            Some(PutOptions::new().with_lease(session.lease)),
        );
        let txn = Txn::new()
            .when([Compare::create_revision(key, CompareOp::Equal, created), free])
            .and_then(match target {
                Target::Ours(_) => Vec::new(),
                _ => vec![take],
            })
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
fn free_slot(slots: &str, count: u32, taken: &[KeyValue], holders: &HashSet<Vec<u8>>) -> Option<Target> {
    (0..count).find_map(
        |slot| match taken.iter().find(|kv| number(slots, kv) == Some(slot)) {
            None => Some(Target::Absent(slot)),
            Some(kv) if !holders.contains(kv.value()) => Some(Target::Stale(slot, kv.mod_revision())),
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
