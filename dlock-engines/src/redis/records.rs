//! Holder records as `scripts/inspect.lua` reads them, or as a listing
//! reads a lone writer's gate raw.

use std::collections::HashMap;
use std::ops::Range;
use std::time::{Duration, SystemTime};

use dlock_core::kit::OwnerId;
use dlock_core::{HolderRecord, LockKey, LockView, Mode, Only, WaiterRecord};

/// What the script returns: a semaphore's count, and `(role, mode, owner,
/// fence, since, ends, label, slot)` per record.
pub(crate) type Reply = (String, Vec<Entry>);
type Entry = (String, String, String, String, String, String, String, String);

// A gate's fields (see head.lua), fixed-width, so read by place: the last
// token, the retention (`~` form), the form, the writer's id, when it was
// granted, and its label's reference to the end.
const FENCE: Range<usize> = 0..14;
const RETENTION: Range<usize> = 14..25;
const FORM: usize = 25;
const WRITER: Range<usize> = 26..58;
const SINCE: Range<usize> = 58..69;
const LABEL: Range<usize> = 69..usize::MAX;

/// What was read of one lock or semaphore.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Read {
    /// inspect.lua's answer.
    Script(Reply),
    /// A lock whose gate alone tells (see [`gate`]): its lone writer's
    /// record, the gate's value, and the writer's deadline; or nobody.
    Gate(Option<(String, u64)>),
}

/// The label references `read` carries (see `labels.rs`).
pub(crate) fn labels(read: &Read) -> impl Iterator<Item = &str> {
    let (entries, lone) = match read {
        Read::Script((_, entries)) => (&entries[..], None),
        Read::Gate(lone) => (&[][..], lone.as_ref().map(|(value, _)| part(value, LABEL))),
    };
    let tagged = entries.iter().map(|entry| entry.6.as_str()).chain(lone);
    tagged.map(|field| self::tagged(field).0)
}

/// A record's label field: the label's reference, then since this dlock
/// the hold's lease in hex ms (`Ab3xYz 7530`); an older dlock's has the
/// reference alone.
pub(crate) fn tagged(field: &str) -> (&str, Option<Duration>) {
    match field.split_once(' ') {
        Some((reference, lease)) => (reference, hex(lease).map(Duration::from_millis)),
        None => (field, None),
    }
}

/// A holder's record with its lease's end, and where the record tells its
/// lease, the renewal that set that end. A hold kept past its release
/// (`hold_at_least`) ends later than a renewal of its lease would set:
/// it shows no renewal rather than one still to come.
fn leased(record: HolderRecord, ends: Option<SystemTime>, lease: Option<Duration>) -> HolderRecord {
    match (ends, lease) {
        (Some(ends), Some(lease)) if ends <= SystemTime::now() + lease => record.leased(ends, lease),
        (ends, _) => HolderRecord {
            lease_ends: ends,
            ..record
        },
    }
}

/// The view of `key` from `read`, its label references read in `labels`;
/// a semaphore (`permits`) shows the count its holders and waiters agreed
/// on, or the one asked about if none.
pub(crate) fn view(
    key: &LockKey,
    permits: Option<u32>,
    read: Read,
    labels: &HashMap<String, String>,
) -> LockView {
    let mut view = LockView {
        group: key.group().to_owned(),
        name: key.name().to_owned(),
        permits,
        holders: Vec::new(),
        waiters: Vec::new(),
    };
    let (count, entries) = match read {
        Read::Script(reply) => reply,
        Read::Gate(lone) => {
            let lone = lone.map(|(value, deadline)| lone_writer(&value, deadline, labels));
            view.holders.extend(lone);
            return view;
        }
    };
    for (role, mode, owner, fence, since, ends, label, slot) in entries {
        let mode = if mode == "r" { Mode::Read } else { Mode::Write };
        let (reference, lease) = tagged(&label);
        let (label, since, owner) = common(labels, &owner, &since, reference);
        if role == "h" {
            let record = HolderRecord {
                label,
                mode,
                fence: hex(&fence),
                since,
                owner,
                slot: slot.parse().ok(),
                ..HolderRecord::default()
            };
            view.holders.push(leased(record, hex(&ends).map(at), lease));
        } else {
            view.waiters.push(WaiterRecord {
                label,
                mode,
                since,
                owner,
            });
        }
    }
    if !view.is_free() {
        view.permits = permits.map(|asked| count.parse().unwrap_or(asked));
    }
    view
}

/// The record of a lone writer holding until `deadline`, from its gate.
fn lone_writer(gate: &str, deadline: u64, labels: &HashMap<String, String>) -> HolderRecord {
    let (reference, lease) = tagged(part(gate, LABEL));
    let (label, since, owner) = common(labels, part(gate, WRITER), part(gate, SINCE), reference);
    let record = HolderRecord {
        label,
        mode: Mode::Write,
        fence: hex(part(gate, FENCE)),
        since,
        owner,
        ..HolderRecord::default()
    };
    leased(record, Some(at(deadline)), lease)
}

