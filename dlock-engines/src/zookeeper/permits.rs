//! Semaphores in the layout of Apache Curator's `InterProcessSemaphoreV2`,
//! so that Curator and dlock clients of one path admit no more than N
//! together.
//!
//! A semaphore `group`/`name` is the path `P = <root>/<group>/<name>%permits`,
//! beside the lock of that name (no escaped name ends so). Under it:
//! - `P/locks`, Curator's internal mutex: a request queues with a node
//!   `_c_<uuid>-lock-<seq>`, in sequence order, watching the one just ahead;
//! - `P/leases`: a node `_c_<uuid>-lease-<seq>` per permit held, and the
//!   mutex holder's while it waits.
//!
//! The mutex holder creates its lease, then lists the leases: with N or
//! fewer, its own counted, it holds and lets the mutex go; otherwise it
//! waits for the leases to change, keeping the mutex, so the line is FIFO.
//!
//! Curator keeps no count. A dlock lease's data is `dlock permits <N>`, then
//! the holder's label on a line of its own; a new one is checked against
//! one other dlock lease, itself checked when it came, so every live dlock
//! lease agrees. A Curator lease (its data an address) is counted, not
//! checked. A dlock node in the mutex line carries the same data, so that
//! a waiter has its label and count to show too.
//!
//! The label cannot go on the first line: dlock before holder records read
//! all of it after `dlock permits ` as the count, and takes a lease whose
//! count does not parse for Curator's. Such a client counts a lease with a
//! label, but checks no count against it.
//!
//! **Slots.** A dlock lease is named `_c_<uuid>-slot<i>-lease-<seq>`:
//! Curator counts the leases whatever their names. Only the mutex holder
//! creates a lease, so it picks the lowest slot no lease names, from a
//! listing of the leases made right after the one that found it at the
//! head of the line (every earlier holder made its lease before letting
//! the mutex go). With every slot named, it waits, keeping the mutex,
//! before it makes its lease. A Curator lease, or one of a dlock before
//! slots, counts against N and has no slot.
//!
//! The fence is the lease's `czxid`; liveness is the session, as for locks.

use std::sync::Arc;

use dlock_core::kit::{
    EngineError, Lifecycle, LostSignal, Poll, Renewal, Request, RequestState, async_trait,
};
use zookeeper_client::Error as ZkError;

use super::nodes::{self, SEMAPHORE, SEMAPHORE_LEASES, SEMAPHORE_LOCKS, Turn};
use super::records::REVOKE;
use super::session::Session;
use super::{Watching, ZooKeeperEngine, children, delete};

type PermitState = RequestState<Permit>;

/// One request for a permit.
struct Permit {
    session: Arc<Session>,
    /// Its node in the mutex's line, until it holds.
    queued: Option<String>,
    /// Its lease and the lease's fence, once it had the mutex.
    lease: Option<(String, u64)>,
    /// While waiting: the watch on the node ahead, or on the leases.
    watch: Option<Watching>,
    /// Asked to let go: its lease's data was the revoke message once.
    revoked: bool,
}

/// How a dlock lease's data starts; the count follows.
const DATA: &str = "dlock permits ";

/// The data of this engine's semaphore nodes: the count, and on the next
/// line the label (which has no control characters).
fn data(count: u32, label: &str) -> Vec<u8> {
    format!("{DATA}{count}\n{label}").into_bytes()
}

/// The lifecycle of a permit of a semaphore of `count` permits.
pub(super) struct Permits<'a> {
    pub(super) engine: &'a ZooKeeperEngine,
    pub(super) count: u32,
}

