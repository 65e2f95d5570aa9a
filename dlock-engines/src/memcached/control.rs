//! An operator's hand on a lock, or on a semaphore's permits, each a slot
//! item taken as a lock's item is. Force release deletes the holder's item,
//! checked against the CAS value it was read with, after leaving a
//! tombstone, `dlock-forced:<key hash>:<owner digest>`, holding the
//! holder's item value and expiring when the item would have: the holder,
//! finding its item gone, reads it ([`MemcachedEngine::forced_out`]).
//! Revoke sets the item's client flags to [`REVOKED`], the same CAS-checked
//! way, keeping value and expiry: the holder's next renewal, checked
//! against the CAS value it last saw, fails, and the read back that
//! follows shows the flags (renewals then keep them). The next holder's
//! item is a new one: it inherits neither.
//!
//! Fences need nothing: every grant takes the next value of the one
//! counter, so the holder after a forced one gets a greater token.

use dlock_core::kit::{EngineError, OwnerId, Request};
use dlock_core::{LockKey, Only};

use super::wire::Reply;
use super::{MemcachedEngine, owner_of, permits};

/// The client flags of a revoked holder's item.
pub(super) const REVOKED: &str = "1";

/// Reads before giving up on an item its holder keeps changing.
const ATTEMPTS: usize = 3;

/// Where word is left that `owner` was forced out of lock `key`.
fn tombstone(key: &LockKey, owner: OwnerId) -> String {
    format!("dlock-forced:{:032x}:{}", key.stable_hash(), owner.digest())
}

/// A holder's item as read: its value, CAS value, a TTL that ends when it
/// does (0, none, if it had none), and whether it was revoked.
struct Found {
    value: Vec<u8>,
    cas: u64,
    ttl: i64,
    revoked: bool,
}

/// Reads lock `key`'s item (`item`) and runs `act` on it, again if `act`
/// finds that the holder changed it meanwhile (answers `None`); 0 if
/// nobody holds it. One round trip for the read, and `act`'s.
async fn on_holder<F, Fut>(engine: &MemcachedEngine, item: &str, act: F) -> Result<u32, EngineError>
where
    F: Fn(Found) -> Fut,
    Fut: Future<Output = Result<Option<u32>, EngineError>>,
{
    for _ in 0..ATTEMPTS {
        let command = format!("mg {item} v c t f\r\n");
        let mut read = engine.call(command.as_bytes(), 1).await?.remove(0);
        let cas = read.flag('c').and_then(|c| c.parse().ok());
        let left: Option<i64> = read.flag('t').and_then(|t| t.parse().ok());
        let revoked = read.flag('f') == Some(REVOKED);
        let (Some(value), Some(cas), Some(left)) = (read.value.take(), cas, left) else {
            return Ok(0);
        };
        let ttl = if left < 0 { 0 } else { left.max(1) };
        if let Some(answer) = act(Found {
            value,
            cas,
            ttl,
            revoked,
        })
        .await?
        {
            return Ok(answer);
        }
    }
    Err(EngineError::failed(
        "memcached: the holder kept changing its item",
    ))
}

/// Two round trips: a read of the holder's item, `item` (lock `key`'s, or
/// a permit slot's), then the tombstone and the delete, if `only` admits
/// the holder (its owner; no record shows a fence). The delete checks the
/// item's CAS, so a holder that came in since is left alone.
pub(super) async fn force_release(
    engine: &MemcachedEngine,
    key: &LockKey,
    item: &str,
    only: &Only,
) -> Result<u32, EngineError> {
    on_holder(engine, item, move |found| async move {
        let Some(owner) = owner_of(&found.value) else {
            return Err(EngineError::failed("memcached: a lock item dlock did not write"));
        };
        if !only.admits(None, Some(&owner.digest())) {
            return Ok(Some(0));
        }
        // The word first: a holder never finds its item gone without it.
        let tomb = tombstone(key, owner);
        let mut command = format!("ms {tomb} {} T{}\r\n", found.value.len(), found.ttl).into_bytes();
        command.extend_from_slice(&found.value);
        command.extend_from_slice(format!("\r\nmd {item} C{}\r\n", found.cas).as_bytes());
        let [_, deleted] = <[Reply; 2]>::try_from(engine.call(&command, 2).await?).expect("two replies");
        if deleted.code() == "HD" {
            return Ok(Some(1));
        }
        // Renewed (EX) or gone (NF) meanwhile: this holder was not forced out.
        engine.call(format!("md {tomb}\r\n").as_bytes(), 1).await?;
        Ok((deleted.code() == "NF").then_some(0))
    })
    .await
}

/// Two round trips: a read of the holder's item, `item`, then the flags
/// set, if `only` admits the holder; the set checks the item's CAS.
pub(super) async fn revoke(engine: &MemcachedEngine, item: &str, only: &Only) -> Result<u32, EngineError> {
    on_holder(engine, item, move |found| async move {
        if !only.admits(None, owner_of(&found.value).map(OwnerId::digest).as_deref()) {
            return Ok(Some(0));
        }
        if found.revoked {
            return Ok(Some(1));
        }
        let mut command = format!(
            "ms {item} {} T{} F{REVOKED} C{}\r\n",
            found.value.len(),
            found.ttl,
            found.cas
        )
        .into_bytes();
        command.extend_from_slice(&found.value);
        command.extend_from_slice(b"\r\n");
        Ok(match engine.call(&command, 1).await?.remove(0).code() {
            "HD" => Some(1),
            "NF" => Some(0),
            _ => None, // Renewed meanwhile: read it again.
        })
    })
    .await
}

/// Whether a tombstone for `req`'s hold, a lock's or a permit's, is
/// there: one round trip.
pub(super) async fn forced_out(engine: &MemcachedEngine, req: &Request) -> Result<bool, EngineError> {
    let Some(held) = MemcachedEngine::held(req).or_else(|| permits::held(req)) else {
        return Ok(false);
    };
    let command = format!("mg {} v\r\n", tombstone(&req.key, req.owner));
    let found = engine.call(command.as_bytes(), 1).await?.remove(0);
    Ok(found.value.is_some_and(|v| v == held.value))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tombstone_names_the_lock_and_the_owner_by_digest_alone() {
        let (key, owner) = (LockKey::new("g", "n").unwrap(), OwnerId::random());
        let tomb = tombstone(&key, owner);
        assert!(tomb.ends_with(&owner.digest()) && !tomb.contains(&owner.to_string()));
        assert_ne!(tomb, tombstone(&LockKey::new("g", "m").unwrap(), owner));
        let value = format!("{owner} g\0n");
        assert_eq!(owner_of(value.as_bytes()), Some(owner));
        assert_eq!(owner_of(b"short"), None);
    }
}
