//! Semaphores on memcached, which keeps no queue: a permit is one of the
//! `n` slot items `<base>#<i>`, taken with `add` as a lock's item is and
//! then renewed and let go the same CAS-checked way. The count is an item
//! of its own, `<base>#n`, which every attempt and renewal keeps alive for
//! a lease, and each slot's value ends with it too: while anyone holds or
//! asks, a client giving another count is refused. A count item that no
//! held slot bears out is left from holders gone: the next count takes
//! over. Best effort, as everything here: a restart or an eviction forgets
//! slots and count.

use std::fmt::Write as _;
use std::sync::OnceLock;

use dlock_core::LockKey;
use dlock_core::kit::{EngineError, Lifecycle, LostSignal, Poll, Renewal, Request, async_trait};

use super::wire::Reply;
use super::{Item, MAX_KEY, MemcachedEngine, item_value, renewal, ttl};

/// The lifecycle of a permit of a semaphore of `count` permits: a slot's
/// item, taken, renewed and let go as a lock's is.
pub(super) struct Permits<'a> {
    pub(super) engine: &'a MemcachedEngine,
    pub(super) count: u32,
}

#[async_trait]
impl Lifecycle for Permits<'_> {
    async fn acquire(&self, req: &Request) -> Result<Poll, EngineError> {
        self.engine.take_permit(req, self.count).await
    }

    async fn poll(&self, req: &Request) -> Result<Poll, EngineError> {
        self.engine.take_permit(req, self.count).await
    }

    async fn cancel(&self, req: &Request) -> Result<(), EngineError> {
        self.engine.remove(held(req)).await.map(drop)
    }

    /// The slot's item, and the count beside it, kept alive.
    async fn renew(&self, req: &Request) -> Result<Renewal, EngineError> {
        let held = held(req);
        let extended = self.engine.extend(req, held).await?;
        if extended {
            self.engine.touch_count(req).await?;
        }
        Ok(renewal(extended, held))
    }

    async fn release(&self, req: &Request) -> Result<bool, EngineError> {
        self.engine.remove(held(req)).await
    }

    /// No signal of its own: a failed renewal tells the core.
    fn lost(&self, _req: &Request) -> Option<LostSignal> {
        None
    }

    fn slot(&self, req: &Request) -> Option<u32> {
        Permit::of(req).taken.get().map(|(_, slot)| *slot)
    }
}

/// What a permit's request keeps: its semaphore's keys, and once granted,
/// the slot's item, valued as a lock's is and then `\0<count>`, and the
/// slot's number.
struct Permit {
    base: String,
    pub taken: OnceLock<(Item, u32)>,
}

impl Permit {
    pub fn of(req: &Request) -> &Permit {
        req.state_or_init(|| Permit {
            base: base_key(&req.key),
            taken: OnceLock::new(),
        })
    }

    /// The count's item.
    pub fn count_key(&self) -> String {
        format!("{}#n", self.base)
    }
}

/// The slot item a permit's request holds, if it is one and was granted.
pub(super) fn held(req: &Request) -> Option<&Item> {
    req.state::<Permit>()?.taken.get().map(|(item, _)| item)
}

/// The slot items of the semaphore `key` of `count` permits.
pub(super) fn slot_items(key: &LockKey, count: u32) -> impl Iterator<Item = String> {
    let base = base_key(key);
    (0..count).map(move |slot| format!("{base}#{slot}"))
}

