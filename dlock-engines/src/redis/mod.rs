//! The Redis engine: ylock's AQS-like read/write lock in Redis, improved.
//!
//! Per lock, under one hash tag (see `keys.rs`): a waiter queue (list of
//! `w:<owner>` / `r:<owner>`), the readers (sorted set scored by each
//! reader's own deadline on the server's clock, so a dead reader expires
//! while others renew — ylock's single-TTL set kept it alive), pending
//! readers (the run admitted together), one liveness key per waiter (a dead
//! queue head is kicked), and the gate: the lock's one record, holding the
//! writer with its deadline and the last fencing token, which exists
//! whenever any of the others does. So an idle lock is taken, and a holder
//! nobody waits for lets go, with two commands in a script, and
//! a held lock nobody waits for is one key, as in the plainest lock; a
//! holder that dies with waiters queued leaves the gate behind, and nobody
//! jumps the queue (`scripts/head.lua` has the gate's forms). Every state
//! change is one Lua script, called by SHA and reloaded after `NOSCRIPT`.
//!
//! **Wake-up and handoff.** A release that frees the lock hands it straight
//! to a live writer at the head of the queue and publishes `<owner>:<fence>`;
//! otherwise it publishes the id of the waiter now first in line, to that
//! waiter's engine only (its liveness key names the engine). One subscriber
//! connection per engine passes each message to that waiter alone (see
//! `notify`): a handed-over writer holds without another round trip, a
//! woken one polls. The core's constant or exponential polling stays the
//! safety net.
//!
//! **Fencing without leaks.** The gate keeps the last token for
//! `fence_retention` (default one minute) past its holder's deadline,
//! whether the holder lets go or dies holding. A token is one past the kept
//! one, or, with none kept, the server clock in microseconds (every path
//! that reads the clock anyway takes the later of the two). Once every
//! lease and the retention have run out, the lock leaves no key behind.
//! Assumption: the Redis server's clock never steps back by more than
//! `fence_retention`.
//!
//! **What the server spends.** A lone writer takes an idle lock with one
//! `GET` and one `SET` and lets go with one `PTTL` and one `SET ... GET`
//! (the token it was granted rebuilds the idle record, and a record that
//! turns out not to be its own is put back): no clock read, and the
//! helpers the queue needs are not even made (a script makes its functions
//! anew on every call). The settings every call would repeat (the publish
//! command, the retention, `waiter_ttl`) are constants in the scripts'
//! text, not arguments.
//!
//! **Records.** A writer's gate, a reader's and a waiter's entry, and a
//! permit keep the grant time and a six-character reference to the
//! process's label (`labels.rs`), registered once per engine, so the
//! memory a held lock costs does not grow with the host's name.
//! `scripts/inspect.lua` reads a lock's records in one call; the labels
//! come from one `MGET`, once per reference. A listing reads the gates
//! raw (`MGET` and `PTTL`s, pipelined): most locks are a lone writer or
//! idle, which the gate alone tells, and only the others go to the script,
//! whose calls cost the server several times the raw commands.
//!
//! **Semaphores** keep apart from the lock of their name, under the same
//! hash tag (`scripts/semaphore.lua`, one script for every call): a record
//! with the count its holders and waiters agreed on and the last token, the
//! holders in a sorted set scored by each permit's own deadline on the
//! server's clock (a crashed holder's permit returns within its lease,
//! whatever the others do), and a queue with a liveness key per waiter as
//! for locks. The first k live waiters may take the k free permits; a
//! newcomer only what they leave. A release wakes, on their own engines'
//! channels, the waiters a free permit now awaits.
//!
//! **Held writes** (`held.rs`, [`HeldWrite`]): `scripts/held.lua` renews
//! the hold as `renew.lua` (or the semaphore's script) does, then writes,
//! only if it still holds.
//!
//! Needs Redis 6.2 or later (`SET ... GET`); a cluster needs 7.0
//! (`SPUBLISH`).
//!
//! Config:
//!
//! ```toml
//! [engines.main]
//! kind = "redis"
//! url = "redis://127.0.0.1:6379"   # redis://user:password@host for ACL users
//! # url = "rediss://host:6380"      # TLS, with feature `redis-tls`
//! # tls_ca_file = "/etc/ssl/redis-ca.pem"
//! # tls_cert_file = "client.pem"    # with tls_key_file, for tls-auth-clients
//! # tls_key_file = "client.key"
//! connect_timeout = "5s"
//! fence_retention = "1m"          # the same in every process sharing these locks
//! waiter_ttl = "3s"                # a queued waiter silent this long is dropped
//!
//! [engines.shared]
//! kind = "redis-cluster"
//! nodes = ["redis://10.0.0.1:7000", "redis://10.0.0.2:7000"]   # seed nodes
//! # nodes = ["rediss://..."]      # TLS to every node (tls-cluster yes), the same tls_ files
//!
//! [engines.ha]
//! kind = "redis-sentinel"
//! sentinels = ["redis://10.0.0.1:26379", "redis://10.0.0.2:26379", "redis://10.0.0.3:26379"]
//! master_name = "mymaster"
//! # sentinels = ["rediss://..."]  # TLS to the sentinels and the data nodes (tls-replication yes)
//! # username = "locker"            # ACL user and password of the data nodes
//! # password = "..."
//! replicas_ack = 1                 # a grant waits for 1 replica (WAIT); 0: no wait (the default)
//! replicas_ack_timeout = "50ms"    # fewer acknowledge in time: undone, retried within the wait
//! ```
//!
//! **A cluster.** Every key of a lock shares one hash tag, so each lock
//! lives on one node; scripts publish with `SPUBLISH` and the subscriber
//! uses `SSUBSCRIBE`, so a notification goes to the node owning the lock's
//! slot and is never broadcast cluster-wide.
//!
//! **Behind Sentinel** (`redis-sentinel`): the same engine, with the
//! primary found through the sentinels. Every connection, the script cache
//! and the subscription follow the primary across a failover without a
//! restart of the process: after any failure the next call asks the
//! sentinels again, and the engine also listens to every sentinel's
//! `+switch-master`, so it leaves an old primary that came back still
//! writable as soon as one sentinel announces the new one.
//!
//! - `replicas_ack = n` (also on `kind = "redis"`) makes each grant run
//!   `WAIT n` on the connection that wrote it; if fewer replicas acknowledge
//!   in time, the grant is undone and retried within the wait. It narrows
//!   the window in which a failover can forget a grant, but is no
//!   guarantee: replication stays asynchronous. With a single replica, no
//!   grant is possible after a failover until a replica is back, which is
//!   why it is not the default.
//! - The fence across a failover: a token is the primary's clock in µs,
//!   bumped past the last token it kept. A promoted replica that missed the
//!   last grant starts from its own clock, which is still greater whenever
//!   the two servers' clocks agree within the failover's duration.
//! - A held lock survives a failover if its grant was replicated and the
//!   failover is shorter than the lease. Otherwise the next renewal is
//!   refused and `lost` fires; the old holder's writes are refused by
//!   fenced storage, since its token is older.

