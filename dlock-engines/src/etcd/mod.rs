//! The etcd engine, in the layout of etcd's own lock (`concurrency.Mutex`,
//! used by `etcdctl lock` and the server's Lock RPC), so that they and
//! dlock exclude each other, with readers added (see `queue.rs`).
//!
//! A lock `group`/`name` is the prefix `<root>/<group>/<name>/` (each part
//! escaped as on ZooKeeper, [`dlock_core::LockKey::path`]). Each acquisition puts one
//! key under it on the engine's lease, and reads the contenders ahead in the
//! same transaction. The key's create revision is the request's place in
//! line. A writer holds when no key is ahead; a reader when no writer is
//! ahead. Otherwise it watches the one key ahead that matters (a writer the
//! one just ahead, a reader the last writer ahead, so a release wakes the
//! next writer or the run of readers behind it, never the whole line) and
//! its own key (`waiting.rs`). Whenever a waiter looks again, one
//! transaction checks that its own key still exists with the same create
//! revision and reads those ahead: a waiter whose lease expired or was
//! revoked while it waited is never granted (etcd issues 11456 and 16221),
//! it queues again on a new lease. A holder that knows who is right behind
//! it hands the lock over in its release (`handoff.rs`). A downgrade
//! rewrites the key's value to the reader mark; the key keeps its place,
//! and the readers watching it wake.
//!
//! **Records** (`records.rs`): a key's value also carries its owner id,
//! the client's clock when the request first queued, and the process's
//! label (`client_name`); `inspect` reads a lock's prefix in one range,
//! `list` the group's.
//!
//! **Force release and revoke** (`control.rs`): one read of the lock's
//! prefix finds its holders; force release deletes their keys, revoke
//! adds a line to their values, in one transaction each. A renewal reads
//! its key's value, so it sees the mark in the read it made anyway; a
//! hold whose key is gone while its session's lease lives was forced out
//! (one lease read, asked only then).
//!
//! A semaphore is a prefix beside the lock's, in the same shape, the first
//! N keys holding (`queue.rs`); each holder takes one of N slot keys
//! beside it (`slots.rs`).
//!
//! **Elections** take the lock's prefix in the layout of
//! `concurrency.Election` (`etcdctl elect`): a campaign's key holds the
//! proposal alone (the campaign's value, else the process's label), so `etcdctl elect -l` prints it and
//! records show an `etcdctl elect` candidate's proposal as its label. Such
//! a key is a writer to dlock and gets no handoff; it keeps no owner id or
//! since, which records then leave out.
//!
//! **Fencing token**: the key's create revision. Conflicting holders hold in
//! create-revision order, and etcd's revision only grows, across members,
//! leader changes and restarts, so the token strictly increases per lock.
//!
//! **Liveness** comes from the session's lease, not a per-hold lease: every
//! key lives as long as the engine's lease, kept alive every third of its
//! TTL. When the lease is gone, or no keep-alive succeeded for half the TTL
//! (before the server can expire it, see `session.rs`), every hold on it
//! fires lost and waiters queue again on a new lease. A killed process's
//! locks are free within the TTL.
//!
//! **Held writes** (`held.rs`, [`HeldTxn`]): the user's transaction nested
//! in one that compares the hold's key with its create revision.
//!
//! Config:
//!
//! ```toml
//! [engines.etcd]
//! kind = "etcd"
//! endpoints = ["10.0.0.1:2379", "10.0.0.2:2379", "10.0.0.3:2379"]
//! root = "/locks"
//! session_ttl = "10s"        # the lease; whole seconds
//! connect_timeout = "5s"
//! # client_name = "billing"  # the label records show; default <host>:<pid>
//! # username = "dlock"       # etcd authentication (both or neither; `user` works too)
//! # password = "secret"
//! # endpoints = ["https://10.0.0.1:2379"]   # TLS, with feature `etcd-tls`
//! # tls_ca_file = "ca.pem"    # a private CA; default: the system trust store
//! # tls_cert_file = "client.pem"   # a client certificate, for --client-cert-auth
//! # tls_key_file = "client.key"
//! ```
//!
//! Building this engine needs `protoc` and its well-known types (Debian
//! `protobuf-compiler` and `libprotobuf-dev`).

mod config;
mod control;
mod handoff;
mod held;
mod queue;
mod records;
/// The client crate, for tests and benchmarks that talk to etcd directly.
pub use etcd_client;
mod key_numbers;
mod session;
mod slots;
mod tls;
mod waiting;
mod watches;

use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, SystemTime};

use dlock_core::kit::session::Sessions;
use dlock_core::kit::{
    Changed, Control, ElectionValues, Engine, EngineError, Expiry, Facets, Fairness, Fencing, Guarantees,
    HeldWrites, HoldAtLeast, Inspect, Lifecycle, List, LostSignal, PermitControl, Poll, Renewal, Request,
    RequestState, RevokedSignal, Semaphores, Watch, async_trait,
};
use dlock_core::{LockKey, LockView, Mode, Only};
use etcd_client::{
    Client, Compare, CompareOp, GetOptions, KeyValue, PutOptions, SortOrder, SortTarget, Txn, TxnOp,
    TxnOpResponse, TxnResponse,
};

