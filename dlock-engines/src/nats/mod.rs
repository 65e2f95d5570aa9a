//! The NATS engine: locks on a JetStream key-value bucket, in line by the
//! stream's revisions, leased by per-key TTLs, woken by one watch.
//!
//! **Line.** Each request writes a key of its own under its lock's prefix
//! (`keys.rs`), created only if absent. The stream gives every write a
//! revision, strictly rising; a key's first one is its place in line, and
//! its fencing token. A writer holds when no key is ahead of it, a reader
//! when no writer is, a permit when fewer keys than permits are: so
//! waiters are served first come first served, and the readers in a run
//! are admitted together. The key's later writes carry its first revision
//! in the value, as the stream keeps only each key's last message.
//!
//! **Watch, not polls** (`mirror.rs`). One ordered consumer per engine
//! keeps a copy of the bucket's live keys; a request reads its line from
//! the copy once the copy has applied its own write, so it finds every
//! key written before it. A release is one purge of its key; the purge's
//! message reaching the next in line is the handoff, with no request in
//! between, and 10,000 waiters on one engine share the one watch.
//! Measured (`benches/nats.rs`, 16 clients on one lock): handoff p50
//! 297–317 µs, 1.6–1.8 NATS request round trips, against 434–467 µs for
//! the same clients polling with a create at the core's 10–200 ms, which
//! also sent the server 4.4 messages per acquisition to the watch's 2.0;
//! the server receives nothing from 10,000 waiters while they wait
//! (`benches/scale.rs`). A watch per waiter, on the key ahead as the etcd
//! engine does, would cost a consumer (a request to the cluster's meta
//! leader) per wait; the one watch costs each engine every write to the
//! bucket.
//!
//! **Lease.** Every write sets the key's TTL (`Nats-TTL`, the bucket's
//! per-key TTLs), so the server removes a dead holder's or waiter's key a
//! lease after its last write, by its own clock, and leaves a marker that
//! wakes the line. A renewal writes the key again at the revision its
//! holder last wrote: one refused was removed or changed by another, and
//! its holder knows at once. A holder counts its lease from when it sent
//! its last write, which the server stamps later, and lets go once it ran
//! out: no two hold at once while clocks agree in rate. A waiter writes its
//! key again every third of its lease. A server restarted with its store
//! keeps the keys and their TTLs, and removes at once those whose time
//! passed; in a cluster, the stream's new leader expires keys by the
//! messages' own times, so a key whose TTL ran out during the election
//! goes as soon as the stream is led again.
//!
//! **Fence, strict.** A key's first revision: later holders of a lock
//! have later keys, and a stream's revisions rise across restarts and
//! leader changes. A permit's fence is its slot key's first revision
//! (`permits.rs`).
//!
//! **Records and control** (`records.rs`, `control.rs`): the copy, brought
//! up to the stream's last revision, shows holders and waiters in line;
//! force release deletes a holder's key at its revision, revoke rewrites it
//! marked, at its revision. The holder's watch hears either at once, and
//! its renewal, sent then, says which. `dlock watch` hears a group's
//! changes from the same watch ([`Watch`]).
//!
//! **Held writes** (`held.rs`, [`HeldPut`]): a user's key `d.<key>` of
//! the bucket, written with the hold key's revision expected; the watch
//! leaves such keys out.
//!
//! ```toml
//! [engines.nats]
//! kind = "nats"
//! servers = ["nats://10.0.0.1:4222", "nats://10.0.0.2:4222"]
//! bucket = "dlock"           # made at startup with per-key TTLs if missing
//! # replicas = 3             # of a bucket made at startup
//! # username = "dlock"       # or token / nkey_seed_file / credentials_file
//! # password_file = "/run/secrets/nats"
//! # tls_ca_file = "ca.pem"   # TLS; also servers = ["tls://..."]
//! ```

mod config;
mod control;
mod held;
mod keys;
mod mirror;
mod permits;
mod records;
mod write;

use std::time::{Duration, Instant};

