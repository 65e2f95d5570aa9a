//! The ZooKeeper engine, wire-compatible with Apache Curator's
//! `InterProcessReadWriteLock`: a Java service using Curator and a Rust
//! service using dlock on the same path exclude each other. Semaphores
//! follow Curator's `InterProcessSemaphoreV2` (`permits.rs`).
//!
//! A lock `group`/`name` is the path `<root>/<group>/<name>` (each part
//! escaped, see `nodes.rs`), created as container nodes that the server
//! deletes once empty. Each acquisition creates one `EPHEMERAL_SEQUENTIAL`
//! child `_c_<uuid>-__WRIT__<seq>` or `_c_<uuid>-__READ__<seq>`. A writer
//! holds when its node is first, else it watches the node just ahead; a
//! reader holds when no writer is ahead, else it watches the first writer
//! ahead. Each waiter watches one node, so a release wakes one waiter (or the
//! readers behind it), never the whole line. A downgrade swaps the write node
//! for a read node with the same sequence in one `multi`, so it keeps its
//! place (CURATOR-621).
//!
//! The create goes in one `multi` with an empty write to the lock's path:
//! the path's new stat counts the children, so a lone node knows it holds
//! without listing its siblings (an uncontended cycle is create + delete,
//! two requests), and its `mzxid` is the create's zxid. The write changes
//! only the path's version; Curator reads neither its data nor its version.
//!
//! **Elections** take Curator's `LeaderLatch` layout on the lock's path:
//! a campaign's node is `_c_<uuid>-latch-<seq>`, its data the proposal
//! alone (the campaign's value, else the process's label), so a Curator latch on the path and dlock
//! candidates lead one at a time and each reads the other's leader. dlock
//! takes latch nodes for writers. After 2³¹ creates under one path the
//! sequence wraps; Curator then orders the wrapped nodes first by their
//! text, dlock last, so a mixed election could lead twice: mixed lines
//! that long are not supported.
//!
//! **Fencing token**: the node's `czxid`, the transaction id that created it.
//! Conflicting holders of one path hold in node order, and nodes are created
//! in zxid order, so the token strictly increases per path across holders,
//! sessions and server restarts (zxids never go back while the data
//! directory is kept).
//!
//! **Records**: a node's data names the process that made it, `dlock
//! <label>` (its `client_name`), written once at create (`records.rs`).
//! `inspect` reads a lock's or semaphore's nodes back in two round trips,
//! `list` a group's in three (`inspect.rs`).
//!
//! **Liveness** comes from the session, not a lease: every node lives as long
//! as the engine's session. When the session ends (expired, or cut off for
//! half the session timeout, before the server can expire it; see
//! `session.rs`) every hold on it fires lost, and waiters queue again on a
//! new session. A shorter blip loses nothing.
//! Renewal checks that the hold's node still exists.
//!
//! **Force release and revocation** (`control.rs`) work as with Curator:
//! force release deletes the holding nodes, and a holder that finds its
//! node gone on a live session knows it was forced out; revocation writes
//! Curator's `__REVOKE__` over them, which a dlock holder reads at its
//! next renewal (one more round trip, only then) and a revocable Curator
//! holder hears at once.
//!
//! **Many waiters.** Each waiter lists the siblings once per turn, as
//! Curator does, so with `queue = "engine"` thousands of waiters on one lock
//! cost O(n²); the default local queue keeps one node per process in line.
//! The LockKeeper (`keeper.rs`) keeps a lock's state (its path, its
//! requests) while used and forgets it `keeper_idle` after its last request.
//!
//! **Servers before 3.8.5** (Debian's 3.8.0 among them) have
//! ZOOKEEPER-4685: an ensemble whose leader dies mid-write can fail to form
//! a quorum again, round after round, while its members retry the same
//! diff. Locks then wait, and fail at their wait's end, until it does.
//! Upgrade, or run members with `-Dzookeeper.forceSnapshotSync=true`.
//!
//! **TLS** (cargo feature `zookeeper-tls`) is for a server's
//! `secureClientPort`, which ZooKeeper serves through Netty
//! (`serverCnxnFactory=org.apache.zookeeper.server.NettyServerCnxnFactory`).
//! `tls_mode` is `require`, `verify-ca` or `verify-full`, and `tls_ca_file`
//! is needed: the client knows no system roots (`tls.rs`).
//!
//! Config:
//!
//! ```toml
//! [engines.zk]
//! kind = "zookeeper"
//! connect = "10.0.0.1:2181,10.0.0.2:2181,10.0.0.3:2181"
//! root = "/locks"
//! session_timeout = "10s"
//! connect_timeout = "5s"
//! keeper_idle = "1m"          # LockKeeper: drop per-lock state idle this long
//! # digest = "user:password"  # digest auth; nodes then get creator-only ACLs
//! # tls_mode = "verify-full"  # for a secureClientPort
//! # tls_ca_file = "/etc/dlock/zk-ca.pem"
//! ```