use handoff::Successor;
use queue::{Contender, PAGE, Turn};

/// How long a waiter trusts its watches before it looks again anyway.
const WATCH_TRUSTED: Duration = Duration::from_secs(2);

/// Contenders behind a holder read with each look, for a handoff.
const BEHIND: i64 = 16;
use key_numbers::{KeyNumber, KeyNumbers};
use session::Session;
use waiting::{Ahead, Signal, Watched, Watching};
use watches::Watches;

pub use config::{EtcdConfig, register};
pub use held::HeldTxn;

/// A request's state over its whole life.
struct Requested {
    /// The client's clock when it first queued, in ms since the epoch (etcd
    /// keeps no time). Its keys' values carry it unchanged, so that a put
    /// repeated finds its own key by the value.
    since: u64,
    /// Its key: none before it is put or once it is deleted.
    key: RequestState<Contending>,
    /// The session its last key was put on, for [`Control::forced_out`]
    /// once the key is gone.
    put_on: Mutex<Weak<Session>>,
}

/// This request's key, taken from it to let go of; `None` if it has none
/// or its session has ended (the key went with it).
fn letting_go(req: &Request) -> Option<Contending> {
    let contending = requested(req).key.lock().take()?;
    (!contending.session.is_ended()).then_some(contending)
}

fn requested(req: &Request) -> &Requested {
    req.state_or_init(|| Requested {
        since: SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64),
        key: RequestState::default(),
        put_on: Mutex::default(),
    })
}

/// One request's key and place in line.
struct Contending {
    key: String,
    /// The number in the key's name, this request's until the key is gone.
    taken: KeyNumber,
    /// The key's create revision: its place, and the fencing token.
    created: i64,
    session: Arc<Session>,
    /// While waiting: the watches on the key ahead and on this one.
    watch: Option<Watching>,
    /// Held with nothing ahead, so it may hand over on release.
    first: bool,
    /// Who was right behind it when it was granted, oldest first.
    successors: Vec<Successor>,
    /// A permit's slot, once granted (`slots.rs`).
    slot: Option<u32>,
}

/// A page of contenders read from the server.
struct Page {
    /// The contenders ahead, latest first.
    ahead: Vec<KeyValue>,
    more: bool,
    /// The contenders right behind, oldest first (a look reads them, for a
    /// handoff once held).
    behind: Vec<KeyValue>,
    /// The revision the page was read at.
    revision: i64,
    /// A permit's slot, put in the transaction that read the page
    /// (`slots.rs`).
    slot: Option<u32>,
}

