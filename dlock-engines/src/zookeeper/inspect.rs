//! `inspect` and `list`: the nodes read back in few round trips, each wave
//! of reads in multi-reads sent together (ZooKeeper 3.6 and later, as
//! Curator 5 needs too). Inspecting a lock or semaphore takes two waves:
//! the children, then their data and stats. Listing a group takes one more
//! first, the group's children. The first wave follows a `sync`, so that a
//! follower has caught up with its leader before answering: a hold made
//! through another member shows at once.

use dlock_core::kit::{EngineError, percent_unescape};
use dlock_core::{LockKey, LockView};
use zookeeper_client::{Error as ZkError, MultiReadResult};

use super::ZooKeeperEngine;
use super::nodes::{SEMAPHORE, SEMAPHORE_LEASES, SEMAPHORE_LOCKS};
use super::records::{self, Found};
use super::session::Session;

/// Reads per multi-read: a few hundred nodes' data and stats stay far
/// below the server's 1 MB packet limit.
const CHUNK: usize = 256;

/// What a child of a group's path is.
enum Listed {
    Lock(LockKey, String),
    Semaphore(LockKey, String),
}

impl ZooKeeperEngine {
    /// Who holds and waits for the lock `key`, or with `permits` its
    /// semaphore.
    pub(super) async fn view(&self, key: &LockKey, permits: Option<u32>) -> Result<LockView, EngineError> {
        let session = self.sessions.live().await?;
        let path = key.path(&self.root);
        let Some(asked) = permits else {
            let found = gather(&session, Some(&path), std::slice::from_ref(&path))
                .await?
                .pop();
            return Ok(records::lock_view(key, &found.unwrap_or_default()));
        };
        let dirs = semaphore_dirs(&format!("{path}{SEMAPHORE}"));
        let mut found = gather(&session, Some(&path), &dirs).await?.into_iter();
        let (leases, locks) = (found.next().unwrap_or_default(), found.next().unwrap_or_default());
        let count = records::count_of(&leases, &locks).unwrap_or(asked);
        Ok(records::semaphore_view(key, count, leases, locks))
    }

    /// Every lock and semaphore of `group` someone holds or waits for, by
    /// name. A semaphore only Curator uses tells no count, so it is left
    /// out, as is a path no dlock name escapes to.
    pub(super) async fn views(&self, group: &str) -> Result<Vec<LockView>, EngineError> {
        let session = self.sessions.live().await?;
        let dir = &group_dir(&self.root, group)?;
        let children = read_children(&session, Some(dir), &[dir.to_owned()]).await?.pop();
        let listed: Vec<Listed> = children
            .unwrap_or_default()
            .iter()
            .filter_map(|child| self.listed(group, dir, child))
            .collect();
        let dirs: Vec<String> = listed
            .iter()
            .flat_map(|l| match l {
                Listed::Lock(_, path) => vec![path.clone()],
                Listed::Semaphore(_, path) => Vec::from(semaphore_dirs(path)),
            })
            .collect();
        let mut found = gather(&session, None, &dirs).await?.into_iter();
        let mut views = Vec::new();
        for l in &listed {
            let view = match l {
                Listed::Lock(key, _) => Some(records::lock_view(key, &found.next().unwrap_or_default())),
                Listed::Semaphore(key, _) => {
                    let (leases, locks) =
                        (found.next().unwrap_or_default(), found.next().unwrap_or_default());
                    records::count_of(&leases, &locks)
                        .map(|count| records::semaphore_view(key, count, leases, locks))
                }
            };
            views.extend(view);
        }
        Ok(views)
    }

    /// The lock or semaphore at `child` of the group's path `dir`, if some
    /// name escapes to exactly it.
    fn listed(&self, group: &str, dir: &str, child: &str) -> Option<Listed> {
        let (escaped, semaphore) = match child.strip_suffix(SEMAPHORE) {
            Some(escaped) => (escaped, true),
            None => (child, false),
        };
        let key = LockKey::new(group, percent_unescape(escaped)?).ok()?;
        let path = key.path(&self.root);
        if path.strip_prefix(dir)?.strip_prefix('/')? != escaped {
            return None;
        }
        Some(if semaphore {
            Listed::Semaphore(key, format!("{path}{SEMAPHORE}"))
        } else {
            Listed::Lock(key, path)
        })
    }
}

