//! Who holds and who waits, read back from the keys under a lock's prefix:
//! holders by the same turn logic that grants (`queue.rs`), the rest
//! waiting in create-revision order. etcd keeps no time, so `since` is the
//! client's clock written into the value. The hold ends with its key's
//! lease (its session's): the lease's granted TTL is the hold's lease, and
//! what is left of it, in whole seconds, its end; the keep-alive that last
//! renewed the lease, that end less the TTL. A permit holder's slot is the
//! slot key naming its key (`slots.rs`), read at the same revision.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::{Duration, SystemTime};

use dlock_core::kit::{EngineError, OwnerId, percent_unescape};
use dlock_core::{HolderRecord, LockKey, LockView, Mode, Only, WaiterRecord};
use etcd_client::{GetOptions, KeyValue, SortOrder, SortTarget};

use super::handoff::first_line;
use super::queue::{self, Contender, PERMIT, READER, WRITER};
use super::session::Session;
use super::slots;

/// Keys read per round trip while listing a group.
const LIST_PAGE: i64 = 512;

/// What follows a semaphore's name in its line's prefix, and in its slot keys'.
const PERMITS: &str = "%permits";
const SLOTS: &str = "%slots";

/// Lock `key`, read in one range on its `prefix`; or semaphore `key`,
/// with a second range on its `slots` at the same revision.
pub(crate) async fn inspect(
    session: &Session,
    key: &LockKey,
    permits: Option<u32>,
    (prefix, slots): (&str, &str),
) -> Result<LockView, EngineError> {
    let oldest_first = GetOptions::new()
        .with_prefix()
        .with_sort(SortTarget::Create, SortOrder::Ascend);
    let (kvs, revision) = read(session, prefix, oldest_first).await?;
    let taken = match permits {
        Some(_) => {
            read(
                session,
                slots,
                GetOptions::new().with_prefix().with_revision(revision),
            )
            .await?
            .0
        }
        None => Vec::new(),
    };
    let leases = leases(session, kvs.iter().map(KeyValue::lease)).await?;
    Ok(view(
        key,
        permits,
        &kvs,
        slots::of_holders(slots, &taken),
        &leases,
    ))
}

/// When each lease ends, and its granted TTL, by lease id.
type Leases = HashMap<i64, (SystemTime, Duration)>;

/// The leases `ids` name (0: none), one call each: the keys of one
/// process share its session's.
async fn leases(session: &Session, ids: impl Iterator<Item = i64>) -> Result<Leases, EngineError> {
    let ids: BTreeSet<i64> = ids.filter(|&id| id != 0).collect();
    let mut leases = Leases::new();
    for id in ids {
        if let Some((granted, left)) = session.lease_left(id).await? {
            leases.insert(id, (SystemTime::now() + left, granted));
        }
    }
    Ok(leases)
}

/// The keys under `prefix`, oldest first, in one range.
pub(crate) async fn contenders(session: &Session, prefix: &str) -> Result<Vec<KeyValue>, EngineError> {
    let oldest_first = GetOptions::new()
        .with_prefix()
        .with_sort(SortTarget::Create, SortOrder::Ascend);
    Ok(read(session, prefix, oldest_first).await?.0)
}

/// The keys under `prefix`, as `options` ask, and the revision read at.
async fn read(
    session: &Session,
    prefix: &str,
    options: GetOptions,
) -> Result<(Vec<KeyValue>, i64), EngineError> {
    let mut got = session
        .retry(|| {
            let mut client = session.kv();
            let (prefix, options) = (prefix.to_owned(), options.clone());
            async move { client.get(prefix, Some(options)).await }
        })
        .await?;
    let revision = got.header().map_or(0, |h| h.revision());
    Ok((got.take_kvs(), revision))
}