pub(crate) mod config;
pub(crate) mod connection;
mod held;
pub(crate) mod keys;
mod labels;
mod notify;
mod permits;
mod records;

use std::sync::Arc;
use std::time::Duration;

use dlock_core::kit::{
    Control, Engine, EngineError, Expiry, Facets, Fairness, Fencing, Guarantees, HeldWrites, HoldAtLeast,
    Inspect, Lifecycle, List, LostSignal, OwnerId, PermitControl, Poll, Renewal, Request, RevokedSignal,
    Semaphores, Wake, async_trait,
};
use dlock_core::{LockKey, LockView, Only};
use redis::Script;

use connection::{Connection, Target};
use permits::Permits;

pub use config::{RedisClusterConfig, RedisConfig, RedisSentinelConfig, register};
pub use held::HeldWrite;

/// Locks a listing reads in one pipeline or script call.
const LIST_BATCH: usize = 1000;

/// A script: this engine's settings as Lua constants (one script per
/// setting in use, not per process), the names all scripts share
/// (`scripts/head.lua`), its lone-writer path, then the helpers
/// (`scripts/common.lua`) where its `-- helpers --` line is, and the rest.
/// `holds_named`, for the scripts an operator's acts run.
const ONLY: &str = include_str!("scripts/only.lua");

fn script(body: &str, settings: &str) -> Script {
    Script::new(&script_text(body, settings))
}

fn script_text(body: &str, settings: &str) -> String {
    let (fast, rest) = body
        .split_once("-- helpers --\n")
        .expect("every script marks where its helpers go");
    [
        settings,
        include_str!("scripts/head.lua"),
        fast,
        include_str!("scripts/common.lua"),
        rest,
    ]
    .concat()
}

