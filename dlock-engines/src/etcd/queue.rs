//! etcd's own lock layout (`concurrency.Mutex`, which `etcdctl lock` and
//! the server's Lock RPC use), with readers: who the contenders are and
//! whose turn it is.
//!
//! A lock is a prefix, `<root>/<group>/<name>/`. Each contender puts one key
//! under it, attached to its session's lease; the key's create revision is
//! its place in line. etcd's Mutex names its key `<prefix><lease hex>`;
//! dlock adds a number, `<prefix><lease hex>-<n>`, the lowest free among the
//! engine's requests on the lock (`key_numbers.rs`), so two requests of one
//! process never share a key. The value's first line says `dlock read
//! <owner id> <since> <label>` or `dlock write <owner id> <since> <label>`
//! (`since`: the client's clock in ms since the epoch when the request first
//! queued; the label last, as it may hold spaces; older dlock wrote the
//! owner id alone); a key whose value does not start with [`READER`], a
//! Mutex's empty one included, is a writer. Both kinds sit under the same
//! prefix, so a Mutex waits for dlock's readers too.
//!
//! A semaphore is the prefix `<root>/<group>/<name>%permits/` (no escaped
//! name ends so, and a Mutex never looks there), its keys named as a lock's,
//! valued `dlock permit <count> <owner id> <since> <label>`. The first
//! `count` keys by create revision hold; a waiter whose key is right behind
//! them waits for any key ahead to go, and one further back for the key
//! just ahead to go or be admitted (an admitted waiter with others behind
//! rewrites its key, adding a line, to tell them). Each key's count was
//! checked against the key just ahead when it was put, so every live key
//! has the same one.

use dlock_core::Mode;
use dlock_core::kit::OwnerId;
use etcd_client::KeyValue;

/// How the value of a dlock reader's key starts.
pub(crate) const READER: &[u8] = b"dlock read ";

/// Contenders read per round trip while looking for the writer ahead.
pub(crate) const PAGE: i64 = 64;

/// This request's key under the lock's `prefix` (which ends with `/`).
pub(crate) fn contender_key(prefix: &str, lease: i64, number: u32) -> String {
    format!("{prefix}{lease:x}-{number}")
}

/// How the value of a dlock writer's key starts.
pub(crate) const WRITER: &[u8] = b"dlock write ";

/// How the value of a dlock permit's key starts.
pub(crate) const PERMIT: &[u8] = b"dlock permit ";

/// The line a waiter admitted with others behind adds to its key's value.
pub(crate) const ADMITTED: &[u8] = b"\nadmitted";

/// The value of a request's key: its mode (or a semaphore's count), owner
/// id, when it first queued (ms since the epoch) and its process's label.
pub(crate) fn value(mode: Mode, permits: Option<u32>, owner: OwnerId, since: u64, label: &str) -> Vec<u8> {
    match (permits, mode) {
        (Some(count), _) => format!("dlock permit {count} {owner} {since} {label}").into_bytes(),
        (None, Mode::Read) => format!("dlock read {owner} {since} {label}").into_bytes(),
        (None, Mode::Write) => format!("dlock write {owner} {since} {label}").into_bytes(),
    }
}

/// One contender, as read from its key.
#[derive(Clone, Copy)]
pub(crate) struct Contender<'a> {
    pub key: &'a [u8],
    pub reader: bool,
    pub created: i64,
    /// A permit's count, from its value.
    pub permits: Option<u32>,
}

impl<'a> From<&'a KeyValue> for Contender<'a> {
    fn from(kv: &'a KeyValue) -> Self {
        Contender {
            key: kv.key(),
            reader: kv.value().starts_with(READER),
            created: kv.create_revision(),
            permits: permits_of(kv.value()),
        }
    }
}

/// What a contender does, given those ahead of it.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Turn {
    Held,
    /// Wait until this key (`key`, created at `created`) changes or goes.
    Watch {
        key: Vec<u8>,
        created: i64,
    },
    /// No writer in this page, but more contenders ahead: read on from
    /// those created at or before this revision.
    ReadOn(i64),
    /// Next in line for a permit: wait until any contender ahead goes.
    WatchDeletes,
}

/// A writer waits for the contender just ahead; a reader for the last
/// writer ahead (once that one goes, every writer ahead has gone, or the
/// reader looks again). `ahead` lists the contenders ahead, latest first;
/// `more`: the server has more beyond them.
pub(crate) fn turn(mode: Mode, ahead: &[Contender], more: bool) -> Turn {
    let wait_for = match mode {
        Mode::Write => ahead.first(),
        Mode::Read => ahead.iter().find(|c| !c.reader),
    };
    match (wait_for, ahead.last()) {
        (Some(c), _) => Turn::Watch {
            key: c.key.to_vec(),
            created: c.created,
        },
        (None, Some(last)) if more => Turn::ReadOn(last.created - 1),
        _ => Turn::Held,
    }
}

