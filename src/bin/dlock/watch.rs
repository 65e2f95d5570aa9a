//! `dlock watch`: each change to a group's locks, or to one lock, as it
//! happens, found by reading the records again and telling what differs:
//! at once when the engine's own watch hears a change in the group (etcd,
//! ZooKeeper: `Capabilities::watch`), and every `--every` in any case. A
//! change and its undoing between two reads pass unseen;
//! a holder's end is told apart by its lease (ended before it ran out:
//! released, or forced out; after: expired), not by who ended it, which
//! the audit trail (`dlock::audit`) names.

use std::collections::BTreeMap;
use std::io::Write;
use std::process::ExitCode;
use std::time::{Duration, SystemTime};

use dlock::{Error, HolderRecord, LockView, Mode, Registry, WaiterRecord};
use serde_json::{Value, json};

use crate::show;

/// How long a change heard waits for the rest of its burst.
const BURST: Duration = Duration::from_millis(20);

/// Reads `target` (GROUP, or GROUP/NAME, its semaphore with `permits`)
/// at each change the engine's watch hears and every `every`, and prints
/// each change, until stdout closes. An engine unreachable at the start
/// is an error; later, it is said once on stderr, and the changes
/// meanwhile come when it answers again.
pub async fn run(
    registry: &Registry,
    target: &str,
    permits: Option<u32>,
    every: Duration,
    json: bool,
) -> Result<ExitCode, Error> {
    let (group, name) = match target.split_once('/') {
        Some((group, name)) => (group, Some(name)),
        None => (group_only(target, permits)?, None),
    };
    let locks = registry.locks(group);
    let read = async || match name {
        Some(name) => match permits {
            Some(n) => Ok(vec![locks.semaphore(name, n).inspect().await?]),
            None => Ok(vec![locks.get(name).inspect().await?]),
        },
        None => locks.list().await,
    };
    // Armed before each read, so no change falls between a read and the
    // wait after it; `native` turns false once the engine says it has no
    // watch of its own.
    let mut native = true;
    let arm = async |native: &mut bool| {
        let heard = match native {
            true => locks.watch().await,
            false => return None,
        };
        match heard {
            Ok(changed) => Some(changed),
            Err(Error::Unsupported { .. }) => {
                *native = false;
                None
            }
            // Unreachable: the read says so, and the timer stands in.
            Err(_) => None,
        }
    };
    let mut heard = arm(&mut native).await;
    let mut seen = Seen::default();
    let mut now = Seen::new(read().await?);
    let mut failing = false;
    loop {
        for change in seen.changes(&now, SystemTime::now()) {
            let shown = if json {
                change.json().to_string()
            } else {
                line(&change)
            };
            if writeln!(std::io::stdout(), "{shown}").is_err() {
                return Ok(ExitCode::SUCCESS);
            }
        }
        seen = now;
        loop {
            match heard.take() {
                Some(changed) => {
                    if tokio::time::timeout(every, changed).await.is_ok() {
                        // A burst of changes, one read.
                        tokio::time::sleep(BURST.min(every)).await;
                    }
                }
                None => tokio::time::sleep(every).await,
            }
            heard = arm(&mut native).await;
            match read().await {
                Ok(views) => {
                    failing = false;
                    now = Seen::new(views);
                    break;
                }
                Err(error) if !failing => {
                    failing = true;
                    eprintln!("dlock: {error}; reading again every {} ms", every.as_millis());
                }
                Err(_) => {}
            }
        }
    }
}

fn group_only(group: &str, permits: Option<u32>) -> Result<&str, Error> {
    match permits {
        Some(_) => Err(Error::config(
            "--permits",
            "watches one semaphore: give GROUP/NAME",
        )),
        None => Ok(group),
    }
}

/// One change.
#[derive(Debug, PartialEq, Eq)]
pub struct Change {
    /// When it was seen, ms since the Unix epoch.
    pub at: u64,
    /// `<group>/<name>`.
    pub lock: String,
    /// A semaphore's count; `None` for a lock.
    pub permits: Option<u32>,
    pub event: Event,
    pub mode: Mode,
    pub label: Option<String>,
    pub owner: Option<String>,
    pub fence: Option<u64>,
}