#[async_trait]
impl Lifecycle for Permits<'_> {
    async fn acquire(&self, req: &Request) -> Result<Poll, EngineError> {
        let answer = self.engine.permit_enqueue(req, self.count).await;
        if req.try_once && !matches!(answer, Ok(Poll::Held(_))) {
            self.engine.permit_remove(req).await?;
        }
        answer
    }

    async fn poll(&self, req: &Request) -> Result<Poll, EngineError> {
        self.engine.permit_poll(req, self.count).await
    }

    async fn cancel(&self, req: &Request) -> Result<(), EngineError> {
        self.engine.permit_remove(req).await.map(drop)
    }

    /// Whether the lease is still there, and asked to let go. A lease's
    /// data is written at its create (version 0); a later version is an
    /// operator's revoke message, read then, after which the holder writes
    /// its record back (conditional on the version read), so the records
    /// go on naming it. The lease is never watched: a revocation is heard
    /// at the next renewal.
    async fn renew(&self, req: &Request) -> Result<Renewal, EngineError> {
        let Some((session, path)) = self.engine.lease_node(req) else {
            return Ok(Renewal::Gone);
        };
        if session.is_ended() {
            return Ok(Renewal::Gone);
        }
        let revoked = self.engine.permit(req, |p| p.revoked)?;
        let stat = match session.client.check_stat(&path).await {
            Ok(Some(stat)) => stat,
            Ok(None) | Err(ZkError::SessionExpired) => return Ok(Renewal::Gone),
            Err(e) => return Err(EngineError::failed(e)),
        };
        if stat.version == 0 || revoked {
            return Ok(if revoked { Renewal::Revoked } else { Renewal::Held });
        }
        let (read, stat) = match session.client.get_data(&path).await {
            Ok(read) => read,
            Err(ZkError::NoNode | ZkError::SessionExpired) => return Ok(Renewal::Gone),
            Err(e) => return Err(EngineError::failed(e)),
        };
        if read != REVOKE {
            return Ok(Renewal::Held);
        }
        self.engine.permit(req, |p| p.revoked = true)?;
        let record = data(self.count, &self.engine.label);
        let _ = session.client.set_data(&path, &record, Some(stat.version)).await;
        Ok(Renewal::Revoked)
    }

    async fn release(&self, req: &Request) -> Result<bool, EngineError> {
        self.engine.permit_remove(req).await
    }

    fn lost(&self, req: &Request) -> Option<LostSignal> {
        let (session, _) = self.engine.lease_node(req)?;
        Some(Box::pin(session.ended()))
    }

    fn slot(&self, req: &Request) -> Option<u32> {
        let lease = self.engine.permit(req, |p| p.lease.clone()).ok()??;
        nodes::lease_slot(&lease.0)
    }
}

/// The children of a semaphore's mutex line and, listed right after, of
/// its leases (`None` if that listing failed).
type Listed = (Vec<String>, Option<Vec<String>>);

/// The lowest slot no lease in `leases` names.
fn free_slot(leases: &[String], count: u32) -> Option<u32> {
    (0..count).find(|&slot| !leases.iter().any(|lease| nodes::lease_slot(lease) == Some(slot)))
}

impl ZooKeeperEngine {
    fn semaphore_path(&self, req: &Request) -> String {
        format!("{}{SEMAPHORE}", self.path(req))
    }

    fn permit<R>(&self, req: &Request, f: impl FnOnce(&mut Permit) -> R) -> Result<R, EngineError> {
        PermitState::of(req)
            .lock()
            .as_mut()
            .map(f)
            .ok_or_else(|| EngineError::failed("no such request"))
    }

    /// The session and path of this request's lease, once it has one.
    pub(super) fn lease_node(&self, req: &Request) -> Option<(Arc<Session>, String)> {
        let (session, (lease, _)) = self
            .permit(req, |p| Some((p.session.clone(), p.lease.clone()?)))
            .ok()??;
        let path = format!("{}/{SEMAPHORE_LEASES}/{lease}", self.semaphore_path(req));
        Some((session, path))
    }

    /// Queues for the semaphore's mutex on the live session, then looks.
    async fn permit_enqueue(&self, req: &Request, count: u32) -> Result<Poll, EngineError> {
        // An earlier attempt that failed after its create keeps its place.
        if self.permit(req, |p| !p.session.is_ended()).unwrap_or(false) {
            return self.permit_look(req, count, None).await;
        }
        let path = self.semaphore_path(req);
        let (locks, leases) = (
            format!("{path}/{SEMAPHORE_LOCKS}"),
            format!("{path}/{SEMAPHORE_LEASES}"),
        );
        let prefix = format!("{locks}/{}", nodes::semaphore_node_prefix(req.owner, None));
        let node_data = data(count, &self.label);
        let (session, ((name, _, listed), leased)) = self
            .on_live_session(|session| {
                let (locks, leases, prefix, node_data) = (&locks, &leases, &prefix, &node_data);
                async move {
                    self.create_and_list(&session, locks, prefix, node_data, req, Some(leases))
                        .await
                }
            })
            .await?;
        *PermitState::of(req).lock() = Some(Permit {
            session,
            queued: Some(name),
            lease: None,
            watch: None,
            revoked: false,
        });
        self.permit_look(req, count, listed.map(|locks| (locks, leased)))
            .await
    }

