//! The DynamoDB engine: a lock is one item of a table, changed only by
//! conditional `UpdateItem`s, each one round trip.
//!
//! **Layout.** The table has a string partition key `pk` and sort key
//! `sk`, and may be shared with other data. A lock's item is `pk =
//! <group>`, `sk = l:<name>` (`h:<hash>` for a name over 1000 bytes, its
//! 128-bit [`LockKey::stable_hash`]); a semaphore's is `sk = s:<name>`
//! (`t:<hash>`). An item whose name is hashed keeps it in `n`, so one
//! `Query` on the group lists them all by name. Each hold is an entry in its item (`item.rs`): a
//! writer, a reader, a permit.
//!
//! **Leases without a server clock.** DynamoDB gives no server time to a
//! condition, so a lease cannot end on the server. As in AWS's lock
//! client, a holder rewrites a random version at each renewal, and a
//! waiter that finds a hold in its way notes its version on its own
//! monotonic clock: a version that stood unchanged for the whole lease
//! (1% more, for clocks that run at slightly different rates) is a dead
//! holder's, and the waiter removes the entry, on the condition that its
//! version is still that one, then takes the lock. A holder counts its
//! lease from when it sent its last renewal, which the waiter can only
//! have seen later: so no two hold at once as long as clock *rates* agree
//! to 1%. Clocks need not agree on the time: a holder whose clock is hours
//! off counts the same leases. A dead holder's lock is free a lease after
//! a waiter first saw its last version.
//!
//! **Fence, strict.** The item's counter `f` goes up by one in the same
//! update that grants, which writes the new value beside the entry; the
//! item stays when the last holder leaves, so tokens rise across holders,
//! takeovers and a server restart that keeps its data. One small item is
//! kept per lock name ever taken.
//!
//! **No queue.** DynamoDB has no blocking read, so a waiter polls; readers
//! share the lock (their count is `rc`), and a writer waits until none
//! holds. Waiters are not ordered: see [`Guarantees`]. A waiter list in
//! the item was measured against this (`benches/dynamodb.rs`, 16
//! clients): fair, but it handed off in 2.5 times the time, got the lock
//! half as often and cost 2.4 times the capacity units, as every waiter
//! must read the item to learn its turn.
//!
//! **Semaphores** (`permits.rs`): one item, with an entry per slot
//! `p:<slot>` and the count `c`, which a client of another count is refused
//! while a live permit holder disagrees.
//!
//! **Records** (`records.rs`): a consistent read of an item shows each
//! holder with its fence, label, lease and last renewal; a `Query` on the
//! group lists its locks. No waiters: there is no queue.
//!
//! **Force release and revoke** (`control.rs`): an update that removes the
//! entry, or marks it asked to let go, on the condition that its owner
//! (and fence) are still the ones meant.
//!
//! **Cost.** Every request asks for the capacity it consumed, and the
//! engine counts it in the metric [`CAPACITY_UNITS`] (labels `engine`,
//! `table`, `kind` = `read` or `write`): an uncontended lock and release
//! is two write units, a waiter's refused try one more.
//!
//! **Throttling and retries.** The SDK retries throttled requests
//! (`ProvisionedThroughputExceededException`) with backoff, within the
//! core's bound on each call. A grant retried after its answer was lost
//! finds its own entry, and takes it as granted.
//!
//! **Held writes** (`held.rs`, [`HeldTransaction`]): the user's items in
//! one transaction after a check of the hold's entry, owner and fence.
//!
//! ```toml
//! [engines.ddb]
//! kind = "dynamodb"
//! region = "eu-west-1"
//! table = "dlock"
//! # create_table = true               # at startup, if missing
//! # endpoint = "http://127.0.0.1:8000" # DynamoDB Local
//! # access_key_id = "AKIA..."          # else the usual AWS chain
//! # secret_access_key_file = "/run/secrets/aws"
//! ```

mod config;
mod control;
mod held;
mod item;
mod permits;
mod records;
mod update;

