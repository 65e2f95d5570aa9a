//! RedLock: one lock over N independent Redis masters. Granted
//! when a majority took it (`SET key owner NX PX`) in less time than the
//! lease, undone everywhere otherwise; released on all; extended only while
//! a majority still agrees. Exclusive only, no queue: see [`Guarantees`].
//! Semaphores: a RedLock per slot (`permits.rs`).
//!
//! **Fan-out.** Every call goes to all masters at once and returns as soon
//! as a majority said yes: a slower master's answer cannot change that. Its
//! call finishes on a task of its own, so a release still reaches every
//! master. A later call on the same key waits there for it first: a call
//! slow to start (its master's connection still opening, a busy machine)
//! could otherwise land after the next one, and a grant landing after its
//! own release would keep the lock on that master until the lease ran out.
//! A refusal waits for every answer, to undo where it was granted. (rslock
//! waits for every master each time.)
//!
//! **Validity and clock drift.** Masters may count time up to 1 % faster
//! than the client, plus 2 ms (RedLock's drift). Each master is asked for a
//! PX large enough that, even so, no master forgets the hold before the
//! lease the core counts from the request's start: PX = (lease + 2 ms) /
//! 0.99. The grant needs a majority within the lease; the core then counts
//! the lease from when the request was sent, which is never later than the
//! masters' validity (see `px` and its test).
//!
//! **Fencing from the quorum.** Each master keeps a counter per lock. The
//! acquire script returns, beside the grant, that master's candidate token:
//! its counter + 1, and at least the master's clock in µs. The acquirer takes
//! the maximum over the granting majority and writes it back to a majority,
//! each write checked against "this owner still holds the lock here"; only
//! then is the token handed out (one extra round trip). Why that is sound:
//! any later majority shares a master with this write-back majority, so the
//! next token is greater. A holder stalled between its grant and its
//! write-back cannot finish the write-back on a majority once another holder
//! has one, so it never uses its token. The maximum of the granting majority
//! alone is not enough: the master it shares with the previous holder's
//! majority may not have seen that holder's token. All of this holds
//! **while masters keep their writes**. A master restarted empty, or
//! failed over to a replica that missed writes, can let two holders in at
//! once (Kleppmann's critique, "How to do distributed locking", 2016;
//! antirez's reply, "Is Redlock safe?", same year, asks for delayed
//! restarts). The clock floor then still makes the newer holder's token
//! larger, so storage that checks tokens refuses the older one
//! (`tests/redlock.rs` shows it). Counters expire after `fence_retention`
//! (a grant renews them, renewals do not), and then tokens come from the
//! clock of whichever masters grant next: so this also assumes the masters'
//! clocks agree, and never step back, within `fence_retention`. Hence the
//! fence is best effort. With `fence = false` there is
//! no counter and no write-back, and tokens only tell holds apart.
//!
//! ```toml
//! [engines.rl]
//! kind = "redlock"
//! masters = ["redis://10.0.0.1:6379", "redis://10.0.0.2:6379", "redis://10.0.0.3:6379"]
//! fence = true                 # false: cheaper, no ordered tokens
//! master_timeout = "50ms"      # a master slower than this counts as a no
//! connect_timeout = "5s"
//! fence_retention = "1m"
//! ```

mod config;
mod permits;
mod records;

use std::collections::HashMap;
use std::future::{Future, poll_fn};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::Poll as TaskPoll;
use std::time::{Duration, SystemTime};

use dlock_core::kit::{
    Control, Engine, EngineError, Facets, Fencing, Guarantees, HoldAtLeast, Inspect, Lifecycle, List,
    LostSignal, PermitControl, Poll, Renewal, Request, Semaphores, async_trait,
};
use dlock_core::{BoxError, LockKey, LockView, Only};
use futures_util::FutureExt;
use futures_util::future::{BoxFuture, Shared};
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{Client, Script};
use tokio::sync::OnceCell;
use tokio::time::Instant;

use crate::redis::keys;
use permits::Permits;