use async_nats::jetstream;
use dlock_core::kit::{
    Changed, Control, Engine, EngineError, Expiry, Facets, Fairness, Fencing, Guarantees, HeldWrites,
    HoldAtLeast, Inspect, Lifecycle, List, LostSignal, PermitControl, Poll, Renewal, Request, RequestState,
    RevokedSignal, Semaphores, Watch, Woken, async_trait,
};
use dlock_core::{LockKey, LockView, Only};
use tokio::sync::watch;

use keys::{Line, Stake};
use mirror::{Found, Mirror};
use write::Wrote;

/// The client crate, for tests and benchmarks that talk to NATS directly.
pub use async_nats;
pub use config::{NatsConfig, register};
pub use held::HeldPut;

/// How long the server keeps the marker of a key removed: the watch
/// learns of a removal from it.
const MARKERS_KEPT: Duration = Duration::from_secs(60);

/// The NATS engine. See the [module docs](self).
pub struct NatsEngine {
    js: jetstream::Context,
    stream: jetstream::stream::Stream,
    bucket: String,
    /// The servers, for messages.
    address: String,
    /// The label each key carries (`client_name`).
    label: String,
    mirror: Mirror,
    /// How long a request to the server, or the watch, may take.
    limit: Duration,
}

/// Which rule admits a line's contenders.
#[derive(Clone, Copy)]
enum Rule {
    Lock,
    Permits(u32),
}

impl Rule {
    fn line(self, key: &LockKey) -> Line {
        match self {
            Rule::Lock => Line::lock(key),
            Rule::Permits(_) => Line::semaphore(key),
        }
    }

    /// How many of `line`'s first contenders hold.
    fn holding(self, line: &[Found]) -> usize {
        match self {
            Rule::Permits(count) => line.len().min(count as usize),
            Rule::Lock => match line.first() {
                None => 0,
                Some(first) if first.stake.is_writer() => 1,
                Some(_) => line.iter().take_while(|f| !f.stake.is_writer()).count(),
            },
        }
    }
}

/// A request's key, from its first write to its release.
#[derive(Clone)]
struct Queued {
    line: Line,
    key: String,
    /// The key's last write's revision.
    revision: u64,
    /// Its first: the place in line, and a lock's fence.
    created: u64,
    /// What the last write wrote.
    stake: Stake,
    /// When the last write was sent, and the lease it set.
    sent: Instant,
    lease: Duration,
    held: bool,
    /// A granted permit's slot key.
    slot: Option<permits::Slot>,
}

impl Queued {
    /// Whether the last write's lease ran out: the server may have
    /// removed the key, whether or not it did.
    fn lapsed(&self) -> bool {
        self.sent.elapsed() >= self.lease
    }
}

/// A request's first write, until it is answered.
#[derive(Clone)]
struct Joining {
    key: String,
    first_sent: Instant,
}

/// What the engine keeps for a request.
#[derive(Clone)]
enum Step {
    Joining(Joining),
    Queued(Box<Queued>),
}

fn state(req: &Request) -> &RequestState<Step> {
    RequestState::<Step>::of(req)
}

fn queued(req: &Request) -> Option<Queued> {
    match state(req).lock().clone()? {
        Step::Queued(queued) => Some(*queued),
        Step::Joining(_) => None,
    }
}

fn keep(req: &Request, queued: Queued) {
    *state(req).lock() = Some(Step::Queued(Box::new(queued)));
}

fn failed(err: impl Into<dlock_core::BoxError>) -> EngineError {
    EngineError::failed(err)
}

fn waiting(mut changes: watch::Receiver<()>) -> Poll {
    Poll::Waiting(Box::pin(async move {
        let _ = changes.changed().await;
        Woken::Retry
    }))
}