/// The etcd engine. See the [module docs](self).
///
/// Built from config (`kind` in `[engines.<name>]`), or by hand:
///
/// ```no_run
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), dlock::Error> {
/// use std::sync::Arc;
/// use dlock::engines::etcd::{EtcdConfig, EtcdEngine};
///
/// let config = EtcdConfig::new(&["10.0.0.1:2379".to_owned(), "10.0.0.2:2379".to_owned()]);
/// let engine = EtcdEngine::connect("main", &config).await?;
/// dlock::install(dlock::Registry::with_engine("main", Arc::new(engine), Default::default())?)?;
/// # Ok(())
/// # }
/// ```
pub struct EtcdEngine {
    client: Client,
    sessions: Sessions<Session>,
    ttl: Duration,
    root: String,
    watches: Arc<Watches>,
    key_numbers: KeyNumbers,
    address: String,
    /// The label this engine's keys carry (`client_name`).
    label: String,
}

impl EtcdEngine {
    /// The lease every key of this engine lives on now.
    pub fn lease(&self) -> i64 {
        self.sessions.current().lease
    }

    async fn live(&self) -> Result<Arc<Session>, EngineError> {
        self.sessions.live(|| Session::open(&self.client, self.ttl)).await
    }

    /// This request's lock's or semaphore's prefix.
    fn prefix(&self, req: &Request, permits: Option<u32>) -> String {
        self.prefix_of(&req.key, permits)
    }

    /// Where a semaphore's slot keys live (`slots.rs`).
    fn slots_prefix(&self, key: &LockKey) -> String {
        slots::prefix(&key.path(&self.root))
    }

    /// A lock's prefix, or a semaphore's beside it (`queue.rs`).
    fn prefix_of(&self, key: &LockKey, permits: Option<u32>) -> String {
        let tail = if permits.is_some() { "%permits/" } else { "/" };
        key.path(&self.root) + tail
    }

    /// The first line of this request's key's value, in `mode`.
    fn value(&self, req: &Request, permits: Option<u32>, mode: Mode) -> Vec<u8> {
        if req.is_campaign() {
            // `concurrency.Election`'s layout: the value is the proposal
            // alone, what `etcdctl elect -l` prints.
            return req.proposal_or(&self.label).as_bytes().to_vec();
        }
        queue::value(mode, permits, req.owner, requested(req).since, &self.label)
    }

    /// Contenders ahead read per look: a page, or one more than a
    /// semaphore's count (to tell next in line from further back).
    fn ahead_read(permits: Option<u32>) -> i64 {
        permits.map_or(PAGE, |count| i64::from(count) + 1)
    }

    /// Puts this request's key and reads those ahead in one transaction,
    /// then settles its turn. Queues on a new lease if the current one has
    /// just gone.
    async fn enqueue(&self, req: &Request, permits: Option<u32>) -> Result<Poll, EngineError> {
        // An earlier attempt that failed after its put left a key in line:
        // keep its place rather than leave it behind as an orphan.
        let live_key = self.contending(req, |c| !c.session.is_ended());
        if live_key.unwrap_or(false) {
            return self.look_again(req, permits).await;
        }
        let prefix = self.prefix(req, permits);
        let mut session = self.live().await?;
        let mut fresh = false;
        let taken = self.key_numbers.take(&prefix);
        loop {
            let key = queue::contender_key(&prefix, session.lease, taken.number);
            match self.put(&session, &prefix, &key, req, permits).await {
                Ok((created, page)) => {
                    let requested = requested(req);
                    *requested.put_on.lock().unwrap_or_else(|e| e.into_inner()) = Arc::downgrade(&session);
                    *requested.key.lock() = Some(Contending {
                        key,
                        taken,
                        created,
                        session: session.clone(),
                        watch: None,
                        first: false,
                        successors: Vec::new(),
                        // Not yet its own: see `slots.rs`.
                        slot: page.as_ref().and_then(|page| page.slot),
                    });
                    let page = match page {
                        Some(page) => page,
                        None => self.look(req, permits, created - 1).await?.ok_or_else(vanished)?,
                    };
                    return self.settle(req, permits, page).await?.ok_or_else(vanished);
                }
                Err(_) if session.is_ended() && !fresh => {
                    fresh = true;
                    session = self.live().await?;
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// The put-and-read transaction. Repeating it is safe: once the key
    /// exists, it reads the key instead, and a key this request put (its
    /// owner id is in the value) is its own, the page then coming from a
    /// look. A key left by an earlier request whose delete was cut off is
    /// deleted first.
    async fn put(
        &self,
        session: &Session,
        prefix: &str,
        key: &str,
        req: &Request,
        permits: Option<u32>,
    ) -> Result<(i64, Option<Page>), EngineError> {
        // With its own key, which comes first.
        let limit = match (permits, req.mode) {
            (Some(_), _) => Self::ahead_read(permits) + 1,
            (None, Mode::Write) => 2,
            (None, Mode::Read) => PAGE + 1,
        };
        let value = self.value(req, permits, req.mode);
        let mut ops = vec![
            TxnOp::put(
                key,
                value.clone(),
                Some(PutOptions::new().with_lease(session.lease)),
            ),
            TxnOp::get(prefix, Some(latest_first().with_limit(limit))),
        ];
        if permits.is_some() {
            ops.push(slots::first(&self.slots_prefix(&req.key), key, session.lease));
        }
        let txn = Txn::new()
            .when([Compare::create_revision(key, CompareOp::Equal, 0)])
            .and_then(ops)
            .or_else([TxnOp::get(key, None)]);
        for _ in 0..3 {
            let answer = session.txn(txn.clone()).await?;
            let put = answer.succeeded();
            let revision = answer.header().map_or(0, |h| h.revision());
            let slot = (put && slots::put_first(&answer)).then_some(0);
            let Some(mut got) = gets(answer).pop() else {
                return Err(EngineError::failed("etcd answered no read"));
            };
            let mut kvs = got.take_kvs();
            // Just put, the key is the newest under the prefix.
            if kvs.first().is_none_or(|mine| mine.key() != key.as_bytes()) {
                continue; // Gone between the compare and the read: again.
            }
            let mine = kvs.remove(0);
            if put || mine.value() == value {
                let page = put.then(|| Page {
                    ahead: kvs,
                    more: got.more(),
                    behind: Vec::new(),
                    revision,
                    slot,
                });
                return Ok((mine.create_revision(), page));
            }
            let stale = Txn::new()
                .when([Compare::create_revision(
                    key,
                    CompareOp::Equal,
                    mine.create_revision(),
                )])
                .and_then([TxnOp::delete(key, None)]);
            session.txn(stale).await?;
        }
        Err(EngineError::failed(format!(
            "cannot put {key}: it keeps coming back"
        )))
    }

    /// Checks that this request's key still exists as created, and reads up
    /// to a page of the contenders created at or before `below`, latest
    /// first, and those right behind it. `None`: the key is gone.
    async fn look(
        &self,
        req: &Request,
        permits: Option<u32>,
        below: i64,
    ) -> Result<Option<Page>, EngineError> {
        let (session, key, created) =
            self.contending(req, |c| (c.session.clone(), c.key.clone(), c.created))?;
        let prefix = self.prefix(req, permits);
        let behind = GetOptions::new()
            .with_prefix()
            .with_sort(SortTarget::Create, SortOrder::Ascend)
            .with_min_create_revision(created + 1)
            .with_limit(BEHIND);
        let txn = Txn::new()
            .when([Compare::create_revision(key.as_str(), CompareOp::Equal, created)])
            .and_then([
                TxnOp::get(
                    prefix.as_str(),
                    Some(
                        latest_first()
                            .with_max_create_revision(below)
                            .with_limit(Self::ahead_read(permits)),
                    ),
                ),
                TxnOp::get(prefix.as_str(), Some(behind)),
            ]);
        let answer = session.txn(txn).await?;
        if !answer.succeeded() {
            return Ok(None);
        }
        let revision = answer.header().map_or(0, |h| h.revision());
        let [mut ahead, mut behind] = <[_; 2]>::try_from(gets(answer))
            .map_err(|_| EngineError::failed("etcd answered other than two reads"))?;
        Ok(Some(Page {
            ahead: ahead.take_kvs(),
            more: ahead.more(),
            behind: behind.take_kvs(),
            revision,
            slot: None,
        }))
    }

    /// Looks again for a request in line; queues it again if its key is
    /// gone (its lease ran out or was revoked) or its lease may have.
    async fn look_again(&self, req: &Request, permits: Option<u32>) -> Result<Poll, EngineError> {
        let created = self.contending(req, |c| c.created)?;
        let settled = match self.look(req, permits, created - 1).await? {
            Some(page) => self.settle(req, permits, page).await?,
            None => None,
        };
        match settled {
            Some(poll) => Ok(poll),
            None => {
                self.remove(req).await?;
                Box::pin(self.enqueue(req, permits)).await
            }
        }
    }

    /// Whose turn it is, reading on while a reader finds no writer in a
    /// full page; while not ours, watches the key that matters and its own.
    /// `None`: this request's key is gone.
    async fn settle(
        &self,
        req: &Request,
        permits: Option<u32>,
        mut page: Page,
    ) -> Result<Option<Poll>, EngineError> {
        let mut first = true;
        loop {
            let ahead: Vec<Contender> = page.ahead.iter().map(Contender::from).collect();
            first &= ahead.is_empty();
            let turn = match permits {
                Some(count) => {
                    // Checked against the key just ahead, which was
                    // checked against its own when put: all agree.
                    if let Some(in_use) = ahead.first().and_then(|c| c.permits).filter(|&n| n != count) {
                        self.remove(req).await?;
                        return Err(EngineError::PermitsDiffer { in_use });
                    }
                    queue::permit_turn(count, &ahead)
                }
                None => queue::turn(req.mode, &ahead, page.more),
            };
            match turn {
                Turn::Held => {
                    if let Some(count) = permits {
                        let (behind, slot) = (!page.behind.is_empty(), page.slot);
                        return self
                            .hold_permit(req, count, (ahead.len() as u32, behind), slot)
                            .await;
                    }
                    let (ended, created) = self.contending(req, |c| {
                        c.watch = None;
                        c.first = first;
                        c.successors = handoff::successors(&page.behind);
                        (c.session.is_ended(), c.created)
                    })?;
                    // Never grant on a lease that may have run out.
                    return Ok((!ended).then_some(Poll::Held(created as u64)));
                }
                Turn::Watch { .. } | Turn::WatchDeletes => {
                    let ahead = match (turn, permits) {
                        (Turn::Watch { key, created }, permits) => Ahead::Key {
                            watched: Watched { key, created },
                            put: req.mode == Mode::Read || permits.is_some(),
                        },
                        (_, count) => Ahead::Deletes {
                            prefix: self.prefix(req, permits).into_bytes(),
                            count: count.unwrap_or(1),
                        },
                    };
                    let wake = self.contending(req, |c| {
                        let own = Watched {
                            key: c.key.clone().into_bytes(),
                            created: c.created,
                        };
                        let session = c.session.clone();
                        let watching =
                            Watching::start(self.watches.clone(), session, own, ahead, page.revision);
                        let wake = watching.wake(c.created as u64, req.lease);
                        c.watch = Some(watching);
                        wake
                    })?;
                    return Ok(Some(Poll::Waiting(wake)));
                }
                Turn::ReadOn(below) => match self.look(req, permits, below).await? {
                    Some(next) => page = next,
                    None => return Ok(None),
                },
            }
        }
    }

    /// A permit's turn, with `ahead` holders before it: tells those
    /// `behind` it is admitted, then keeps the slot `put` with the read
    /// that admitted it, or claims one, trying first the slot it put as it
    /// queued, else the count of holders ahead, most often free. `None`:
    /// its key is gone.
    async fn hold_permit(
        &self,
        req: &Request,
        count: u32,
        (ahead, behind): (u32, bool),
        put: Option<u32>,
    ) -> Result<Option<Poll>, EngineError> {
        self.contending(req, |c| c.watch = None)?;
        if behind {
            self.admitted(req, Some(count)).await?;
        }
        let (session, key, created, queued) =
            self.contending(req, |c| (c.session.clone(), c.key.clone(), c.created, c.slot))?;
        let (slots, line) = (self.slots_prefix(&req.key), self.prefix(req, Some(count)));
        let slot = match put {
            Some(slot) => slot,
            None => {
                match slots::claim(&session, &slots, &line, (&key, created), count, (queued, ahead)).await? {
                    Some(slot) => slot,
                    None => return Ok(None),
                }
            }
        };
        self.contending(req, |c| c.slot = Some(slot))?;
        // Never grant on a lease that may have run out.
        Ok((!session.is_ended()).then_some(Poll::Held(created as u64)))
    }

    /// Tells the permit waiters behind that this one is admitted: the one
    /// right behind watches this key for it (`queue.rs`).
    async fn admitted(&self, req: &Request, permits: Option<u32>) -> Result<(), EngineError> {
        let (session, key, created) =
            self.contending(req, |c| (c.session.clone(), c.key.clone(), c.created))?;
        let mut value = self.value(req, permits, req.mode);
        value.extend_from_slice(queue::ADMITTED);
        let txn = Txn::new()
            .when([Compare::create_revision(key.as_str(), CompareOp::Equal, created)])
            .and_then([TxnOp::put(
                key.as_str(),
                value,
                Some(PutOptions::new().with_ignore_lease()),
            )]);
        session.txn(txn).await.map(drop)
    }

    /// Runs `f` on this request's key.
    fn contending<R>(&self, req: &Request, f: impl FnOnce(&mut Contending) -> R) -> Result<R, EngineError> {
        requested(req)
            .key
            .lock()
            .as_mut()
            .map(f)
            .ok_or_else(|| EngineError::failed("no such request"))
    }

    /// Deletes this request's key, handing the lock over to the waiters
    /// right behind if it can (`handoff.rs`); `Ok(false)` if the key was
    /// already gone.
    async fn remove(&self, req: &Request) -> Result<bool, EngineError> {
        let Some(contending) = letting_go(req) else {
            return Ok(false);
        };
        let Contending {
            key,
            taken,
            created,
            session,
            watch,
            first,
            successors,
            slot,
        } = contending;
        // Handed the lock while the core was not listening: it holds.
        let (first, successors) = match watch.as_ref().map(|w| w.signal.borrow().clone()) {
            Some(Signal::Granted(value)) => (req.mode == Mode::Write, handoff::passed_on(&value)),
            _ => (first, successors),
        };
        drop(watch);
        let slot = slot.map(|slot| format!("{}{slot}", self.slots_prefix(&req.key)));
        let release = release(&key, created, if first { &successors } else { &[] }, slot);
        let attempt = move |session: &Session| {
            let mut client = session.kv();
            let release = release.clone();
            async move {
                match release {
                    Release::Delete(key) => client.delete(key, None).await.map(|d| d.deleted() > 0),
                    Release::Txn(txn) => client.txn(txn).await.map(deleted),
                }
            }
        };
        match tokio::time::timeout(session::FIRST_ATTEMPT, attempt(&session)).await {
            Ok(Ok(deleted)) => Ok(deleted),
            // Keep trying while the lease lives (a key left behind would
            // block the lock until the lease ends), in a task of its own,
            // so that it goes on if the caller stops waiting. The key names
            // this request alone until the delete is done (the task keeps
            // its key number): deleting it never takes another's place, and a
            // repeated handoff finds its compares false and only deletes.
            _ => {
                let watching = session.clone();
                let retried = tokio::spawn(async move {
                    let _taken = taken;
                    session.retry(|| attempt(&session)).await
                });
                // A retry cannot tell whether the first try deleted the key.
                match retried.await {
                    Ok(Ok(_)) => Ok(true),
                    Ok(Err(_)) if watching.is_ended() => Ok(false),
                    Ok(Err(e)) => Err(e),
                    Err(e) => Err(EngineError::failed(e)),
                }
            }
        }
    }
}

/// How a key goes.
#[derive(Clone)]
enum Release {
    Delete(String),
    /// Deletes it in a transaction that also hands over, or frees its slot.
    Txn(Txn),
}

/// The release: delete `key`; with successors to hand over to, in one
/// transaction, if `key` and theirs are still as created, rewrite theirs
/// first, then delete it. A permit's slot key goes with it while it
/// names `key` (`slots.rs`).
fn release(key: &str, created: i64, successors: &[Successor], slot: Option<String>) -> Release {
    if let Some(slot) = slot {
        let delete = TxnOp::delete(key, None);
        let txn = Txn::new()
            .when([Compare::value(slot.as_str(), CompareOp::Equal, key)])
            .and_then([delete.clone(), TxnOp::delete(slot, None)])
            .or_else([delete]);
        return Release::Txn(txn);
    }
    let (targets, rest) = handoff::targets(successors);
    if targets.is_empty() {
        return Release::Delete(key.to_owned());
    }
    let delete = TxnOp::delete(key, None);
    let mut checks = vec![Compare::create_revision(key, CompareOp::Equal, created)];
    let mut ops = Vec::new();
    for target in targets {
        checks.push(Compare::create_revision(
            target.key.clone(),
            CompareOp::Equal,
            target.created,
        ));
        ops.push(TxnOp::put(
            target.key.clone(),
            handoff::value(&target.line, rest),
            Some(PutOptions::new().with_ignore_lease()),
        ));
    }
    ops.push(delete.clone());
    Release::Txn(Txn::new().when(checks).and_then(ops).or_else([delete]))
}

/// Whether a release's transaction deleted the key: its first delete.
fn deleted(answer: TxnResponse) -> bool {
    answer.op_responses().into_iter().find_map(|op| match op {
        TxnOpResponse::Delete(deleted) => Some(deleted.deleted() > 0),
        _ => None,
    }) == Some(true)
}

/// Latest first, keys and values: the contenders ahead of a request.
fn latest_first() -> GetOptions {
    GetOptions::new()
        .with_prefix()
        .with_sort(SortTarget::Create, SortOrder::Descend)
}

fn gets(answer: TxnResponse) -> Vec<etcd_client::GetResponse> {
    answer
        .op_responses()
        .into_iter()
        .filter_map(|op| match op {
            TxnOpResponse::Get(got) => Some(got),
            _ => None,
        })
        .collect()
}

fn vanished() -> EngineError {
    EngineError::failed("this request's key vanished as it was put")
}

/// Whether `key` still exists as created at `created`, and if its value
/// says it was revoked (`control.rs`). A read that fails (a leader
/// election, say) is an error, so the watchdog asks again; taken for a no,
/// it made a sound hold lost as `Rejected`.
async fn renewal(session: &Session, key: &[u8], created: i64) -> Result<Renewal, EngineError> {
    let got = session
        .retry(|| {
            let mut client = session.kv();
            let key = key.to_vec();
            async move { client.get(key, None).await }
        })
        .await?;
    Ok(match got.kvs().first() {
        Some(kv) if kv.create_revision() == created && control::is_revoked(kv.value()) => Renewal::Revoked,
        Some(kv) if kv.create_revision() == created => Renewal::Held,
        _ => Renewal::Gone,
    })
}

impl EtcdEngine {
    /// A first try, for a lock or (with `permits`) a permit.
    async fn try_first(&self, req: &Request, permits: Option<u32>) -> Result<Poll, EngineError> {
        let answer = self.enqueue(req, permits).await;
        if req.try_once && !matches!(answer, Ok(Poll::Held(_))) {
            self.remove(req).await?;
        }
        answer
    }

    /// A later try, for a lock or (with `permits`) a permit.
    async fn try_again(&self, req: &Request, permits: Option<u32>) -> Result<Poll, EngineError> {
        let state = self.contending(req, |c| {
            let said = c.watch.as_ref().map(|w| {
                let trusted = w.since.elapsed() < WATCH_TRUSTED;
                (
                    w.signal.borrow().clone(),
                    w.wake(c.created as u64, req.lease),
                    trusted,
                )
            });
            (c.session.is_ended(), c.created, said)
        });
        match state {
            // The lease ended with our place in line: queue again.
            Ok((true, _, _)) | Err(_) => {
                self.remove(req).await?;
                self.enqueue(req, permits).await
            }
            // Nothing moved: keep waiting, no round trip, while the watches
            // are young enough to trust (a stream to a member that died
            // stays silent until its connection is found dead).
            Ok((false, _, Some((Signal::Waiting, wake, true)))) => Ok(Poll::Waiting(wake)),
            // Handed over while the core was not listening.
            Ok((false, created, Some((Signal::Granted(_), _, _)))) => Ok(Poll::Held(created as u64)),
            Ok((false, _, _)) => self.look_again(req, permits).await,
        }
    }

    /// Whether this request's key is still there as it was put, with its session.
    async fn renewing(&self, req: &Request) -> Result<Renewal, EngineError> {
        let Ok((session, key, created)) =
            self.contending(req, |c| (c.session.clone(), c.key.clone(), c.created))
        else {
            return Ok(Renewal::Gone);
        };
        if session.is_ended() {
            return Ok(Renewal::Gone);
        }
        renewal(&session, key.as_bytes(), created).await
    }

    /// Fires when the session this request's key lives on ends.
    fn session_ended(&self, req: &Request) -> Option<LostSignal> {
        let session = self.contending(req, |c| c.session.clone()).ok()?;
        Some(Box::pin(session.ended()))
    }
}

#[async_trait]
impl Engine for EtcdEngine {
    fn kind(&self) -> &'static str {
        "etcd"
    }

    fn address(&self) -> String {
        self.address.clone()
    }

    fn guarantees(&self) -> Guarantees {
        Guarantees {
            read: true,
            fairness: Fairness::Fifo,
            fencing: Fencing::Strict,
            expiry: Expiry::Session,
            lease_unit: Duration::from_millis(1),
            waiter_ttl: None,
        }
    }

    #[allow(clippy::needless_update)]
    fn facets(&self) -> Facets<'_> {
        Facets {
            semaphores: Some(self),
            inspect: Some(self),
            list: Some(self),
            control: Some(self),
            permit_control: Some(self),
            hold_at_least: Some(self),
            election_values: Some(self),
            watch: Some(self),
            held_writes: Some(self),
            // Every facet today; one added later stays missing here until
            // this engine implements it.
            ..Facets::default()
        }
    }

    async fn downgrade(&self, req: &Request) -> Result<bool, EngineError> {
        let Ok((session, key, created)) =
            self.contending(req, |c| (c.session.clone(), c.key.clone(), c.created))
        else {
            return Ok(false);
        };
        // The reader mark, keeping owner, since and label.
        let rewrite = |value: Vec<u8>| {
            TxnOp::put(
                key.as_str(),
                value,
                Some(PutOptions::new().with_ignore_lease().with_prev_key()),
            )
        };
        let as_created = Compare::create_revision(key.as_str(), CompareOp::Equal, created);
        let txn = Txn::new()
            .when([as_created.clone()])
            .and_then([rewrite(self.value(req, None, Mode::Read))]);
        let answer = session.txn(txn).await?;
        if !answer.succeeded() {
            return Ok(false);
        }
        // A revoked holder stays revoked: mark the new value too, unless
        // the key changed since (marked again by a revoke, or gone).
        let rewritten = answer.header().map_or(0, |h| h.revision());
        let was_revoked = answer.op_responses().into_iter().any(|op| match op {
            TxnOpResponse::Put(put) => put.prev_key().is_some_and(|kv| control::is_revoked(kv.value())),
            _ => false,
        });
        if was_revoked {
            let mut value = self.value(req, None, Mode::Read);
            value.extend_from_slice(control::REVOKED);
            let txn = Txn::new()
                .when([
                    as_created,
                    Compare::mod_revision(key.as_str(), CompareOp::Equal, rewritten),
                ])
                .and_then([rewrite(value)]);
            session.txn(txn).await?;
        }
        Ok(true)
    }
}

#[async_trait]
impl Lifecycle for EtcdEngine {
    async fn acquire(&self, req: &Request) -> Result<Poll, EngineError> {
        self.try_first(req, None).await
    }

    async fn poll(&self, req: &Request) -> Result<Poll, EngineError> {
        self.try_again(req, None).await
    }

    async fn cancel(&self, req: &Request) -> Result<(), EngineError> {
        self.remove(req).await.map(drop)
    }

    async fn renew(&self, req: &Request) -> Result<Renewal, EngineError> {
        self.renewing(req).await
    }

    async fn release(&self, req: &Request) -> Result<bool, EngineError> {
        self.remove(req).await
    }

    fn lost(&self, req: &Request) -> Option<LostSignal> {
        self.session_ended(req)
    }

    /// A lock's holder watches its key.
    fn revoked(&self, req: &Request) -> Option<RevokedSignal> {
        let key = self.contending(req, |c| c.key.clone()).ok()?;
        Some(control::listen(self.watches.clone(), key))
    }
}

/// The lifecycle of a permit of a semaphore of `count` permits: the
/// lock's, in the semaphore's line.
struct Permits<'a> {
    engine: &'a EtcdEngine,
    count: u32,
}

#[async_trait]
impl Lifecycle for Permits<'_> {
    async fn acquire(&self, req: &Request) -> Result<Poll, EngineError> {
        self.engine.try_first(req, Some(self.count)).await
    }

    async fn poll(&self, req: &Request) -> Result<Poll, EngineError> {
        self.engine.try_again(req, Some(self.count)).await
    }

    async fn cancel(&self, req: &Request) -> Result<(), EngineError> {
        self.engine.remove(req).await.map(drop)
    }

    async fn renew(&self, req: &Request) -> Result<Renewal, EngineError> {
        self.engine.renewing(req).await
    }

    async fn release(&self, req: &Request) -> Result<bool, EngineError> {
        self.engine.remove(req).await
    }

    /// A permit cannot be revoked: only its session's end is heard.
    fn lost(&self, req: &Request) -> Option<LostSignal> {
        self.engine.session_ended(req)
    }

    fn slot(&self, req: &Request) -> Option<u32> {
        self.engine.contending(req, |c| c.slot).ok().flatten()
    }
}

impl Semaphores for EtcdEngine {
    fn permits(&self, count: u32) -> Box<dyn Lifecycle + '_> {
        Box::new(Permits { engine: self, count })
    }

    fn slots(&self) -> bool {
        true
    }
}

