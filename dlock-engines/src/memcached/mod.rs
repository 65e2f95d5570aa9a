//! The memcached engine: a lock is one item added with `add`
//! semantics (meta `ms ... ME`), holding its owner id, with a TTL for its
//! lease. Every later change is checked against the item's CAS value: the
//! watchdog extends with a CAS-checked set, release is a CAS-checked delete.
//! A plain `delete` or `touch` is never sent to a lock that may have changed
//! hands. memcached keeps no queue and has no read mode: see
//! [`Guarantees`] and facets below.
//!
//! **Leases in whole seconds.** memcached's clock is a count of seconds that
//! a one-second timer moves on to the monotonic clock's second. Each tick
//! comes a little late, so the tick drifts through the second, and when it
//! crosses a second's start the count moves by two at once (or by none):
//! an item given a TTL of n seconds ends between n−2 and n+1 seconds
//! later. Under load that happened twice in 500 server-seconds, and such a
//! jump ends a 2 s TTL set in the tick before it. The engine asks
//! for ⌈lease⌉ + 2 s: the server keeps a hold at least as long as the
//! holder counts on, and a dead holder's lock is free about 2 s after its
//! lease (3 s while the timer runs late). The lease unit is 1 s.
//!
//! **Fencing, best effort.** Tokens come from one counter item,
//! `dlock:fence`, incremented in the same round trip as the `add` and after
//! it on the same connection, so a holder's token is taken after the
//! previous holder's delete. When the counter is missing (a restart, a
//! `flush_all`, an eviction) the holder that finds it so starts it again
//! from its own clock in microseconds, or from the server's clock less a
//! second if that is later (it ticks in whole seconds, so it cannot order
//! two restarts within a second). So tokens keep rising across restarts
//! as long as the engines' clocks agree to better than the time between
//! two restarts and do not step back, and fewer than a million locks a
//! second were taken since the counter started. memcached's own CAS values are
//! unique but not ordered (memcached issue 1302), so they are only used to
//! check ownership. Run memcached with `-M` (return errors instead of
//! evicting) in production, as the tests do.
//!
//! **Semaphores.** A permit is one of `n` slot items, `dlock-sem:<group>:<name>#<i>`,
//! taken with `add` like a lock's item and renewed and let go the same
//! CAS-checked way; the count is an item beside them (`#n`), kept alive by
//! every attempt and renewal and written into each slot's value, so a
//! client giving another count is refused while anyone holds or asks; a
//! count no held slot bears out gives way to the next. No queue, as for locks; and, as for
//! the fences, a restart or eviction forgets slots and count.
//!
//! **Records** (`records.rs`): an item's value carries, after the owner id,
//! when the hold was granted and the process's label, so one round trip
//! shows a lock's holder, or a semaphore's; no fence (it is taken after the
//! item is written), no waiters (no queue), and no listing.
//!
//! **Force release and revoke** (`control.rs`): force release leaves a
//! tombstone for the holder, then deletes its item, CAS-checked; revoke
//! sets the item's client flags, CAS-checked, which the holder's next
//! renewal finds (its CAS no longer matches, and the read back shows
//! them). Two round trips each; nothing more on a renewal until then.
//!
//! **Keys.** `dlock:<group>:<name>` (`%` and `:` percent-escaped) when that
//! is at most 250 printable ASCII bytes; otherwise `dlock:#<hash>`, the
//! key's 128-bit [`LockKey::stable_hash`]. Two names that hash alike share
//! one lock: they over-exclude, never under-exclude. The item's value keeps the owner and
//! the full name, and release and renewal compare it whole.
//!
//! **TLS and login.** For a server run with `-Z`, `tls_mode` is
//! `require`, `verify-ca` or `verify-full`, with the `tls_` files (a
//! client certificate where `ssl_verify_mode=2` asks for one); memcached
//! cannot offer TLS on a port that speaks plain too, so `prefer` is
//! refused. TLS sessions are never resumed: memcached 1.6 answers a
//! resumed TLS 1.3 session with an internal_error alert. For a server run
//! with `-Y <authfile>`, each connection logs in first with `username`
//! and `password` (or `password_file`). Both are done within
//! `connect_timeout`.
//!
//! ```toml
//! [engines.mc]
//! kind = "memcached"
//! address = "127.0.0.1:11211"
//! connections = 4
//! connect_timeout = "5s"
//! # tls_mode = "verify-full"         # for memcached -Z
//! # tls_ca_file = "/etc/dlock/mc-ca.pem"
//! # username = "locks"               # for memcached -Y <authfile>
//! # password_file = "/run/secrets/memcached"
//! ```

