//! The table of holds, by task: where a task's nested acquisitions find the
//! hold it already has, and where a share handed to another task is filed
//! for that task too.

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::sync::{Arc, LazyLock, Mutex, MutexGuard};
use std::thread::ThreadId;

use crate::LockKey;
use crate::key::shard_of;
use crate::kit::{KeyHashing, Request};
use crate::registry::Group;

use super::{Hold, lock};

/// Who reentrancy is scoped to: the tokio task, or the thread for code that runs
/// outside any task (`block_on`, whose future never changes thread).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub(crate) enum TaskKey {
    Task(tokio::task::Id),
    Thread(ThreadId),
}

impl TaskKey {
    pub fn current() -> Self {
        match tokio::task::try_id() {
            Some(id) => TaskKey::Task(id),
            None => TaskKey::Thread(std::thread::current().id()),
        }
    }
}

/// Where a hold is filed: the engine instance is part of it, so the same name
/// on two engines is two locks; and a semaphore is not the lock of its name.
#[derive(Clone, PartialEq, Eq, Hash)]
pub(super) struct HoldKey {
    task: TaskKey,
    engine: usize,
    key: LockKey,
    semaphore: bool,
}

impl HoldKey {
    pub(super) fn new(task: TaskKey, group: &Group, key: &LockKey, semaphore: bool) -> Self {
        HoldKey {
            task,
            // The hold keeps the engine alive, so its address is not reused while filed.
            engine: engine_id(group),
            key: key.clone(),
            semaphore,
        }
    }

    pub(super) fn shard(&self) -> MutexGuard<'static, HashMap<HoldKey, Arc<Hold>, KeyHashing>> {
        lock(&TABLE[shard_of::<SHARDS>(self)])
    }
}

/// Tells engine instances apart: the same name on two engines is two locks.
pub(crate) fn engine_id(group: &Group) -> usize {
    Arc::as_ptr(&group.engine) as *const () as usize
}

const SHARDS: usize = 32;
type Shard = Mutex<HashMap<HoldKey, Arc<Hold>, KeyHashing>>;
static TABLE: LazyLock<[Shard; SHARDS]> = LazyLock::new(|| std::array::from_fn(|_| Shard::default()));

/// Every hold filed for the current task.
pub(crate) fn held_by_this_task() -> Vec<Arc<Hold>> {
    let task = TaskKey::current();
    TABLE
        .iter()
        .flat_map(|shard| {
            lock(shard)
                .iter()
                .filter(|(filed, _)| filed.task == task)
                .map(|(_, hold)| hold.clone())
                .collect::<Vec<_>>()
        })
        .collect()
}

/// The holds of `req`'s lock (or semaphore) on `group`'s engine filed for
/// other tasks of this process, each once (a share is filed for every task
/// it was handed to): what a task waiting for it may be waiting on.
pub(crate) fn held_by_other_tasks(group: &Group, req: &Request) -> Vec<Arc<Hold>> {
    let (task, engine) = (TaskKey::current(), engine_id(group));
    let semaphore = req.permits().is_some();
    let mut holds: Vec<Arc<Hold>> = Vec::new();
    for shard in TABLE.iter() {
        for (filed, hold) in lock(shard).iter() {
            let theirs = filed.engine == engine
                && filed.key == req.key
                && filed.semaphore == semaphore
                && filed.task != task;
            if theirs && !holds.iter().any(|h| Arc::ptr_eq(h, hold)) {
                holds.push(hold.clone());
            }
        }
    }
    holds
}

/// A hold filed for a task other than the one that took it, for as long as
/// it lives.
pub(crate) struct Filed {
    filed: Option<HoldKey>,
    hold: Arc<Hold>,
}

impl Drop for Filed {
    fn drop(&mut self) {
        if let Some(filed) = self.filed.take() {
            let mut table = filed.shard();
            if table.get(&filed).is_some_and(|h| Arc::ptr_eq(h, &self.hold)) {
                table.remove(&filed);
            }
        }
    }
}

/// Files `hold` for the current task too, so that the task's nested
/// acquisitions reenter it; undone when the returned value drops.
pub(super) fn file_for_this_task(hold: &Arc<Hold>) -> Filed {
    let filed = HoldKey {
        task: TaskKey::current(),
        ..hold.filed.clone()
    };
    let filed = match filed.shard().entry(filed.clone()) {
        Entry::Vacant(v) => {
            v.insert(hold.clone());
            Some(filed)
        }
        // This task holds the lock already: that hold serves.
        Entry::Occupied(_) => None,
    };
    Filed {
        filed,
        hold: hold.clone(),
    }
}
