//! Holder records as `scripts/inspect.lua` reads them, or as a listing
//! reads a lone writer's gate raw.

use std::collections::HashMap;
use std::time::{Duration, SystemTime};

use dlock_core::kit::OwnerId;
use dlock_core::{HolderRecord, LockKey, LockView, Mode, WaiterRecord};

/// What the script returns: a semaphore's count, and `(role, mode, owner,
/// fence, since, ends, label)` per record.
pub(crate) type Reply = (String, Vec<Entry>);
type Entry = (String, String, String, String, String, String, String);

/// The label references `reply` carries (see `labels.rs`).
pub(crate) fn labels(reply: &Reply) -> impl Iterator<Item = &str> {
    reply.1.iter().map(|entry| entry.6.as_str())
}

/// The view of `key` from `reply`, its label references read in `labels`;
/// a semaphore (`permits`) shows the count its holders and waiters agreed
/// on, or the one asked about if none.
pub(crate) fn view(
    key: &LockKey,
    permits: Option<u32>,
    reply: Reply,
    labels: &HashMap<String, String>,
) -> LockView {
    let (count, entries) = reply;
    // Server ms since the epoch, on the server's clock.
    let at = |ms: u64| SystemTime::UNIX_EPOCH + Duration::from_millis(ms);
    let mut view = LockView {
        group: key.group().to_owned(),
        name: key.name().to_owned(),
        permits: permits.map(|asked| count.parse().unwrap_or(asked)),
        holders: Vec::new(),
        waiters: Vec::new(),
    };
    for (role, mode, owner, fence, since, ends, label) in entries {
        let mode = if mode == "r" { Mode::Read } else { Mode::Write };
        // The id is digested at once and goes no further.
        let owner = u128::from_str_radix(&owner, 16)
            .ok()
            .map(|id| OwnerId::from_u128(id).digest());
        let label = labels.get(&label).cloned();
        let since = hex(&since).map(at);
        if role == "h" {
            view.holders.push(HolderRecord {
                label,
                mode,
                fence: hex(&fence),
                since,
                lease_ends: hex(&ends).map(at),
                owner,
            });
        } else {
            view.waiters.push(WaiterRecord {
                label,
                mode,
                since,
                owner,
            });
        }
    }
    if view.is_free() {
        view.permits = permits;
    }
    view
}

/// What inspect.lua would answer for a lock whose gate (see head.lua) is
/// `value`, with `pttl` left, read at server ms `now`, if the gate alone
/// tells: nothing there, an idle lock, or a lone writer (`~`); `None` where
/// others may be about, or the gate changed between the reads, and only
/// the script can tell.
pub(crate) fn gate(value: Option<&[u8]>, pttl: i64, now: u64) -> Option<Reply> {
    let none = || Some((String::new(), Vec::new()));
    let Some(value) = value else { return none() };
    match value.get(25) {
        Some(b'.') if value.len() == 26 => none(),
        Some(b'~') if value.len() >= 58 && pttl >= 0 => {
            let text = std::str::from_utf8(value).ok()?;
            // Fields past the id may be short or missing (an older dlock's).
            let part = |from: usize, to: usize| text.get(from.min(text.len())..to.min(text.len()));
            // The gate outlives the writer's deadline by the retention.
            let deadline = (now + pttl.unsigned_abs()).checked_sub(hex(part(14, 25)?)?)?;
            if deadline <= now {
                return none();
            }
            let entry = (
                "h".to_owned(),
                "w".to_owned(),
                part(26, 58)?.to_owned(),
                part(0, 14)?.to_owned(),
                part(58, 69)?.to_owned(),
                format!("{deadline:x}"),
                part(69, usize::MAX)?.to_owned(),
            );
            Some((String::new(), vec![entry]))
        }
        _ => None,
    }
}

fn hex(text: &str) -> Option<u64> {
    u64::from_str_radix(text, 16).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    const OWNER: &str = "0123456789abcdef0123456789abcdef";

    #[test]
    fn a_gate_alone_tells_of_a_lone_writer_an_idle_lock_or_none() {
        let now = 1_000_000;
        // Retention 0x3e8 = 1000 ms past the writer's deadline.
        let lone = format!("0000000000002a000000003e8~{OWNER}000000f4240abc123");
        let (count, entries) = gate(Some(lone.as_bytes()), 1500, now).expect("a lone writer");
        assert_eq!(count, "");
        let deadline = format!("{:x}", now + 500);
        let want = (
            "h",
            "w",
            OWNER,
            "0000000000002a",
            "000000f4240",
            deadline.as_str(),
            "abc123",
        );
        let got = &entries[0];
        assert_eq!(entries.len(), 1);
        assert_eq!(
            (&*got.0, &*got.1, &*got.2, &*got.3, &*got.4, &*got.5, &*got.6),
            want
        );
        // Past the deadline, within the retention: nobody holds.
        assert_eq!(
            gate(Some(lone.as_bytes()), 900, now),
            Some((String::new(), Vec::new()))
        );
        // An older dlock's writer: the id alone.
        let older = &lone[..58];
        let (_, entries) = gate(Some(older.as_bytes()), 1500, now).expect("an older writer");
        assert_eq!((&*entries[0].4, &*entries[0].6), ("", ""));
        let idle = "0000000000002a00000000000.";
        assert_eq!(
            gate(Some(idle.as_bytes()), 900, now),
            Some((String::new(), Vec::new()))
        );
        assert_eq!(gate(None, -2, now), Some((String::new(), Vec::new())));
    }

    #[test]
    fn a_gate_with_others_about_or_changed_between_reads_is_left_to_the_script() {
        let now = 1_000_000;
        let crowd = format!("0000000000002a000000f4628|{OWNER}");
        assert_eq!(gate(Some(crowd.as_bytes()), 1500, now), None);
        assert_eq!(gate(Some(b"0000000000002a00000000000|"), 1500, now), None);
        let lone = format!("0000000000002a000000003e8~{OWNER}");
        // Gone (-2) or made anew without a lease (-1) after the MGET.
        assert_eq!(gate(Some(lone.as_bytes()), -2, now), None);
        assert_eq!(gate(Some(lone.as_bytes()), -1, now), None);
        assert_eq!(gate(Some(b"short~"), 1500, now), None);
    }
}