mod config;
mod control;
mod held;
mod inspect;
mod keeper;
mod nodes;
mod permits;
mod records;
mod session;
mod tls;
/// The client crate, whose types held writes take ([`HeldMulti`]).
pub use zookeeper_client;

use std::sync::Arc;
use std::time::Duration;

use dlock_core::kit::{
    Changed, Control, ElectionValues, Engine, EngineError, Expiry, Facets, Fairness, Fencing, Guarantees,
    HeldWrites, Inspect, Lifecycle, List, LostSignal, PermitControl, Poll, Renewal, Request, RequestState,
    RevokedSignal, Semaphores, Wake, Watch, Woken, async_trait,
};
use dlock_core::{LockKey, LockView, Only};
use tokio::sync::watch;
use tokio::task::AbortHandle;
use zookeeper_client::{
    Acls, AddWatchMode, CreateMode, Error as ZkError, MultiWriteError, MultiWriteResult, OneshotWatcher,
};

use keeper::Keeper;
use nodes::Turn;
use permits::Permits;
use session::{Session, Sessions};

pub use config::{ZooKeeperConfig, register};
pub use held::HeldMulti;

/// A request's node: none before it is created or once it is removed.
type NodeState = RequestState<Node>;

/// One request's node.
struct Node {
    name: String,
    fence: u64,
    session: Arc<Session>,
    /// While waiting: the watch on the node ahead.
    watch: Option<Watching>,
    /// The node's data version last read: 0 from its create, moved on by
    /// a revocation (`control.rs`).
    seen: i32,
    /// Asked to let go: stays so while it holds.
    revoked: bool,
    /// Its ear for a revocation, once the core listens (`control.rs`).
    asked: Option<Arc<control::Asked>>,
}

/// A waiter's watch, and whether it fired; stopped when dropped.
struct Watching {
    fired: watch::Receiver<bool>,
    task: AbortHandle,
}

impl Watching {
    /// A watch on the node at `ahead`; `None` if it is gone already.
    async fn on(session: &Session, ahead: &str) -> Result<Option<Self>, EngineError> {
        let (stat, watcher) = session
            .retry(|| session.client.check_and_watch_stat(ahead))
            .await
            .map_err(|e| session.failed(e))?;
        Ok(stat.map(|_| Watching::start(watcher)))
    }

    fn start(watcher: OneshotWatcher) -> Self {
        let (fire, fired) = watch::channel(false);
        let task = tokio::spawn(async move {
            watcher.changed().await;
            let _ = fire.send(true);
        })
        .abort_handle();
        Watching { fired, task }
    }

    fn fired(&self) -> bool {
        *self.fired.borrow()
    }

    /// The future the core awaits: resolves once the watch fired.
    fn wake(&self) -> Wake {
        let mut fired = self.fired.clone();
        Box::pin(async move {
            let _ = fired.wait_for(|fired| *fired).await;
            Woken::Retry
        })
    }
}