#[async_trait]
impl Inspect for EtcdEngine {
    fn shows_fences(&self) -> bool {
        true
    }

    fn shows_renewals(&self) -> bool {
        true
    }

    async fn inspect(&self, key: &LockKey, permits: Option<u32>) -> Result<LockView, EngineError> {
        let session = self.live().await?;
        let prefixes = (&self.prefix_of(key, permits)[..], &self.slots_prefix(key)[..]);
        records::inspect(&session, key, permits, prefixes).await
    }
}

#[async_trait]
impl List for EtcdEngine {
    async fn list(&self, group: &str) -> Result<Vec<LockView>, EngineError> {
        let session = self.live().await?;
        records::list(&session, &self.root, group).await
    }
}

/// One watch on the group's prefix, on the engine's shared stream.
#[async_trait]
impl Watch for EtcdEngine {
    async fn watch(&self, group: &str) -> Result<Changed, EngineError> {
        let prefix = records::group_prefix(&self.root, group)
            .ok_or_else(|| EngineError::failed("not a group dlock can name"))?;
        match self.watches.watch(prefix.into_bytes(), true, false).await {
            Some(mut watch) => Ok(Box::pin(async move {
                watch.changed().await;
            })),
            // The stream broke (a leader lost, say): the next watch opens
            // a new one.
            None => Ok(dlock_core::kit::unwatched()),
        }
    }
}

