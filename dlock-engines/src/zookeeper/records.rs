//! Holder records: what a lock's or a semaphore's nodes say about who
//! holds and who waits.
//!
//! A dlock lock node's data is `dlock <label>`, written at create and
//! otherwise only put back by its holder over a revocation: Curator's
//! revocation writes `__REVOKE__` into a contender's data (`control.rs`),
//! which a blind rewrite could erase. A downgrade's read node adds the fence of
//! the write node it replaces, `dlock <label>\tfence=<n>`: its own czxid is
//! the swap's, not the guard's fence. A label has no control characters,
//! so the first tab ends it, spaces and all; more `\t<field>=<value>` may
//! follow. Semaphore nodes carry their count first (`permits.rs`).
//!
//! An election's node, named as a Curator `LeaderLatch` participant's,
//! holds the proposal alone (dlock's label, a `LeaderLatch`'s id), shown
//! as its label, with no owner.
//!
//! A node with other data (Curator writes its address; dlock before
//! records wrote nothing) shows no label and no owner, though its name
//! carries a UUID: Curator's is random per node, and telling an older
//! dlock's from it takes the data. Its fence and since are its stat's.
//!
//! A node revoked and not yet written back shows no label and no owner;
//! a read node, no fence either: a downgrade's carried one is gone, and
//! its czxid would say more than the guard's.
//!
//! The fence is the node's czxid, as the engine hands it out; since is its
//! ctime on the leader's clock: when it joined the line, which is when it
//! was granted only if nobody was ahead. A hold lasts as long as its
//! session, so no lease ends.

use std::time::{Duration, SystemTime};

use dlock_core::{HolderRecord, LockKey, LockView, Mode, Only, WaiterRecord};
use zookeeper_client::Stat;

use super::nodes;
use super::permits;

/// How a dlock lock node's data starts; the label follows.
const DATA: &str = "dlock ";

/// Curator's revocation message (`LockInternals.REVOKE_MESSAGE`), the
/// whole of a node's data; no record is ever so.
pub(super) const REVOKE: &[u8] = b"__REVOKE__";

/// A lock node's data: this process's label, and for a downgrade's read
/// node the guard's fence.
pub(super) fn data(label: &str, fence: Option<u64>) -> Vec<u8> {
    match fence {
        Some(fence) => format!("{DATA}{label}\tfence={fence}"),
        None => format!("{DATA}{label}"),
    }
    .into_bytes()
}

/// The label and any carried fence in a lock node's data; `None` for a
/// node dlock did not write so.
fn written(data: &[u8]) -> Option<(&str, Option<u64>)> {
    let text = std::str::from_utf8(data).ok()?.strip_prefix(DATA)?;
    let Some((label, fields)) = text.split_once('\t') else {
        return Some((text, None));
    };
    let fence = fields
        .split('\t')
        .find_map(|field| field.strip_prefix("fence=")?.parse().ok());
    Some((label, fence))
}

/// One node as read back: its name, data and stat.
pub(super) struct Found {
    pub name: String,
    pub data: Vec<u8>,
    /// Its czxid.
    pub fence: u64,
    /// Its ctime.
    pub since: SystemTime,
}

impl Found {
    pub fn new(name: String, data: Vec<u8>, stat: &Stat) -> Self {
        Found {
            name,
            data,
            fence: stat.czxid as u64,
            since: SystemTime::UNIX_EPOCH + Duration::from_millis(stat.ctime.max(0) as u64),
        }
    }
}

fn empty(key: &LockKey, permits: Option<u32>) -> LockView {
    LockView {
        group: key.group().to_owned(),
        name: key.name().to_owned(),
        permits,
        holders: Vec::new(),
        waiters: Vec::new(),
    }
}

