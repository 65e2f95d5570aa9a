//! Holder records as `scripts/inspect.lua` reads them.

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

fn hex(text: &str) -> Option<u64> {
    u64::from_str_radix(text, 16).ok()
}