impl Drop for Watching {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The ZooKeeper engine. See the [module docs](self).
///
/// Built from config (`kind` in `[engines.<name>]`), or by hand:
///
/// ```no_run
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), dlock::Error> {
/// use std::sync::Arc;
/// use dlock::engines::zookeeper::{ZooKeeperConfig, ZooKeeperEngine};
///
/// let config = ZooKeeperConfig::new("10.0.0.1:2181,10.0.0.2:2181,10.0.0.3:2181");
/// let engine = ZooKeeperEngine::connect("main", &config).await?;
/// dlock::install(dlock::Registry::with_engine("main", Arc::new(engine), Default::default())?)?;
/// # Ok(())
/// # }
/// ```
pub struct ZooKeeperEngine {
    sessions: Sessions,
    root: String,
    acls: Acls<'static>,
    keeper: Arc<Keeper>,
    address: String,
    /// What this process's nodes say it is called (see `records.rs`).
    label: String,
}

impl ZooKeeperEngine {
    /// Locks whose state the LockKeeper holds now, idle ones included.
    pub fn kept_locks(&self) -> usize {
        self.keeper.len()
    }

    fn path(&self, req: &Request) -> Arc<str> {
        self.keeper.path(&req.key, || req.key.path(&self.root))
    }

    /// Joins the line with a new node on the live session, then looks.
    async fn enqueue(&self, req: &Request) -> Result<Poll, EngineError> {
        let path = self.path(req);
        // An earlier attempt that failed after its create left a node in
        // line: keep its place rather than leave it behind as an orphan.
        if self.node(req, |n| !n.session.is_ended()).unwrap_or(false) {
            return self.look(req, &path, None).await;
        }
        let (session, (name, fence, children)) = self
            .on_live_session(|session| {
                let path = &path;
                async move { self.create(&session, path, req).await }
            })
            .await?;
        let node = Node {
            name,
            fence,
            session,
            watch: None,
            seen: 0,
            revoked: false,
            asked: None,
        };
        *NodeState::of(req).lock() = Some(node);
        self.look(req, &path, children).await
    }

    /// Runs `create` on the live session; if that session expired under
    /// it, once more on a new one.
    async fn on_live_session<T, F, Fut>(&self, create: F) -> Result<(Arc<Session>, T), EngineError>
    where
        F: Fn(Arc<Session>) -> Fut,
        Fut: Future<Output = Result<T, EngineError>>,
    {
        let session = self.sessions.live().await?;
        match create(session.clone()).await {
            Ok(created) => Ok((session, created)),
            Err(_) if session.is_ended() => {
                let session = self.sessions.live().await?;
                Ok((session.clone(), create(session).await?))
            }
            Err(e) => Err(e),
        }
    }

    /// Creates this request's node, and the container parents if missing.
    /// The create travels in one `multi` with an empty write to the parent,
    /// whose new stat says whether the node is alone (then no listing is
    /// needed: the uncontended cycle is two requests, like a bare create +
    /// delete) and whose `mzxid` is the create's zxid, the fence: a create
    /// inside a multi returns no stat of its own (ZOOKEEPER-4026). Returns
    /// the siblings when they are known.
    async fn create(
        &self,
        session: &Session,
        path: &str,
        req: &Request,
    ) -> Result<(String, u64, Option<Vec<String>>), EngineError> {
        let client = &session.client;
        let (name, data) = self.node_of(req, None);
        let prefix = format!("{path}/{name}");
        let options = CreateMode::EphemeralSequential.with_acls(self.acls);
        // A container parent can vanish between our creating it and using it.
        let mut vanished = 0;
        loop {
            let mut multi = client.new_multi_writer();
            multi
                .add_create(&prefix, &data, &options)
                .map_err(EngineError::failed)?;
            multi.add_set_data(path, &[], None).map_err(EngineError::failed)?;
            let failed = match multi.commit().await {
                Ok(answers) => return created(&answers),
                Err(MultiWriteError::OperationFailed { index, source }) => {
                    if source == ZkError::NoNode && vanished < 5 {
                        vanished += 1;
                        self.create_parents(session, path).await?;
                        continue;
                    }
                    // A parent that lets us create but not write: list instead.
                    if index == 1 && source == ZkError::NoAuth {
                        let made = self
                            .create_and_list(session, path, &prefix, &data, req, None)
                            .await?;
                        return Ok(made.0);
                    }
                    source
                }
                Err(MultiWriteError::RequestFailed { source }) => source,
            };
            if let Some((name, fence)) = self.recover(session, path, req, failed).await? {
                return Ok((name, fence, None));
            }
        }
    }

    /// How a request's node's name starts, and what the node holds: a
    /// lock's node its record; a campaign's, Curator's `LeaderLatch` node,
    /// the proposal alone (else the label), which `LeaderLatch` reports as
    /// the participant's id. The one place a request's kind matters here.
    fn node_of(&self, req: &Request, fence: Option<u64>) -> (String, Vec<u8>) {
        match req.is_campaign() {
            true => (
                nodes::latch_prefix(req.owner),
                req.proposal_or(&self.label).as_bytes().to_vec(),
            ),
            false => (
                nodes::node_prefix(req.owner, req.mode),
                records::data(&self.label, fence),
            ),
        }
    }

    /// A plain create of a node with `data` under `path` (a lock's parent we
    /// may not write, or a semaphore's), with the siblings listed right
    /// behind it, then the children of `beside` if asked, in the same round
    /// trip (ZooKeeper serves one session's requests in order, so the
    /// listings see the new node and what came before it).
    async fn create_and_list(
        &self,
        session: &Session,
        path: &str,
        prefix: &str,
        data: &[u8],
        req: &Request,
        beside: Option<&str>,
    ) -> Result<((String, u64, Option<Vec<String>>), Option<Vec<String>>), EngineError> {
        let client = &session.client;
        let options = CreateMode::EphemeralSequential.with_acls(self.acls);
        let mut vanished = 0;
        loop {
            let (created, listed, beside) = tokio::join!(
                client.create(prefix, data, &options),
                client.list_children(path),
                async {
                    match beside {
                        Some(beside) => children(client.list_children(beside).await),
                        None => None,
                    }
                }
            );
            match created {
                Ok((stat, seq)) => {
                    let name = format!("{}{seq}", &prefix[path.len() + 1..]);
                    return Ok(((name, fence(stat.czxid), listed.ok()), beside));
                }
                Err(ZkError::NoNode) if vanished < 5 => {
                    vanished += 1;
                    self.create_parents(session, path).await?;
                }
                Err(e) => {
                    if let Some((name, fence)) = self.recover(session, path, req, e).await? {
                        return Ok(((name, fence, None), None));
                    }
                }
            }
        }
    }

    /// After a create failed with `failed`: the node if the reply was lost
    /// with the node made (found by its owner prefix, Curator's
    /// "protection"), `None` to try again, or the error if it is not
    /// transient.
    async fn recover(
        &self,
        session: &Session,
        path: &str,
        req: &Request,
        failed: ZkError,
    ) -> Result<Option<(String, u64)>, EngineError> {
        if session::transient(&failed) && !session.is_ended() {
            self.find_own(session, path, req).await
        } else {
            Err(session.failed(failed))
        }
    }

    /// Creates `path` and any missing ancestors as containers, deepest
    /// first: usually only the lock's own path is missing.
    async fn create_parents(&self, session: &Session, path: &str) -> Result<(), EngineError> {
        let options = CreateMode::Container.with_acls(self.acls);
        let mut missing = vec![path];
        while let Some(&next) = missing.last() {
            match session.retry(|| session.client.create(next, &[], &options)).await {
                Ok(_) | Err(ZkError::NodeExists) => {
                    missing.pop();
                }
                Err(ZkError::NoNode) => match next.rfind('/') {
                    Some(at) if at > 0 => missing.push(&next[..at]),
                    _ => return Err(EngineError::failed(format!("cannot create {path}"))),
                },
                Err(e) => return Err(session.failed(e)),
            }
        }
        Ok(())
    }

    async fn find_own(
        &self,
        session: &Session,
        path: &str,
        req: &Request,
    ) -> Result<Option<(String, u64)>, EngineError> {
        let mine = nodes::protected_prefix(req.owner);
        let children = match session.retry(|| session.client.list_children(path)).await {
            Ok(children) => children,
            Err(ZkError::NoNode) => return Ok(None),
            Err(e) => return Err(session.failed(e)),
        };
        let Some(name) = children.into_iter().find(|c| c.starts_with(&mine)) else {
            return Ok(None);
        };
        let node = format!("{path}/{name}");
        match session.retry(|| session.client.check_stat(&node)).await {
            Ok(Some(stat)) => Ok(Some((name, fence(stat.czxid)))),
            Ok(None) => Ok(None),
            Err(e) => Err(session.failed(e)),
        }
    }

    /// Whose turn it is, from `listed` if given; while not ours, arms a
    /// watch on the node ahead.
    async fn look(
        &self,
        req: &Request,
        path: &str,
        mut listed: Option<Vec<String>>,
    ) -> Result<Poll, EngineError> {
        loop {
            let (session, name) = self.node(req, |n| (n.session.clone(), n.name.clone()))?;
            let children = match listed.take() {
                Some(children) => children,
                None => session
                    .retry(|| session.client.list_children(path))
                    .await
                    .map_err(|e| session.failed(e))?,
            };
            let ahead = match nodes::turn(&children, &name) {
                Turn::Held => {
                    let fence = self.node(req, |n| {
                        n.watch = None;
                        n.fence
                    })?;
                    return Ok(Poll::Held(fence));
                }
                Turn::Gone => {
                    // Its name carries the owner id: the lock's path only.
                    return Err(EngineError::failed(format!(
                        "this request's node under {path} vanished while queued"
                    )));
                }
                Turn::Watch(ahead) => format!("{path}/{ahead}"),
            };
            let Some(watching) = Watching::on(&session, &ahead).await? else {
                continue; // Gone already: look again.
            };
            let wake = watching.wake();
            self.node(req, |n| n.watch = Some(watching))?;
            return Ok(Poll::Waiting(wake));
        }
    }

    /// Runs `f` on this request's node.
    fn node<R>(&self, req: &Request, f: impl FnOnce(&mut Node) -> R) -> Result<R, EngineError> {
        NodeState::of(req)
            .lock()
            .as_mut()
            .map(f)
            .ok_or_else(|| EngineError::failed("no such request"))
    }

    /// Deletes this request's node; `Ok(false)` if it was already gone.
    /// A node found gone stays the request's, for `forced_out` to ask why.
    async fn remove(&self, req: &Request) -> Result<bool, EngineError> {
        let Some((session, path)) = self.held_node(req) else {
            return Ok(false);
        };
        let removed = !session.is_ended() && delete(&session, path).await;
        if removed {
            NodeState::of(req).lock().take();
        }
        Ok(removed)
    }

    /// The session and path of this request's lock node, if it has one:
    /// a permit's request has none.
    fn held_node(&self, req: &Request) -> Option<(Arc<Session>, String)> {
        let node = req.state::<NodeState>()?.lock();
        let node = node.as_ref()?;
        Some((node.session.clone(), format!("{}/{}", self.path(req), node.name)))
    }
}

/// Deletes the node at `path`; `false` if it was already gone. A failure
/// other than that goes on in the background while the session lives, as
/// Curator's guaranteed delete does: a node left behind would block the
/// lock for good.
async fn delete(session: &Arc<Session>, path: String) -> bool {
    match session.client.delete(&path, None).await {
        Ok(()) => true,
        Err(ZkError::NoNode | ZkError::SessionExpired) => false,
        Err(_) => {
            tokio::spawn(delete_until_gone(session.clone(), path));
            true
        }
    }
}

/// The node's name, its fence, and the siblings if it is alone, from the
/// answers to [`ZooKeeperEngine::create`]'s multi.
fn created(answers: &[MultiWriteResult]) -> Result<(String, u64, Option<Vec<String>>), EngineError> {
    let [
        MultiWriteResult::Create { path, .. },
        MultiWriteResult::SetData { stat: parent },
    ] = answers
    else {
        // Not the answers themselves: the created path carries the owner id.
        return Err(EngineError::failed(format!(
            "unexpected answer to create: {} results",
            answers.len()
        )));
    };
    let name = path.rsplit('/').next().unwrap_or_default().to_owned();
    let alone = (parent.num_children == 1).then(|| vec![name.clone()]);
    Ok((name, fence(parent.mzxid), alone))
}

fn fence(czxid: i64) -> u64 {
    czxid as u64
}

async fn delete_until_gone(session: Arc<Session>, path: String) {
    while !session.is_ended() {
        tokio::time::sleep(Duration::from_millis(100)).await;
        match session.client.delete(&path, None).await {
            Ok(()) | Err(ZkError::NoNode | ZkError::SessionExpired) => return,
            Err(_) => {}
        }
    }
}

#[async_trait]
impl Engine for ZooKeeperEngine {
    fn kind(&self) -> &'static str {
        "zookeeper"
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

    fn facets(&self) -> Facets<'_> {
        Facets {
            semaphores: Some(self),
            inspect: Some(self),
            list: Some(self),
            control: Some(self),
            permit_control: Some(self),
            election_values: Some(self),
            watch: Some(self),
            held_writes: Some(self),
            ..Facets::default()
        }
    }

    async fn downgrade(&self, req: &Request) -> Result<bool, EngineError> {
        let (session, name, fence) = match self.node(req, |n| (n.session.clone(), n.name.clone(), n.fence)) {
            Ok(node) => node,
            Err(_) => return Ok(false),
        };
        let read = nodes::downgraded(&name).ok_or_else(|| EngineError::failed("not a write node"))?;
        let path = self.path(req);
        let options = CreateMode::Ephemeral.with_acls(self.acls);
        // The read node's czxid is the swap's: its data keeps the guard's fence.
        let data = records::data(&self.label, Some(fence));
        let mut retried = false;
        loop {
            let mut swap = session.client.new_multi_writer();
            swap.add_create(&format!("{path}/{read}"), &data, &options)
                .map_err(EngineError::failed)?;
            swap.add_delete(&format!("{path}/{name}"), None)
                .map_err(EngineError::failed)?;
            match swap.commit().await {
                Ok(_) => break,
                // A retry after a lost reply finds its own swap done.
                Err(MultiWriteError::OperationFailed {
                    index: 0,
                    source: ZkError::NodeExists,
                }) if retried => break,
                Err(MultiWriteError::OperationFailed {
                    source: ZkError::NoNode,
                    ..
                }) => return Ok(false),
                Err(MultiWriteError::RequestFailed { source })
                    if session::transient(&source) && !session.is_ended() =>
                {
                    retried = true;
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                Err(e) => return Err(session.failed(e.into())),
            }
        }
        self.node(req, |n| {
            n.name = read;
            n.seen = 0;
        })?;
        Ok(true)
    }
}

#[async_trait]
impl Lifecycle for ZooKeeperEngine {
    async fn acquire(&self, req: &Request) -> Result<Poll, EngineError> {
        let answer = self.enqueue(req).await;
        if req.try_once && !matches!(answer, Ok(Poll::Held(_))) {
            self.cancel(req).await?;
        }
        answer
    }

    async fn poll(&self, req: &Request) -> Result<Poll, EngineError> {
        let state = self.node(req, |n| {
            let watch = n.watch.as_ref().map(|w| (w.fired(), w.wake()));
            (n.session.is_ended(), watch)
        });
        match state {
            // The session ended with our place in line: queue again.
            Ok((true, _)) | Err(_) => {
                NodeState::of(req).lock().take();
                self.enqueue(req).await
            }
            // Nothing moved ahead of us: keep waiting, no round trip.
            Ok((false, Some((false, wake)))) => Ok(Poll::Waiting(wake)),
            Ok(_) => self.look(req, &self.path(req), None).await,
        }
    }

    async fn cancel(&self, req: &Request) -> Result<(), EngineError> {
        self.release(req).await.map(drop)
    }

    async fn renew(&self, req: &Request) -> Result<Renewal, EngineError> {
        let Some((session, path)) = self.held_node(req) else {
            return Ok(Renewal::Gone);
        };
        if session.is_ended() {
            return Ok(Renewal::Gone);
        }
        match self.stat(req, &session, &path).await {
            Ok(Some(stat)) => self.revoked(req, &session, &path, stat.version).await,
            Ok(None) => Ok(Renewal::Gone),
            Err(ZkError::SessionExpired) => Ok(Renewal::Gone),
            Err(e) => Err(EngineError::failed(e)),
        }
    }

    async fn release(&self, req: &Request) -> Result<bool, EngineError> {
        self.remove(req).await
    }

    fn lost(&self, req: &Request) -> Option<LostSignal> {
        let (session, _) = self.held_node(req)?;
        Some(Box::pin(session.ended()))
    }

    fn revoked(&self, req: &Request) -> Option<RevokedSignal> {
        self.listen(req)
    }
}

impl Semaphores for ZooKeeperEngine {
    fn permits(&self, count: u32) -> Box<dyn Lifecycle + '_> {
        Box::new(Permits { engine: self, count })
    }

    fn slots(&self) -> bool {
        true
    }
}