/// What changed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Event {
    /// A hold began.
    Taken,
    /// A hold ended before its lease ran out: let go, or forced out.
    Released,
    /// A hold ended with its lease run out: its holder stopped renewing.
    Expired,
    /// A request joined the line.
    Waiting,
    /// A request left the line without a hold: it gave up, or timed out.
    GaveUp,
}

impl Event {
    fn as_str(self) -> &'static str {
        match self {
            Event::Taken => "taken",
            Event::Released => "released",
            Event::Expired => "expired",
            Event::Waiting => "waiting",
            Event::GaveUp => "gave_up",
        }
    }
}

impl Change {
    /// As `--json` prints it, a line each: `{"at": ms, "lock": "order/42",
    /// "permits": null, "event": "taken", "mode": "write", "label": ...,
    /// "owner": ..., "fence": ...}`.
    pub fn json(&self) -> Value {
        json!({
            "at": self.at,
            "lock": self.lock,
            "permits": self.permits,
            "event": self.event.as_str(),
            "mode": self.mode.as_str(),
            "label": self.label,
            "owner": self.owner,
            "fence": self.fence,
        })
    }
}

/// Who a record is, across reads: the owner digest where dlock wrote it,
/// else what the record shows.
type Who = (Option<String>, Option<u64>, Option<SystemTime>, Option<String>);

fn holder_who(h: &HolderRecord) -> Who {
    (
        h.owner.clone(),
        h.fence,
        h.since,
        h.owner.is_none().then(|| h.label.clone()).flatten(),
    )
}

fn waiter_who(w: &WaiterRecord) -> Who {
    (
        w.owner.clone(),
        None,
        w.since,
        w.owner.is_none().then(|| w.label.clone()).flatten(),
    )
}

/// The records of one read, by lock.
#[derive(Default)]
pub struct Seen(BTreeMap<(String, Option<u32>), LockView>);

impl Seen {
    pub fn new(views: Vec<LockView>) -> Self {
        Seen(
            views
                .into_iter()
                .map(|v| ((format!("{}/{}", v.group, v.name), v.permits), v))
                .collect(),
        )
    }

    /// What changed from `self` to `now`, read at `at`: ends first, then
    /// beginnings, by lock.
    pub fn changes(&self, now: &Seen, at: SystemTime) -> Vec<Change> {
        let ms = at
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        let mut changes = Vec::new();
        let empty = LockView {
            group: String::new(),
            name: String::new(),
            permits: None,
            holders: Vec::new(),
            waiters: Vec::new(),
        };
        let keys: std::collections::BTreeSet<_> = self.0.keys().chain(now.0.keys()).collect();
        for key in keys {
            let (before, after) = (
                self.0.get(key).unwrap_or(&empty),
                now.0.get(key).unwrap_or(&empty),
            );
            let change = |event, mode, label: &Option<String>, owner: &Option<String>, fence| Change {
                at: ms,
                lock: key.0.clone(),
                permits: key.1,
                event,
                mode,
                label: label.clone(),
                owner: owner.clone(),
                fence,
            };
            let held: Vec<Who> = after.holders.iter().map(holder_who).collect();
            let holding = |who: &Who| held.iter().any(|h| h.0.is_some() && h.0 == who.0 || h == who);
            for h in before.holders.iter().filter(|h| !held.contains(&holder_who(h))) {
                let expired = h.lease_ends.is_some_and(|ends| ends <= at);
                let event = if expired { Event::Expired } else { Event::Released };
                changes.push(change(event, h.mode, &h.label, &h.owner, h.fence));
            }
            for w in before.waiters.iter() {
                let who = waiter_who(w);
                let waits = after.waiters.iter().any(|a| waiter_who(a) == who);
                if !waits && !holding(&who) {
                    changes.push(change(Event::GaveUp, w.mode, &w.label, &w.owner, None));
                }
            }
            let had: Vec<Who> = before.holders.iter().map(holder_who).collect();
            for h in after.holders.iter().filter(|h| !had.contains(&holder_who(h))) {
                changes.push(change(Event::Taken, h.mode, &h.label, &h.owner, h.fence));
            }
            let waited: Vec<Who> = before.waiters.iter().map(waiter_who).collect();
            for w in after.waiters.iter().filter(|w| !waited.contains(&waiter_who(w))) {
                changes.push(change(Event::Waiting, w.mode, &w.label, &w.owner, None));
            }
        }
        changes
    }
}