/// Every lock and semaphore of `group` that someone holds or waits for,
/// by name: one range on the group's prefix, a page per round trip.
pub(crate) async fn list(session: &Session, root: &str, group: &str) -> Result<Vec<LockView>, EngineError> {
    let prefix =
        group_prefix(root, group).ok_or_else(|| EngineError::failed("not a group dlock can name"))?;
    // Past the prefix: it ends with `/`, and `0` comes right after.
    let end = format!("{}0", &prefix[..prefix.len() - 1]);
    let mut by_lock: BTreeMap<String, Vec<KeyValue>> = BTreeMap::new();
    let (mut from, mut revision) = (prefix.clone().into_bytes(), 0);
    loop {
        // Every page at the first one's revision: one moment's view.
        let options = GetOptions::new()
            .with_range(end.clone())
            .with_revision(revision)
            .with_limit(LIST_PAGE);
        let mut got = session
            .retry(|| {
                let mut client = session.kv();
                let (from, options) = (from.clone(), options.clone());
                async move { client.get(from, Some(options)).await }
            })
            .await?;
        if revision == 0 {
            revision = got.header().map_or(0, |h| h.revision());
        }
        let kvs = got.take_kvs();
        if let Some(last) = kvs.last() {
            from = last.key().to_vec();
            from.push(0);
        }
        for kv in kvs {
            // `<name>/<contender>`: a name's path has no `/`.
            let rest = &kv.key()[prefix.len()..];
            if let Some(slash) = rest.iter().position(|&b| b == b'/')
                && let Ok(lock) = std::str::from_utf8(&rest[..slash])
            {
                by_lock.entry(lock.to_owned()).or_default().push(kv);
            }
        }
        if !got.more() {
            break;
        }
    }
    // `<name>%slots` beside `<name>%permits`: a semaphore's slot keys.
    let (slot_keys, mut by_lock): (BTreeMap<_, _>, BTreeMap<_, _>) =
        by_lock.into_iter().partition(|(lock, _)| lock.ends_with(SLOTS));
    let leases = leases(session, by_lock.values().flatten().map(KeyValue::lease)).await?;
    let views = by_lock.iter_mut().filter_map(|(lock, kvs)| {
        kvs.sort_by_key(KeyValue::create_revision);
        let slots = format!("{}{SLOTS}", lock.strip_suffix(PERMITS).unwrap_or(lock));
        let taken = slot_keys.get(&slots).map_or(&[][..], Vec::as_slice);
        let slots = format!("{prefix}{slots}/");
        listed(root, group, lock, kvs, slots::of_holders(&slots, taken), &leases)
    });
    Ok(views.collect())
}

/// Whether the holder whose key is `kv` is one `only` admits, by its fence
/// (the key's create revision) and the owner its line names.
pub(crate) fn admits(only: &Only, kv: &KeyValue) -> bool {
    only.admits(
        Some(kv.create_revision() as u64),
        Line::read(kv.value()).owner.as_deref(),
    )
}

/// What a key's first line says of its request. A field is `None` for a
/// key dlock did not write (`etcdctl lock`'s is empty; an election's shows
/// its proposal as its label), or one written by an older dlock, which kept
/// the owner id alone.
#[derive(Debug, PartialEq, Eq)]
struct Line {
    mode: Mode,
    owner: Option<String>,
    since: Option<SystemTime>,
    label: Option<String>,
}

impl Line {
    fn read(value: &[u8]) -> Line {
        let first = first_line(value);
        let mut line = Line {
            mode: if first.starts_with(READER) {
                Mode::Read
            } else {
                Mode::Write
            },
            owner: None,
            since: None,
            label: None,
        };
        // `<owner> <since> <label>`, after the mode or a permit's count;
        // without an owner id, not a line dlock wrote.
        let Some(fields) = line_fields(first).and_then(|f| std::str::from_utf8(f).ok()) else {
            // A key dlock did not lay out as a lock's: an election's
            // (`etcdctl elect`, or dlock's own) holds its proposal, the
            // label it shows.
            line.label = std::str::from_utf8(first)
                .ok()
                .filter(|v| !v.is_empty() && !v.contains(char::is_control) && owner_digest(v).is_none())
                .map(str::to_owned);
            return line;
        };
        let (owner, rest) = fields.split_once(' ').unwrap_or((fields, ""));
        line.owner = owner_digest(owner);
        if line.owner.is_some()
            && let Some((since, label)) = rest.split_once(' ')
        {
            line.since = since
                .parse()
                .ok()
                .map(|ms| SystemTime::UNIX_EPOCH + Duration::from_millis(ms));
            line.label = (!label.is_empty()).then(|| label.to_owned());
        }
        line
    }
}

/// What follows the mode, or a permit's count, in a line dlock wrote.
fn line_fields(line: &[u8]) -> Option<&[u8]> {
    if let Some(rest) = line.strip_prefix(PERMIT) {
        let space = rest.iter().position(|&b| b == b' ')?;
        return Some(&rest[space + 1..]);
    }
    line.strip_prefix(READER).or_else(|| line.strip_prefix(WRITER))
}

/// The digest of an owner id written as 32 hex digits; the id itself goes
/// no further than this function.
fn owner_digest(hex: &str) -> Option<String> {
    if hex.len() != 32 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    let bits = u128::from_str_radix(hex, 16).ok()?;
    Some(OwnerId::from_u128(bits).digest())
}

/// The view of lock or semaphore `key` from its keys, oldest first. A
/// semaphore's count is the one its keys carry (they all agree, see
/// `queue.rs`), else the one asked for; `slot` says a holder key's slot.
fn view(
    key: &LockKey,
    permits: Option<u32>,
    kvs: &[KeyValue],
    slot: impl Fn(&[u8]) -> Option<u32>,
    leases: &Leases,
) -> LockView {
    let permits = permits.map(|asked| {
        kvs.iter()
            .find_map(|kv| Contender::from(kv).permits)
            .unwrap_or(asked)
    });
    let mut view = LockView {
        group: key.group().to_owned(),
        name: key.name().to_owned(),
        permits,
        holders: Vec::new(),
        waiters: Vec::new(),
    };
    for (kv, holds) in kvs.iter().zip(queue::holding(kvs, permits)) {
        let line = Line::read(kv.value());
        if holds {
            let record = HolderRecord {
                label: line.label,
                mode: line.mode,
                fence: Some(kv.create_revision() as u64),
                since: line.since,
                owner: line.owner,
                slot: permits.and_then(|_| slot(kv.key())),
                ..HolderRecord::default()
            };
            view.holders.push(match leases.get(&kv.lease()) {
                Some(&(ends, lease)) => record.leased(ends, lease),
                None => record,
            });
        } else {
            view.waiters.push(WaiterRecord {
                label: line.label,
                mode: line.mode,
                since: line.since,
                owner: line.owner,
            });
        }
    }
    view
}

