//! Force release and revocation of a lock, in Apache Curator's terms, so
//! that they reach Curator's holders too (its semaphores have neither).
//!
//! **Force release** deletes the holding nodes: the first write node if it
//! holds, else every read node ahead of the first writer. ZooKeeper lets
//! anyone with delete rights on the lock's path delete another session's
//! ephemeral node. The next node in line holds then, and its czxid, the
//! fence, is above the old holders' (it was created after them). No word
//! needs leaving: a lock node goes away while its session lives only if
//! someone deleted it, so a hold that finds its node gone on a live
//! session was forced out.
//!
//! **Revocation** is Curator's `Revoker.attemptRevoke`: the message
//! `__REVOKE__` written over each holding node's data. A dlock holder sees
//! it at renewal: a node's data version is 0 from its create, so a greater
//! one means a write, read then (the one extra round trip). A Curator
//! holder that called `makeRevocable` hears it through its data watch. A
//! later holder has a node of its own, so it inherits nothing. Curator
//! compresses nothing unless told to (`enableCompression`); this writes
//! the plain message, so such a holder cannot read it.
//!
//! A dlock holder watches too, once its first renewal is due: that
//! renewal's stat sets a watch on the node (the same one request), and a
//! write or a delete wakes the core, which renews at once. So a revocation
//! or a force release is heard at once after the first renewal, and
//! within a third of the lease before it; a hold that ends sooner never
//! sets a watch.
//!
//! The message overwrites the node's record (`records.rs`). A dlock holder
//! that reads it writes its record back, conditional on the version it
//! read, so another request landing meanwhile is not lost.

use std::sync::atomic::{AtomicBool, Ordering};

use dlock_core::kit::{EngineError, Renewal, Request, RevokedSignal};
use dlock_core::{LockKey, Only};
use tokio::sync::Notify;
use zookeeper_client::{Error as ZkError, EventType, Stat};

use super::inspect::{gather, read_children, semaphore_dirs};
use super::nodes::SEMAPHORE;
use super::records::{self, REVOKE};
use super::session::{self, Session};
use super::{ZooKeeperEngine, nodes};

/// A holder's ear for a revocation, made when the core first listens.
#[derive(Default)]
pub(super) struct Asked {
    heard: Notify,
    /// A data watch is set on the node.
    watching: AtomicBool,
}

impl ZooKeeperEngine {
    /// What the core listens to while it renews a lock's hold.
    pub(super) fn listen(&self, req: &Request) -> Option<RevokedSignal> {
        let asked = self
            .node(req, |n| n.asked.get_or_insert_with(Default::default).clone())
            .ok()?;
        Some(Box::pin(async move { asked.heard.notified().await }))
    }

    /// The stat of `req`'s node at `path`, for a renewal: with a data
    /// watch, if the core listens and none is set.
    pub(super) async fn stat(
        &self,
        req: &Request,
        session: &Session,
        path: &str,
    ) -> Result<Option<Stat>, ZkError> {
        let asked = self.node(req, |n| n.asked.clone()).ok().flatten();
        let Some(asked) = asked.filter(|asked| !asked.watching.swap(true, Ordering::SeqCst)) else {
            return session.client.check_stat(path).await;
        };
        let watched = session.client.check_and_watch_stat(path).await;
        let Ok((Some(stat), watcher)) = watched else {
            asked.watching.store(false, Ordering::SeqCst);
            return watched.map(|(stat, _)| stat);
        };
        // Fires on a write (a revocation), the node's delete (a force
        // release, or the holder's own release or downgrade, which a
        // renewal sees through) or the session's end.
        tokio::spawn(async move {
            let event = watcher.changed().await;
            asked.watching.store(false, Ordering::SeqCst);
            if matches!(
                event.event_type,
                EventType::NodeDataChanged | EventType::NodeDeleted
            ) {
                asked.heard.notify_one();
            }
        });
        Ok(Some(stat))
    }

    /// Deletes the holding nodes of the lock `key` (with `permits`, the
    /// holding leases of its semaphore) that `only` admits; how many it
    /// deleted. A node's name is never used again, so deleting it by its
    /// path touches only the hold that was read.
    pub(super) async fn force_out(
        &self,
        key: &LockKey,
        permits: Option<u32>,
        only: &Only,
    ) -> Result<u32, EngineError> {
        let session = self.sessions.live().await?;
        let holding = self.holding(&session, key, permits, only).await?;
        on_each(&session, &holding, |node| session.client.delete(node, None)).await
    }

    /// Writes Curator's revoke message over the holding nodes of the lock
    /// `key` (with `permits`, the holding leases of its semaphore) that
    /// `only` admits; how many it reached.
    pub(super) async fn ask_to_let_go(
        &self,
        key: &LockKey,
        permits: Option<u32>,
        only: &Only,
    ) -> Result<u32, EngineError> {
        let session = self.sessions.live().await?;
        let holding = self.holding(&session, key, permits, only).await?;
        on_each(&session, &holding, |node| {
            session.client.set_data(node, REVOKE, None)
        })
        .await
    }