mod config;
mod control;
mod permits;
mod records;
mod wire;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, SystemTime};

use dlock_core::kit::{
    Control, Engine, EngineError, Expiry, Facets, Fairness, Fencing, Guarantees, HoldAtLeast, Inspect,
    Lifecycle, LostSignal, OwnerId, PermitControl, Poll, Renewal, Request, Semaphores, async_trait,
    percent_escape,
};
use dlock_core::{LockKey, LockView, Only};

use permits::Permits;
use wire::{Pool, Reply};

pub use config::{MemcachedConfig, register};

const FENCE_KEY: &str = "dlock:fence";
const MAX_KEY: usize = 250;

/// The memcached engine. See the [module docs](self).
///
/// Built from config (`kind` in `[engines.<name>]`), or by hand:
///
/// ```no_run
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), dlock::Error> {
/// use std::sync::Arc;
/// use dlock::engines::memcached::{MemcachedConfig, MemcachedEngine};
///
/// let config = MemcachedConfig {
///     connections: 4,
///     ..MemcachedConfig::new("127.0.0.1:11211")
/// };
/// let engine = MemcachedEngine::connect("main", &config).await?;
/// dlock::install(dlock::Registry::with_engine("main", Arc::new(engine), Default::default())?)?;
/// # Ok(())
/// # }
/// ```
pub struct MemcachedEngine {
    pool: Pool,
    address: String,
    /// The label each item's value carries (`client_name`).
    label: String,
}

/// What a hold keeps from its grant to its release: its item's key and
/// value, made once (escaping the name and writing the owner cost a fifth
/// of the client's work a cycle when made on every call), and the item's
/// CAS value after its last change, for the next CAS-checked one.
struct Item {
    key: String,
    value: Vec<u8>,
    cas: Mutex<Option<u64>>,
    /// Its flags said it was revoked (`control.rs`): renewals keep them.
    revoked: AtomicBool,
}

impl Item {
    /// The item `key` valued `value`, added with CAS value `cas`.
    fn added(key: String, value: Vec<u8>, cas: Option<u64>) -> Item {
        Item {
            key,
            value,
            cas: Mutex::new(cas),
            revoked: AtomicBool::new(false),
        }
    }

    fn cas(&self) -> Option<u64> {
        *self.cas.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn set_cas(&self, cas: Option<u64>) {
        *self.cas.lock().unwrap_or_else(|e| e.into_inner()) = cas;
    }

    fn revoked(&self) -> bool {
        self.revoked.load(Ordering::Relaxed)
    }
}

/// A lock's request state: its item once granted. The value is made at
/// each attempt, as it records when the hold began.
type Taken = OnceLock<Item>;

impl MemcachedEngine {
    async fn call(&self, request: &[u8], replies: usize) -> Result<Vec<Reply>, EngineError> {
        self.pool
            .call(request, replies)
            .await
            .map_err(EngineError::failed)
    }

    /// The item a lock's request holds, or holds if granted; none for a
    /// permit's request, whose slot is its own (`permits.rs`).
    fn held(req: &Request) -> Option<&Item> {
        req.state::<Taken>()?.get()
    }

    /// Adds `key` valued `value` if it is missing, and takes a token in
    /// the same round trip, after the add (see the module docs): the item,
    /// and the token, if it was added.
    async fn add(
        &self,
        key: String,
        value: Vec<u8>,
        lease: Duration,
    ) -> Result<Option<(Item, u64)>, EngineError> {
        let mut command = format!("ms {key} {} T{} ME c\r\n", value.len(), ttl(lease)).into_bytes();
        command.extend_from_slice(&value);
        command.extend_from_slice(format!("\r\nma {FENCE_KEY} v\r\n").as_bytes());
        let [added, fence] = <[Reply; 2]>::try_from(self.call(&command, 2).await?).expect("two replies");
        if added.code() != "HD" {
            return Ok(None);
        }
        let item = Item::added(key, value, added.flag('c').and_then(|c| c.parse().ok()));
        let fence = match fence.code() {
            "NF" => self.restart_fences().await?,
            _ => counter(fence)?,
        };
        Ok(Some((item, fence)))
    }

    /// A CAS-checked set of `req`'s item (`held`) to its value with a
    /// fresh TTL; true if `req` still held it.
    async fn extend(&self, req: &Request, held: Option<&Item>) -> Result<bool, EngineError> {
        let Some(item) = held else {
            return Ok(false);
        };
        let (key, value) = (&item.key, &item.value);
        let reply = self
            .checked(item, |cas| {
                let flags = match item.revoked() {
                    true => format!(" F{}", control::REVOKED),
                    false => String::new(),
                };
                let mut command =
                    format!("ms {key} {} T{}{flags} C{cas} c\r\n", value.len(), ttl(req.lease)).into_bytes();
                command.extend_from_slice(value);
                command.extend_from_slice(b"\r\n");
                command
            })
            .await?;
        item.set_cas(reply.as_ref().and_then(|r| r.flag('c')?.parse().ok()));
        Ok(reply.is_some())
    }

    /// Starts the missing fence counter from the clock in microseconds and
    /// takes its first token; if another holder started it meanwhile, takes
    /// the next one (see the module docs).
    async fn restart_fences(&self) -> Result<u64, EngineError> {
        let stats = self
            .pool
            .call_until(b"stats\r\n", |read| {
                read.last().is_some_and(|r| r.code() == "END")
            })
            .await
            .map_err(EngineError::failed)?;
        let server_second: u64 = stats
            .iter()
            .find(|r| r.tokens().next() == Some("time"))
            .and_then(|r| r.tokens().nth(1)?.parse().ok())
            .ok_or_else(|| EngineError::failed("memcached: `stats` has no time"))?;
        let own = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |now| now.as_micros() as u64);
        // The server's second can be up to a second ahead of the true time
        // (it adds whole seconds of uptime to its whole start second): one
        // second less is never ahead, so it only lifts a client clock that
        // is far behind.
        let start = own.max(server_second.saturating_sub(1) * 1_000_000);
        let command = format!("ma {FENCE_KEY} N0 J{start} v\r\n");
        counter(self.call(command.as_bytes(), 1).await?.remove(0))
    }

    /// Deletes `req`'s item (`held`) if it is still its own; true if it was.
    async fn remove(&self, held: Option<&Item>) -> Result<bool, EngineError> {
        let Some(item) = held else {
            return Ok(false);
        };
        let reply = self
            .checked(item, |cas| format!("md {} C{cas}\r\n", item.key).into_bytes())
            .await?;
        item.set_cas(None);
        Ok(reply.is_some())
    }

    /// Sends `command(cas)` for the item's CAS value if it is still `item`;
    /// the reply if it applied. The CAS remembered from the last change is
    /// tried first; if it no longer matches (a reply was lost, so the item
    /// changed under a CAS never learned, or it was revoked), the item is
    /// read back once and compared by value; the read tells whether it was
    /// revoked.
    async fn checked(
        &self,
        item: &Item,
        command: impl Fn(u64) -> Vec<u8>,
    ) -> Result<Option<Reply>, EngineError> {
        if let Some(cas) = item.cas() {
            let reply = self.call(&command(cas), 1).await?.remove(0);
            match reply.code() {
                "HD" => return Ok(Some(reply)),
                "NF" => return Ok(None),
                _ => {} // EX: read it back.
            }
        }
        let found = self
            .call(format!("mg {} v c f\r\n", item.key).as_bytes(), 1)
            .await?
            .remove(0);
        let cas = match found.value.as_deref() {
            Some(found_value) if found_value == item.value => found.flag('c').and_then(|c| c.parse().ok()),
            _ => None,
        };
        if cas.is_some() && found.flag('f') == Some(control::REVOKED) {
            item.revoked.store(true, Ordering::Relaxed);
        }
        let Some(cas) = cas else { return Ok(None) };
        let reply = self.call(&command(cas), 1).await?.remove(0);
        Ok((reply.code() == "HD").then_some(reply))
    }
}

/// The fence counter's value in an `ma` reply.
fn counter(reply: Reply) -> Result<u64, EngineError> {
    reply
        .value
        .as_deref()
        .and_then(|v| std::str::from_utf8(v).ok()?.parse().ok())
        .ok_or_else(|| EngineError::failed(format!("memcached: bad counter reply {:?}", reply.code())))
}

/// The item's key: readable when memcached allows it, hashed otherwise.
fn item_key(key: &LockKey) -> String {
    let mut readable = String::with_capacity(key.group().len() + key.name().len() + 7);
    readable.push_str("dlock:");
    escape_into(key.group(), &mut readable);
    readable.push(':');
    escape_into(key.name(), &mut readable);
    if readable.len() <= MAX_KEY && readable.bytes().all(|b| b.is_ascii_graphic()) {
        return readable;
    }
    format!("dlock:#{:032x}", key.stable_hash())
}

fn escape_into(text: &str, out: &mut String) {
    percent_escape(text, |c| c == ':', out);
}

/// The owner, then the record (when granted, in ms since the epoch, and
/// the label, which has no control character), then the full name, so a
/// hashed key's item still says whose it is: `<owner> <since> <label>\0
/// <group>\0<name>`. The owner and the time make it unique to the hold.
fn item_value(req: &Request, label: &str) -> Vec<u8> {
    let since = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |t| t.as_millis());
    let (group, name) = (req.key.group(), req.key.name());
    format!("{} {since} {label}\0{group}\0{name}", req.owner).into_bytes()
}