/// `12:00:01.250 order/42 taken write billing 7 0a1b2c3d fence 7`, names
/// and labels escaped.
pub fn line(change: &Change) -> String {
    let mut line = format!(
        "{} {}{} {} {}",
        clock(change.at),
        show::escaped(&change.lock),
        change
            .permits
            .map_or_else(String::new, |n| format!(" ({n} permits)")),
        change.event.as_str(),
        change.mode.as_str()
    );
    for part in [&change.label, &change.owner].into_iter().flatten() {
        line += &format!(" {}", show::escaped(part));
    }
    if let Some(fence) = change.fence {
        line += &format!(" fence {fence}");
    }
    line
}

/// `hh:mm:ss.mmm` of the day, UTC.
fn clock(ms: u64) -> String {
    let of_day = ms % 86_400_000;
    let (h, m, s) = (of_day / 3_600_000, of_day / 60_000 % 60, of_day / 1000 % 60);
    format!("{h:02}:{m:02}:{s:02}.{:03}", of_day % 1000)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn at(s: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(s)
    }

    fn holder(owner: &str, fence: u64, ends: u64) -> HolderRecord {
        HolderRecord {
            label: Some("billing 7".to_owned()),
            owner: Some(owner.to_owned()),
            fence: Some(fence),
            since: Some(at(1)),
            lease_ends: Some(at(ends)),
            ..HolderRecord::default()
        }
    }

    fn waiter(owner: &str) -> WaiterRecord {
        WaiterRecord {
            label: None,
            mode: Mode::Read,
            since: Some(at(2)),
            owner: Some(owner.to_owned()),
        }
    }

    fn seen(holders: Vec<HolderRecord>, waiters: Vec<WaiterRecord>) -> Seen {
        Seen::new(vec![LockView {
            group: "order".to_owned(),
            name: "42".to_owned(),
            permits: None,
            holders,
            waiters,
        }])
    }

    fn events(before: &Seen, after: &Seen, now: u64) -> Vec<(Event, Option<String>)> {
        let changes = before.changes(after, at(now));
        changes.into_iter().map(|c| (c.event, c.owner)).collect()
    }

    #[test]
    fn each_hold_and_wait_that_begins_or_ends_is_one_change() {
        let a = || Some("aaaaaaaa".to_owned());
        let b = || Some("bbbbbbbb".to_owned());
        let start = seen(vec![holder("aaaaaaaa", 7, 30)], vec![waiter("bbbbbbbb")]);
        assert_eq!(
            events(&Seen::default(), &start, 5),
            [(Event::Taken, a()), (Event::Waiting, b())],
            "what is there at the start comes first"
        );
        assert!(events(&start, &start, 6).is_empty(), "nothing changed");

        // The waiter is granted as the holder lets go: no gave_up.
        let handed = seen(vec![holder("bbbbbbbb", 8, 40)], vec![]);
        assert_eq!(
            events(&start, &handed, 10),
            [(Event::Released, a()), (Event::Taken, b())]
        );
        // Gone after its lease ended: expired.
        assert_eq!(events(&handed, &Seen::default(), 41), [(Event::Expired, b())]);
        // A waiter gone without a hold gave up.
        let waiting = seen(vec![holder("aaaaaaaa", 7, 30)], vec![waiter("bbbbbbbb")]);
        let alone = seen(vec![holder("aaaaaaaa", 7, 30)], vec![]);
        assert_eq!(events(&waiting, &alone, 10), [(Event::GaveUp, b())]);
        // The same owner with another fence is another hold.
        let again = seen(vec![holder("aaaaaaaa", 9, 30)], vec![]);
        assert_eq!(
            events(&alone, &again, 10),
            [(Event::Released, a()), (Event::Taken, a())]
        );
    }

    #[test]
    fn a_line_escapes_what_applications_wrote() {
        let change = Change {
            at: 3_723_250,
            lock: "order/\u{1b}[31m".to_owned(),
            permits: Some(3),
            event: Event::Taken,
            mode: Mode::Write,
            label: Some("a\nb".to_owned()),
            owner: Some("0a1b2c3d".to_owned()),
            fence: Some(7),
        };
        assert_eq!(
            line(&change),
            "01:02:03.250 order/\\u{1b}[31m (3 permits) taken write a\\nb 0a1b2c3d fence 7"
        );
        assert_eq!(change.json()["event"], "taken");
    }
}