/// Where a semaphore at `path` keeps its leases and its mutex line.
pub(super) fn semaphore_dirs(path: &str) -> [String; 2] {
    [
        format!("{path}/{SEMAPHORE_LEASES}"),
        format!("{path}/{SEMAPHORE_LOCKS}"),
    ]
}

/// The nodes under each of `dirs`, in two waves: the children of all, then
/// every child's data and stat. A node gone in between is left out.
pub(super) async fn gather(
    session: &Session,
    sync: Option<&str>,
    dirs: &[String],
) -> Result<Vec<Vec<Found>>, EngineError> {
    let children = read_children(session, sync, dirs).await?;
    let paths: Vec<String> = dirs
        .iter()
        .zip(&children)
        .flat_map(|(dir, names)| names.iter().map(move |name| format!("{dir}/{name}")))
        .collect();
    let mut read = read_all(session, None, &paths, true).await?.into_iter();
    let mut found = Vec::with_capacity(dirs.len());
    for names in children {
        let mut nodes = Vec::with_capacity(names.len());
        for name in names {
            match read.next() {
                Some(MultiReadResult::Data { data, stat }) => nodes.push(Found::new(name, data, &stat)),
                Some(MultiReadResult::Error { err: ZkError::NoNode }) => {}
                Some(MultiReadResult::Error { err }) => return Err(session.failed(err)),
                _ => return Err(EngineError::failed("unexpected answer to a read of data")),
            }
        }
        found.push(nodes);
    }
    Ok(found)
}

/// The node of `group` under `root`, as the locks' paths escape it.
pub(super) fn group_dir(root: &str, group: &str) -> Result<String, EngineError> {
    let probe = LockKey::new(group, "-").map_err(EngineError::failed)?.path(root);
    Ok(probe[..probe.len() - "/-".len()].to_owned())
}

/// The children of each of `dirs`; none for a path that is gone.
pub(super) async fn read_children(
    session: &Session,
    sync: Option<&str>,
    dirs: &[String],
) -> Result<Vec<Vec<String>>, EngineError> {
    read_all(session, sync, dirs, false)
        .await?
        .into_iter()
        .map(|read| match read {
            MultiReadResult::Children { children } => Ok(children),
            MultiReadResult::Error { err: ZkError::NoNode } => Ok(Vec::new()),
            MultiReadResult::Error { err } => Err(session.failed(err)),
            _ => Err(EngineError::failed("unexpected answer to a read of children")),
        })
        .collect()
}

/// Reads the data (or the children) of every path, `CHUNK` to a
/// multi-read, all sent before any answer is awaited: one round trip.
/// With `sync`, a sync of that path goes first: ZooKeeper serves one
/// session's requests in order, so the reads see what the leader had.
async fn read_all(
    session: &Session,
    sync: Option<&str>,
    paths: &[String],
    data: bool,
) -> Result<Vec<MultiReadResult>, EngineError> {
    let client = &session.client;
    let read = || async move {
        let synced = sync.map(|path| client.sync(path));
        let mut chunks = Vec::new();
        for chunk in paths.chunks(CHUNK) {
            let mut reader = client.new_multi_reader();
            for path in chunk {
                if data {
                    reader.add_get_data(path)?;
                } else {
                    reader.add_get_children(path)?;
                }
            }
            chunks.push(reader.commit());
        }
        if let Some(synced) = synced {
            synced.await?;
        }
        let mut read = Vec::with_capacity(paths.len());
        for chunk in chunks {
            read.extend(chunk.await?);
        }
        Ok(read)
    };
    session.retry(read).await.map_err(|e| session.failed(e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_escaped_name_reads_back() {
        for name in ["plain", "a/b%c", "..", "naïve 🔒", "\u{1}"] {
            let path = LockKey::new("g", name).unwrap().path("");
            let escaped = path.rsplit('/').next().unwrap();
            assert_eq!(percent_unescape(escaped).as_deref(), Some(name), "{escaped}");
        }
    }
}
