//! Holder records on RedLock: each master's copy of a hold is its record,
//! `<owner> <token> <since> <label>` (see `scripts/take.lua`), and a hold
//! shows where a majority of masters agree on its owner.

use std::time::{Duration, SystemTime};

use dlock_core::kit::OwnerId;
use dlock_core::{HolderRecord, LockKey, LockView, Mode, Only};

use super::permits::per_slot;

/// What `scripts/records.lua` returned on one master: its count, then each
/// key's value and PTTL; `None` from a master that did not answer.
pub(super) type Reply = Option<Vec<String>>;

/// The view of `key` from every master's reply, read at `read_at`.
pub(super) fn view(
    key: &LockKey,
    permits: Option<u32>,
    replies: &[Reply],
    quorum: usize,
    read_at: SystemTime,
) -> LockView {
    // The count a majority keeps, else the one asked about.
    let counts = replies
        .iter()
        .flatten()
        .filter_map(|r| r.first()?.parse::<u32>().ok());
    let count = permits.map(|asked| agreed(counts.collect(), quorum).unwrap_or(asked));
    let slots = 0..count.unwrap_or(1);
    let holders = slots
        .filter_map(|slot| slot_hold(replies, quorum, read_at, slot, count).map(|(_, holder)| holder))
        .collect();
    LockView {
        group: key.group().to_owned(),
        name: key.name().to_owned(),
        permits: count,
        holders,
        waiters: Vec::new(),
    }
}

/// One key's value and PTTL on one master, if the key is there.
fn copy(reply: &[String], slot: usize) -> Option<(&str, u64)> {
    let value = reply.get(1 + 2 * slot)?;
    let ttl = reply.get(2 + 2 * slot)?.parse::<u64>().ok()?;
    (!value.is_empty()).then_some((value.as_str(), ttl))
}

/// The hold a majority of masters agree on in `replies` of slot `slot` of
/// a semaphore of `count` (of a lock, `None`, its one key): its owner id
/// (in hex), and its record, with the permit's slot and per-slot fence.
fn slot_hold(
    replies: &[Reply],
    quorum: usize,
    read_at: SystemTime,
    slot: u32,
    count: Option<u32>,
) -> Option<(&str, HolderRecord)> {
    let copies = replies.iter().flatten().filter_map(|r| copy(r, slot as usize));
    let (owner, mut holder) = hold(copies.collect(), quorum, read_at)?;
    holder.slot = count.map(|_| slot);
    if let (Some(count), Some(token)) = (count, holder.fence) {
        holder.fence = Some(per_slot(token, slot, count));
    }
    Some((owner, holder))
}

/// The holds that `only` admits in `replies`, of a lock, or of a
/// semaphore of `count`: each one's slot (0 for a lock) and owner id.
pub(super) fn admitted<'r>(
    replies: &'r [Reply],
    quorum: usize,
    count: Option<u32>,
    only: &Only,
) -> Vec<(u32, &'r str)> {
    let read_at = SystemTime::now();
    let holds = (0..count.unwrap_or(1)).filter_map(|slot| {
        let (owner, holder) = slot_hold(replies, quorum, read_at, slot, count)?;
        only.admits_record(&holder).then_some((slot, owner))
    });
    holds.collect()
}

/// The hold a majority of copies agree on: its owner id, and its record:
/// its owner's, with the token a
/// majority of them name (the quorum's, as granted or written back; see
/// `token`), and a lease that ends when the last copy of that majority
/// does.
fn hold(copies: Vec<(&str, u64)>, quorum: usize, read_at: SystemTime) -> Option<(&str, HolderRecord)> {
    let owner = agreed(copies.iter().map(|(value, _)| value.get(..32)).collect(), quorum)??;
    let mine: Vec<(Vec<&str>, u64)> = copies
        .iter()
        .filter(|(value, _)| value.get(..32) == Some(owner))
        .map(|(value, ttl)| (value.splitn(4, ' ').collect(), *ttl))
        .collect();
    let field = |i: usize| mine.iter().find_map(|(fields, _)| fields.get(i).copied());
    let tokens = mine
        .iter()
        .map(|(fields, _)| fields.get(1).and_then(|t| t.parse::<u64>().ok()));
    let fence = agreed(tokens.collect(), quorum).flatten();
    let mut ttls: Vec<u64> = mine.iter().map(|(_, ttl)| *ttl).collect();
    ttls.sort_unstable_by(|a, b| b.cmp(a));
    let record = HolderRecord {
        label: field(3).filter(|l| !l.is_empty()).map(str::to_owned),
        mode: Mode::Write,
        // 0: a hold taken without the fence.
        fence: fence.filter(|&f| f > 0),
        since: field(2)
            .and_then(|ms| u64::from_str_radix(ms, 16).ok())
            .map(|ms| SystemTime::UNIX_EPOCH + Duration::from_millis(ms)),
        lease_ends: ttls
            .get(quorum - 1)
            .map(|&ttl| read_at + Duration::from_millis(ttl)),
        owner: u128::from_str_radix(owner, 16)
            .ok()
            .map(|id| OwnerId::from_u128(id).digest()),
        ..HolderRecord::default()
    };
    Some((owner, record))
}

/// The value at least `quorum` of `values` have.
fn agreed<T: PartialEq + Copy>(values: Vec<T>, quorum: usize) -> Option<T> {
    values
        .iter()
        .copied()
        .find(|v| values.iter().filter(|w| *w == v).count() >= quorum)
}