/// The owner id an item's value starts with (see `item_value`).
fn owner_of(value: &[u8]) -> Option<OwnerId> {
    let hex = std::str::from_utf8(value.get(..32)?).ok()?;
    u128::from_str_radix(hex, 16).ok().map(OwnerId::from_u128)
}

/// What a renewal answers: whether the item (`held`) was `extended`,
/// and whether it was asked to let go.
fn renewal(extended: bool, held: Option<&Item>) -> Renewal {
    match (extended, held.is_some_and(Item::revoked)) {
        (false, _) => Renewal::Gone,
        (true, true) => Renewal::Revoked,
        (true, false) => Renewal::Held,
    }
}

/// Whole seconds, two more than the lease rounds up to (see the module docs).
fn ttl(lease: Duration) -> u64 {
    lease.as_secs() + u64::from(lease.subsec_nanos() > 0) + 2
}

#[async_trait]
impl Engine for MemcachedEngine {
    fn kind(&self) -> &'static str {
        "memcached"
    }

    fn address(&self) -> String {
        self.address.clone()
    }

    fn guarantees(&self) -> Guarantees {
        Guarantees {
            read: false,
            fairness: Fairness::None,
            fencing: Fencing::BestEffort,
            expiry: Expiry::Lease,
            lease_unit: Duration::from_secs(1),
            waiter_ttl: None,
        }
    }

    fn facets(&self) -> Facets<'_> {
        Facets {
            semaphores: Some(self),
            inspect: Some(self),
            control: Some(self),
            permit_control: Some(self),
            hold_at_least: Some(self),
            ..Facets::default()
        }
    }

    async fn downgrade(&self, _req: &Request) -> Result<bool, EngineError> {
        unreachable!("the core never downgrades on an engine without read mode")
    }
}