/// A held write's script (`scripts/held.lua`): `renewal`, a whole script,
/// made the function `renewed`, then the writes, which begin at ARGV
/// `writes_from`.
fn held_script(renewal: &str, writes_from: u8) -> Script {
    Script::new(&format!(
        "local writes_from = {writes_from}\nlocal function renewed()\n{renewal}\nend\n{}",
        include_str!("scripts/held.lua")
    ))
}

struct Scripts {
    acquire: Script,
    renew: Script,
    release: Script,
    downgrade: Script,
    /// Every call on a semaphore; it shares nothing with the lock's.
    semaphore: Script,
    /// Reads a lock's or semaphore's records.
    inspect: Script,
    /// Forces a lock's holders out, or asks them to let go.
    control: Script,
    /// Whether a holder found gone was forced out.
    forced: Script,
    /// A lock's held write (`held.rs`).
    held: Script,
    /// A permit's held write.
    held_permit: Script,
}

/// The Redis engine, on one server, a cluster or behind Sentinel. See the
/// [module docs](self).
///
/// Built from config (`kind` in `[engines.<name>]`), or by hand:
///
/// ```no_run
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), dlock::Error> {
/// use std::sync::Arc;
/// use dlock::engines::redis::{RedisConfig, RedisEngine};
///
/// let engine = RedisEngine::connect("main", &RedisConfig::new("redis://127.0.0.1:6379")).await?;
/// dlock::install(dlock::Registry::with_engine("main", Arc::new(engine), Default::default())?)?;
/// # Ok(())
/// # }
/// ```
pub struct RedisEngine {
    kind: &'static str,
    connection: Connection,
    notifier: Arc<notify::Notifier>,
    scripts: Scripts,
    address: String,
    waiter_ttl: Duration,
    /// Replicas that must acknowledge a grant (`WAIT`), and how long to wait.
    replicas_ack: Option<(u32, Duration)>,
    /// Names this engine's channel for each lock (`<prefix>:n:<id>`), so a
    /// release wakes only the process whose waiter is next.
    id: String,
    /// The label every hold's and waiter's record refers to.
    labels: labels::Labels,
}

impl RedisEngine {
    /// Grants wait for `replicas` replicas (none: 0), at most `timeout`.
    fn acknowledged_by(mut self, replicas: u32, timeout: Duration) -> Self {
        self.replicas_ack = (replicas > 0).then_some((replicas, timeout));
        self
    }

    /// With `replicas_ack`, waits until that many replicas have the grant
    /// (`WAIT` on the connection that wrote it); true if they do in time.
    async fn replicated(&self) -> Result<bool, EngineError> {
        let Some((replicas, timeout)) = self.replicas_ack else {
            return Ok(true);
        };
        let acked: u32 = redis::cmd("WAIT")
            .arg(replicas)
            .arg(millis(timeout))
            .query_async(&mut self.connection.clone())
            .await
            .map_err(EngineError::failed)?;
        Ok(acked >= replicas)
    }

    /// Registers the target's label (see `labels`) and makes the engine.
    async fn new(
        target: Target<'_>,
        connection: Connection,
        notifier: notify::Notifier,
        publish: &'static str,
        (fence_retention, waiter_ttl): (Duration, Duration),
    ) -> Result<Self, dlock_core::Error> {
        let labels = target
            .within(labels::Labels::register(&connection, &target.label))
            .await?;
        let settings = format!(
            "local publish, retain, waiter_ttl = '{publish}', {}, {}\n",
            millis(fence_retention),
            millis(waiter_ttl)
        );
        Ok(RedisEngine {
            kind: target.at.kind,
            connection,
            notifier: Arc::new(notifier),
            scripts: Scripts {
                acquire: script(include_str!("scripts/acquire.lua"), &settings),
                renew: script(include_str!("scripts/renew.lua"), &settings),
                release: script(include_str!("scripts/release.lua"), &settings),
                downgrade: script(include_str!("scripts/downgrade.lua"), &settings),
                semaphore: Script::new(&[&settings, ONLY, include_str!("scripts/semaphore.lua")].concat()),
                held: held_script(&script_text(include_str!("scripts/renew.lua"), &settings), 3),
                held_permit: held_script(
                    &[&settings, ONLY, include_str!("scripts/semaphore.lua")].concat(),
                    4,
                ),
                inspect: Script::new(include_str!("scripts/inspect.lua")),
                control: script(&[ONLY, include_str!("scripts/control.lua")].concat(), &settings),
                forced: Script::new(include_str!("scripts/forced.lua")),
            },
            address: target.address,
            waiter_ttl,
            replicas_ack: None,
            id: OwnerId::random().to_string(),
            labels,
        })
    }

    /// One try. A receiver taken before the script runs catches a release
    /// during the round trip; without one (lock not yet subscribed here), the
    /// wait subscribes and then tries again at once.
    async fn attempt(&self, req: &Request, permits: Option<u32>, queue: bool) -> Result<Poll, EngineError> {
        let record = keys::record(&req.key, permits.is_some());
        // Only a request that may wait hears from the lock.
        let channel = queue.then(|| keys::channel(&record, &self.id));
        let watching = channel.as_deref().and_then(|c| self.notifier.existing(c));
        let join = if queue { "1" } else { "0" };
        let (owner, lease) = (req.owner.to_string(), millis(req.lease));
        // The answer, and for a semaphore when its first holder's lease
        // ends and the slot it granted.
        let (answer, expires, slot): (i64, i64, i64) = match permits {
            Some(n) => {
                let args = (owner, "acquire", n, lease, join, &self.id, self.labels.tag(lease));
                self.eval(&self.scripts.semaphore, &record, args).await
            }
            None => {
                let mode = match req.mode {
                    dlock_core::Mode::Write => "w",
                    dlock_core::Mode::Read => "r",
                };
                let args = (owner, mode, lease, join, &self.id, self.labels.tag(lease));
                self.eval(&self.scripts.acquire, &record, args)
                    .await
                    .map(|fence| (fence, -1, -1))
            }
        }
        .map_err(EngineError::failed)?;
        if answer < 0 {
            let in_use = u32::try_from(-answer).map_err(EngineError::failed)?;
            return Err(EngineError::PermitsDiffer { in_use });
        }
        if answer > 0 {
            if self.replicated().await? {
                if let Ok(slot) = u32::try_from(slot) {
                    *permits::Slot::of(req).lock() = Some(slot);
                }
                return Ok(Poll::Held(answer as u64));
            }
            // Too few replicas have it: a failover now could forget it.
            // Undo, and try again within the wait.
            self.let_go(req, permits, "cancel").await?;
            return Ok(Poll::Waiting(Box::pin(std::future::pending())));
        }
        let wake: Wake = match (watching, channel) {
            // A handed-over grant lasts the waiter's lease or its liveness
            // window, the shorter (see release.lua), counted from this call
            // on both sides. With replicas_ack a handed-over grant must
            // still be acknowledged: the waiter then claims it by polling.
            (Some(receiver), _) => {
                let handoff = self
                    .replicas_ack
                    .is_none()
                    .then_some(req.lease.min(self.waiter_ttl));
                notify::wake_for(receiver, req.owner, handoff)
            }
            (None, None) => Box::pin(std::future::pending()),
            // Subscribed after this attempt: try again at once, so a release
            // that happened meanwhile is not missed.
            (None, Some(channel)) => match self.notifier.subscribe(&channel).await {
                Some(_) => Box::pin(std::future::ready(dlock_core::kit::Woken::Retry)),
                None => Box::pin(std::future::pending()),
            },
        };
        // A permit whose holder died comes free with no one to publish it:
        // look again when the first holder's lease ends.
        let wake = match u64::try_from(expires) {
            Ok(ms) => notify::or_at(wake, Duration::from_millis(ms)),
            Err(_) => wake,
        };
        Ok(Poll::Waiting(wake))
    }

    /// What inspect.lua reads of each of `records` (see `keys::record`), in
    /// one call: all on one node, and in a cluster of one slot.
    async fn records(&self, records: &[&str]) -> Result<Vec<records::Reply>, EngineError> {
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(self.scripts.inspect.get_hash())
            .arg(records.len())
            .arg(records);
        self.send(&self.scripts.inspect, cmd)
            .await
            .map_err(EngineError::failed)
    }

    /// Locks' gates read raw, for a listing: the server's clock, an `MGET`
    /// and each one's `PTTL`, in one pipeline, far cheaper on the server
    /// than a script's calls; what each gate tells alone (records::gate).
    async fn gates(&self, gates: &[&str]) -> Result<Vec<Option<records::Read>>, EngineError> {
        let mut pipe = redis::pipe();
        pipe.cmd("TIME").cmd("MGET").arg(gates);
        for gate in gates {
            pipe.cmd("PTTL").arg(gate);
        }
        let mut connection = self.connection.clone();
        let read = async {
            let mut replies = pipe
                .query_async::<Vec<redis::Value>>(&mut connection)
                .await?
                .into_iter();
            let mut next = || replies.next().unwrap_or(redis::Value::Nil);
            let (seconds, micros): (u64, u64) = redis::from_redis_value(next())?;
            let now = seconds * 1000 + micros / 1000;
            let values: Vec<redis::Value> = redis::from_redis_value(next())?;
            values
                .into_iter()
                .map(|value| {
                    // The value's bytes become the record as they are.
                    let value = match value {
                        redis::Value::BulkString(bytes) => Some(bytes),
                        _ => None,
                    };
                    Ok(records::gate(value, redis::from_redis_value(next())?, now))
                })
                .collect::<redis::RedisResult<Vec<_>>>()
        };
        read.await.map_err(EngineError::failed)
    }

    /// Forces out the holders of lock `key`, or asks them to let go
    /// (`how`): control.lua.
    /// An operator's act, `how`, on the holders of the lock `key` that
    /// `only` admits (control.lua).
    async fn control(&self, key: &LockKey, how: &str, only: &Only) -> Result<u32, EngineError> {
        self.act(&self.scripts.control, &keys::record(key, false), how, only)
            .await
    }

    /// An operator's act, `how`, on the permits' holders of the semaphore
    /// `key` that `only` admits (semaphore.lua).
    async fn act_on_permits(&self, key: &LockKey, how: &str, only: &Only) -> Result<u32, EngineError> {
        self.act(&self.scripts.semaphore, &keys::record(key, true), how, only)
            .await
    }

    /// An operator's act, `how`, through `script` on `record`: on every
    /// hold in one call, or on those a read of the records admits, named
    /// to the script, which acts on each only while it is still the hold
    /// that was read (its owner id and fence).
    async fn act(&self, script: &Script, record: &str, how: &str, only: &Only) -> Result<u32, EngineError> {
        let mut named = Vec::new();
        if !only.is_any() {
            let read = self.records(&[record]).await?.pop();
            named = read.map_or_else(Vec::new, |reply| records::admitted(&reply, only));
            if named.is_empty() {
                return Ok(0);
            }
        }
        self.eval(script, record, ("", how, named))
            .await
            .map_err(EngineError::failed)
    }

    async fn run(
        &self,
        script: &Script,
        record: &str,
        req: &Request,
        arg: impl redis::ToRedisArgs,
    ) -> Result<bool, EngineError> {
        self.invoke(script, record, req, arg)
            .await
            .map_err(EngineError::failed)
    }

    /// A release or a withdrawal, sent once more on a fresh connection if
    /// the first went down with a dead one (a killed connection fails its
    /// next command): otherwise the lock would stay taken for the lease.
    /// The core bounds both tries by the call timeout. If the first had
    /// run after all, the second finds nothing of this owner's: a release
    /// then reports the hold lost, never a hold that is still there.
    async fn let_go(&self, req: &Request, permits: Option<u32>, how: &str) -> Result<bool, EngineError> {
        let (release, record) = match permits {
            Some(_) => (&self.scripts.semaphore, keys::record(&req.key, true)),
            None => (&self.scripts.release, keys::record(&req.key, false)),
        };
        // The token lets a lone writer's release go without reading the gate first.
        let fence = match req.fence {
            0 => String::new(),
            fence => format!("{fence:014x}"),
        };
        let args = (how, fence);
        match self.invoke(release, &record, req, &args).await {
            Err(e) if e.is_unrecoverable_error() => self.run(release, &record, req, &args).await,
            done => done.map_err(EngineError::failed),
        }
    }

    async fn invoke(
        &self,
        script: &Script,
        record: &str,
        req: &Request,
        arg: impl redis::ToRedisArgs,
    ) -> redis::RedisResult<bool> {
        let done: u8 = self.eval(script, record, (req.owner.to_string(), arg)).await?;
        Ok(done == 1)
    }

    /// `EVALSHA` of `script` on the lock's gate, its arguments written
    /// straight into one command buffer (redis-rs's script invocation
    /// copies each into a buffer of its own first); loads the script after
    /// `NOSCRIPT` and sends it once more.
    async fn eval<T: redis::FromRedisValue>(
        &self,
        script: &Script,
        gate: &str,
        args: impl redis::ToRedisArgs,
    ) -> redis::RedisResult<T> {
        // Room for every part at once: a lock's name and ids rarely need more.
        let mut cmd = redis::Cmd::with_capacity(12, 256 + gate.len());
        cmd.arg("EVALSHA")
            .arg(script.get_hash())
            .arg(1)
            .arg(gate)
            .arg(args);
        self.send(script, cmd).await
    }

    /// Sends `cmd`, an `EVALSHA` of `script`, loading the script first if
    /// the server does not have it.
    async fn send<T: redis::FromRedisValue>(
        &self,
        script: &Script,
        cmd: redis::Cmd,
    ) -> redis::RedisResult<T> {
        let mut connection = self.connection.clone();
        match cmd.query_async(&mut connection).await {
            Err(e) if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) => {
                script.load_async(&mut connection).await?;
                cmd.query_async(&mut connection).await
            }
            done => done,
        }
    }
}

