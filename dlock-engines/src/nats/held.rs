//! Writes that land only while the hold is current: the user's key is
//! written with an expected revision of the hold's key
//! (`Nats-Expected-Last-Subject-Sequence-Subject`), so the stream refuses
//! it once that key has been removed, expired or taken over.

use async_nats::HeaderMap;
use dlock_core::kit::{HeldBy, held_by};
use dlock_core::{Error, HeldLock};

use super::write::Wrote;
use super::{NatsEngine, failed, queued};

/// Where the users' keys are in the bucket, apart from the engine's.
pub(crate) const DATA: &str = "d.";

/// How often a write refused because the holder itself wrote its key
/// meanwhile (a renewal, an operator's mark) is sent again.
const RETRIES: usize = 3;

/// A hold's writes to the engine's own bucket, each to one key of the
/// user's, landing only while the hold's key is as this holder last saw
/// it or rewrote it: none lands once the key has gone (released, expired
/// on the server's clock, forced out). A user's key `k` is the bucket's
/// key `d.<k>`, apart from the engine's; read it with any KV client.
///
/// ```no_run
/// # async fn demo() -> Result<(), dlock::Error> {
/// use dlock::engines::nats::HeldPut;
///
/// let guard = dlock::lock("jobs", "import").lock().await?;
/// // Err(Lost) if the hold has ended: then nothing was written.
/// let revision = HeldPut::of(&guard)?.put("import.cursor", "4096").await?;
/// # let _ = revision;
/// # Ok(())
/// # }
/// ```
pub struct HeldPut<'a> {
    held: HeldBy<'a, NatsEngine>,
}

impl<'a> HeldPut<'a> {
    /// The held writes of `guard`'s hold; `Unsupported` where it is not on
    /// a NATS engine.
    pub fn of(guard: &'a impl AsRef<HeldLock>) -> Result<Self, Error> {
        let held = held_by(guard.as_ref(), "nats::HeldPut")?;
        Ok(HeldPut { held })
    }

    /// The bucket's key that the user's key `key` is: `d.<key>`.
    pub fn key(key: &str) -> String {
        format!("{DATA}{key}")
    }

    /// Puts `value` at the user's key `key` if the hold is still current;
    /// its new revision, or `Err(Lost)` with nothing written. Sent once
    /// (again only where the holder itself had rewritten its key); should
    /// no answer come within `call_timeout`, the error says so and whether
    /// it landed is unknown.
    pub async fn put(&self, key: &str, value: impl AsRef<[u8]>) -> Result<u64, Error> {
        self.send(key, HeaderMap::new(), value.as_ref().to_vec()).await
    }

    /// Deletes the user's key `key` (a delete marker, as a KV client's
    /// `delete`) if the hold is still current; as [`put`](Self::put).
    pub async fn delete(&self, key: &str) -> Result<u64, Error> {
        let mut headers = HeaderMap::new();
        headers.insert("KV-Operation", "DEL");
        self.send(key, headers, Vec::new()).await
    }

    async fn send(&self, key: &str, mut headers: HeaderMap, payload: Vec<u8>) -> Result<u64, Error> {
        let engine = self.held.store();
        let req = self.held.request();
        let hold = queued(req).filter(|q| q.held);
        let key = Self::key(key);
        self.held
            .write(async move {
                let Some(hold) = hold else {
                    return Ok(None);
                };
                headers.insert(
                    "Nats-Expected-Last-Subject-Sequence-Subject",
                    engine.subject(&hold.key).as_str(),
                );
                let mut expected = hold.revision;
                for _ in 0..RETRIES {
                    match engine
                        .publish(&key, headers.clone(), payload.clone(), expected)
                        .await?
                    {
                        Wrote::Done(revision) => return Ok(Some(revision)),
                        Wrote::Refused => {}
                    }
                    // The holder's own renewal or an operator's mark moves the
                    // key on while it is still this hold's.
                    match engine.last(&hold.key).await? {
                        Some(found)
                            if found.stake.owner() == Some(req.owner) && found.created == hold.created =>
                        {
                            expected = found.revision;
                        }
                        _ => return Ok(None),
                    }
                }
                Err(failed("the hold's key kept changing under the write"))
            })
            .await
    }
}