    async fn permit_poll(&self, req: &Request, count: u32) -> Result<Poll, EngineError> {
        let state = self.permit(req, |p| {
            let watch = p.watch.as_ref().map(|w| (w.fired(), w.wake()));
            (p.session.is_ended(), watch)
        });
        match state {
            // The session ended, and the nodes with it: queue again.
            Ok((true, _)) | Err(_) => {
                PermitState::of(req).lock().take();
                self.permit_enqueue(req, count).await
            }
            Ok((false, Some((false, wake)))) => Ok(Poll::Waiting(wake)),
            Ok(_) => self.permit_look(req, count, None).await,
        }
    }

    /// Where this request stands: in the mutex's line (`listed`: its
    /// children and the leases, if just read), or holding the mutex and
    /// waiting for a slot or a lease to go, or holding a permit.
    async fn permit_look(
        &self,
        req: &Request,
        count: u32,
        mut listed: Option<Listed>,
    ) -> Result<Poll, EngineError> {
        let path = self.semaphore_path(req);
        let leases = format!("{path}/{SEMAPHORE_LEASES}");
        loop {
            let (session, queued, lease) = self.permit(req, |p| {
                p.watch = None;
                (p.session.clone(), p.queued.clone(), p.lease.clone())
            })?;
            if let Some((lease, fence)) = lease {
                let (children, _, watcher) = session
                    .retry(|| session.client.get_and_watch_children(&leases))
                    .await
                    .map_err(|e| session.failed(e))?;
                if !children.contains(&lease) {
                    let gone = format!("this request's lease under {leases} vanished while waiting");
                    return Err(EngineError::failed(gone));
                }
                if children.len() <= count as usize {
                    self.let_go_of_mutex(req).await?;
                    return Ok(Poll::Held(fence));
                }
                let watching = Watching::start(watcher);
                let wake = watching.wake();
                self.permit(req, |p| p.watch = Some(watching))?;
                return Ok(Poll::Waiting(wake));
            }
            let queued = queued.ok_or_else(|| EngineError::failed("neither queued nor leased"))?;
            let locks = format!("{path}/{SEMAPHORE_LOCKS}");
            let (children, leased) = match listed.take() {
                Some(listed) => listed,
                None => {
                    let list = || async {
                        let (locks, leases) = tokio::join!(
                            session.client.list_children(&locks),
                            session.client.list_children(&leases)
                        );
                        Ok((locks?, children(leases)))
                    };
                    session.retry(list).await.map_err(|e| session.failed(e))?
                }
            };
            match nodes::mutex_turn(&children, &queued) {
                Turn::Gone => {
                    let gone = format!("this request's node under {locks} vanished while queued");
                    return Err(EngineError::failed(gone));
                }
                Turn::Watch(ahead) => {
                    let Some(watching) = Watching::on(&session, &format!("{locks}/{ahead}")).await? else {
                        continue; // Gone already: look again.
                    };
                    let wake = watching.wake();
                    self.permit(req, |p| p.watch = Some(watching))?;
                    return Ok(Poll::Waiting(wake));
                }
                Turn::Held => {
                    let leased = match leased {
                        Some(leased) => leased,
                        // None made yet: no lease.
                        None => match session.retry(|| session.client.list_children(&leases)).await {
                            Err(ZkError::NoNode) => Vec::new(),
                            listed => listed.map_err(|e| session.failed(e))?,
                        },
                    };
                    let slot = match free_slot(&leased, count) {
                        Some(slot) => slot,
                        None => {
                            // Every slot named: wait for a lease to go.
                            let (leased, _, watcher) = session
                                .retry(|| session.client.get_and_watch_children(&leases))
                                .await
                                .map_err(|e| session.failed(e))?;
                            if free_slot(&leased, count).is_some() {
                                continue;
                            }
                            let watching = Watching::start(watcher);
                            let wake = watching.wake();
                            self.permit(req, |p| p.watch = Some(watching))?;
                            return Ok(Poll::Waiting(wake));
                        }
                    };
                    let (lease, fence, leased) = self.take_lease(req, count, slot, &session, &leases).await?;
                    if leased.len() <= count as usize && leased.contains(&lease) {
                        self.let_go_of_mutex(req).await?;
                        return Ok(Poll::Held(fence));
                    }
                }
            }
        }
    }

