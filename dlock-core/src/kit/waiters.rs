//! Which locks this process waits for: for engines whose newcomer skips its
//! try while a waiter of the same process is queued for the lock (it could
//! only be refused), and that wake their own waiters when they let go.

use std::collections::HashMap;
use std::future::Future;
use std::hash::Hash;
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::Notify;

/// Waiters per lock key, counted, with a way to wake them.
pub struct Waiters<K> {
    keys: Mutex<HashMap<K, (usize, Arc<Notify>)>>,
}

impl<K: Hash + Eq + Clone> Default for Waiters<K> {
    fn default() -> Self {
        Waiters {
            keys: Mutex::default(),
        }
    }
}

impl<K: Hash + Eq + Clone> Waiters<K> {
    fn keys(&self) -> MutexGuard<'_, HashMap<K, (usize, Arc<Notify>)>> {
        self.keys.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// One more waiter for `key`.
    pub fn join(&self, key: &K) {
        self.keys().entry(key.clone()).or_default().0 += 1;
    }

    /// One waiter fewer for `key`.
    pub fn leave(&self, key: &K) {
        let mut keys = self.keys();
        if let Some((count, _)) = keys.get_mut(key) {
            *count -= 1;
            if *count == 0 {
                keys.remove(key);
            }
        }
    }

    /// Whether any request of this process waits for `key`.
    pub fn any(&self, key: &K) -> bool {
        self.keys().contains_key(key)
    }

    /// Wakes every waiter for `key` that awaits [`Waiters::woken`].
    pub fn wake(&self, key: &K) {
        if let Some((_, notify)) = self.keys().get(key) {
            notify.notify_waiters();
        }
    }

    /// Resolves at the next [`Waiters::wake`] of `key` from now on (even
    /// before it is first polled); never, if nobody waits for the key.
    pub fn woken(&self, key: &K) -> impl Future<Output = ()> + Send + 'static {
        let notified = self
            .keys()
            .get(key)
            .map(|(_, notify)| notify.clone().notified_owned());
        async move {
            match notified {
                Some(notified) => notified.await,
                None => std::future::pending().await,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_per_key_and_forgets_a_key_nobody_waits_for() {
        let waiters = Waiters::default();
        waiters.join(&1);
        waiters.join(&1);
        waiters.leave(&1);
        assert!(waiters.any(&1));
        waiters.leave(&1);
        assert!(!waiters.any(&1));
        waiters.leave(&2);
        assert!(!waiters.any(&2));
    }

    #[tokio::test]
    async fn a_wake_reaches_those_already_waiting() {
        let waiters = Arc::new(Waiters::default());
        waiters.join(&"k");
        let woken = waiters.woken(&"k");
        waiters.wake(&"k");
        tokio::time::timeout(std::time::Duration::from_secs(1), woken)
            .await
            .expect("woken");
    }
}