#[async_trait]
impl Lifecycle for MemcachedEngine {
    /// `add` and the fence counter's increment in one round trip.
    async fn acquire(&self, req: &Request) -> Result<Poll, EngineError> {
        let value = item_value(req, &self.label);
        let Some((item, fence)) = self.add(item_key(&req.key), value, req.lease).await? else {
            // No queue, no notification: the core polls.
            return Ok(Poll::Waiting(Box::pin(std::future::pending())));
        };
        let _ = req.state_or_init(Taken::new).set(item);
        Ok(Poll::Held(fence))
    }

    async fn poll(&self, req: &Request) -> Result<Poll, EngineError> {
        self.acquire(req).await
    }

    async fn cancel(&self, req: &Request) -> Result<(), EngineError> {
        self.remove(Self::held(req)).await.map(drop)
    }

    async fn renew(&self, req: &Request) -> Result<Renewal, EngineError> {
        let held = Self::held(req);
        let extended = self.extend(req, held).await?;
        Ok(renewal(extended, held))
    }

    async fn release(&self, req: &Request) -> Result<bool, EngineError> {
        self.remove(Self::held(req)).await
    }

    /// No signal of its own: a failed renewal tells the core.
    fn lost(&self, _req: &Request) -> Option<LostSignal> {
        None
    }
}