impl NatsEngine {
    /// Writes a new key for `req` at the back of its line. A write whose
    /// answer was lost is sent again with the same key, and a refusal then
    /// reads the key back: one this request wrote is its own.
    async fn join(&self, req: &Request, rule: Rule) -> Result<Queued, EngineError> {
        let line = rule.line(&req.key);
        let joining = match state(req).lock().clone() {
            Some(Step::Joining(joining)) => joining,
            _ => Joining {
                key: line.contender(),
                first_sent: Instant::now(),
            },
        };
        *state(req).lock() = Some(Step::Joining(joining.clone()));
        let Joining { key, first_sent } = joining;
        let permits = match rule {
            Rule::Lock => None,
            Rule::Permits(count) => Some(count),
        };
        let stake = Stake::new(req, &self.label, &line, permits);
        let sent = Instant::now();
        let written = self.put(&key, &stake, 0, req.lease).await?;
        *state(req).lock() = None;
        let (revision, created, stake, sent) = match written {
            Wrote::Done(revision) => (revision, revision, stake, sent),
            Wrote::Refused => match self.last(&key).await? {
                // Its lease counted from the first send, the earliest.
                Some(found) if found.stake.owner() == Some(req.owner) => {
                    (found.revision, found.created, found.stake, first_sent)
                }
                _ => return Err(failed("nats: a request's new key was there before it")),
            },
        };
        Ok(Queued {
            line,
            key,
            revision,
            created,
            stake,
            sent,
            lease: req.lease,
            held: false,
            slot: None,
        })
    }

    /// Writes `queued`'s key again for `lease`, at its last revision;
    /// false if it was removed or changed meanwhile.
    async fn rewrite(&self, queued: &mut Queued, lease: Duration) -> Result<bool, EngineError> {
        let stake = queued.stake.again(queued.created, lease);
        let sent = Instant::now();
        match self.put(&queued.key, &stake, queued.revision, lease).await? {
            Wrote::Done(revision) => {
                queued.revision = revision;
                queued.stake = stake;
                queued.sent = sent;
                queued.lease = lease;
                Ok(true)
            }
            Wrote::Refused => Ok(false),
        }
    }

    /// A first try: one that only tries leaves no key behind.
    async fn first_try(&self, req: &Request, rule: Rule) -> Result<Poll, EngineError> {
        let answer = self.attempt(req, rule).await;
        if req.try_once && !matches!(answer, Ok(Poll::Held(_))) {
            self.let_go(req).await?;
        }
        answer
    }

    /// One look at `req`'s line, joining it first if need be: held, or
    /// waiting for the line's next change.
    async fn attempt(&self, req: &Request, rule: Rule) -> Result<Poll, EngineError> {
        let mut current = match queued(req) {
            Some(queued) => queued,
            None => self.join(req, rule).await?,
        };
        for _ in 0..2 {
            let changes = self.mirror.changes(&current.line);
            // The copy need only hold every write before this request's
            // last: its own may not have come back yet.
            let before = current.revision - 1;
            self.mirror.caught_up(before, self.limit).await.map_err(failed)?;
            let (cap, count) = match rule {
                Rule::Lock => (1, None),
                Rule::Permits(count) => (count as usize, Some(count)),
            };
            let mine = (current.key.as_str(), current.created);
            let Some(standing) = self.mirror.standing(&current.line, mine, before, (cap, count)) else {
                keep(req, current);
                return Ok(waiting(changes));
            };
            // A key not back yet stands where its first revision puts it.
            if !standing.present && standing.whole >= current.revision {
                // It expired or was removed while it waited.
                current = self.join(req, rule).await?;
                continue;
            }
            if let Some(other) = standing.other_count {
                self.remove(&current.key, current.revision, false).await?;
                *state(req).lock() = None;
                return Err(EngineError::PermitsDiffer { in_use: other });
            }
            let admitted = match rule {
                Rule::Lock if current.stake.is_writer() => standing.ahead == 0,
                Rule::Lock => !standing.writer_ahead,
                Rule::Permits(count) => standing.ahead < count as usize,
            };
            // A key written a third of its lease ago is written again, for
            // the holder it becomes or the waiter it stays.
            let stale = current.sent.elapsed() >= current.lease / 3 || current.lease != req.lease;
            if stale && !self.rewrite(&mut current, req.lease).await? {
                current = self.join(req, rule).await?;
                continue;
            }
            if !admitted {
                keep(req, current);
                return Ok(waiting(changes));
            }
            let fence = match rule {
                Rule::Lock => current.created,
                Rule::Permits(count) => match self.take_slot(req, &current, count).await? {
                    Some(slot) => {
                        let fence = slot.created;
                        current.slot = Some(slot);
                        fence
                    }
                    None => {
                        keep(req, current);
                        return Ok(waiting(changes));
                    }
                },
            };
            current.held = true;
            keep(req, current);
            return Ok(Poll::Held(fence));
        }
        Err(failed(
            "nats: the request's key was removed as soon as it was written",
        ))
    }