use std::time::{Duration, Instant};

use aws_sdk_dynamodb::Client;
use dlock_core::kit::{
    Control, Engine, EngineError, Expiry, Facets, Fairness, Fencing, Guarantees, HeldWrites, HoldAtLeast,
    Inspect, Lifecycle, List, LostSignal, PermitControl, Poll, Renewal, Request, RequestState, Semaphores,
    async_trait,
};
use dlock_core::{LockKey, LockView, Mode, Only};

use item::{Entry, FENCE, READERS, Seen, WRITER, entries, entry_value, fence_of, millis, millis_now};
use update::{Outcome, Update, number, number_of, text};

pub use aws_sdk_dynamodb;
pub use config::{DynamoDbConfig, register};
pub use held::HeldTransaction;
pub use update::CAPACITY_UNITS;

/// The longest name kept in a sort key as it is; longer ones are hashed.
const MAX_SORT_NAME: usize = 1000;

/// The DynamoDB engine. See the [module docs](self).
pub struct DynamoDbEngine {
    client: Client,
    table: String,
    /// `endpoint` if set, else `dynamodb:<region>`, for messages.
    address: String,
    /// The label each entry carries (`client_name`).
    label: String,
    seen: Seen,
    spent: update::Spent,
}

/// An item's key.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Place {
    pk: String,
    sk: String,
}

impl Place {
    fn of(key: &LockKey, readable: &str, hashed: &str) -> Place {
        let sk = match key.name().len() <= MAX_SORT_NAME {
            true => format!("{readable}:{}", key.name()),
            false => format!("{hashed}:{:032x}", key.stable_hash()),
        };
        Place {
            pk: key.group().to_owned(),
            sk,
        }
    }

    /// Whether the name is hashed into the sort key, so that the item
    /// keeps it in `n`.
    fn hashed(&self) -> bool {
        self.sk.starts_with("h:") || self.sk.starts_with("t:")
    }

    /// The full name, from the sort key or, hashed, from the item.
    fn name<'a>(&'a self, item: &'a update::Attrs) -> Option<&'a str> {
        match self.hashed() {
            true => item.get("n")?.as_s().ok().map(String::as_str),
            false => self.sk.get(2..),
        }
    }

    fn lock(key: &LockKey) -> Place {
        Place::of(key, "l", "h")
    }

    fn semaphore(key: &LockKey) -> Place {
        Place::of(key, "s", "t")
    }
}

/// What a granted request keeps: its item and entry, which a downgrade
/// changes from the writer's to a reader's, and when the grant or
/// renewal that set its lease was sent.
#[derive(Clone)]
struct Taken {
    place: Place,
    entry: String,
    sent: Instant,
    lease: Duration,
}

impl Taken {
    /// Whether its lease ran out: a waiter may since have counted it
    /// dead, whether or not one did.
    fn lapsed(&self) -> bool {
        self.sent.elapsed() >= self.lease
    }
}

/// Notes `req`'s hold of `entry` at `place`, leased from `sent`.
fn keep(req: &Request, place: &Place, entry: &str, sent: Instant) {
    *RequestState::<Taken>::of(req).lock() = Some(Taken {
        place: place.clone(),
        entry: entry.to_owned(),
        sent,
        lease: req.lease,
    });
}

fn taken(req: &Request) -> Option<Taken> {
    RequestState::<Taken>::of(req).lock().clone()
}

fn failed(err: impl std::error::Error + Send + Sync + 'static) -> EngineError {
    EngineError::failed(err)
}

fn waiting() -> Poll {
    // No queue and no notification: the core polls.
    Poll::Waiting(Box::pin(std::future::pending()))
}