fn millis(d: Duration) -> u64 {
    d.as_millis().try_into().unwrap_or(u64::MAX)
}

#[async_trait]
impl Engine for RedisEngine {
    fn kind(&self) -> &'static str {
        self.kind
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
            lease_unit: Duration::from_millis(1),
            waiter_ttl: Some(self.waiter_ttl),
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

    async fn downgrade(&self, req: &Request) -> Result<bool, EngineError> {
        let gate = keys::record(&req.key, false);
        self.run(&self.scripts.downgrade, &gate, req, millis(req.lease))
            .await
    }
}

#[async_trait]
impl Lifecycle for RedisEngine {
    async fn acquire(&self, req: &Request) -> Result<Poll, EngineError> {
        self.attempt(req, None, !req.try_once).await
    }

    async fn poll(&self, req: &Request) -> Result<Poll, EngineError> {
        self.attempt(req, None, true).await
    }

    async fn cancel(&self, req: &Request) -> Result<(), EngineError> {
        self.let_go(req, None, "cancel").await.map(drop)
    }

    async fn renew(&self, req: &Request) -> Result<Renewal, EngineError> {
        let gate = keys::record(&req.key, false);
        let args = (req.owner.to_string(), millis(req.lease));
        let answer: u8 = self
            .eval(&self.scripts.renew, &gate, args)
            .await
            .map_err(EngineError::failed)?;
        Ok(match answer {
            0 => Renewal::Gone,
            1 => Renewal::Held,
            _ => Renewal::Revoked,
        })
    }