/// The view of the keys found under `<group prefix><segment>/`, `segment`
/// being a name as the lock's path escapes it, with `%permits` after it
/// for a semaphore. `None` if no dlock lock has that prefix (a key put
/// there by hand), or if no key says a semaphore's count.
fn listed(
    root: &str,
    group: &str,
    segment: &str,
    kvs: &[KeyValue],
    slot: impl Fn(&[u8]) -> Option<u32>,
    leases: &Leases,
) -> Option<LockView> {
    let (escaped, semaphore) = match segment.strip_suffix(PERMITS) {
        Some(escaped) => (escaped, true),
        None => (segment, false),
    };
    let key = LockKey::new(group, percent_unescape(escaped)?).ok()?;
    // Only the escaping the path gives names this prefix: `%41` is not `A`.
    if !key.path(root).ends_with(&format!("/{escaped}")) {
        return None;
    }
    let permits = if semaphore {
        Some(kvs.iter().find_map(|kv| Contender::from(kv).permits)?)
    } else {
        None
    };
    Some(view(&key, permits, kvs, slot, leases))
}

/// `<root>/<group>/`, as the locks' paths escape the group.
pub(crate) fn group_prefix(root: &str, group: &str) -> Option<String> {
    let path = LockKey::new(group, "-").ok()?.path(root);
    Some(path.strip_suffix('-')?.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_line_tells_mode_owner_since_and_a_label_with_spaces() {
        let owner = OwnerId::random();
        let value = queue::value(Mode::Read, None, owner, 1_764_166_213_000, "web 1:42");
        let line = Line::read(&value);
        assert_eq!(line.mode, Mode::Read);
        assert_eq!(line.owner, Some(owner.digest()));
        assert_eq!(line.label.as_deref(), Some("web 1:42"));
        assert_eq!(
            line.since,
            Some(SystemTime::UNIX_EPOCH + Duration::from_millis(1_764_166_213_000))
        );
        let mut permit = queue::value(Mode::Write, Some(3), owner, 5, "host:1");
        permit.extend_from_slice(queue::ADMITTED);
        let line = Line::read(&permit);
        assert_eq!((line.mode, line.owner), (Mode::Write, Some(owner.digest())));
        assert_eq!(line.label.as_deref(), Some("host:1"));
    }

    #[test]
    fn what_a_line_cannot_tell_is_none() {
        let none = |mode| Line {
            mode,
            owner: None,
            since: None,
            label: None,
        };
        // etcdctl lock, and a downgrade as older dlock wrote it.
        assert_eq!(Line::read(b""), none(Mode::Write));
        assert_eq!(Line::read(b"dlock read "), none(Mode::Read));
        assert_eq!(Line::read(b"dlock write xyz 12 a"), none(Mode::Write));
        // An election's proposal is its label, unless it is no text.
        let elected = Line::read(b"web-7:8080");
        assert_eq!(elected.label.as_deref(), Some("web-7:8080"));
        assert_eq!((elected.mode, elected.owner), (Mode::Write, None));
        assert_eq!(Line::read(b"dlock web").label.as_deref(), Some("dlock web"));
        assert_eq!(Line::read(b"\x01\x02").label, None);
        let owner = OwnerId::random().to_string();
        assert_eq!(
            Line::read(owner.as_bytes()).label,
            None,
            "an owner id is never a label"
        );
        // An older dlock's: the owner alone.
        let owner = OwnerId::random();
        let line = Line::read(format!("dlock permit 2 {owner}").as_bytes());
        assert_eq!(
            line,
            Line {
                owner: Some(owner.digest()),
                ..none(Mode::Write)
            }
        );
    }

    #[test]
    fn names_come_back_only_as_the_path_escapes_them() {
        assert_eq!(group_prefix("/locks", "a/b").as_deref(), Some("/locks/a%2Fb/"));
        assert_eq!(group_prefix("/locks", "..").as_deref(), Some("/locks/%2E%2E/"));
        let none = |_: &[u8]| None;
        assert!(
            listed("/locks", "g", "%41", &[], none, &Leases::new()).is_none(),
            "`A` is not escaped"
        );
        assert!(
            listed("/locks", "g", "s%permits", &[], none, &Leases::new()).is_none(),
            "no count"
        );
        let free = listed("/locks", "g", "a%2Fb", &[], none, &Leases::new()).expect("a lock");
        assert_eq!((free.name.as_str(), free.permits), ("a/b", None));
    }
}