#[async_trait]
impl Inspect for ZooKeeperEngine {
    fn shows_fences(&self) -> bool {
        true
    }

    async fn inspect(&self, key: &LockKey, permits: Option<u32>) -> Result<LockView, EngineError> {
        self.view(key, permits).await
    }
}

#[async_trait]
impl List for ZooKeeperEngine {
    async fn list(&self, group: &str) -> Result<Vec<LockView>, EngineError> {
        self.views(group).await
    }
}

/// A persistent recursive watch (ZooKeeper 3.6+) on the group's node:
/// every lock's and semaphore's nodes are under it.
#[async_trait]
impl Watch for ZooKeeperEngine {
    async fn watch(&self, group: &str) -> Result<Changed, EngineError> {
        let session = self.sessions.live().await?;
        let dir = inspect::group_dir(&self.root, group)?;
        let watched = session
            .client
            .watch(&dir, AddWatchMode::PersistentRecursive)
            .await;
        // A watch the server could not set now (a connection lost, say):
        // the next one is set again.
        let Ok(mut watcher) = watched else {
            return Ok(dlock_core::kit::unwatched());
        };
        // One event, then dropped: a second `changed` after a session's
        // end would panic.
        Ok(Box::pin(async move {
            watcher.changed().await;
        }))
    }
}