pub use config::{RedLockConfig, register};

struct Master {
    address: String,
    client: Client,
    /// Made on first use; a master down at startup is tried again later.
    connection: OnceCell<ConnectionManager>,
    /// By key, the last call still running here after its fan-out
    /// returned: the next call on the key waits for it (module docs).
    behind: Mutex<HashMap<String, Behind>>,
}

/// A call left running on a master, as something later calls can await.
type Behind = Shared<BoxFuture<'static, ()>>;

struct Scripts {
    acquire: Arc<Script>,
    fence: Arc<Script>,
    renew: Arc<Script>,
    /// Forces a hold out, or asks its owner to let go.
    control: Arc<Script>,
    /// Whether a holder found gone was forced out.
    forced: Arc<Script>,
    release: Arc<Script>,
    permits: Arc<Script>,
    records: Arc<Script>,
}

/// The RedLock engine. See the [module docs](self).
///
/// Built from config (`kind` in `[engines.<name>]`), or by hand:
///
/// ```no_run
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), dlock::Error> {
/// use std::sync::Arc;
/// use dlock::engines::redlock::{RedLockConfig, RedLockEngine};
///
/// let masters = ["redis://10.0.0.1:6379", "redis://10.0.0.2:6379", "redis://10.0.0.3:6379"];
/// let config = RedLockConfig::new(masters.map(String::from).to_vec());
/// let engine = RedLockEngine::connect("main", &config).await?;
/// dlock::install(dlock::Registry::with_engine("main", Arc::new(engine), Default::default())?)?;
/// # Ok(())
/// # }
/// ```
pub struct RedLockEngine {
    masters: Vec<Arc<Master>>,
    quorum: usize,
    fence: bool,
    master_timeout: Duration,
    fence_retention: Duration,
    scripts: Scripts,
    address: String,
    /// Every hold's label.
    label: String,
}

/// What one master said; `Err` for an error or no answer in time.
type Answer = Result<i64, BoxError>;

impl RedLockEngine {
    /// Sends `call` to every master at once. Returns once a majority said
    /// yes, or all answered: a slow master's answer cannot change a yes
    /// already settled, so its call finishes in the background (its slot
    /// says so).
    async fn on_all(&self, call: Call<'_>, keys: &[&str], args: &[&str]) -> Vec<Answer> {
        let (keys, args): (Arc<[String]>, Arc<[String]>) = (
            keys.iter().map(|k| k.to_string()).collect(),
            args.iter().map(|a| a.to_string()).collect(),
        );
        let calls = self
            .masters
            .iter()
            .map(|master| master.call(call, keys.clone(), args.clone(), self.master_timeout));
        let (answers, rest) = until_majority(calls, self.quorum).await;
        for (i, call) in rest {
            self.masters[i].leave(&keys[0], call);
        }
        answers
    }

    /// Whether a majority said yes (a non-zero answer).
    fn majority(&self, answers: &[Answer]) -> bool {
        answers.iter().filter(|a| matches!(a, Ok(n) if *n > 0)).count() >= self.quorum
    }

    /// True if a majority said yes; an engine error if too few answered to
    /// know (a failure, not a loss); false if a majority said no.
    fn agreed(&self, answers: Vec<Answer>) -> Result<bool, EngineError> {
        if self.majority(&answers) {
            return Ok(true);
        }
        match self.unreachable(answers) {
            Some(error) => Err(error),
            None => Ok(false),
        }
    }

    /// An operator's act, `how`, on the holds that `only` admits of the
    /// lock `key`, or with `permits` of the semaphore's slots: on every
    /// master's copy of each, or, for holds `only` names, on each copy
    /// still that owner's, as a read of the majority found them. How many
    /// holds a master had, as a majority's answers tell.
    async fn control(
        &self,
        key: &LockKey,
        permits: Option<u32>,
        how: &str,
        only: &Only,
    ) -> Result<u32, EngineError> {
        let target = |slot: u32| match permits {
            Some(_) => permits::Keys::of(key).slot(slot),
            None => keys::prefix(key),
        };
        let aimed: Vec<(String, String)> = if only.is_any() {
            (0..permits.unwrap_or(1))
                .map(|slot| (target(slot), String::new()))
                .collect()
        } else {
            let replies = self.replies(key, permits).await?;
            let admitted = records::admitted(&replies, self.quorum, permits, only).into_iter();
            admitted
                .map(|(slot, owner)| (target(slot), owner.to_owned()))
                .collect()
        };
        let mut reached = 0;
        for (key, owner) in aimed {
            let answers = self
                .on_all(Call::Script(&self.scripts.control), &[&key], &[how, &owner])
                .await;
            // A copy on a minority is no hold: a release that a majority
            // answered may still be on its way to the last master.
            let held = self.majority(&answers);
            if let Some(error) = self.unreachable(answers) {
                return Err(error);
            }
            reached += u32::from(held);
        }
        Ok(reached)
    }

    /// An error when too few masters answered at all for any majority.
    fn unreachable(&self, answers: Vec<Answer>) -> Option<EngineError> {
        let failed: Vec<String> = answers
            .into_iter()
            .zip(&self.masters)
            .filter_map(|(a, m)| a.err().map(|e| format!("{}: {e}", m.address)))
            .collect();
        (self.masters.len() - failed.len() < self.quorum).then(|| {
            EngineError::failed(format!(
                "{} of {} masters failed, a majority is {}: {}",
                failed.len(),
                self.masters.len(),
                self.quorum,
                failed.join("; ")
            ))
        })
    }

    /// What a hold's record says after its owner and token: when it was
    /// asked for, in ms on this client's clock (the masters' differ), and
    /// the label.
    fn record_tail(&self) -> String {
        let now = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap_or_default();
        format!("{:x} {}", now.as_millis(), self.label)
    }

    async fn attempt(&self, req: &Request) -> Result<Poll, EngineError> {
        let started = Instant::now();
        let (key, owner) = (keys::prefix(&req.key), req.owner.to_string());
        let px = px(req.lease).as_millis().to_string();
        let answers = if self.fence {
            let retention = self.fence_retention.as_millis().to_string();
            let counter = format!("{key}:f");
            self.on_all(
                Call::Script(&self.scripts.acquire),
                &[&key, &counter],
                &[&owner, &px, &retention, &self.record_tail()],
            )
            .await
        } else {
            // Token 0 in the record: no token to show.
            let record = format!("{owner} 0 {}", self.record_tail());
            self.on_all(Call::SetNx, &[&key], &[&record, &px]).await
        };
        if self.majority(&answers) && started.elapsed() < req.lease {
            let Some(token) = self.token(req, &key, &format!("{key}:f"), &answers).await? else {
                return self.undo(req, &key, answers).await;
            };
            if started.elapsed() < req.lease {
                return Ok(Poll::Held(token));
            }
        }
        self.undo(req, &key, answers).await
    }

    /// The token of a grant. Without the fence, one that only tells holds
    /// apart. With it: each granting master has already moved its counter
    /// to its candidate; if they all agree (counters in step, the usual
    /// case), that token is on a majority already. If not, the greatest is
    /// written back to a majority, checked against ownership. `None` if the
    /// write-back found no majority. `key` is what the owner holds,
    /// `counter` the fence counter beside it.
    async fn token(
        &self,
        req: &Request,
        key: &str,
        counter: &str,
        answers: &[Answer],
    ) -> Result<Option<u64>, EngineError> {
        if !self.fence {
            return Ok(Some(req.owner.as_u128() as u64));
        }
        let granted: Vec<u64> = answers
            .iter()
            .filter_map(|a| a.as_ref().ok())
            .filter(|&&t| t > 0)
            .map(|&t| t as u64)
            .collect();
        let token = granted.iter().copied().max().unwrap_or(0);
        if granted.iter().all(|&t| t == token) {
            return Ok(Some(token));
        }
        let owner = req.owner.to_string();
        let retention = self.fence_retention.as_millis().to_string();
        let written = self
            .on_all(
                Call::Script(&self.scripts.fence),
                &[key, counter],
                &[&owner, &token.to_string(), &retention],
            )
            .await;
        Ok(self.majority(&written).then_some(token))
    }

    /// Lets go everywhere after a refused attempt; an engine error if too
    /// few masters answered for any majority, else waiting (no queue and
    /// no notification: the core's polling retries).
    async fn undo(&self, req: &Request, key: &str, answers: Vec<Answer>) -> Result<Poll, EngineError> {
        let owner = req.owner.to_string();
        self.on_all(Call::Script(&self.scripts.release), &[key], &[&owner])
            .await;
        match self.unreachable(answers) {
            Some(error) => Err(error),
            None => Ok(Poll::Waiting(Box::pin(std::future::pending()))),
        }
    }
}

/// One request to every master.
#[derive(Clone, Copy)]
enum Call<'a> {
    Script(&'a Arc<Script>),
    /// `SET key owner NX PX px`, as plain RedLock sends it: 1 if taken.
    SetNx,
}

impl Master {
    /// The records script on this master (see `records.rs`); `None` if it
    /// failed or did not answer in time.
    async fn records(&self, script: &Script, key: &str, stem: &str, timeout: Duration) -> records::Reply {
        let mut connection = self.connection(timeout).await.ok()?.clone();
        let mut invocation = script.key(key);
        invocation.arg(stem);
        tokio::time::timeout(timeout, invocation.invoke_async(&mut connection))
            .await
            .ok()?
            .ok()
    }

    async fn connection(&self, timeout: Duration) -> Result<&ConnectionManager, BoxError> {
        self.connection
            .get_or_try_init(|| async {
                let config = ConnectionManagerConfig::new()
                    .set_connection_timeout(Some(timeout))
                    .set_response_timeout(Some(timeout))
                    .set_number_of_retries(1);
                ConnectionManager::new_with_config(self.client.clone(), config).await
            })
            .await
            .map_err(BoxError::from)
    }

    /// `call` on this master, owning all it needs, so that it can finish
    /// in the background. Its connection bounds it by the master timeout;
    /// it waits that long at most for an earlier call on its key.
    fn call(
        self: &Arc<Self>,
        call: Call<'_>,
        keys: Arc<[String]>,
        args: Arc<[String]>,
        timeout: Duration,
    ) -> impl Future<Output = Answer> + Send + 'static {
        let (master, script) = (self.clone(), call.script());
        let earlier = self.behind_on(&keys[0]);
        async move {
            if let Some(earlier) = earlier {
                let _ = tokio::time::timeout(timeout, earlier).await;
            }
            let mut connection = master.connection(timeout).await?.clone();
            let answer = match script {
                Some(script) => {
                    let mut invocation = script.prepare_invoke();
                    for key in keys.iter() {
                        invocation.key(key);
                    }
                    for arg in args.iter() {
                        invocation.arg(arg);
                    }
                    invocation.invoke_async::<i64>(&mut connection).await
                }
                None => redis::cmd("SET")
                    .arg(&keys[0])
                    .arg(&args[0])
                    .arg("NX")
                    .arg("PX")
                    .arg(&args[1])
                    .query_async::<Option<String>>(&mut connection)
                    .await
                    .map(|set| i64::from(set.is_some())),
            };
            answer.map_err(BoxError::from)
        }
    }

    /// The call on `key` still running here, if any.
    fn behind_on(&self, key: &str) -> Option<Behind> {
        let behind = self.behind.lock().unwrap_or_else(|e| e.into_inner());
        match behind.is_empty() {
            true => None,
            false => behind.get(key).cloned(),
        }
    }

    /// Finishes `call` on `key` in the background, as the one later calls
    /// on the key wait for until it ends.
    fn leave(self: &Arc<Self>, key: &str, call: Pin<Box<impl Future<Output = Answer> + Send + 'static>>) {
        let done: Behind = call.map(drop).boxed().shared();
        let mut behind = self.behind.lock().unwrap_or_else(|e| e.into_inner());
        behind.insert(key.to_owned(), done.clone());
        drop(behind);
        let (master, key) = (self.clone(), key.to_owned());
        tokio::spawn(async move {
            done.clone().await;
            let mut behind = master.behind.lock().unwrap_or_else(|e| e.into_inner());
            if behind.get(&key).is_some_and(|last| last.ptr_eq(&done)) {
                behind.remove(&key);
            }
        });
    }
}

