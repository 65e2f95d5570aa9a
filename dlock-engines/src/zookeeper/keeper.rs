//! The LockKeeper (ylock 4.2.2): the engine's per-lock state, kept a while
//! after its last request so hot keys reuse it, then evicted, so a service
//! that locks millions of distinct keys (per user, per order) stays bounded.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use tokio::time::Instant;

use dlock_core::{LockKey, OwnerId};

/// One lock path and the requests this process has on it.
pub(crate) struct Entry<N> {
    pub path: Arc<str>,
    pub nodes: HashMap<OwnerId, N>,
    last_used: Instant,
}

pub(crate) struct Keeper<N> {
    idle: Duration,
    locks: Mutex<HashMap<LockKey, Entry<N>>>,
}

impl<N: Send + 'static> Keeper<N> {
    /// A keeper that evicts locks idle for `idle`, swept by a background task
    /// that ends with the keeper.
    pub fn new(idle: Duration) -> Arc<Self> {
        let keeper = Arc::new(Keeper {
            idle,
            locks: Mutex::new(HashMap::new()),
        });
        tokio::spawn(sweep(Arc::downgrade(&keeper), idle));
        keeper
    }

    /// Runs `f` on the entry for `key`, made with `path(key)` if absent.
    pub fn with<R>(
        &self,
        key: &LockKey,
        path: impl FnOnce() -> String,
        f: impl FnOnce(&mut Entry<N>) -> R,
    ) -> R {
        let mut locks = self.locks();
        let entry = locks.entry(key.clone()).or_insert_with(|| Entry {
            path: path().into(),
            nodes: HashMap::new(),
            last_used: Instant::now(),
        });
        entry.last_used = Instant::now();
        f(entry)
    }

    /// Removes and returns `owner`'s request on `key`.
    pub fn take(&self, key: &LockKey, owner: OwnerId) -> Option<N> {
        let mut locks = self.locks();
        let entry = locks.get_mut(key)?;
        entry.last_used = Instant::now();
        entry.nodes.remove(&owner)
    }

    /// Locks held in memory right now, idle ones included.
    pub fn len(&self) -> usize {
        self.locks().len()
    }

    fn evict_idle(&self) {
        let now = Instant::now();
        let mut locks = self.locks();
        locks.retain(|_, e| !e.nodes.is_empty() || now.duration_since(e.last_used) < self.idle);
        // A burst of distinct keys must not pin its table's memory either.
        if locks.capacity() > 4 * locks.len() + 64 {
            locks.shrink_to_fit();
        }
    }

    fn locks(&self) -> MutexGuard<'_, HashMap<LockKey, Entry<N>>> {
        self.locks.lock().unwrap_or_else(|e| e.into_inner())
    }
}

async fn sweep<N: Send + 'static>(keeper: Weak<Keeper<N>>, idle: Duration) {
    let mut tick = tokio::time::interval((idle / 2).max(Duration::from_millis(10)));
    loop {
        tick.tick().await;
        match keeper.upgrade() {
            Some(keeper) => keeper.evict_idle(),
            None => return,
        }
    }
}