    async fn release(&self, req: &Request) -> Result<bool, EngineError> {
        self.let_go(req, None, "release").await
    }

    /// No signal of its own: a failed renewal tells the core.
    fn lost(&self, _req: &Request) -> Option<LostSignal> {
        None
    }

    /// A lock's holder subscribes to the lock's control channel, on which
    /// an operator's revoke or force release is published.
    fn revoked(&self, req: &Request) -> Option<RevokedSignal> {
        let (notifier, channel) = (self.notifier.clone(), keys::control_channel(&req.key));
        Some(Box::pin(async move {
            if let Some(mut heard) = notifier.subscribe(&channel).await {
                // A message, or messages lost, or the subscriber gone: look.
                let _ = heard.recv().await;
                return;
            }
            // No subscriber now: the renewals tell.
            std::future::pending().await
        }))
    }
}

impl Semaphores for RedisEngine {
    fn permits(&self, count: u32) -> Box<dyn Lifecycle + '_> {
        Box::new(Permits { engine: self, count })
    }

    fn slots(&self) -> bool {
        true
    }
}

#[async_trait]
impl Inspect for RedisEngine {
    fn shows_fences(&self) -> bool {
        true
    }

    fn shows_renewals(&self) -> bool {
        true
    }

    async fn inspect(&self, key: &LockKey, permits: Option<u32>) -> Result<LockView, EngineError> {
        let read = self
            .records(&[&keys::record(key, permits.is_some())])
            .await?
            .pop()
            .map(records::Read::Script)
            .ok_or_else(|| EngineError::failed("inspect.lua answered nothing"))?;
        let labels = self
            .labels
            .resolve(&self.connection, records::labels(&read))
            .await?;
        Ok(records::view(key, permits, read, &labels))
    }
}