impl Call<'_> {
    fn script(self) -> Option<Arc<Script>> {
        match self {
            Call::Script(script) => Some(script.clone()),
            Call::SetNx => None,
        }
    }
}

/// What each master is asked to keep the hold for, so that even a master
/// whose clock runs fast by RedLock's drift (1 % + 2 ms) keeps it for the
/// whole lease: PX − drift(PX) ≥ lease.
fn px(lease: Duration) -> Duration {
    Duration::from_secs_f64((lease + Duration::from_millis(2)).as_secs_f64() / 0.99).max(lease)
        + Duration::from_millis(1)
}

/// Polls the calls in place (a fan-out without a task each) until
/// `quorum` of them said yes or all are done. Returns the answers, the
/// slots not awaited marked so, and those calls by slot, still running.
async fn until_majority<F>(
    calls: impl IntoIterator<Item = F>,
    quorum: usize,
) -> (Vec<Answer>, Vec<(usize, Pin<Box<F>>)>)
where
    F: Future<Output = Answer> + Send + 'static,
{
    let mut pending: Vec<Option<Pin<Box<F>>>> = calls.into_iter().map(|f| Some(Box::pin(f))).collect();
    let mut done: Vec<Option<Answer>> = pending.iter().map(|_| None).collect();
    poll_fn(|cx| {
        for (slot, out) in pending.iter_mut().zip(done.iter_mut()) {
            if let Some(future) = slot
                && let TaskPoll::Ready(value) = future.as_mut().poll(cx)
            {
                *out = Some(value);
                *slot = None;
            }
        }
        let yes = done.iter().filter(|d| matches!(d, Some(Ok(n)) if *n > 0)).count();
        if yes >= quorum || pending.iter().all(Option::is_none) {
            TaskPoll::Ready(())
        } else {
            TaskPoll::Pending
        }
    })
    .await;
    let rest = pending
        .into_iter()
        .enumerate()
        .filter_map(|(i, call)| Some((i, call?)))
        .collect();
    let answers = done
        .into_iter()
        .map(|d| d.unwrap_or_else(|| Err("not awaited: a majority had already said yes".into())))
        .collect();
    (answers, rest)
}

