//! The exclusion check the suites share: a counter incremented by a read, a
//! pause and a write inside the lock, and a count of holders that found
//! another inside. It comes out exact, with no overlap, only if no two
//! holders overlapped.

use std::sync::atomic::{AtomicU64, Ordering};

/// A counter that notices overlapping holders; see the module docs.
#[derive(Default)]
pub struct GuardedCounter {
    counter: AtomicU64,
    inside: AtomicU64,
    overlaps: AtomicU64,
}

impl GuardedCounter {
    /// One increment; call it while holding the lock.
    pub async fn increment(&self) {
        if self.inside.fetch_add(1, Ordering::SeqCst) != 0 {
            self.overlaps.fetch_add(1, Ordering::SeqCst);
        }
        let seen = self.counter.load(Ordering::SeqCst);
        tokio::task::yield_now().await;
        self.counter.store(seen + 1, Ordering::SeqCst);
        self.inside.fetch_sub(1, Ordering::SeqCst);
    }

    /// Increments so far: exact only if no holders overlapped.
    pub fn count(&self) -> u64 {
        self.counter.load(Ordering::SeqCst)
    }

    /// Increments that found another holder inside.
    pub fn overlaps(&self) -> u64 {
        self.overlaps.load(Ordering::SeqCst)
    }
}
