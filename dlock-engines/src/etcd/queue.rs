//! etcd's own lock layout (`concurrency.Mutex`, which `etcdctl lock` and
//! the server's Lock RPC use), with readers: who the contenders are and
//! whose turn it is.
//!
//! A lock is a prefix, `<root>/<group>/<name>/`. Each contender puts one key
//! under it, attached to its session's lease; the key's create revision is
//! its place in line. etcd's Mutex names its key `<prefix><lease hex>`;
//! dlock adds a number, `<prefix><lease hex>-<n>`, the lowest free among the
//! engine's requests on the lock (`key_numbers.rs`), so two requests of one
//! process never share a key. The value says `dlock read <owner id>` or
//! `dlock write <owner id>`; a key whose value does not start with
//! [`READER`], a Mutex's empty one included, is a writer. Both kinds sit under the same prefix, so a Mutex waits for
//! dlock's readers too.

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

/// The value of a request's key: its mode and owner id.
pub(crate) fn value(mode: Mode, owner: OwnerId) -> Vec<u8> {
    match mode {
        Mode::Read => format!("dlock read {owner}").into_bytes(),
        Mode::Write => format!("dlock write {owner}").into_bytes(),
    }
}

/// One contender, as read from its key.
#[derive(Clone, Copy)]
pub(crate) struct Contender<'a> {
    pub key: &'a [u8],
    pub reader: bool,
    pub created: i64,
}

impl<'a> From<&'a KeyValue> for Contender<'a> {
    fn from(kv: &'a KeyValue) -> Self {
        Contender {
            key: kv.key(),
            reader: kv.value().starts_with(READER),
            created: kv.create_revision(),
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

#[cfg(test)]
mod tests {
    use super::*;

    fn kv(key: &'static str, value: &[u8], created: i64) -> Contender<'static> {
        Contender {
            key: key.as_bytes(),
            reader: value.starts_with(READER),
            created,
        }
    }

    #[test]
    fn writers_wait_for_the_one_ahead_readers_for_the_last_writer() {
        let (read, write) = (
            value(Mode::Read, OwnerId::random()),
            value(Mode::Write, OwnerId::random()),
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
}
