//! An operator's hand on a lock. Force release deletes its holders' keys;
//! revoke marks them, adding a last line, [`REVOKED`], to each holder's
//! value, which its renewal reads. Both find the holders as the grants do
//! (`queue.rs`), from one read of the lock's prefix, and touch only keys
//! still as read: a key that holds goes on holding until it goes (keys only
//! leave the line ahead of it), so a holder that came in since is left
//! alone. The session's lease is never revoked: the holds of the session's
//! other locks live on it.
//!
//! A holder watches its key once its first renewal is due (on the
//! engine's one watch stream): a mark, or the key's delete, wakes the
//! core, which renews at once and so hears of it then, not a third of a
//! lease later. A hold that ends sooner watches nothing.
//!
//! Keys `etcdctl lock` put are holders like any other: deleting one lets
//! the next waiter in, and a mark leaves it a writer (its value no more
//! starts with the reader's mark than it did).

use std::sync::Arc;

use dlock_core::Only;
use dlock_core::kit::{EngineError, RevokedSignal};
use etcd_client::{Compare, CompareOp, KeyValue, PutOptions, Txn, TxnOp, TxnOpResponse};

use super::queue;
use super::records::{admits, contenders};
use super::session::Session;
use super::watches::Watches;

/// The last line of a revoked holder's key's value. Nothing is written
/// after it (a handoff rewrites waiters' keys, not holders'), and a first
/// line holds no newline.
pub(crate) const REVOKED: &[u8] = b"\nrevoked";

/// Resolves when the holder's `key` is written or deleted: the core then
/// renews at once. A watch that cannot be made, or a stream that breaks,
/// leaves it to the renewals.
pub(crate) fn listen(watches: Arc<Watches>, key: String) -> RevokedSignal {
    Box::pin(async move {
        if let Some(mut watch) = watches.watch(key.into_bytes(), false, false).await
            && watch.changed().await.is_some()
        {
            return;
        }
        std::future::pending().await
    })
}

/// Sub-transactions per transaction, well under etcd's `--max-txn-ops`.
const BATCH: usize = 64;

/// Marking again the holders whose key changed under a revoke (a
/// downgrade) gives up after this many reads.
const ATTEMPTS: usize = 3;

pub(crate) fn is_revoked(value: &[u8]) -> bool {
    value.ends_with(REVOKED)
}

/// The holders of the lock whose keys are under `prefix`, or with
/// `permits` of the semaphore, that `only` admits.
async fn holders(
    session: &Session,
    prefix: &str,
    permits: Option<u32>,
    only: &Only,
) -> Result<Vec<KeyValue>, EngineError> {
    let kvs = contenders(session, prefix).await?;
    let holding = queue::holding(&kvs, permits);
    let holders = kvs.into_iter().zip(holding).filter(|(_, holds)| *holds);
    Ok(holders.map(|(kv, _)| kv).filter(|kv| admits(only, kv)).collect())
}

/// Runs each of `guarded`, a key's check and its change, in as few round
/// trips as batches allow; says which passed its check.
async fn each(session: &Session, guarded: Vec<Txn>) -> Result<Vec<bool>, EngineError> {
    let mut passed = Vec::with_capacity(guarded.len());
    for batch in guarded.chunks(BATCH) {
        let ops = batch.iter().cloned().map(TxnOp::txn);
        let answer = session.txn(Txn::new().and_then(ops.collect::<Vec<_>>())).await?;
        passed.extend(answer.op_responses().into_iter().map(|op| match op {
            TxnOpResponse::Txn(txn) => txn.succeeded(),
            _ => false,
        }));
    }
    Ok(passed)
}

fn as_created(kv: &KeyValue) -> Compare {
    Compare::create_revision(kv.key(), CompareOp::Equal, kv.create_revision())
}

/// Deletes the keys of the holders of the lock under `prefix` (with
/// `permits`, of the semaphore) that `only` admits, each while it is the
/// key that was read (its create revision); answers how many it deleted. A
/// permit's slot key is left to its lease: it names a key gone, so the
/// slot is free. A reply lost and the call retried undercounts: the keys
/// deleted the first time are gone when it checks again.
pub(crate) async fn force_release(
    session: &Session,
    prefix: &str,
    permits: Option<u32>,
    only: &Only,
) -> Result<u32, EngineError> {
    let holders = holders(session, prefix, permits, only).await?;
    let deletes = holders.iter().map(|kv| {
        Txn::new()
            .when([as_created(kv)])
            .and_then([TxnOp::delete(kv.key(), None)])
    });
    let deleted = each(session, deletes.collect()).await?;
    Ok(deleted.into_iter().filter(|&d| d).count() as u32)
}

/// Marks the holders of the lock under `prefix` (with `permits`, of the
/// semaphore) that `only` admits as revoked; answers how many are marked,
/// by this call or an earlier one. Each mark checks that the key was not
/// rewritten since it was read; one that was is read and marked again.
pub(crate) async fn revoke(
    session: &Session,
    prefix: &str,
    permits: Option<u32>,
    only: &Only,
) -> Result<u32, EngineError> {
    let mut holders = holders(session, prefix, permits, only).await?;
    let mut asked = 0;
    for _ in 0..ATTEMPTS {
        let (marked, unmarked): (Vec<_>, Vec<_>) = holders.into_iter().partition(|kv| is_revoked(kv.value()));
        asked += marked.len() as u32;
        let marks = unmarked.iter().map(|kv| {
            let mut value = kv.value().to_vec();
            value.extend_from_slice(REVOKED);
            Txn::new()
                .when([
                    as_created(kv),
                    Compare::mod_revision(kv.key(), CompareOp::Equal, kv.mod_revision()),
                ])
                .and_then([TxnOp::put(
                    kv.key(),
                    value,
                    Some(PutOptions::new().with_ignore_lease()),
                )])
        });
        let done = each(session, marks.collect()).await?;
        asked += done.iter().filter(|&&d| d).count() as u32;
        let changed: Vec<(Vec<u8>, i64)> = unmarked
            .iter()
            .zip(done)
            .filter(|(_, done)| !done)
            .map(|(kv, _)| (kv.key().to_vec(), kv.create_revision()))
            .collect();
        if changed.is_empty() {
            return Ok(asked);
        }
        // Still there as created: still holding. Gone: nobody to ask.
        holders = contenders(session, prefix).await?;
        holders.retain(|kv| changed.contains(&(kv.key().to_vec(), kv.create_revision())));
    }
    Err(EngineError::failed(
        "cannot revoke: the holders' keys keep changing",
    ))
}
