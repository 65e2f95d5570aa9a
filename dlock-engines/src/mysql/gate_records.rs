//! Records of write holds taken at once. Such a hold has no row, only its
//! session holding the gate, and other sessions can learn no more of it
//! than that session's id (`IS_USED_LOCK`). Writing its record as it takes
//! the gate would add a write to every uncontended cycle, which writes
//! nothing today. So a hold writes its record (`dlock_gates`) only once it
//! has lasted [`RECORD_AFTER`](dlock_core::kit::RECORD_AFTER), through the pool, and removes it before it
//! lets the gate go: a shorter hold writes nothing, a longer one pays a
//! write, a delete and a round trip, a small share of its length. Readers
//! of records wait for young holds (`records.rs`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use dlock_core::LockKey;
use dlock_core::kit::{Deferrals, Deferred, OwnerId};
use mysql_async::Pool;
use mysql_async::prelude::ToValue;

use super::sql::key_and_name;
use super::{gate, micros, sql};

/// What a record says of a hold.
pub struct Hold {
    pub lock: LockKey,
    /// The id of the session holding the gate.
    pub conn: u32,
    pub owner: OwnerId,
    pub fence: u64,
    pub label: Arc<str>,
    pub lease: Duration,
}

/// The record of one hold, to be written once it has lasted.
pub struct Record(Deferred);

impl Record {
    /// Writes the record of `hold`, taken now, [`RECORD_AFTER`](dlock_core::kit::RECORD_AFTER) from now
    /// (`records` waits that long), unless stopped before; the statement
    /// checks that the session still holds the gate. What only the write
    /// needs is made in it.
    pub fn later(records: &Deferrals, pool: Pool, hold: Hold) -> Record {
        let taken = Instant::now();
        Record(records.after(async move {
            let Ok(mut conn) = pool.get_conn().await else {
                return false;
            };
            let (gate, (key, name)) = (gate::name(&hold.lock), key_and_name(&hold.lock));
            let params = vec![
                gate.to_value(),
                hold.conn.to_value(),
                key.to_value(),
                name.to_value(),
                hold.owner.digest().to_value(),
                hold.fence.to_value(),
                micros(taken.elapsed()),
                hold.label.as_bytes().to_value(),
                micros(hold.lease),
                gate.to_value(),
                hold.conn.to_value(),
            ];
            // A failed statement may still have written: removing is harmless.
            match sql::exec(&mut conn, &sql::record_gate(), params).await {
                Ok((written, _)) => written > 0,
                Err(_) => true,
            }
        }))
    }

    /// Stops it: whether it was written, and so must be removed. A hold
    /// that ends before [`RECORD_AFTER`](dlock_core::kit::RECORD_AFTER) neither waits nor writes.
    pub async fn stop(self) -> bool {
        self.0.stop().await
    }
}