#[async_trait]
impl Engine for RedLockEngine {
    fn kind(&self) -> &'static str {
        "redlock"
    }

    fn address(&self) -> String {
        self.address.clone()
    }

    fn guarantees(&self) -> Guarantees {
        Guarantees {
            fencing: if self.fence {
                Fencing::BestEffort
            } else {
                Fencing::None
            },
            lease_unit: Duration::from_millis(1),
            ..Guarantees::default()
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
            ..Facets::default()
        }
    }

    async fn downgrade(&self, _req: &Request) -> Result<bool, EngineError> {
        unreachable!("the core never downgrades on an engine without read mode")
    }
}

#[async_trait]
impl Lifecycle for RedLockEngine {
    async fn acquire(&self, req: &Request) -> Result<Poll, EngineError> {
        self.poll(req).await
    }

    async fn poll(&self, req: &Request) -> Result<Poll, EngineError> {
        self.attempt(req).await
    }

    async fn cancel(&self, req: &Request) -> Result<(), EngineError> {
        let (key, owner) = (keys::prefix(&req.key), req.owner.to_string());
        self.on_all(Call::Script(&self.scripts.release), &[&key], &[&owner])
            .await;
        Ok(())
    }

    async fn renew(&self, req: &Request) -> Result<Renewal, EngineError> {
        let (key, owner) = (keys::prefix(&req.key), req.owner.to_string());
        let px = px(req.lease).as_millis().to_string();
        let answers = self
            .on_all(Call::Script(&self.scripts.renew), &[&key], &[&owner, &px])
            .await;
        let asked = answers.iter().any(|a| matches!(a, Ok(2)));
        Ok(match self.agreed(answers)? {
            true if asked => Renewal::Revoked,
            held => Renewal::from(held),
        })
    }

