//! The bucket's keys, and what a request's key holds.
//!
//! A lock's contenders are the keys `l.<group>.<name>.<id>`, a
//! semaphore's `s.<group>.<name>.<id>`, and a permit's slot
//! `p.<group>.<name>.<slot>`. A key's tokens allow only `[A-Za-z0-9_-]`:
//! any other byte of a group or name is written `=XX` (hex), and a part
//! whose escaped form would be long is its 128-bit hash, `==<hex>`, with
//! the name kept in the value for records.

use std::time::{Duration, SystemTime};

use dlock_core::LockKey;
use dlock_core::kit::{OwnerId, Request};
use serde::{Deserialize, Serialize};

/// The longest escaped part kept as it is; longer ones are hashed.
const MAX_PART: usize = 200;

/// A lock's or semaphore's line: the prefix of its contenders' keys.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Line(pub String);

impl Line {
    pub fn lock(key: &LockKey) -> Line {
        Line(format!("l.{}", place(key)))
    }

    pub fn semaphore(key: &LockKey) -> Line {
        Line(format!("s.{}", place(key)))
    }

    /// The key of `slot` of this semaphore's permits.
    pub fn slot(&self, slot: u32) -> String {
        format!("p.{}.{slot}", &self.0[2..])
    }

    /// A fresh contender's key.
    pub fn contender(&self) -> String {
        format!("{}.{:016x}", self.0, OwnerId::random().as_u128() as u64)
    }

    /// The line `key` (a contender's) is in.
    pub fn of(key: &str) -> Option<Line> {
        let (line, _) = key.rsplit_once('.')?;
        (line.starts_with("l.") || line.starts_with("s.")).then(|| Line(line.to_owned()))
    }

    /// The group and name, unescaped: `None` for a hashed part.
    pub fn names(&self) -> (Option<String>, Option<String>) {
        let mut parts = self.0[2..].split('.');
        let mut next = || parts.next().and_then(unescape);
        (next(), next())
    }
}

/// `<group>.<name>`, each escaped.
fn place(key: &LockKey) -> String {
    format!("{}.{}", part(key.group()), part(key.name()))
}

/// The prefix of a group's lines of one kind (`l` or `s`).
pub(crate) fn group_prefix(kind: char, group: &str) -> String {
    format!("{kind}.{}.", part(group))
}

/// A group's name as keys write it.
pub(crate) fn group_token(group: &str) -> String {
    part(group)
}

fn part(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for b in text.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'_' | b'-' => out.push(b as char),
            _ => out.push_str(&format!("={b:02X}")),
        }
    }
    if out.is_empty() {
        // A token may not be empty.
        return "=".to_owned();
    }
    if out.len() > MAX_PART {
        return format!("=={:032x}", hash(text));
    }
    out
}

fn unescape(part: &str) -> Option<String> {
    if part == "=" {
        return Some(String::new());
    }
    if part.starts_with("==") {
        return None;
    }
    let bytes = part.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'=' {
            out.push(u8::from_str_radix(part.get(i + 1..i + 3)?, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

fn hash(text: &str) -> u128 {
    LockKey::new("g", text).map_or(0, |k| k.stable_hash())
}

/// What a contender's (or a slot's) key holds, as JSON.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub(crate) struct Stake {
    /// The owner id, hex.
    pub o: String,
    /// `w` or `r`.
    pub m: char,
    /// The key's first revision, its place in line and fence; absent in
    /// the first write, whose own revision it is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub c: Option<u64>,
    /// The holder's label.
    pub l: String,
    /// When the request first queued, ms since the epoch, its clock.
    pub s: u64,
    /// The lease this write set, ms.
    pub t: u64,
    /// When this write was made, ms since the epoch, its clock.
    pub u: u64,
    /// Asked to let go.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub x: bool,
    /// The permits a semaphore's contender counts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub k: Option<u32>,
    /// The group and name, where the key hashes either.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub n: Option<(String, String)>,
}

impl Stake {
    /// A new contender's stake for `req`.
    pub fn new(req: &Request, label: &str, line: &Line, permits: Option<u32>) -> Stake {
        let (group, name) = line.names();
        let hashed = group.is_none() || name.is_none();
        Stake {
            o: req.owner.to_string(),
            m: match req.mode {
                dlock_core::Mode::Read => 'r',
                dlock_core::Mode::Write => 'w',
            },
            c: None,
            l: label.to_owned(),
            s: millis_now(),
            t: millis(req.lease),
            u: millis_now(),
            x: false,
            k: permits,
            n: hashed.then(|| (req.key.group().to_owned(), req.key.name().to_owned())),
        }
    }

    pub fn owner(&self) -> Option<OwnerId> {
        u128::from_str_radix(&self.o, 16).ok().map(OwnerId::from_u128)
    }

    pub fn is_writer(&self) -> bool {
        self.m == 'w'
    }

    pub fn lease(&self) -> Duration {
        Duration::from_millis(self.t)
    }

    pub fn since(&self) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_millis(self.s)
    }

    pub fn renewed(&self) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_millis(self.u)
    }

    /// The same stake, written again now for `lease`.
    pub fn again(&self, created: u64, lease: Duration) -> Stake {
        Stake {
            c: Some(created),
            t: millis(lease),
            u: millis_now(),
            ..self.clone()
        }
    }
}

pub(crate) fn millis(span: Duration) -> u64 {
    span.as_millis() as u64
}

fn millis_now() -> u64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn groups_and_names_are_escaped_into_tokens_and_read_back() {
        let key = LockKey::new("order", "a.b c/=").unwrap();
        let line = Line::lock(&key);
        assert_eq!(line.0, "l.order.a=2Eb=20c=2F=3D");
        assert_eq!(
            line.names(),
            (Some("order".to_owned()), Some("a.b c/=".to_owned()))
        );
        assert_eq!(line.slot(3), "p.order.a=2Eb=20c=2F=3D.3");
        let contender = line.contender();
        assert_eq!(Line::of(&contender), Some(line));
        let long = LockKey::new("g", "n".repeat(MAX_PART + 1)).unwrap();
        assert_eq!(Line::semaphore(&long).names(), (Some("g".to_owned()), None));
    }
}