#[async_trait]
impl List for RedisEngine {
    /// `SCAN` for the group's records (on every primary of a cluster), then
    /// the gates of its locks raw, in batches, and inspect.lua for the
    /// semaphores and the locks whose gate alone does not tell (per lock in
    /// a cluster, whose locks each have a slot of their own), all at once
    /// on the connection; and the labels they name in one `MGET`.
    async fn list(&self, group: &str) -> Result<Vec<LockView>, EngineError> {
        let found = self
            .connection
            .scan(&keys::pattern(group, ":[ws]"))
            .await
            .map_err(EngineError::failed)?;
        let (found, keys): (Vec<String>, Vec<(LockKey, Option<u32>)>) = found
            .into_iter()
            .filter_map(|record| {
                let (name, tail) = keys::name_in(&record, group)?;
                // A semaphore's count is the one stored, whatever is asked.
                let permits = (tail == ":s").then_some(0);
                let key = LockKey::new(group, name.as_str()).ok()?;
                Some((record, (key, permits)))
            })
            .unzip();
        let mut replies: Vec<Option<records::Read>> = vec![None; found.len()];
        let cluster = matches!(self.connection, Connection::Cluster(_));
        if !cluster {
            let locks: Vec<usize> = (0..found.len()).filter(|&i| keys[i].1.is_none()).collect();
            let read = batched(&found, &locks, LIST_BATCH, |gates| async move {
                self.gates(&gates).await
            })
            .await?;
            for (i, read) in locks.iter().zip(read) {
                replies[*i] = read;
            }
        }
        let rest: Vec<usize> = (0..found.len()).filter(|&i| replies[i].is_none()).collect();
        let batch = if cluster { 1 } else { LIST_BATCH };
        let read = batched(&found, &rest, batch, |records| async move {
            self.records(&records).await
        })
        .await?;
        for (i, reply) in rest.iter().zip(read) {
            replies[*i] = Some(records::Read::Script(reply));
        }
        let labels = self
            .labels
            .resolve(
                &self.connection,
                replies.iter().flatten().flat_map(records::labels),
            )
            .await?;
        // A lock with no answer (a reply cut short) is left out, not
        // shown with another's.
        let views = keys.iter().zip(replies);
        Ok(views
            .filter_map(|((key, permits), read)| Some(records::view(key, *permits, read?, &labels)))
            .collect())
    }
}