impl DynamoDbEngine {
    /// Tries to write `entry` of the item at `place` for `req`, with
    /// `shape`'s conditions and writes besides: the fence, or `None` if
    /// the item refused. An entry in the way whose holder stopped renewing
    /// is removed, and the grant tried again.
    async fn grant(
        &self,
        req: &Request,
        place: &Place,
        entry: &str,
        shape: &(dyn Fn(&mut Update) + Send + Sync),
    ) -> Result<Option<u64>, EngineError> {
        for _ in 0..2 {
            let sent = Instant::now();
            let mut update = Update::default();
            let (e, fe, f) = (
                update.name(entry),
                update.name(&fence_of(entry)),
                update.name(FENCE),
            );
            let value = update.value(entry_value(req, &self.label));
            let (zero, one) = (update.value(number(0)), update.value(number(1)));
            if place.hashed() {
                let (n, name) = (update.name("n"), update.value(text(req.key.name())));
                update.set(format!("{n} = {name}"));
            }
            // Both read the counter as it was: the entry's fence is the new value.
            update
                .set(format!("{e} = {value}"))
                .set(format!("{fe} = if_not_exists({f}, {zero}) + {one}"))
                .set(format!("{f} = if_not_exists({f}, {zero}) + {one}"))
                .only_if(format!("attribute_not_exists({e})"));
            shape(&mut update);
            let old = match self.update(place, update).await? {
                Outcome::Done(new) => {
                    let fence = number_of(new.get(FENCE))
                        .ok_or_else(|| EngineError::failed("dynamodb: a grant wrote no fence"))?;
                    keep(req, place, entry, sent);
                    return Ok(Some(fence));
                }
                Outcome::Refused(old) => old,
            };
            let found = entries(&old);
            if let Some(own) = found
                .iter()
                .find(|x| x.name == entry && x.owner == Some(req.owner))
            {
                // A grant sent again after its answer was lost.
                keep(req, place, entry, sent);
                return own
                    .fence
                    .map(Some)
                    .ok_or_else(|| EngineError::failed("dynamodb: an entry without its fence"));
            }
            let lapsed: Vec<&Entry> = found.iter().filter(|x| self.seen.lapsed(place, x)).collect();
            if lapsed.is_empty() || !self.clear(place, &lapsed).await? {
                return Ok(None);
            }
        }
        Ok(None)
    }

    /// Removes the entries of holders that stopped renewing, if each still
    /// has the version seen; whether they were removed.
    async fn clear(&self, place: &Place, lapsed: &[&Entry]) -> Result<bool, EngineError> {
        let mut update = Update::default();
        let v = update.name("v");
        for entry in lapsed {
            let e = update.name(&entry.name);
            let fe = update.name(&fence_of(&entry.name));
            update.remove(e.clone()).remove(fe);
            update.equals(format!("{e}.{v}"), text(entry.version.clone()));
        }
        let readers = lapsed.iter().filter(|e| e.is_reader()).count() as i64;
        if readers > 0 {
            let rc = update.name(READERS);
            update.add(rc, -readers);
        }
        Ok(matches!(self.update(place, update).await?, Outcome::Done(_)))
    }

    /// Renews `taken`'s entry with a fresh version, if `req` still holds
    /// it and its lease has not run out; one that has is let go.
    async fn renew_entry(&self, req: &Request, taken: &Taken) -> Result<Renewal, EngineError> {
        if taken.lapsed() {
            self.remove_entry(req, taken).await?;
            return Ok(Renewal::Gone);
        }
        let sent = Instant::now();
        let mut update = Update::default();
        let e = update.name(&taken.entry);
        let [o, v, l, u, x] = ["o", "v", "l", "u", "x"].map(|field| update.name(field));
        let version = update.value(item::version());
        let lease = update.value(number(millis(req.lease)));
        let now = update.value(number(millis_now()));
        let no = update.value(aws_sdk_dynamodb::types::AttributeValue::Bool(false));
        update
            .set(format!("{e}.{v} = {version}"))
            .set(format!("{e}.{l} = {lease}"))
            .set(format!("{e}.{u} = {now}"))
            .set(format!("{e}.{x} = if_not_exists({e}.{x}, {no})"))
            .equals(format!("{e}.{o}"), text(req.owner.to_string()));
        Ok(match self.update(&taken.place, update).await? {
            Outcome::Refused(_) => Renewal::Gone,
            Outcome::Done(new) => {
                keep(req, &taken.place, &taken.entry, sent);
                let revoked = new
                    .get(&taken.entry)
                    .and_then(|entry| entry.as_m().ok()?.get("x")?.as_bool().ok().copied());
                match revoked {
                    Some(true) => Renewal::Revoked,
                    _ => Renewal::Held,
                }
            }
        })
    }