    /// The paths of the lock `key`'s holding nodes (with `permits`, of its
    /// semaphore's holding leases) that `only` admits, after a sync: a
    /// hold taken through another ensemble member shows. Every hold of a
    /// lock needs the names alone; some, their records too.
    async fn holding(
        &self,
        session: &Session,
        key: &LockKey,
        permits: Option<u32>,
        only: &Only,
    ) -> Result<Vec<String>, EngineError> {
        let path = key.path(&self.root);
        if let Some(count) = permits {
            let path = format!("{path}{SEMAPHORE}");
            let dirs = semaphore_dirs(&path);
            let mut found = gather(session, Some(&path), &dirs).await?.into_iter();
            let (leases, locks) = (found.next().unwrap_or_default(), found.next().unwrap_or_default());
            let admitted = records::admitted_leases(count, leases, locks, only).into_iter();
            return Ok(admitted.map(|name| format!("{}/{name}", dirs[0])).collect());
        }
        let dirs = std::slice::from_ref(&path);
        if !only.is_any() {
            let found = gather(session, Some(&path), dirs)
                .await?
                .pop()
                .unwrap_or_default();
            let admitted = records::admitted(key, &found, only).into_iter();
            return Ok(admitted.map(|name| format!("{path}/{name}")).collect());
        }
        let children = read_children(session, Some(&path), dirs)
            .await?
            .pop()
            .unwrap_or_default();
        Ok(nodes::line(&children)
            .into_iter()
            .filter(|place| place.held)
            .map(|place| format!("{path}/{}", children[place.at]))
            .collect())
    }

    /// Whether a lock hold found gone was forced out: its node is gone
    /// while the session it was made on lives. A node dlock deletes itself
    /// leaves the request (see `remove`), and a downgrade renames it at
    /// once, so only someone else's delete makes this true.
    pub(super) async fn node_deleted(&self, req: &Request) -> Result<bool, EngineError> {
        let Some((session, path)) = self.held_node(req).or_else(|| self.lease_node(req)) else {
            return Ok(false);
        };
        if session.is_ended() {
            return Ok(false);
        }
        match session.retry(|| session.client.check_stat(&path)).await {
            Ok(found) => Ok(found.is_none()),
            Err(ZkError::SessionExpired) => Ok(false),
            Err(e) => Err(session.failed(e)),
        }
    }

    /// A lock hold's renewal, its node found at data `version`: held, or
    /// held and asked to let go once its data was the revoke message.
    pub(super) async fn revoked(
        &self,
        req: &Request,
        session: &Session,
        path: &str,
        version: i32,
    ) -> Result<Renewal, EngineError> {
        let Ok((seen, revoked, fence)) = self.node(req, |n| (n.seen, n.revoked, n.fence)) else {
            return Ok(Renewal::Gone);
        };
        let answer = |revoked| if revoked { Renewal::Revoked } else { Renewal::Held };
        if version == seen {
            return Ok(answer(revoked));
        }
        let (data, stat) = match session.client.get_data(path).await {
            Ok(read) => read,
            Err(ZkError::NoNode | ZkError::SessionExpired) => return Ok(Renewal::Gone),
            Err(e) => return Err(session.failed(e)),
        };
        let asked = data == REVOKE;
        let revoked = self.node(req, |n| {
            n.seen = stat.version;
            n.revoked |= asked;
            n.revoked
        })?;
        if asked {
            // The record back, with the fence: a downgrade's read node
            // carries it, and for any other it is its czxid anyway.
            let (_, record) = self.node_of(req, Some(fence));
            if let Ok(written) = session.client.set_data(path, &record, Some(stat.version)).await {
                let _ = self.node(req, |n| n.seen = written.version);
            }
        }
        Ok(answer(revoked))
    }
}

/// Runs `op` on every node, all sent before any answer is awaited (one
/// round trip), each again while it fails for want of a connection; counts
/// the nodes it succeeded on. A node gone meanwhile is not counted.
async fn on_each<T, F, Fut>(session: &Session, nodes: &[String], op: F) -> Result<u32, EngineError>
where
    F: Fn(&str) -> Fut,
    Fut: Future<Output = Result<T, ZkError>>,
{
    let sent: Vec<Fut> = nodes.iter().map(|node| op(node)).collect();
    let mut done = 0;
    for (node, answer) in nodes.iter().zip(sent) {
        let answer = match answer.await {
            Err(e) if session::transient(&e) => session.retry(|| op(node)).await,
            answer => answer,
        };
        match answer {
            Ok(_) => done += 1,
            Err(ZkError::NoNode) => {}
            Err(e) => return Err(session.failed(e)),
        }
    }
    Ok(done)
}