    /// Renews `req`'s hold: its key, and a permit's slot.
    async fn renew_hold(&self, req: &Request) -> Result<Renewal, EngineError> {
        let Some(mut current) = queued(req).filter(|q| q.held) else {
            return Ok(Renewal::Gone);
        };
        if current.lapsed() {
            // Gone at once, with no call to a server that may not answer:
            // the key's TTL, no longer than the lease, removes it.
            let mut gone = current;
            gone.held = false;
            keep(req, gone);
            return Ok(Renewal::Gone);
        }
        if !self.rewrite(&mut current, req.lease).await? {
            // Changed by another: revoked (marked), or gone.
            match self.last(&current.key).await? {
                Some(found) if found.stake.owner() == Some(req.owner) => {
                    current.revision = found.revision;
                    current.stake = found.stake;
                    if !self.rewrite(&mut current, req.lease).await? {
                        return Ok(Renewal::Gone);
                    }
                }
                _ => {
                    let mut gone = current;
                    gone.held = false;
                    keep(req, gone);
                    return Ok(Renewal::Gone);
                }
            }
        }
        if let Some(slot) = &mut current.slot
            && !self.renew_slot(slot, &current.stake, req.lease).await?
        {
            return Ok(Renewal::Gone);
        }
        let revoked = current.stake.x;
        keep(req, current);
        Ok(if revoked { Renewal::Revoked } else { Renewal::Held })
    }

    /// The watch's word that `req`'s held key was marked or removed by
    /// another: the core renews at once, and the renewal tells which.
    fn marked(&self, req: &Request) -> Option<RevokedSignal> {
        let current = queued(req).filter(|q| q.held)?;
        Some(Box::pin(self.mirror.marked(&current.line, &current.key)))
    }

    /// Removes `req`'s key (and slot); whether it still held.
    async fn let_go(&self, req: &Request) -> Result<bool, EngineError> {
        let step = state(req).lock().take();
        let current = match step {
            Some(Step::Queued(current)) => *current,
            Some(Step::Joining(Joining { key, .. })) => {
                // A first write whose answer was lost.
                if let Some(found) = self.last(&key).await? {
                    self.remove_own(&key, found.revision, req).await?;
                }
                return Ok(false);
            }
            None => return Ok(false),
        };
        if let Some(slot) = &current.slot {
            self.remove_own(&slot.key, slot.revision, req).await?;
        }
        let removed = self.remove_own(&current.key, current.revision, req).await?;
        Ok(removed && current.held)
    }

    /// Removes `key` of `req`'s at `revision`, or at the one an operator's
    /// mark left; whether it was there.
    async fn remove_own(&self, key: &str, revision: u64, req: &Request) -> Result<bool, EngineError> {
        if let Wrote::Done(_) = self.remove(key, revision, false).await? {
            return Ok(true);
        }
        match self.last(key).await? {
            Some(found) if found.stake.owner() == Some(req.owner) => Ok(matches!(
                self.remove(key, found.revision, false).await?,
                Wrote::Done(_)
            )),
            _ => Ok(false),
        }
    }
}