/// What holders' and waiters' records share: the label, the grant or
/// request time, and the owner id's digest (the id goes no further).
/// The holders in `reply` that `only` admits, each as control.lua takes
/// them: `<owner id> <fence in hex>`.
pub(crate) fn admitted(reply: &Reply, only: &Only) -> Vec<String> {
    let holders = reply.1.iter().filter(|entry| entry.0 == "h");
    let admitted = holders.filter(|(_, _, owner, fence, ..)| {
        let digest = u128::from_str_radix(owner, 16).map(|id| OwnerId::from_u128(id).digest());
        only.admits(hex(fence), digest.ok().as_deref())
    });
    admitted
        .map(|(_, _, owner, fence, ..)| format!("{owner} {fence}"))
        .collect()
}

fn common(
    labels: &HashMap<String, String>,
    owner: &str,
    since: &str,
    label: &str,
) -> (Option<String>, Option<SystemTime>, Option<String>) {
    let owner = u128::from_str_radix(owner, 16)
        .ok()
        .map(|id| OwnerId::from_u128(id).digest());
    (labels.get(label).cloned(), hex(since).map(at), owner)
}

/// Server ms since the epoch, on the server's clock, as a time.
fn at(ms: u64) -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_millis(ms)
}

/// What a lock's gate (see head.lua), `value` with `pttl` left, read at
/// server ms `now`, tells alone: nothing there, an idle lock, or a lone
/// writer (`~`) and its deadline; `None` where others may be about, or the
/// gate changed between the reads, and only the script can tell.
pub(crate) fn gate(value: Option<Vec<u8>>, pttl: i64, now: u64) -> Option<Read> {
    let Some(value) = value else {
        return Some(Read::Gate(None));
    };
    match value.get(FORM) {
        Some(b'.') if value.len() == FORM + 1 => Some(Read::Gate(None)),
        Some(b'~') if value.len() >= WRITER.end && pttl >= 0 => {
            let value = String::from_utf8(value).ok()?;
            // The gate outlives the writer's deadline by the retention.
            let retention = hex(value.get(RETENTION)?)?;
            let deadline = (now + pttl.unsigned_abs()).checked_sub(retention)?;
            if deadline <= now {
                return Some(Read::Gate(None));
            }
            // Fields past the id may be short or missing (an older dlock's),
            // but the id must be whole.
            let whole = value.is_char_boundary(WRITER.start) && value.is_char_boundary(WRITER.end);
            whole.then_some(Read::Gate(Some((value, deadline))))
        }
        _ => None,
    }
}

/// Bytes `field` of a gate's value, cut short where it is.
fn part(value: &str, field: Range<usize>) -> &str {
    let end = value.len();
    value.get(field.start.min(end)..field.end.min(end)).unwrap_or("")
}

fn hex(text: &str) -> Option<u64> {
    u64::from_str_radix(text, 16).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    const OWNER: &str = "0123456789abcdef0123456789abcdef";

    fn read(value: &str, pttl: i64, now: u64) -> Option<Read> {
        gate(Some(value.as_bytes().to_vec()), pttl, now)
    }

    fn lone(read: Option<Read>) -> LockView {
        let key = LockKey::new("g", "a").expect("key");
        let labels = HashMap::from([("abc123".to_owned(), "billing 7".to_owned())]);
        view(&key, None, read.expect("the gate tells"), &labels)
    }

    #[test]
    fn a_gate_alone_tells_of_a_lone_writer_an_idle_lock_or_none() {
        let now = 1_000_000;
        // Retention 0x3e8 = 1000 ms past the writer's deadline.
        let value = format!("0000000000002a000000003e8~{OWNER}000000f4240abc123");
        let view = lone(read(&value, 1500, now));
        let [holder] = view.holders.as_slice() else {
            panic!("{view:?}")
        };
        let owner = OwnerId::from_u128(u128::from_str_radix(OWNER, 16).expect("hex")).digest();
        assert_eq!(
            holder,
            &HolderRecord {
                label: Some("billing 7".to_owned()),
                mode: Mode::Write,
                fence: Some(42),
                since: Some(at(1_000_000)),
                lease_ends: Some(at(now + 500)),
                owner: Some(owner),
                ..HolderRecord::default()
            }
        );
        // Past the deadline, within the retention: nobody holds.
        assert!(lone(read(&value, 900, now)).is_free());
        // An older dlock's writer: the id alone.
        let older = lone(read(&value[..58], 1500, now));
        assert_eq!(
            (older.holders[0].since, older.holders[0].label.as_deref()),
            (None, None)
        );
        assert!(lone(read("0000000000002a00000000000.", 900, now)).is_free());
        assert!(lone(gate(None, -2, now)).is_free());
    }

    #[test]
    fn a_gate_with_others_about_or_changed_between_reads_is_left_to_the_script() {
        let now = 1_000_000;
        assert_eq!(
            read(&format!("0000000000002a000000f4628|{OWNER}"), 1500, now),
            None
        );
        assert_eq!(read("0000000000002a00000000000|", 1500, now), None);
        let value = format!("0000000000002a000000003e8~{OWNER}");
        // Gone (-2) or made anew without a lease (-1) after the MGET.
        assert_eq!(read(&value, -2, now), None);
        assert_eq!(read(&value, -1, now), None);
        assert_eq!(read("short~", 1500, now), None);
    }
}
