//! Semaphores in the lock table: a row per request, as for locks, under a
//! key of its own that ends with the count (4 bytes), so that the rows of
//! one semaphore, whatever their count, lie in one range of the index. A
//! request holds once the live holders and the live waiters ahead of it
//! are fewer than the count; a newcomer takes a permit at once only if all
//! live rows are, so it never passes the line (FIFO). A row is inserted
//! only while no live row of the range has another count, so all live rows
//! agree; once none is live, a new count takes over. Holds are renewed,
//! released and expire as a lock's rows do; no gate. The statements read
//! the range with shared next-key locks before writing into it, as the
//! lock's do (see `sql.rs`), so two grants that would make one too many
//! cannot both commit.
//!
//! A grant writes its slot into the row: the lowest no live holder's row
//! has, read under the same locks as the count, so two grants that would
//! share one cannot both commit either. An expired holder's slot is free
//! again. The grant draws its token too (`UUID_SHORT()`, after its reads):
//! a slot's next holder is granted only once this one's row is gone or
//! expired, so it draws a greater one. One read after the commit brings
//! both back.

use std::time::Instant;

use dlock_core::LockKey;
use dlock_core::kit::{EngineError, Lifecycle, LostSignal, Poll, Renewal, Request, async_trait};
use mysql_async::Value;
use mysql_async::prelude::ToValue;

use super::sql::MAX_KEY;
use super::{Mine, MysqlEngine, NEXT_IN_LINE, look_again, micros, owner};

const NOW: &str = "UTC_TIMESTAMP(6)";

/// Where a semaphore's rows are: the key for `count`, the range of every
/// count's keys, and the full name when the key is a hash.
pub(super) struct Range {
    pub key: Vec<u8>,
    pub low: Vec<u8>,
    pub high: Vec<u8>,
    pub name: Option<Vec<u8>>,
}

impl Range {
    /// A readable key is 0x03, the group's length, the group, the name's
    /// length (2 bytes), the name; a hashed one 0x04 and the 128-bit stable
    /// hash. Then the count. Never a lock's key (0x01 or 0x02).
    pub fn of(key: &LockKey, count: u32) -> Self {
        let (group, name) = (key.group().as_bytes(), key.name().as_bytes());
        let mut stem = vec![3, group.len() as u8];
        stem.extend_from_slice(group);
        stem.extend_from_slice(&(name.len() as u16).to_be_bytes());
        stem.extend_from_slice(name);
        let mut full = None;
        if stem.len() + 4 > MAX_KEY || name.len() > usize::from(u16::MAX) {
            full = Some(stem);
            stem = vec![4];
            stem.extend_from_slice(&key.stable_hash().to_be_bytes());
        }
        let with = |count: u32| [stem.as_slice(), &count.to_be_bytes()].concat();
        Range {
            key: with(count),
            low: with(0),
            high: with(u32::MAX),
            name: full,
        }
    }

    /// This semaphore's rows, live, as conditions on `t`: range, name,
    /// and the two as parameters.
    fn live(&self, t: &str) -> (String, Vec<Value>) {
        (
            format!("{t}.lock_key BETWEEN ? AND ? AND {t}.name <=> ? AND {t}.expires > {NOW}"),
            vec![self.low.to_value(), self.high.to_value(), self.name.to_value()],
        )
    }

    /// This semaphore's live rows in one read, as the derived table `c`:
    /// how many (`c.n`), and the slots their holders have as bits
    /// (`c.held`); and its parameters.
    fn tally(&self) -> (String, Vec<Value>) {
        let (live, params) = self.live("o");
        let tally = format!(
            "(SELECT COUNT(*) AS n, BIT_OR(IF(o.held = 1, 1 << o.slot, 0)) AS held \
              FROM dlock_queue o WHERE {live}) c"
        );
        (tally, params)
    }

    /// The lowest slot no live holder has, as an expression, and its
    /// parameters: of `count` up to 64, the lowest bit clear in the tally
    /// (the count of the trailing ones); past that, more than the tally's
    /// bits hold, 0 if free, else the lowest one right above a held one.
    fn free_slot(&self, count: u32) -> (String, Vec<Value>) {
        if count <= 64 {
            return ("BIT_COUNT(c.held & ~(c.held + 1))".to_owned(), Vec::new());
        }
        let held = |t: &str| {
            let (live, params) = self.live(t);
            (format!("{live} AND {t}.held = 1"), params)
        };
        let ((zero, mut params), (above, a), (next, b)) = (held("s0"), held("sa"), held("sb"));
        params.extend(a.into_iter().chain(b));
        let expression = format!(
            "IF(EXISTS (SELECT 1 FROM dlock_queue s0 WHERE {zero} AND s0.slot = 0), \
               (SELECT MIN(sa.slot) + 1 FROM dlock_queue sa WHERE {above} \
                  AND NOT EXISTS (SELECT 1 FROM dlock_queue sb WHERE {next} AND sb.slot = sa.slot + 1)), \
               0)"
        );
        (expression, params)
    }
}

