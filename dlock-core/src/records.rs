//! Who holds a lock, who waits, and since when: what an operator asks, as
//! an engine can tell it. Every record names a holder by its process's
//! label and a short digest of its owner id, never the id itself, which is
//! what renews and releases a hold.
//!
//! A view, and what an operator's act did ([`Acted`]), serialize to the
//! JSON the `dlock` command prints and the admin page serves: modes as
//! `"read"` / `"write"`, times as milliseconds since the Unix epoch, a field
//! the engine cannot tell as `null`.

use std::time::{Duration, SystemTime};

use serde::{Serialize, Serializer};

use crate::Mode;
use crate::kit::OwnerId;

/// A lock or semaphore as its engine saw it at one moment.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct LockView {
    /// The lock's group.
    pub group: String,
    /// The lock's name.
    pub name: String,
    /// A semaphore's count, as its holders and waiters agree on it; `None`
    /// for a lock.
    pub permits: Option<u32>,
    /// Who holds it now.
    pub holders: Vec<HolderRecord>,
    /// Who waits for it, first in line first.
    pub waiters: Vec<WaiterRecord>,
}

impl LockView {
    /// Nobody holds it and nobody waits.
    pub fn is_free(&self) -> bool {
        self.holders.is_empty() && self.waiters.is_empty()
    }
}

/// One hold. A field the engine cannot tell is `None`: a hold made by
/// another client of the same layout (Curator on ZooKeeper, `etcdctl lock`
/// on etcd) carries no dlock label or owner; a dlock hold always has its
/// label, since and owner digest, and its fence where the engine's records
/// show fences ([`Capabilities::fence_in_records`](crate::kit::Capabilities::fence_in_records)).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct HolderRecord {
    /// The holding process's label: its `client_name`, by default
    /// `<host name>:<pid>`.
    pub label: Option<String>,
    /// Read or write; a permit is `Write`.
    #[serde(serialize_with = "mode_word")]
    pub mode: Mode,
    /// The hold's fencing token.
    pub fence: Option<u64>,
    /// A permit's slot (see [`HeldLock::slot`](crate::HeldLock::slot)).
    pub slot: Option<u32>,
    /// When it was granted, by the server's clock where it has one.
    #[serde(serialize_with = "millis")]
    pub since: Option<SystemTime>,
    /// When its lease ends unless renewed; `None` where the hold ends with
    /// a session or connection whose end the engine cannot see.
    #[serde(serialize_with = "millis")]
    pub lease_ends: Option<SystemTime>,
    /// How long each renewal extends the hold (in JSON, ms). With
    /// [`renewed`](Self::renewed), it tells a dead holder from a slow one:
    /// a live holder's watchdog renews every third of it.
    #[serde(serialize_with = "span_millis")]
    pub lease: Option<Duration>,
    /// When the hold was last renewed (for a hold that ends with a
    /// session, when the session was).
    #[serde(serialize_with = "millis")]
    pub renewed: Option<SystemTime>,
    /// A short digest of the owner id (see [`OwnerId::digest`]).
    pub owner: Option<String>,
}

impl HolderRecord {
    /// The lease and its end read from the server, and the renewal that
    /// set that end: `ends - lease`.
    pub fn leased(mut self, ends: SystemTime, lease: Duration) -> Self {
        self.lease_ends = Some(ends);
        self.lease = Some(lease);
        self.renewed = ends.checked_sub(lease);
        self
    }
}

/// A writer of whom nothing more is known: what an engine fills in, and
/// leaves the rest of (`..HolderRecord::default()`).
impl Default for HolderRecord {
    fn default() -> Self {
        HolderRecord {
            label: None,
            mode: Mode::Write,
            fence: None,
            slot: None,
            since: None,
            lease_ends: None,
            lease: None,
            renewed: None,
            owner: None,
        }
    }
}

/// One waiting request; `None` as for [`HolderRecord`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct WaiterRecord {
    /// The waiting process's label.
    pub label: Option<String>,
    /// What it waits for.
    #[serde(serialize_with = "mode_word")]
    pub mode: Mode,
    /// When it joined the line.
    #[serde(serialize_with = "millis")]
    pub since: Option<SystemTime>,
    /// A short digest of the owner id.
    pub owner: Option<String>,
}

/// Which holds an operator's act is for: those whose record shows this
/// fence, this owner digest, or both. The engine checks it on the server,
/// against the hold it acts on, so a hold that changed hands since the
/// operator looked is left alone. [`Only::any`] is every hold.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Only {
    /// The hold's fencing token, as its record shows it.
    pub fence: Option<u64>,
    /// The owner digest of the hold's record ([`OwnerId::digest`]).
    pub owner: Option<String>,
}