#[async_trait]
impl Control for EtcdEngine {
    /// Its key gone while its session's lease lives: nothing of dlock's
    /// deletes a hold's key but its release, so someone else did.
    async fn forced_out(&self, req: &Request) -> Result<bool, EngineError> {
        let put_on = requested(req)
            .put_on
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .upgrade();
        match put_on {
            Some(session) if !session.is_ended() => session.lives().await,
            _ => Ok(false),
        }
    }

    async fn force_release(&self, key: &LockKey, only: &Only) -> Result<u32, EngineError> {
        let session = self.live().await?;
        control::force_release(&session, &self.prefix_of(key, None), None, only).await
    }

    async fn revoke(&self, key: &LockKey, only: &Only) -> Result<u32, EngineError> {
        let session = self.live().await?;
        control::revoke(&session, &self.prefix_of(key, None), None, only).await
    }
}

/// A permit is a key in the semaphore's line, as a lock's hold is in the
/// lock's: the same deletes and marks reach it.
#[async_trait]
impl PermitControl for EtcdEngine {
    async fn force_release_permits(
        &self,
        key: &LockKey,
        count: u32,
        only: &Only,
    ) -> Result<u32, EngineError> {
        let session = self.live().await?;
        let prefix = self.prefix_of(key, Some(count));
        control::force_release(&session, &prefix, Some(count), only).await
    }