/// The count in a semaphore row's key.
pub(super) fn count_of(key: &[u8]) -> Option<u32> {
    let tail: [u8; 4] = key.get(key.len().checked_sub(4)?..)?.try_into().ok()?;
    Some(u32::from_be_bytes(tail))
}

/// The lifecycle of a permit of a semaphore of `count` permits: a lock's
/// row in the semaphore's range, renewed, released and expiring as a
/// lock's rows do.
pub(super) struct Permits<'a> {
    pub(super) engine: &'a MysqlEngine,
    pub(super) count: u32,
}

#[async_trait]
impl Lifecycle for Permits<'_> {
    async fn acquire(&self, req: &Request) -> Result<Poll, EngineError> {
        self.engine.permit_acquire(req, self.count).await
    }

    async fn poll(&self, req: &Request) -> Result<Poll, EngineError> {
        self.engine.permit_poll(req, self.count).await
    }

    async fn cancel(&self, req: &Request) -> Result<(), EngineError> {
        self.engine.withdraw(req, MysqlEngine::permit_wake_key(req)).await
    }

    async fn renew(&self, req: &Request) -> Result<Renewal, EngineError> {
        self.engine.renewing(req).await
    }

    async fn release(&self, req: &Request) -> Result<bool, EngineError> {
        self.engine
            .let_go_woken(req, MysqlEngine::permit_wake_key(req))
            .await
    }

    /// No signal of its own: a failed renewal tells the core.
    fn lost(&self, _req: &Request) -> Option<LostSignal> {
        None
    }

    fn slot(&self, req: &Request) -> Option<u32> {
        Mine::of(req).slot.get().copied()
    }
}

impl MysqlEngine {
    /// Takes a permit at once if every live row leaves room, else joins
    /// the line; either only while no live row gives another count.
    async fn permit_acquire(&self, req: &Request, count: u32) -> Result<Poll, EngineError> {
        let range = Range::of(&req.key, count);
        let (live, live_params) = range.live("o");
        let other_count =
            format!("NOT EXISTS (SELECT 1 FROM dlock_queue o WHERE {live} AND o.lock_key <> ?)");
        let mut agreeing = live_params.clone();
        agreeing.push(range.key.to_value());
        let row = |held: u8, lease| {
            vec![
                range.key.to_value(),
                range.name.to_value(),
                owner(req),
                held.to_value(),
                micros(lease),
                self.label(),
            ]
        };
        let ((free_slot, slot_params), (tally, tally_params)) = (range.free_slot(count), range.tally());
        let take = format!(
            "INSERT INTO dlock_queue (lock_key, name, owner, mode, held, expires, since, label, slot, fence) \
             SELECT ?, ?, ?, 0, ?, {NOW} + INTERVAL ? MICROSECOND, {NOW}, ?, {free_slot}, UUID_SHORT() \
             FROM {tally} WHERE {other_count} AND c.n < ?"
        );
        let params = [
            row(1, req.lease),
            slot_params,
            tally_params,
            agreeing.clone(),
            vec![count.to_value()],
        ]
        .concat();
        if self.run(&take, params).await?.0 == 1 {
            return self.drawn(req).await.map(Poll::Held);
        }
        if req.try_once {
            return self.permit_refused(&range).await;
        }
        let join = format!(
            "INSERT INTO dlock_queue (lock_key, name, owner, mode, held, expires, since, label) \
             SELECT ?, ?, ?, 0, ?, {NOW} + INTERVAL ? MICROSECOND, {NOW}, ? FROM DUAL WHERE {other_count}"
        );
        if self
            .run(&join, [row(0, self.waiter_ttl), agreeing].concat())
            .await?
            .0
            == 0
        {
            return self.permit_refused(&range).await;
        }
        Mine::of(req).line().refreshed = Instant::now();
        self.start_waiting(req, &range.low);
        Ok(Poll::Waiting(self.wake(&range.low, NEXT_IN_LINE)))
    }