    /// Removes `taken`'s entry, if `req` still holds it.
    async fn remove_entry(&self, req: &Request, taken: &Taken) -> Result<bool, EngineError> {
        let mut update = Update::default();
        let (e, fe, o) = (
            update.name(&taken.entry),
            update.name(&fence_of(&taken.entry)),
            update.name("o"),
        );
        update
            .remove(e.clone())
            .remove(fe)
            .equals(format!("{e}.{o}"), text(req.owner.to_string()));
        if taken.entry.starts_with("r:") {
            let rc = update.name(READERS);
            update.add(rc, -1);
        }
        Ok(matches!(
            self.update(&taken.place, update).await?,
            Outcome::Done(_)
        ))
    }

    async fn let_go(&self, req: &Request) -> Result<bool, EngineError> {
        match taken(req) {
            Some(taken) => self.remove_entry(req, &taken).await,
            None => Ok(false),
        }
    }
}

#[async_trait]
impl Engine for DynamoDbEngine {
    fn kind(&self) -> &'static str {
        "dynamodb"
    }

    fn address(&self) -> String {
        self.address.clone()
    }

    fn guarantees(&self) -> Guarantees {
        Guarantees {
            read: true,
            fairness: Fairness::None,
            fencing: Fencing::Strict,
            expiry: Expiry::Lease,
            lease_unit: Duration::from_millis(1),
            waiter_ttl: None,
        }
    }

    fn facets(&self) -> Facets<'_> {
        Facets {
            semaphores: Some(self),
            inspect: Some(self),
            list: Some(self),
            control: Some(self),
            permit_control: Some(self),
            hold_at_least: Some(self),
            held_writes: Some(self),
            ..Facets::default()
        }
    }

    /// The writer's entry becomes a reader's, with its version and fence,
    /// in one update.
    async fn downgrade(&self, req: &Request) -> Result<bool, EngineError> {
        let Some(held) = taken(req) else { return Ok(false) };
        let reading = item::reader(req.owner);
        let mut update = Update::default();
        let (w, fw, r, fr, o, rc) = (
            update.name(WRITER),
            update.name(&fence_of(WRITER)),
            update.name(&reading),
            update.name(&fence_of(&reading)),
            update.name("o"),
            update.name(READERS),
        );
        update
            .set(format!("{r} = {w}"))
            .set(format!("{fr} = {fw}"))
            .remove(w.clone())
            .remove(fw)
            .add(rc, 1)
            .equals(format!("{w}.{o}"), text(req.owner.to_string()));
        let done = matches!(self.update(&held.place, update).await?, Outcome::Done(_));
        if done {
            *RequestState::<Taken>::of(req).lock() = Some(Taken {
                entry: reading,
                ..held
            });
        }
        Ok(done)
    }
}

#[async_trait]
impl Lifecycle for DynamoDbEngine {
    /// One conditional update: a writer while no one holds, a reader
    /// while no writer does.
    async fn acquire(&self, req: &Request) -> Result<Poll, EngineError> {
        let place = Place::lock(&req.key);
        let granted = match req.mode {
            Mode::Write => {
                let none_reading = |update: &mut Update| {
                    let (rc, zero) = (update.name(READERS), update.value(number(0)));
                    update.only_if(format!("(attribute_not_exists({rc}) OR {rc} = {zero})"));
                };
                self.grant(req, &place, WRITER, &none_reading).await?
            }
            Mode::Read => {
                let no_writer = |update: &mut Update| {
                    let (w, rc) = (update.name(WRITER), update.name(READERS));
                    update.only_if(format!("attribute_not_exists({w})")).add(rc, 1);
                };
                self.grant(req, &place, &item::reader(req.owner), &no_writer)
                    .await?
            }
        };
        Ok(granted.map_or_else(waiting, Poll::Held))
    }