#[async_trait]
impl Control for RedisEngine {
    async fn forced_out(&self, req: &Request) -> Result<bool, EngineError> {
        // A permit's holder is noted in the lock's hash too (semaphore.lua).
        let gate = keys::record(&req.key, false);
        self.run(&self.scripts.forced, &gate, req, &[] as &[&str]).await
    }

    async fn force_release(&self, key: &LockKey, only: &Only) -> Result<u32, EngineError> {
        self.control(key, "force", only).await
    }

    async fn revoke(&self, key: &LockKey, only: &Only) -> Result<u32, EngineError> {
        self.control(key, "revoke", only).await
    }
}

/// semaphore.lua's "force" and "revoke", on the holds a read of the
/// records admits, or every one.
#[async_trait]
impl PermitControl for RedisEngine {
    async fn force_release_permits(&self, key: &LockKey, _: u32, only: &Only) -> Result<u32, EngineError> {
        self.act_on_permits(key, "force", only).await
    }

    async fn revoke_permits(&self, key: &LockKey, _: u32, only: &Only) -> Result<u32, EngineError> {
        self.act_on_permits(key, "revoke", only).await
    }
}

#[async_trait]
impl HoldAtLeast for RedisEngine {}

impl HeldWrites for RedisEngine {
    fn store(&self) -> &(dyn std::any::Any + Send + Sync) {
        self
    }
}

/// What `read` answers for the keys `found[i]` of each `i` in `which`, in
/// batches of `size`, all sent at once, in their order.
async fn batched<'k, T, F: Future<Output = Result<Vec<T>, EngineError>>>(
    found: &'k [String],
    which: &[usize],
    size: usize,
    read: impl Fn(Vec<&'k str>) -> F,
) -> Result<Vec<T>, EngineError> {
    let calls = which
        .chunks(size)
        .map(|batch| read(batch.iter().map(|&i| found[i].as_str()).collect()));
    Ok(futures_util::future::try_join_all(calls)
        .await?
        .into_iter()
        .flatten()
        .collect())
}
