//! Writes that land only while the hold is current: one script renews the
//! hold, as the watchdog would, and makes the writes only if it still
//! holds (`scripts/held.lua`).

use dlock_core::kit::{EngineError, HeldBy, held_by};
use dlock_core::{Error, HeldLock};

use super::{RedisEngine, keys, millis};

/// A hold's writes to Redis, made in one script with the hold's renewal,
/// only if the hold is still current: a holder paused past its lease, or
/// forced out, writes nothing. A lock's holder (write or read) and a
/// permit's may write.
///
/// On a cluster every key written must be in the lock's slot:
/// [`beside`](HeldWrite::beside) names such keys. A key in another slot is
/// refused by the server (`CROSSSLOT`), and nothing is written.
///
/// ```no_run
/// # async fn demo() -> Result<(), dlock::Error> {
/// use dlock::engines::redis::HeldWrite;
///
/// let guard = dlock::lock("jobs", "import").lock().await?;
/// let held = HeldWrite::of(&guard)?;
/// let (cursor, stats) = (held.beside("cursor"), held.beside("stats"));
/// // Err(Lost) if the hold has ended: then nothing was written.
/// held.set(&cursor, "4096").hset(&stats, "rows", "4096").commit().await?;
/// # Ok(())
/// # }
/// ```
pub struct HeldWrite<'a> {
    held: HeldBy<'a, RedisEngine>,
    /// One per write.
    keys: Vec<String>,
    /// Each write's command, its arguments' count, and those.
    args: Vec<Vec<u8>>,
}

impl<'a> HeldWrite<'a> {
    /// The held writes of `guard`'s hold; `Unsupported` where it is not on
    /// a Redis engine (single, Cluster or Sentinel).
    pub fn of(guard: &'a impl AsRef<HeldLock>) -> Result<Self, Error> {
        let held = held_by(guard.as_ref(), "redis::HeldWrite")?;
        Ok(HeldWrite {
            held,
            keys: Vec::new(),
            args: Vec::new(),
        })
    }

    /// A key of the user's own named `name`, in the lock's hash slot and
    /// apart from the engine's keys: `{dlock:<group>:<name>}:data:<name>`.
    pub fn beside(&self, name: &str) -> String {
        let mut key = keys::prefix(&self.held.request().key);
        key.push_str(":data:");
        keys::escape_into(name, &mut key);
        key
    }

    /// `SET key value`, with the others.
    pub fn set(self, key: &str, value: impl AsRef<[u8]>) -> Self {
        self.write("SET", key, &[value.as_ref()])
    }

    /// `HSET key field value`, with the others.
    pub fn hset(self, key: &str, field: &str, value: impl AsRef<[u8]>) -> Self {
        self.write("HSET", key, &[field.as_bytes(), value.as_ref()])
    }

    /// `DEL key`, with the others.
    pub fn del(self, key: &str) -> Self {
        self.write("DEL", key, &[])
    }

    fn write(mut self, command: &str, key: &str, args: &[&[u8]]) -> Self {
        self.keys.push(key.to_owned());
        self.args.push(command.as_bytes().to_vec());
        self.args.push(args.len().to_string().into_bytes());
        self.args.extend(args.iter().map(|arg| arg.to_vec()));
        self
    }

    /// Makes the writes, in order, if the hold is still current, renewing
    /// it; `Err(Lost)`, with nothing written, otherwise. Sent once: should
    /// the answer not come within `call_timeout`, the error says so and
    /// whether they landed is unknown.
    pub async fn commit(self) -> Result<(), Error> {
        let engine = self.held.store();
        let req = self.held.request();
        let permit = self.held.is_permit();
        let (script, record) = match permit {
            true => (&engine.scripts.held_permit, keys::record(&req.key, true)),
            false => (&engine.scripts.held, keys::record(&req.key, false)),
        };
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(script.get_hash())
            .arg(1 + self.keys.len())
            .arg(record)
            .arg(&self.keys);
        cmd.arg(req.owner.to_string());
        if permit {
            cmd.arg("renew");
        }
        cmd.arg(millis(req.lease)).arg(&self.args);
        self.held
            .write(async move {
                let held: u8 = engine.send(script, cmd).await.map_err(EngineError::failed)?;
                Ok((held == 1).then_some(()))
            })
            .await
    }
}
