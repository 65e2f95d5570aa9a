//! Writes that land only while the hold is current: the user's own
//! transaction, nested in one that first compares the hold's key with its
//! create revision (what etcd's `Mutex.IsOwner` gives).

use dlock_core::kit::{EngineError, HeldBy, held_by};
use dlock_core::{Error, HeldLock};
use etcd_client::{Compare, CompareOp, Txn, TxnOp, TxnOpResponse, TxnResponse};

use super::{EtcdEngine, requested};

/// A hold's writes to etcd, each landing only while the hold is current,
/// checked by etcd in the same transaction.
///
/// ```no_run
/// # async fn demo() -> Result<(), dlock::Error> {
/// use dlock::engines::etcd::{HeldTxn, etcd_client::{Txn, TxnOp}};
///
/// let guard = dlock::lock("leader", "config").lock().await?;
/// let txn = Txn::new().and_then([TxnOp::put("/config/leader", "me", None)]);
/// // Err(Lost) if the hold has ended (expired, taken over, forced out).
/// let answer = HeldTxn::of(&guard)?.commit(txn).await?;
/// assert!(answer.succeeded()); // the user's own compares, if any, held
/// # Ok(())
/// # }
/// ```
pub struct HeldTxn<'a> {
    held: HeldBy<'a, EtcdEngine>,
}

impl<'a> HeldTxn<'a> {
    /// The held writes of `guard`'s hold (a lock's, a permit's or a
    /// leader's); `Unsupported` where it is not on an etcd engine.
    pub fn of(guard: &'a impl AsRef<HeldLock>) -> Result<Self, Error> {
        let held = held_by(guard.as_ref(), "etcd::HeldTxn")?;
        Ok(HeldTxn { held })
    }

    /// Commits `txn` if the hold is still current, and answers `txn`'s own
    /// response (its compares decide between its success and failure
    /// operations); `Err(Lost)` without applying any of it otherwise. Sent
    /// once: should the answer not come within `call_timeout`, the error
    /// says so and whether it landed is unknown.
    pub async fn commit(&self, txn: Txn) -> Result<TxnResponse, Error> {
        let req = self.held.request();
        let hold = requested(req)
            .key
            .lock()
            .as_ref()
            .map(|c| (c.key.clone(), c.created, c.session.kv()));
        self.held
            .write(async move {
                let Some((key, created, mut kv)) = hold else {
                    return Ok(None);
                };
                let checked = Txn::new()
                    .when([Compare::create_revision(key, CompareOp::Equal, created)])
                    .and_then([TxnOp::txn(txn)]);
                let answer = kv.txn(checked).await.map_err(EngineError::failed)?;
                if !answer.succeeded() {
                    return Ok(None);
                }
                match answer.op_responses().into_iter().next() {
                    Some(TxnOpResponse::Txn(inner)) => Ok(Some(inner)),
                    _ => Err(EngineError::failed(
                        "etcd answered a nested transaction with no response",
                    )),
                }
            })
            .await
    }
}