#[async_trait]
impl Control for ZooKeeperEngine {
    async fn forced_out(&self, req: &Request) -> Result<bool, EngineError> {
        self.node_deleted(req).await
    }

    async fn force_release(&self, key: &LockKey, only: &Only) -> Result<u32, EngineError> {
        self.force_out(key, None, only).await
    }

    async fn revoke(&self, key: &LockKey, only: &Only) -> Result<u32, EngineError> {
        self.ask_to_let_go(key, None, only).await
    }
}

#[async_trait]
impl PermitControl for ZooKeeperEngine {
    async fn force_release_permits(
        &self,
        key: &LockKey,
        count: u32,
        only: &Only,
    ) -> Result<u32, EngineError> {
        self.force_out(key, Some(count), only).await
    }

    async fn revoke_permits(&self, key: &LockKey, count: u32, only: &Only) -> Result<u32, EngineError> {
        self.ask_to_let_go(key, Some(count), only).await
    }
}

impl ElectionValues for ZooKeeperEngine {}

impl HeldWrites for ZooKeeperEngine {
    fn store(&self) -> &(dyn std::any::Any + Send + Sync) {
        self
    }
}

/// A listing's children: none where the parent is not made yet; `None` if
/// the listing failed otherwise.
fn children(listed: Result<Vec<String>, ZkError>) -> Option<Vec<String>> {
    match listed {
        Err(ZkError::NoNode) => Some(Vec::new()),
        listed => listed.ok(),
    }
}