    /// Holding the mutex: creates this request's lease in `slot` and checks
    /// its count against another dlock lease. Returns the lease, its fence
    /// and the leases listed right behind its create.
    async fn take_lease(
        &self,
        req: &Request,
        count: u32,
        slot: u32,
        session: &Session,
        leases: &str,
    ) -> Result<(String, u64, Vec<String>), EngineError> {
        let prefix = format!("{leases}/{}", nodes::semaphore_node_prefix(req.owner, Some(slot)));
        let ((lease, fence, listed), _) = self
            .create_and_list(session, leases, &prefix, &data(count, &self.label), req, None)
            .await?;
        self.permit(req, |p| p.lease = Some((lease.clone(), fence)))?;
        let listed = match listed {
            Some(listed) => listed,
            None => session
                .retry(|| session.client.list_children(leases))
                .await
                .map_err(|e| session.failed(e))?,
        };
        for other in listed.iter().filter(|&other| *other != lease) {
            let other = format!("{leases}/{other}");
            match session.retry(|| session.client.get_data(&other)).await {
                Ok((data, _)) => match written(&data) {
                    Some((in_use, _)) if in_use != count => {
                        self.permit_remove(req).await?;
                        return Err(EngineError::PermitsDiffer { in_use });
                    }
                    Some(_) => break,
                    None => {} // Curator's: no count to check.
                },
                Err(ZkError::NoNode) => {}
                Err(e) => return Err(session.failed(e)),
            }
        }
        Ok((lease, fence, listed))
    }

    /// Holding a permit, lets the semaphore's mutex go to the next in line,
    /// without waiting for the answer: the permit does not depend on it,
    /// nor on its order with a release's delete of the lease.
    async fn let_go_of_mutex(&self, req: &Request) -> Result<(), EngineError> {
        let (session, queued) = self.permit(req, |p| (p.session.clone(), p.queued.take()))?;
        if let Some(queued) = queued {
            let path = format!("{}/{SEMAPHORE_LOCKS}/{queued}", self.semaphore_path(req));
            tokio::spawn(async move { delete(&session, path).await });
        }
        Ok(())
    }

    /// Deletes this request's lease and its place in the mutex's line;
    /// `Ok(false)` if it had no lease left.
    async fn permit_remove(&self, req: &Request) -> Result<bool, EngineError> {
        let Some(permit) = PermitState::of(req).lock().take() else {
            return Ok(false);
        };
        if permit.session.is_ended() {
            return Ok(false);
        }
        let path = self.semaphore_path(req);
        // The lease first: the next mutex holder must not count it.
        let mut removed = false;
        if let Some((lease, _)) = permit.lease {
            removed = delete(&permit.session, format!("{path}/{SEMAPHORE_LEASES}/{lease}")).await;
        }
        if let Some(queued) = permit.queued {
            delete(&permit.session, format!("{path}/{SEMAPHORE_LOCKS}/{queued}")).await;
        }
        Ok(removed)
    }
}

/// The count and label in a dlock semaphore node's data; `None` for a
/// Curator node. A lease of dlock before holder records has no label.
pub(super) fn written(data: &[u8]) -> Option<(u32, Option<&str>)> {
    let text = std::str::from_utf8(data).ok()?;
    let (first, label) = match text.split_once('\n') {
        Some((first, label)) => (first, Some(label)),
        None => (text, None),
    };
    Some((first.strip_prefix(DATA)?.parse().ok()?, label))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dlock_lease_tells_its_count_and_label_and_a_curator_lease_does_not() {
        assert_eq!(written(&data(5, "billing 7")), Some((5, Some("billing 7"))));
        assert_eq!(written(format!("{DATA}5").as_bytes()), Some((5, None)));
        assert_eq!(written(b"10.1.2.3"), None);
    }
}