impl Only {
    /// Every hold.
    pub fn any() -> Self {
        Only::default()
    }

    /// The hold with this fencing token.
    pub fn fence(fence: u64) -> Self {
        Only {
            fence: Some(fence),
            owner: None,
        }
    }

    /// The hold of this owner digest.
    pub fn owner(digest: impl Into<String>) -> Self {
        Only {
            fence: None,
            owner: Some(digest.into()),
        }
    }

    /// Whether every hold is meant.
    pub fn is_any(&self) -> bool {
        self.fence.is_none() && self.owner.is_none()
    }

    /// Whether a hold with the fence `fence` and the owner digest `owner`
    /// (each `None` where unknown: such a hold is admitted only by a
    /// condition that does not ask for it) is one of these.
    pub fn admits(&self, fence: Option<u64>, owner: Option<&str>) -> bool {
        let fenced = self.fence.is_none_or(|wanted| fence == Some(wanted));
        fenced && self.owner.as_deref().is_none_or(|wanted| owner == Some(wanted))
    }

    /// Whether the hold `record` shows is one of these.
    pub fn admits_record(&self, record: &HolderRecord) -> bool {
        self.admits(record.fence, record.owner.as_deref())
    }
}

impl std::fmt::Display for Only {
    /// `fence 1234`, `owner 0a1b2c3d`, both, or `every hold`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match (self.fence, &self.owner) {
            (None, None) => f.write_str("every hold"),
            (Some(fence), None) => write!(f, "fence {fence}"),
            (None, Some(owner)) => write!(f, "owner {owner}"),
            (Some(fence), Some(owner)) => write!(f, "fence {fence} of owner {owner}"),
        }
    }
}

/// What an operator's act on a lock did, as the `dlock` command
/// (`--json`) prints it and the admin page answers it:
/// `{"lock": "order/42", "forced_out": 1}`, or `"asked"` for a revocation.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Acted {
    /// `<group>/<name>`.
    pub lock: String,
    /// What was done, to how many.
    #[serde(flatten)]
    pub reached: Reached,
}

/// Whom an operator's act reached, and how many.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Reached {
    /// A force release: the holds it ended.
    ForcedOut(u32),
    /// A revocation: the holders it asked to let go.
    Asked(u32),
}

impl Acted {
    /// How many holds or holders the act reached (0: the lock was free).
    pub fn holders(&self) -> u32 {
        match self.reached {
            Reached::ForcedOut(n) | Reached::Asked(n) => n,
        }
    }
}

impl std::fmt::Display for Acted {
    /// `order/42: forced out 1 holder(s)`, `order/42: asked 2 holder(s)`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let verb = match self.reached {
            Reached::ForcedOut(_) => "forced out",
            Reached::Asked(_) => "asked",
        };
        write!(f, "{}: {verb} {} holder(s)", self.lock, self.holders())
    }
}

fn mode_word<S: Serializer>(mode: &Mode, out: S) -> Result<S::Ok, S::Error> {
    out.serialize_str(mode.as_str())
}

fn span_millis<S: Serializer>(span: &Option<Duration>, out: S) -> Result<S::Ok, S::Error> {
    match span {
        Some(span) => out.serialize_some(&(span.as_millis() as u64)),
        None => out.serialize_none(),
    }
}

/// Milliseconds since the Unix epoch: what a script or a page reads.
pub(crate) fn millis<S: Serializer>(time: &Option<SystemTime>, out: S) -> Result<S::Ok, S::Error> {
    let ms = time.and_then(|t| t.duration_since(SystemTime::UNIX_EPOCH).ok());
    match ms {
        Some(ms) => out.serialize_some(&(ms.as_millis() as u64)),
        None => out.serialize_none(),
    }
}

impl OwnerId {
    /// Eight hex digits that tell holds apart in a listing and match
    /// [`Guard::owner_digest`](crate::Guard::owner_digest), without being
    /// the id: 32 bits of a 128-bit random id give nothing to renew or
    /// release with.
    pub fn digest(self) -> String {
        // SplitMix64's finalizer over both halves.
        let mut z = (self.as_u128() as u64) ^ ((self.as_u128() >> 64) as u64).rotate_left(29);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        format!("{:08x}", (z ^ (z >> 31)) as u32)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_digest_is_eight_hex_digits_and_not_the_id() {
        let owner = OwnerId::random();
        let digest = owner.digest();
        assert_eq!(digest.len(), 8);
        assert!(digest.chars().all(|c| c.is_ascii_hexdigit()));
        assert!(!owner.to_string().contains(&digest));
        assert_eq!(digest, owner.digest(), "the same id, the same digest");
        assert_ne!(digest, OwnerId::random().digest());
    }
}