#[async_trait]
impl Engine for NatsEngine {
    fn kind(&self) -> &'static str {
        "nats"
    }

    fn address(&self) -> String {
        self.address.clone()
    }

    fn guarantees(&self) -> Guarantees {
        Guarantees {
            read: true,
            fairness: Fairness::Fifo,
            fencing: Fencing::Strict,
            expiry: Expiry::Lease,
            lease_unit: Duration::from_secs(1),
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
            watch: Some(self),
            held_writes: Some(self),
            ..Facets::default()
        }
    }

    /// The key is written again as a reader's, keeping its place; the
    /// readers behind it wake.
    async fn downgrade(&self, req: &Request) -> Result<bool, EngineError> {
        let Some(mut current) = queued(req).filter(|q| q.held) else {
            return Ok(false);
        };
        current.stake.m = 'r';
        let done = self.rewrite(&mut current, req.lease).await?;
        if done {
            keep(req, current);
        }
        Ok(done)
    }
}

#[async_trait]
impl Lifecycle for NatsEngine {
    async fn acquire(&self, req: &Request) -> Result<Poll, EngineError> {
        self.first_try(req, Rule::Lock).await
    }

    async fn poll(&self, req: &Request) -> Result<Poll, EngineError> {
        self.attempt(req, Rule::Lock).await
    }

    async fn cancel(&self, req: &Request) -> Result<(), EngineError> {
        self.let_go(req).await.map(drop)
    }

    async fn renew(&self, req: &Request) -> Result<Renewal, EngineError> {
        self.renew_hold(req).await
    }

    async fn release(&self, req: &Request) -> Result<bool, EngineError> {
        self.let_go(req).await
    }

    /// No signal of its own: a failed renewal tells the core.
    fn lost(&self, _req: &Request) -> Option<LostSignal> {
        None
    }

    fn revoked(&self, req: &Request) -> Option<RevokedSignal> {
        self.marked(req)
    }
}

impl Semaphores for NatsEngine {
    fn permits(&self, count: u32) -> Box<dyn Lifecycle + '_> {
        Box::new(permits::Permits { engine: self, count })
    }

    fn slots(&self) -> bool {
        true
    }
}

#[async_trait]
impl Inspect for NatsEngine {
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
impl List for NatsEngine {
    async fn list(&self, group: &str) -> Result<Vec<LockView>, EngineError> {
        records::list(self, group).await
    }
}

#[async_trait]
impl Control for NatsEngine {
    async fn forced_out(&self, req: &Request) -> Result<bool, EngineError> {
        control::forced_out(self, req).await
    }

    async fn force_release(&self, key: &LockKey, only: &Only) -> Result<u32, EngineError> {
        control::act(self, &Line::lock(key), Rule::Lock, only, control::Act::Force).await
    }

    async fn revoke(&self, key: &LockKey, only: &Only) -> Result<u32, EngineError> {
        control::act(self, &Line::lock(key), Rule::Lock, only, control::Act::Revoke).await
    }
}

#[async_trait]
impl PermitControl for NatsEngine {
    async fn force_release_permits(
        &self,
        key: &LockKey,
        count: u32,
        only: &Only,
    ) -> Result<u32, EngineError> {
        let rule = Rule::Permits(count);
        control::act(self, &Line::semaphore(key), rule, only, control::Act::Force).await
    }

    async fn revoke_permits(&self, key: &LockKey, count: u32, only: &Only) -> Result<u32, EngineError> {
        let rule = Rule::Permits(count);
        control::act(self, &Line::semaphore(key), rule, only, control::Act::Revoke).await
    }
}

#[async_trait]
impl HoldAtLeast for NatsEngine {}

impl HeldWrites for NatsEngine {
    fn store(&self) -> &(dyn std::any::Any + Send + Sync) {
        self
    }
}

/// The watch of the bucket already hears every change: a group's is a
/// signal from it.
#[async_trait]
impl Watch for NatsEngine {
    async fn watch(&self, group: &str) -> Result<Changed, EngineError> {
        let mut changes = self.mirror.group_changes(&keys::group_token(group));
        Ok(Box::pin(async move {
            let _ = changes.changed().await;
        }))
    }
}