    async fn poll(&self, req: &Request) -> Result<Poll, EngineError> {
        self.acquire(req).await
    }

    async fn cancel(&self, req: &Request) -> Result<(), EngineError> {
        self.let_go(req).await.map(drop)
    }

    async fn renew(&self, req: &Request) -> Result<Renewal, EngineError> {
        match taken(req) {
            Some(taken) => self.renew_entry(req, &taken).await,
            None => Ok(Renewal::Gone),
        }
    }

    async fn release(&self, req: &Request) -> Result<bool, EngineError> {
        self.let_go(req).await
    }

    /// No signal of its own: a failed renewal tells the core.
    fn lost(&self, _req: &Request) -> Option<LostSignal> {
        None
    }
}

impl Semaphores for DynamoDbEngine {
    fn permits(&self, count: u32) -> Box<dyn Lifecycle + '_> {
        Box::new(permits::Permits { engine: self, count })
    }

    fn slots(&self) -> bool {
        true
    }
}

#[async_trait]
impl Inspect for DynamoDbEngine {
    fn shows_fences(&self) -> bool {
        true
    }

    fn shows_renewals(&self) -> bool {
        true
    }

    async fn inspect(&self, key: &LockKey, permits: Option<u32>) -> Result<LockView, EngineError> {
        records::inspect(self, key, permits).await
    }
}

#[async_trait]
impl List for DynamoDbEngine {
    async fn list(&self, group: &str) -> Result<Vec<LockView>, EngineError> {
        records::list(self, group).await
    }
}

#[async_trait]
impl Control for DynamoDbEngine {
    async fn forced_out(&self, req: &Request) -> Result<bool, EngineError> {
        control::forced_out(self, req).await
    }

    async fn force_release(&self, key: &LockKey, only: &Only) -> Result<u32, EngineError> {
        control::act(self, &Place::lock(key), only, control::Act::Force).await
    }

    async fn revoke(&self, key: &LockKey, only: &Only) -> Result<u32, EngineError> {
        control::act(self, &Place::lock(key), only, control::Act::Revoke).await
    }
}

/// A permit is an entry of the semaphore's item, reached as a lock's is.
#[async_trait]
impl PermitControl for DynamoDbEngine {
    async fn force_release_permits(
        &self,
        key: &LockKey,
        _count: u32,
        only: &Only,
    ) -> Result<u32, EngineError> {
        control::act(self, &Place::semaphore(key), only, control::Act::Force).await
    }

    async fn revoke_permits(&self, key: &LockKey, _count: u32, only: &Only) -> Result<u32, EngineError> {
        control::act(self, &Place::semaphore(key), only, control::Act::Revoke).await
    }
}

#[async_trait]
impl HoldAtLeast for DynamoDbEngine {}

impl HeldWrites for DynamoDbEngine {
    fn store(&self) -> &(dyn std::any::Any + Send + Sync) {
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_names_are_hashed_and_locks_and_semaphores_kept_apart() {
        let key = LockKey::new("order", "42").unwrap();
        assert_eq!(Place::lock(&key).sk, "l:42");
        assert_eq!(Place::semaphore(&key).sk, "s:42");
        assert_eq!(Place::lock(&key).pk, "order");
        let long = LockKey::new("g", "n".repeat(MAX_SORT_NAME + 1)).unwrap();
        let sk = Place::lock(&long).sk;
        assert!(sk.starts_with("h:") && sk.len() == 34, "{sk}");
        assert!(Place::semaphore(&long).sk.starts_with("t:"));
    }
}