    async fn revoke_permits(&self, key: &LockKey, count: u32, only: &Only) -> Result<u32, EngineError> {
        let session = self.live().await?;
        control::revoke(&session, &self.prefix_of(key, Some(count)), Some(count), only).await
    }
}

#[async_trait]
impl HoldAtLeast for EtcdEngine {
    /// Moves the key onto a lease of its own that ends `keep` from now,
    /// so the lock stays taken that long whatever becomes of this process
    /// and its session. No handoff: the waiters behind see the key go when
    /// that lease ends, as after a crash.
    async fn release_after(&self, req: &Request, keep: Duration) -> Result<bool, EngineError> {
        let Some(Contending {
            key,
            taken,
            created,
            session,
            ..
        }) = letting_go(req)
        else {
            return Ok(false);
        };
        let (lease, lives) = session.lease_for(keep).await?;
        let txn = Txn::new()
            .when([Compare::create_revision(key.as_str(), CompareOp::Equal, created)])
            .and_then([TxnOp::put(
                key.as_str(),
                "",
                Some(PutOptions::new().with_lease(lease).with_ignore_value()),
            )]);
        let moved = session.txn(txn).await?.succeeded();
        // The key's name stays this process's while the key may live.
        tokio::spawn(async move {
            tokio::time::sleep(lives).await;
            drop(taken);
        });
        Ok(moved)
    }
}

impl ElectionValues for EtcdEngine {}

impl HeldWrites for EtcdEngine {
    fn store(&self) -> &(dyn std::any::Any + Send + Sync) {
        self
    }
}
