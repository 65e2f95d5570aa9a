//! Writes that land only while the hold is current: one `multi`, sent on
//! the session that made the hold's node, that first checks the node
//! exists, then makes the user's creates, sets and deletes. The node is
//! ephemeral and named for its owner, so it exists only while that
//! session lives and the hold was not forced out (a force release deletes
//! it). Its version is not compared: a revocation writes the node while
//! the hold stays current.
//!
//! The server's refusals: the node gone (`NoNode` on the check), or the
//! session expired (`SessionExpired`, what a holder paused past its session
//! timeout hears when it resumes). A `sync` goes first, on the same
//! session, so that such a holder hears that rather than have its write
//! fail on the connection its client gives up on. An operation of the user's that fails
//! for its own reason (a node that exists, a version of the user's that
//! does not match) applies nothing either, and answers the engine's error.

use dlock_core::kit::{EngineError, HeldBy, held_by};
use dlock_core::{Error, HeldLock};
use zookeeper_client::{CheckWriteError, CreateOptions, Error as ZkError, MultiWriteError, MultiWriteResult};

use super::ZooKeeperEngine;

/// A hold's writes to ZooKeeper, made in one `multi` only if the hold's
/// node still exists: a holder whose session expired (paused past its
/// session timeout), or that was forced out, writes nothing. A lock's
/// holder (write or read), a permit's and a leader's may write.
///
/// An operation of the user's that the server refuses (a create of a node
/// that exists, a set or delete whose version does not match) fails the
/// whole `multi`, and `commit` answers `Error::Engine` whose source is
/// [`MultiWriteError::OperationFailed`], indexed from the first operation
/// added here; the hold goes on.
///
/// ```no_run
/// # async fn demo() -> Result<(), dlock::Error> {
/// use dlock::engines::zookeeper::HeldMulti;
/// use dlock::engines::zookeeper::zookeeper_client::{Acls, CreateMode};
///
/// let guard = dlock::lock("jobs", "import").lock().await?;
/// let options = CreateMode::Persistent.with_acls(Acls::anyone_all());
/// // Err(Lost) if the hold has ended: then nothing was written.
/// HeldMulti::of(&guard)?
///     .set_data("/app/cursor", b"4096", None)
///     .create("/app/done/batch-7", b"", &options)
///     .commit()
///     .await?;
/// # Ok(())
/// # }
/// ```
pub struct HeldMulti<'a> {
    held: HeldBy<'a, ZooKeeperEngine>,
    ops: Vec<Op<'a>>,
}

enum Op<'a> {
    Create {
        path: String,
        data: Vec<u8>,
        options: CreateOptions<'a>,
    },
    SetData {
        path: String,
        data: Vec<u8>,
        version: Option<i32>,
    },
    Delete {
        path: String,
        version: Option<i32>,
    },
}

impl<'a> HeldMulti<'a> {
    /// The held writes of `guard`'s hold; `Unsupported` where it is not on
    /// a ZooKeeper engine.
    pub fn of(guard: &'a impl AsRef<HeldLock>) -> Result<Self, Error> {
        let held = held_by(guard.as_ref(), "zookeeper::HeldMulti")?;
        Ok(HeldMulti {
            held,
            ops: Vec::new(),
        })
    }

    /// Creates the node `path` with `data`, with the others.
    pub fn create(mut self, path: &str, data: &[u8], options: &CreateOptions<'a>) -> Self {
        self.ops.push(Op::Create {
            path: path.to_owned(),
            data: data.to_vec(),
            options: options.clone(),
        });
        self
    }

    /// Sets the data of the node `path`, if its version is `version`
    /// (`None`: any), with the others.
    pub fn set_data(mut self, path: &str, data: &[u8], version: Option<i32>) -> Self {
        self.ops.push(Op::SetData {
            path: path.to_owned(),
            data: data.to_vec(),
            version,
        });
        self
    }

    /// Deletes the node `path`, if its version is `version` (`None`: any),
    /// with the others.
    pub fn delete(mut self, path: &str, version: Option<i32>) -> Self {
        self.ops.push(Op::Delete {
            path: path.to_owned(),
            version,
        });
        self
    }

    /// Makes the writes, all or none, if the hold is still current, and
    /// answers each one's result, in order; `Err(Lost)`, with nothing
    /// written, otherwise. Sent once: should the answer not come within
    /// `call_timeout`, or the connection drop before it, the error says so
    /// and whether they landed is unknown.
    pub async fn commit(self) -> Result<Vec<MultiWriteResult>, Error> {
        let engine = self.held.store();
        let req = self.held.request();
        let node = match self.held.is_permit() {
            true => engine.lease_node(req),
            false => engine.held_node(req),
        };
        let ops = self.ops;
        self.held
            .write(async move {
                let Some((session, path)) = node else {
                    return Ok(None);
                };
                let mut multi = session
                    .client
                    .new_check_writer(&path, None)
                    .map_err(EngineError::failed)?;
                for (index, op) in ops.iter().enumerate() {
                    let added = match op {
                        Op::Create { path, data, options } => multi.add_create(path, data, options),
                        Op::SetData { path, data, version } => multi.add_set_data(path, data, *version),
                        Op::Delete { path, version } => multi.add_delete(path, *version),
                    };
                    // A path the client refuses: nothing is sent.
                    added.map_err(|source| {
                        EngineError::failed(MultiWriteError::OperationFailed { index, source })
                    })?;
                }
                // A holder resuming from a pause has a connection its client
                // is about to give up on, which would fail the write with its
                // outcome unknown: a sync first, tried again over that, puts
                // the write on a live connection, or hears the session expired.
                match session.retry(|| session.client.sync(&path)).await {
                    Ok(()) => {}
                    Err(ZkError::SessionExpired) => return Ok(None),
                    Err(e) => return Err(session.failed(e)),
                }
                match multi.commit().await {
                    Ok(results) => Ok(Some(results)),
                    Err(
                        CheckWriteError::CheckFailed {
                            source: ZkError::NoNode,
                        }
                        | CheckWriteError::RequestFailed {
                            source: ZkError::SessionExpired,
                        },
                    ) => Ok(None),
                    Err(CheckWriteError::OperationFailed { index, source }) => {
                        Err(EngineError::failed(MultiWriteError::OperationFailed {
                            index,
                            source,
                        }))
                    }
                    Err(e) => Err(session.failed(e.into())),
                }
            })
            .await
    }
}