    async fn release(&self, req: &Request) -> Result<bool, EngineError> {
        let (key, owner) = (keys::prefix(&req.key), req.owner.to_string());
        let answers = self
            .on_all(Call::Script(&self.scripts.release), &[&key], &[&owner])
            .await;
        self.agreed(answers)
    }

    /// No signal of its own: a failed renewal tells the core.
    fn lost(&self, _req: &Request) -> Option<LostSignal> {
        None
    }
}

impl Semaphores for RedLockEngine {
    fn permits(&self, count: u32) -> Box<dyn Lifecycle + '_> {
        Box::new(Permits { engine: self, count })
    }

    fn slots(&self) -> bool {
        true
    }
}

#[async_trait]
impl Inspect for RedLockEngine {
    fn shows_fences(&self) -> bool {
        true
    }

    /// Every master's copies at once; a hold shows where a majority agree.
    async fn inspect(&self, key: &LockKey, permits: Option<u32>) -> Result<LockView, EngineError> {
        let read_at = SystemTime::now();
        let replies = self.replies(key, permits).await?;
        Ok(records::view(key, permits, &replies, self.quorum, read_at))
    }
}

impl RedLockEngine {
    /// Every master's copies of the lock `key`, or with `permits` of the
    /// semaphore, read at once; an error if fewer than a majority answer.
    async fn replies(&self, key: &LockKey, permits: Option<u32>) -> Result<Vec<records::Reply>, EngineError> {
        let (record, stem) = match permits {
            Some(_) => {
                let keys = permits::Keys::of(key);
                (keys.count, keys.stem)
            }
            None => (keys::prefix(key), String::new()),
        };
        let replies = futures_util::future::join_all(
            self.masters
                .iter()
                .map(|m| m.records(&self.scripts.records, &record, &stem, self.master_timeout)),
        )
        .await;
        if replies.iter().flatten().count() < self.quorum {
            return Err(EngineError::failed(format!(
                "fewer than a majority ({}) of the masters answered",
                self.quorum
            )));
        }
        Ok(replies)
    }
}