/// A read/write lock from its nodes: holders and waiters in line order.
pub(super) fn lock_view(key: &LockKey, found: &[Found]) -> LockView {
    let names: Vec<String> = found.iter().map(|f| f.name.clone()).collect();
    let mut view = empty(key, None);
    for place in nodes::line(&names) {
        let node = &found[place.at];
        let written = written(&node.data);
        let label = match written {
            Some((label, _)) => Some(label.to_owned()),
            None if nodes::is_latch(&node.name) => proposal(&node.data),
            None => None,
        };
        let owner = written.and_then(|_| nodes::owner_digest(&node.name));
        if place.held {
            let fence = match written {
                Some((_, Some(carried))) => Some(carried),
                _ if place.mode == Mode::Read && node.data == REVOKE => None,
                _ => Some(node.fence),
            };
            view.holders.push(HolderRecord {
                label,
                mode: place.mode,
                fence,
                since: Some(node.since),
                lease_ends: None,
                owner,
                ..HolderRecord::default()
            });
        } else {
            view.waiters.push(WaiterRecord {
                label,
                mode: place.mode,
                since: Some(node.since),
                owner,
            });
        }
    }
    view
}

/// The names of the holding nodes among `found`, a lock's, whose records
/// `only` admits.
pub(super) fn admitted<'f>(key: &LockKey, found: &'f [Found], only: &Only) -> Vec<&'f str> {
    let names: Vec<String> = found.iter().map(|f| f.name.clone()).collect();
    let held = nodes::line(&names).into_iter().filter(|place| place.held);
    let records = lock_view(key, found).holders;
    let pairs = held.zip(records).filter(|(_, record)| only.admits_record(record));
    pairs.map(|(place, _)| found[place.at].name.as_str()).collect()
}

/// A `LeaderLatch` participant's id, dlock's label, as its label: text
/// that could be a label, and not a revocation.
fn proposal(data: &[u8]) -> Option<String> {
    let text = std::str::from_utf8(data).ok()?;
    let label = !text.is_empty() && !text.contains(char::is_control) && data != REVOKE;
    label.then(|| text.to_owned())
}

/// A semaphore's count as its dlock nodes tell it; `None` if only Curator
/// uses it.
pub(super) fn count_of(leases: &[Found], locks: &[Found]) -> Option<u32> {
    leases
        .iter()
        .chain(locks)
        .find_map(|f| permits::written(&f.data))
        .map(|(count, _)| count)
}

/// A semaphore of `count` from its leases and its mutex line. A lease is
/// held, but for the mutex holder's while the leases outnumber the count:
/// that one waits. Waiting are the mutex line, less the holders whose node
/// in it is still being deleted (known by their UUID: Curator's lease has
/// another than its mutex node, and shows as waiting till it is gone).
pub(super) fn semaphore_view(
    key: &LockKey,
    count: u32,
    mut leases: Vec<Found>,
    mut locks: Vec<Found>,
) -> LockView {
    leases.sort_by_key(|f| nodes::semaphore_order(&f.name, true));
    locks.sort_by_key(|f| nodes::semaphore_order(&f.name, false));
    let held = held_leases(count, &leases, &locks);
    let holds = |f: &Found| {
        let ours = nodes::protection(&f.name);
        ours.is_some() && held.iter().any(|h| nodes::protection(&h.name) == ours)
    };
    let mut view = empty(key, Some(count));
    view.waiters = locks
        .iter()
        .filter(|f| !holds(f))
        .map(|f| {
            let (label, owner) = permit_labels(f);
            WaiterRecord {
                label,
                mode: Mode::Write,
                since: Some(f.since),
                owner,
            }
        })
        .collect();
    view.holders = held
        .into_iter()
        .map(|f| {
            let (label, owner) = permit_labels(f);
            HolderRecord {
                label,
                mode: Mode::Write,
                fence: Some(f.fence),
                since: Some(f.since),
                lease_ends: None,
                owner,
                slot: nodes::lease_slot(&f.name),
                ..HolderRecord::default()
            }
        })
        .collect();
    view
}

