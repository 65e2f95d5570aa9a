//! What a lock's (or a semaphore's) item holds, and how a waiter tells a
//! dead holder's entry from a live one without a server clock.
//!
//! Each hold is an entry, a map attribute: `w` for a writer, `r:<owner>`
//! for each reader, `p:<slot>` for each permit, holding the owner id
//! (`o`), the version its last renewal wrote (`v`), its lease in ms
//! (`l`), when it began and was last renewed by its holder's clock in ms
//! (`s`, `u`), its label (`t`) and, once asked to let go, `x` (read back by renewals). Its fence
//! sits beside it, in `f:<entry>`, written by the same update that takes
//! the item's counter `f`.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime};

use aws_sdk_dynamodb::types::AttributeValue;
use dlock_core::kit::{OwnerId, Request};

use super::Place;
use super::update::{Attrs, number, number_of, text};

/// How much faster a waiter's clock may run than a holder's: a waiter
/// waits this much longer than a lease before it counts a version dead.
pub(super) const DRIFT: f64 = 0.01;

/// How long a sighting no poll has renewed is kept.
const FORGET_AFTER: Duration = Duration::from_secs(60);

/// The item's fence counter.
pub(super) const FENCE: &str = "f";
/// The number of readers in a lock's item.
pub(super) const READERS: &str = "rc";
/// A lock's writer entry.
pub(super) const WRITER: &str = "w";

/// One hold, as its entry shows it.
pub(super) struct Entry {
    /// The attribute it is: `w`, `r:<owner>` or `p:<slot>`.
    pub name: String,
    pub owner: Option<OwnerId>,
    pub version: String,
    pub lease: Duration,
    pub since: Option<SystemTime>,
    pub renewed: Option<SystemTime>,
    pub label: Option<String>,
    pub fence: Option<u64>,
}

impl Entry {
    pub fn is_reader(&self) -> bool {
        self.name.starts_with("r:")
    }

    /// The permit slot it is, if it is one.
    pub fn slot(&self) -> Option<u32> {
        self.name.strip_prefix("p:")?.parse().ok()
    }
}

/// A reader's entry.
pub(super) fn reader(owner: OwnerId) -> String {
    format!("r:{owner}")
}

/// A permit's entry.
pub(super) fn permit(slot: u32) -> String {
    format!("p:{slot}")
}

/// Where an entry's fence is kept.
pub(super) fn fence_of(entry: &str) -> String {
    format!("f:{entry}")
}

/// Every hold in `item`.
pub(super) fn entries(item: &Attrs) -> Vec<Entry> {
    item.iter()
        .filter(|(name, _)| *name == WRITER || name.starts_with("r:") || name.starts_with("p:"))
        .filter_map(|(name, value)| {
            let map = value.as_m().ok()?;
            let ms = |field: &str| {
                number_of(map.get(field)).map(|ms| SystemTime::UNIX_EPOCH + Duration::from_millis(ms))
            };
            let owner = map.get("o").and_then(|o| o.as_s().ok());
            Some(Entry {
                name: name.clone(),
                owner: owner
                    .and_then(|o| u128::from_str_radix(o, 16).ok())
                    .map(OwnerId::from_u128),
                version: map.get("v")?.as_s().ok()?.clone(),
                lease: Duration::from_millis(number_of(map.get("l"))?),
                since: ms("s"),
                renewed: ms("u"),
                label: map.get("t").and_then(|t| t.as_s().ok()).cloned(),
                fence: number_of(item.get(&fence_of(name))),
            })
        })
        .collect()
}

/// A fresh version, written by each grant and renewal.
pub(super) fn version() -> AttributeValue {
    text(format!("{:016x}", OwnerId::random().as_u128() as u64))
}

/// The entry `req` writes when granted.
pub(super) fn entry_value(req: &Request, label: &str) -> AttributeValue {
    let now = millis_now();
    AttributeValue::M(HashMap::from([
        ("o".to_owned(), text(req.owner.to_string())),
        ("v".to_owned(), version()),
        ("l".to_owned(), number(millis(req.lease))),
        ("s".to_owned(), number(now)),
        ("u".to_owned(), number(now)),
        ("t".to_owned(), text(label)),
    ]))
}

pub(super) fn millis(span: Duration) -> i64 {
    i64::try_from(span.as_millis()).unwrap_or(i64::MAX)
}

pub(super) fn millis_now() -> i64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, millis)
}

/// What this engine has seen of other holders' entries: each entry's
/// version, and since when, by this process's monotonic clock. An entry
/// whose version stayed the same for its whole lease (and [`DRIFT`]
/// more) belongs to a holder that stopped renewing: it may be taken over.
/// Safe as long as clocks run at nearly the same rate; they need not
/// agree on the time.
#[derive(Default)]
pub(super) struct Seen(Mutex<HashMap<(Place, String), Sighting>>);

struct Sighting {
    version: String,
    first: Instant,
    last: Instant,
}

impl Seen {
    /// Notes `entry` of the item at `place` as seen now; whether its
    /// version has stood for its whole lease since this engine first saw it.
    pub fn lapsed(&self, place: &Place, entry: &Entry) -> bool {
        let now = Instant::now();
        let mut seen = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if seen.len() > 4096 {
            seen.retain(|_, s| now.duration_since(s.last) < FORGET_AFTER);
        }
        let sighting = seen
            .entry((place.clone(), entry.name.clone()))
            .or_insert_with(|| Sighting {
                version: entry.version.clone(),
                first: now,
                last: now,
            });
        if sighting.version != entry.version {
            sighting.version = entry.version.clone();
            sighting.first = now;
        }
        sighting.last = now;
        now.duration_since(sighting.first) >= entry.lease.mul_f64(1.0 + DRIFT)
    }
}