#[async_trait]
impl List for RedLockEngine {
    /// `SCAN` on every master for the group's locks and semaphores, then
    /// each one found inspected.
    async fn list(&self, group: &str) -> Result<Vec<LockView>, EngineError> {
        let mut found = std::collections::BTreeSet::new();
        for master in &self.masters {
            let Ok(connection) = master.connection(self.master_timeout).await else {
                continue;
            };
            for (tail, semaphore) in [("", false), (":s:n", true)] {
                let pattern = keys::pattern(group, tail);
                let keys = crate::redis::connection::scan_with(&pattern, |cmd| {
                    let mut connection = connection.clone();
                    async move { cmd.query_async(&mut connection).await }
                })
                .await
                .map_err(EngineError::failed)?;
                found.extend(
                    keys.iter()
                        .filter_map(|k| keys::name_in(k, group))
                        .filter(|(_, rest)| *rest == tail)
                        .map(|(name, _)| (name, semaphore)),
                );
            }
        }
        let keys: Vec<(LockKey, bool)> = found
            .into_iter()
            .filter_map(|(name, semaphore)| Some((LockKey::new(group, name.as_str()).ok()?, semaphore)))
            .collect();
        // All at once, as on Redis: one round trip per lock would be slow for many.
        let views = keys
            .iter()
            .map(|(key, semaphore)| self.inspect(key, semaphore.then_some(0)));
        futures_util::future::try_join_all(views).await
    }
}

