//! The LockKeeper (ylock 4.2.2): the engine's per-lock state (the lock's
//! escaped path), kept a while after its last use so hot keys reuse it, then
//! evicted, so a service that locks millions of distinct keys (per user, per
//! order) stays bounded. Each request's own node lives with the request.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use tokio::time::Instant;

use dlock_core::LockKey;
use dlock_core::kit::KeyHashing;

struct Entry {
    path: Arc<str>,
    last_used: Instant,
}

pub(crate) struct Keeper {
    idle: Duration,
    locks: Mutex<HashMap<LockKey, Entry, KeyHashing>>,
}

impl Keeper {
    /// A keeper that evicts locks idle for `idle`, swept by a background task
    /// that ends with the keeper.
    pub fn new(idle: Duration) -> Arc<Self> {
        let keeper = Arc::new(Keeper {
            idle,
            locks: Mutex::new(HashMap::default()),
        });
        tokio::spawn(sweep(Arc::downgrade(&keeper), idle));
        keeper
    }

    /// The path of `key`, made with `path()` if not kept.
    pub fn path(&self, key: &LockKey, path: impl FnOnce() -> String) -> Arc<str> {
        let mut locks = self.locks();
        let entry = locks.entry(key.clone()).or_insert_with(|| Entry {
            path: path().into(),
            last_used: Instant::now(),
        });
        entry.last_used = Instant::now();
        entry.path.clone()
    }

    /// Locks held in memory right now, idle ones included.
    pub fn len(&self) -> usize {
        self.locks().len()
    }

    fn evict_idle(&self) {
        let now = Instant::now();
        let mut locks = self.locks();
        locks.retain(|_, e| now.duration_since(e.last_used) < self.idle);
        // A burst of distinct keys must not pin its table's memory either.
        if locks.capacity() > 4 * locks.len() + 64 {
            locks.shrink_to_fit();
        }
    }

    fn locks(&self) -> MutexGuard<'_, HashMap<LockKey, Entry, KeyHashing>> {
        self.locks.lock().unwrap_or_else(|e| e.into_inner())
    }
}

async fn sweep(keeper: Weak<Keeper>, idle: Duration) {
    let mut tick = tokio::time::interval((idle / 2).max(Duration::from_millis(10)));
    loop {
        tick.tick().await;
        match keeper.upgrade() {
            Some(keeper) => keeper.evict_idle(),
            None => return,
        }
    }
}