impl Semaphores for MemcachedEngine {
    fn permits(&self, count: u32) -> Box<dyn Lifecycle + '_> {
        Box::new(Permits { engine: self, count })
    }

    fn slots(&self) -> bool {
        true
    }
}

#[async_trait]
impl Inspect for MemcachedEngine {
    fn shows_fences(&self) -> bool {
        false
    }

    async fn inspect(&self, key: &LockKey, permits: Option<u32>) -> Result<LockView, EngineError> {
        records::inspect(self, key, permits).await
    }
}

#[async_trait]
impl Control for MemcachedEngine {
    async fn forced_out(&self, req: &Request) -> Result<bool, EngineError> {
        control::forced_out(self, req).await
    }

    async fn force_release(&self, key: &LockKey, only: &Only) -> Result<u32, EngineError> {
        control::force_release(self, key, &item_key(key), only).await
    }

    async fn revoke(&self, key: &LockKey, only: &Only) -> Result<u32, EngineError> {
        control::revoke(self, &item_key(key), only).await
    }
}

/// A permit is its slot's item, reached as a lock's item is, slot by slot.
#[async_trait]
impl PermitControl for MemcachedEngine {
    async fn force_release_permits(
        &self,
        key: &LockKey,
        count: u32,
        only: &Only,
    ) -> Result<u32, EngineError> {
        let mut forced = 0;
        for item in permits::slot_items(key, count) {
            forced += control::force_release(self, key, &item, only).await?;
        }
        Ok(forced)
    }

    async fn revoke_permits(&self, key: &LockKey, count: u32, only: &Only) -> Result<u32, EngineError> {
        let mut asked = 0;
        for item in permits::slot_items(key, count) {
            asked += control::revoke(self, &item, only).await?;
        }
        Ok(asked)
    }
}

#[async_trait]
impl HoldAtLeast for MemcachedEngine {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_readable_when_memcached_allows_else_hashed() {
        let key = |g: &str, n: &str| item_key(&LockKey::new(g, n).unwrap());
        assert_eq!(key("order", "42"), "dlock:order:42");
        assert_ne!(key("g:a", "b"), key("g", "a:b"));
        for odd in ["with space", "ünïcødé", "\n", &"k".repeat(300)] {
            let hashed = key("g", odd);
            assert!(hashed.starts_with("dlock:#") && hashed.len() == 39, "{hashed}");
        }
        assert_ne!(key("g", "with space"), key("g", "with  space"));
    }

    #[test]
    fn ttls_cover_the_lease_in_whole_seconds() {
        assert_eq!(ttl(Duration::from_secs(1)), 3);
        assert_eq!(ttl(Duration::from_millis(1500)), 4);
        assert_eq!(ttl(Duration::from_secs(30)), 32);
    }
}