/// The leases, sorted, that hold permits of a semaphore of `count`, its
/// mutex line sorted in `locks`: all but the lease the mutex holder made
/// while every permit was taken, which waits.
fn held_leases<'f>(count: u32, leases: &'f [Found], locks: &[Found]) -> Vec<&'f Found> {
    let head = locks.first().and_then(|f| nodes::protection(&f.name));
    let waiting = head.filter(|_| leases.len() > count as usize);
    let held = leases
        .iter()
        .filter(|f| waiting.is_none() || nodes::protection(&f.name) != waiting);
    held.collect()
}

/// The names of the leases that hold permits of a semaphore of `count`
/// whose records `only` admits.
pub(super) fn admitted_leases(
    count: u32,
    mut leases: Vec<Found>,
    mut locks: Vec<Found>,
    only: &Only,
) -> Vec<String> {
    leases.sort_by_key(|f| nodes::semaphore_order(&f.name, true));
    locks.sort_by_key(|f| nodes::semaphore_order(&f.name, false));
    let held = held_leases(count, &leases, &locks).into_iter();
    let admitted = held.filter(|f| only.admits(Some(f.fence), permit_labels(f).1.as_deref()));
    admitted.map(|f| f.name.clone()).collect()
}

/// A semaphore node's label and owner digest, for a dlock node.
fn permit_labels(f: &Found) -> (Option<String>, Option<String>) {
    match permits::written(&f.data) {
        Some((_, label)) => (label.map(str::to_owned), nodes::owner_digest(&f.name)),
        None => (None, None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use dlock_core::kit::OwnerId;

    const AT: SystemTime = SystemTime::UNIX_EPOCH;

    fn node(name: String, data: &[u8], fence: u64) -> Found {
        Found {
            name,
            data: data.to_vec(),
            fence,
            since: AT + Duration::from_secs(fence),
        }
    }

    fn key() -> LockKey {
        LockKey::new("g", "n").unwrap()
    }

    #[test]
    fn a_label_with_spaces_and_a_carried_fence_read_back() {
        assert_eq!(written(&data("web 7:12", None)), Some(("web 7:12", None)));
        assert_eq!(written(&data("web 7:12", Some(42))), Some(("web 7:12", Some(42))));
        assert_eq!(written(b"dlock a\tnew=1\tfence=9"), Some(("a", Some(9))));
        assert_eq!(written(b"10.0.0.7"), None);
        assert_eq!(written(b""), None);
    }

    #[test]
    fn a_revoked_node_shows_no_label_and_a_revoked_reader_no_fence() {
        let (a, b) = (OwnerId::random(), OwnerId::random());
        let name = |owner, mode, seq| format!("{}{seq:010}", nodes::node_prefix(owner, mode));
        let readers = [
            node(name(a, Mode::Read, 1), REVOKE, 10),
            node(name(b, Mode::Read, 2), &data("b", Some(20)), 30),
        ];
        let view = lock_view(&key(), &readers);
        let shown: Vec<_> = view
            .holders
            .iter()
            .map(|h| (h.label.as_deref(), h.owner.is_some(), h.fence))
            .collect();
        assert_eq!(shown, [(None, false, None), (Some("b"), true, Some(20))]);
        let writer = [node(name(a, Mode::Write, 1), REVOKE, 10)];
        let view = lock_view(&key(), &writer);
        assert_eq!(view.holders[0].fence, Some(10));
        assert_eq!(view.holders[0].label, None);
    }

    #[test]
    fn holders_then_waiters_in_line_and_curators_node_has_no_label() {
        let (a, b) = (OwnerId::random(), OwnerId::random());
        let name = |owner, mode, seq| format!("{}{seq:010}", nodes::node_prefix(owner, mode));
        let curator = format!("_c_{}-__READ__0000000004", "0a1b2c3d-0000-4000-8000-00000000000e");
        let found = [
            node(name(b, Mode::Write, 3), &data("b", None), 30),
            node(name(a, Mode::Read, 1), &data("a", Some(5)), 10),
            node(curator, b"10.0.0.7", 40),
            node(name(a, Mode::Read, 2), &data("a", None), 20),
        ];
        let view = lock_view(&key(), &found);
        let fences: Vec<_> = view
            .holders
            .iter()
            .map(|h| (h.fence, h.label.as_deref()))
            .collect();
        assert_eq!(fences, [(Some(5), Some("a")), (Some(20), Some("a"))]);
        assert_eq!(view.holders[0].owner, Some(a.digest()));
        assert_eq!(view.holders[0].since, Some(AT + Duration::from_secs(10)));
        let waiting: Vec<_> = view
            .waiters
            .iter()
            .map(|w| (w.mode, w.label.as_deref()))
            .collect();
        assert_eq!(waiting, [(Mode::Write, Some("b")), (Mode::Read, None)]);
        assert_eq!(
            (view.waiters[0].owner.clone(), view.waiters[1].owner.clone()),
            (Some(b.digest()), None)
        );
    }

    /// A dlock lease (in slot `seq`) or node in the mutex line.
    fn permit_node(owner: OwnerId, lease: bool, seq: u32, count: u32) -> Found {
        let name = format!(
            "{}{seq:010}",
            nodes::semaphore_node_prefix(owner, lease.then_some(seq))
        );
        let data = format!("dlock permits {count}\nw{seq}");
        node(name, data.as_bytes(), seq.into())
    }

    fn owners<'v>(records: impl Iterator<Item = &'v Option<String>>) -> Vec<Option<String>> {
        records.cloned().collect()
    }

    #[test]
    fn a_semaphores_holders_are_its_leases_but_the_waiting_mutex_holders() {
        let (a, b, c, d) = (
            OwnerId::random(),
            OwnerId::random(),
            OwnerId::random(),
            OwnerId::random(),
        );
        // a and b hold; c has the mutex and a lease, and waits; d queues.
        let leases = vec![
            permit_node(c, true, 3, 2),
            permit_node(a, true, 1, 2),
            permit_node(b, true, 2, 2),
        ];
        let locks = vec![permit_node(d, false, 6, 2), permit_node(c, false, 5, 2)];
        assert_eq!(count_of(&leases, &locks), Some(2));
        let view = semaphore_view(&key(), 2, leases, locks);
        assert_eq!(
            owners(view.holders.iter().map(|h| &h.owner)),
            [Some(a.digest()), Some(b.digest())]
        );
        assert_eq!(view.holders[0].label.as_deref(), Some("w1"));
        let slots: Vec<Option<u32>> = view.holders.iter().map(|h| h.slot).collect();
        assert_eq!(slots, [Some(1), Some(2)]);
        assert_eq!(
            owners(view.waiters.iter().map(|w| &w.owner)),
            [Some(c.digest()), Some(d.digest())]
        );
        assert_eq!(view.permits, Some(2));
    }

    #[test]
    fn a_holder_whose_mutex_node_is_still_there_is_no_waiter() {
        let (a, b) = (OwnerId::random(), OwnerId::random());
        let leases = vec![permit_node(a, true, 2, 2)];
        let locks = vec![permit_node(b, false, 3, 2), permit_node(a, false, 1, 2)];
        let view = semaphore_view(&key(), 2, leases, locks);
        assert_eq!(owners(view.holders.iter().map(|h| &h.owner)), [Some(a.digest())]);
        assert_eq!(owners(view.waiters.iter().map(|w| &w.owner)), [Some(b.digest())]);
    }

    #[test]
    fn a_semaphore_only_curator_uses_tells_no_count() {
        let curator = node("_c_x-lease-0000000001".to_owned(), b"10.0.0.7", 1);
        assert_eq!(count_of(&[curator], &[]), None);
    }
}