#[async_trait]
impl Control for RedLockEngine {
    /// Any master that noted it: the note is written only by force, beside
    /// the lock's key, or a permit's (the only hold with a slot) slot key.
    async fn forced_out(&self, req: &Request) -> Result<bool, EngineError> {
        let key = match req.slot {
            Some(slot) => permits::Keys::of(&req.key).slot(slot),
            None => keys::prefix(&req.key),
        };
        let owner = req.owner.to_string();
        let answers = self
            .on_all(Call::Script(&self.scripts.forced), &[&key], &[&owner])
            .await;
        Ok(answers.iter().any(|a| matches!(a, Ok(1))))
    }

    async fn force_release(&self, key: &LockKey, only: &Only) -> Result<u32, EngineError> {
        self.control(key, None, "force", only).await
    }

    async fn revoke(&self, key: &LockKey, only: &Only) -> Result<u32, EngineError> {
        self.control(key, None, "revoke", only).await
    }
}

/// A permit is its slot's key on each master, held as a lock's key is:
/// control.lua reaches it the same way.
#[async_trait]
impl PermitControl for RedLockEngine {
    async fn force_release_permits(
        &self,
        key: &LockKey,
        count: u32,
        only: &Only,
    ) -> Result<u32, EngineError> {
        self.control(key, Some(count), "force", only).await
    }

    async fn revoke_permits(&self, key: &LockKey, count: u32, only: &Only) -> Result<u32, EngineError> {
        self.control(key, Some(count), "revoke", only).await
    }
}

#[async_trait]
impl HoldAtLeast for RedLockEngine {}

#[cfg(test)]
mod tests {
    use super::*;

    /// What the fan-out leaves running on a master is what the next call
    /// on that key waits for, and only that key; once it ends, nothing is.
    #[tokio::test]
    async fn a_call_left_running_holds_back_the_next_on_its_key_until_it_ends() {
        let master = Arc::new(Master {
            address: "127.0.0.1:1".into(),
            client: Client::open("redis://127.0.0.1:1").expect("url"),
            connection: OnceCell::new(),
            behind: Default::default(),
        });
        let (answer, answered) = tokio::sync::oneshot::channel::<()>();
        let slow = async move {
            let _ = answered.await;
            Ok(1)
        };
        let granted = || async { Ok(1) };
        let calls: [Pin<Box<dyn Future<Output = Answer> + Send>>; 3] =
            [Box::pin(granted()), Box::pin(granted()), Box::pin(slow)];
        let (answers, rest) = until_majority(calls, 2).await;
        assert!(matches!(answers.as_slice(), [Ok(1), Ok(1), Err(_)]));
        let [(2, call)] = <[_; 1]>::try_from(rest).ok().expect("the third left running") else {
            panic!("the wrong slot left running");
        };
        master.leave("k", call);
        assert!(master.behind_on("other").is_none());
        let next = master.behind_on("k").expect("the next call on k waits");
        assert!(
            next.clone().now_or_never().is_none(),
            "waits no longer than the call runs"
        );
        answer.send(()).expect("send");
        next.await;
        for _ in 0..100 {
            if master.behind_on("k").is_none() {
                return;
            }
            tokio::task::yield_now().await;
        }
        panic!("an ended call is still waited for");
    }

    /// The drift rule: a master counting 1 % fast, plus 2 ms, still keeps
    /// the hold for the whole lease the core counts.
    #[test]
    fn a_fast_master_clock_keeps_the_hold_for_the_whole_lease() {
        for ms in [30, 100, 1_000, 30_000, 600_000] {
            let lease = Duration::from_millis(ms);
            let px = px(lease);
            let drift = px.mul_f64(0.01) + Duration::from_millis(2);
            assert!(px - drift >= lease, "lease {lease:?}: px {px:?}, drift {drift:?}");
            assert!(
                px < lease.mul_f64(1.02) + Duration::from_millis(4),
                "px {px:?} needlessly long"
            );
        }
    }
}