/// Which of a lock's or semaphore's contenders hold, `kvs` oldest first,
/// by the turns that grant: each as if it looked now.
pub(crate) fn holding(kvs: &[KeyValue], permits: Option<u32>) -> Vec<bool> {
    let latest_first: Vec<Contender> = kvs.iter().rev().map(Contender::from).collect();
    let oldest_first = latest_first.iter().rev().enumerate();
    oldest_first
        .map(|(i, c)| {
            let ahead = &latest_first[kvs.len() - i..];
            let turn = match permits {
                Some(count) => permit_turn(count, ahead),
                None => turn(if c.reader { Mode::Read } else { Mode::Write }, ahead, false),
            };
            turn == Turn::Held
        })
        .collect()
}

/// The count in a permit key's value.
fn permits_of(value: &[u8]) -> Option<u32> {
    let count = value.strip_prefix(PERMIT)?.split(|&b| b == b' ').next()?;
    std::str::from_utf8(count).ok()?.parse().ok()
}

/// A permit's turn among `count`: held while fewer than `count` are
/// ahead. `ahead` lists up to `count + 1` of them, latest first.
pub(crate) fn permit_turn(count: u32, ahead: &[Contender]) -> Turn {
    match (ahead.len().cmp(&(count as usize)), ahead.first()) {
        (std::cmp::Ordering::Less, _) => Turn::Held,
        (std::cmp::Ordering::Greater, Some(just_ahead)) => Turn::Watch {
            key: just_ahead.key.to_vec(),
            created: just_ahead.created,
        },
        _ => Turn::WatchDeletes,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kv(key: &'static str, value: &[u8], created: i64) -> Contender<'static> {
        Contender {
            key: key.as_bytes(),
            reader: value.starts_with(READER),
            created,
            permits: None,
        }
    }

    #[test]
    fn writers_wait_for_the_one_ahead_readers_for_the_last_writer() {
        let (read, write) = (
            value(Mode::Read, None, OwnerId::random(), 1, "a b"),
            value(Mode::Write, None, OwnerId::random(), 1, "a b"),
        );
        let ahead = [kv("r2", &read, 9), kv("w", &write, 8), kv("r1", &read, 7)];
        let watch = |key: &str, created| Turn::Watch {
            key: key.into(),
            created,
        };
        assert_eq!(turn(Mode::Write, &ahead, false), watch("r2", 9));
        assert_eq!(turn(Mode::Read, &ahead, false), watch("w", 8));
        assert_eq!(turn(Mode::Read, &ahead[..1], false), Turn::Held);
        assert_eq!(turn(Mode::Read, &ahead[..1], true), Turn::ReadOn(8));
        assert_eq!(turn(Mode::Write, &[], false), Turn::Held);
        // etcd's Mutex writes an empty value: a writer.
        assert_eq!(turn(Mode::Read, &[kv("m", b"", 5)], false), watch("m", 5));
    }

    #[test]
    fn keys_name_the_lease_and_the_number() {
        assert_eq!(contender_key("/locks/g/n/", 0x694d, 0), "/locks/g/n/694d-0");
        assert_ne!(contender_key("/l/", 1, 0), contender_key("/l/", 1, 1));
    }

    #[test]
    fn permits_go_to_the_first_count_then_the_next_in_line_waits_for_any() {
        let ahead = [kv("c", b"", 9), kv("b", b"", 8), kv("a", b"", 7)];
        assert_eq!(permit_turn(3, &ahead[..2]), Turn::Held);
        assert_eq!(permit_turn(3, &ahead), Turn::WatchDeletes);
        assert_eq!(
            permit_turn(2, &ahead),
            Turn::Watch {
                key: "c".into(),
                created: 9
            }
        );
        assert_eq!(permit_turn(1, &[]), Turn::Held);
    }

    #[test]
    fn a_permit_key_tells_its_count() {
        let mut admitted = value(Mode::Write, Some(5), OwnerId::random(), 1, "host 7");
        assert_eq!(permits_of(&admitted), Some(5));
        admitted.extend_from_slice(ADMITTED);
        assert_eq!(permits_of(&admitted), Some(5));
        assert_eq!(
            permits_of(&value(Mode::Write, None, OwnerId::random(), 1, "host 7")),
            None
        );
        // As older dlock wrote it.
        assert_eq!(
            permits_of(format!("dlock permit 5 {}", OwnerId::random()).as_bytes()),
            Some(5)
        );
    }
}