    /// Not taken, and not in line: another count in use, or simply busy.
    async fn permit_refused(&self, range: &Range) -> Result<Poll, EngineError> {
        let (live, mut params) = range.live("o");
        params.push(range.key.to_value());
        let other: Option<Vec<u8>> = self
            .first(
                &format!("SELECT o.lock_key FROM dlock_queue o WHERE {live} AND o.lock_key <> ? LIMIT 1"),
                params,
            )
            .await?;
        match other.as_deref().and_then(count_of) {
            Some(in_use) => Err(EngineError::PermitsDiffer { in_use }),
            None => Ok(Poll::Waiting(Box::pin(std::future::pending()))),
        }
    }

    /// A waiter looks where it stands (the live holders and the live
    /// waiters ahead), and takes its permit once they are fewer than the
    /// count; a row found expired joins the line again.
    async fn permit_poll(&self, req: &Request, count: u32) -> Result<Poll, EngineError> {
        let range = Range::of(&req.key, count);
        let blocking = format!(
            "other.lock_key = me.lock_key AND other.name <=> me.name AND other.owner <> me.owner \
             AND other.expires > {NOW} AND (other.held = 1 OR other.ticket < me.ticket)"
        );
        let mine = format!("me.owner = ? AND me.held = 0 AND me.expires > {NOW}");
        let line: Option<u64> = self
            .first(
                &format!(
                    "SELECT COUNT(other.ticket) FROM dlock_queue me LEFT JOIN dlock_queue other ON {blocking} \
                     WHERE {mine} GROUP BY me.ticket"
                ),
                vec![owner(req)],
            )
            .await?;
        let Some(blockers) = line else {
            self.run(super::sql::FORGET, vec![owner(req)]).await?;
            return self.permit_acquire(req, count).await;
        };
        if blockers < u64::from(count) {
            let ((free_slot, slot_params), (tally, tally_params)) = (range.free_slot(count), range.tally());
            let turn = format!(
                "REPLACE INTO dlock_queue (lock_key, name, owner, mode, held, expires, since, label, slot, fence) \
                 SELECT me.lock_key, me.name, me.owner, 0, 1, {NOW} + INTERVAL ? MICROSECOND, {NOW}, me.label, \
                   {free_slot}, UUID_SHORT() \
                 FROM dlock_queue me, {tally} WHERE {mine} \
                   AND (SELECT COUNT(*) FROM dlock_queue other WHERE {blocking}) < ?"
            );
            let params = [
                vec![micros(req.lease)],
                slot_params,
                tally_params,
                vec![owner(req), count.to_value()],
            ]
            .concat();
            if self.run(&turn, params).await?.0 > 0 {
                self.stop_waiting(req, &Self::permit_wake_key(req));
                return self.drawn(req).await.map(Poll::Held);
            }
        }
        if Mine::of(req).line().refreshed.elapsed() >= self.waiter_ttl / 3 {
            let params = vec![micros(self.waiter_ttl), owner(req), 0u8.to_value()];
            if self.run(&super::sql::extend(), params).await?.0 == 1 {
                Mine::of(req).line().refreshed = Instant::now();
            }
        }
        let ahead = (blockers + 1).saturating_sub(u64::from(count));
        Ok(Poll::Waiting(self.wake(&range.low, look_again(ahead))))
    }

    /// The grant's token and slot, read back once it committed.
    async fn drawn(&self, req: &Request) -> Result<u64, EngineError> {
        let read = "SELECT fence, slot FROM dlock_queue WHERE owner = ?";
        match self
            .first::<(Option<u64>, Option<u32>)>(read, vec![owner(req)])
            .await?
        {
            Some((Some(fence), slot)) => {
                if let Some(slot) = slot {
                    let _ = Mine::of(req).slot.set(slot);
                }
                Ok(fence)
            }
            _ => Err(EngineError::failed(
                "the permit's row was gone before its token was read",
            )),
        }
    }

    /// Where this process's waiters for the semaphore are woken.
    fn permit_wake_key(req: &Request) -> Vec<u8> {
        Range::of(&req.key, 0).low
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_count_of_a_semaphore_lies_in_its_range_and_no_other_name_does() {
        let key = LockKey::new("g", "a").unwrap();
        let (three, five) = (Range::of(&key, 3), Range::of(&key, 5));
        assert!(three.low <= five.key && five.key <= three.high);
        assert_eq!(count_of(&five.key), Some(5));
        let longer = Range::of(&LockKey::new("g", "ab").unwrap(), 3);
        assert!(!(three.low <= longer.key && longer.key <= three.high));
        let long = "n".repeat(300);
        let hashed = Range::of(&LockKey::new("g", long.as_str()).unwrap(), 2);
        assert_eq!((hashed.key.len(), hashed.key[0]), (21, 4));
        assert!(hashed.name.is_some());
    }
}