impl MemcachedEngine {
    /// One round trip keeps the count alive (adding it if missing) and
    /// reads it and every slot; a second adds a free slot, picked by the
    /// request's random owner id so that clients spread out, and takes a
    /// token.
    async fn take_permit(&self, req: &Request, n: u32) -> Result<Poll, EngineError> {
        let permit = Permit::of(req);
        let (count, ttl) = (permit.count_key(), ttl(req.lease));
        let mut command = format!(
            "ms {count} {} T{ttl} ME\r\n{n}\r\nmg {count} v T{ttl}\r\n",
            n.to_string().len()
        );
        for slot in 0..n {
            let _ = write!(command, "mg {}#{slot} v\r\n", permit.base);
        }
        let replies = self.call(command.as_bytes(), 2 + n as usize).await?;
        let slot_count = |slot: &Reply| {
            slot.value
                .as_deref()
                .and_then(|v| count_of(v.rsplit(|b| *b == 0).next()?))
        };
        if let Some(in_use) = replies[2..]
            .iter()
            .filter_map(slot_count)
            .find(|in_use| *in_use != n)
        {
            return Err(EngineError::PermitsDiffer { in_use });
        }
        if let Some(in_use) = replies[1]
            .value
            .as_deref()
            .and_then(count_of)
            .filter(|in_use| *in_use != n)
        {
            self.recount(permit, n, in_use, ttl).await?;
        }
        let free: Vec<usize> = (0..n as usize)
            .filter(|slot| replies[2 + slot].code() == "EN")
            .collect();
        let waiting = || Ok(Poll::Waiting(Box::pin(std::future::pending())));
        if free.is_empty() {
            return waiting();
        }
        let slot = free[(req.owner.as_u128() % free.len() as u128) as usize];
        let key = format!("{}#{slot}", permit.base);
        let mut value = item_value(req, &self.label);
        value.extend_from_slice(format!("\0{n}").as_bytes());
        let Some((item, fence)) = self.add(key, value, req.lease).await? else {
            return waiting(); // another client took it first
        };
        let _ = permit.taken.set((item, slot as u32));
        Ok(Poll::Held(fence))
    }

    /// The count item says `in_use`, but this client's slots, all free,
    /// disagree with none: unless a slot past them is held, the count is
    /// left from holders gone, and `n` takes over.
    async fn recount(&self, permit: &Permit, n: u32, in_use: u32, ttl: u64) -> Result<(), EngineError> {
        let mut command = String::new();
        for slot in n..in_use {
            let _ = write!(command, "mg {}#{slot}\r\n", permit.base);
        }
        let replies = self
            .call(command.as_bytes(), in_use.saturating_sub(n) as usize)
            .await?;
        if replies.iter().any(|slot| slot.code() != "EN") {
            return Err(EngineError::PermitsDiffer { in_use });
        }
        let command = format!(
            "ms {} {} T{ttl}\r\n{n}\r\n",
            permit.count_key(),
            n.to_string().len()
        );
        self.call(command.as_bytes(), 1).await.map(drop)
    }

    /// Keeps the count alive beside a renewed permit.
    async fn touch_count(&self, req: &Request) -> Result<(), EngineError> {
        let command = format!("mg {} T{}\r\n", Permit::of(req).count_key(), ttl(req.lease));
        self.call(command.as_bytes(), 1).await.map(drop)
    }
}

/// A count, as the count item holds it and each slot's value ends with.
pub(super) fn count_of(text: &[u8]) -> Option<u32> {
    std::str::from_utf8(text).ok()?.parse().ok()
}

/// `dlock-sem:<group>:<name>` (`%`, `:` and `#` percent-escaped) when its
/// slot keys fit memcached's; otherwise `dlock-sem:#<hash>`. Never a lock's
/// key, which starts `dlock:`.
pub(super) fn base_key(key: &LockKey) -> String {
    let mut readable = String::from("dlock-sem:");
    let escape =
        |text: &str, out: &mut String| dlock_core::kit::percent_escape(text, |c| matches!(c, ':' | '#'), out);
    escape(key.group(), &mut readable);
    readable.push(':');
    escape(key.name(), &mut readable);
    // Room for `#` and a slot number of up to ten digits.
    if readable.len() + 11 <= MAX_KEY && readable.bytes().all(|b| b.is_ascii_graphic()) {
        return readable;
    }
    format!("dlock-sem:#{:032x}", key.stable_hash())
}
