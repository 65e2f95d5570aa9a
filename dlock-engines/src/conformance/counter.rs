//! The exclusion checks the suites share. For a lock: a counter incremented
//! by a read, a pause and a write inside the lock, and a count of holders
//! that found another inside; it comes out exact, with no overlap, only if
//! no two holders overlapped. For a semaphore: how many were inside at
//! most, and how many entries found the limit already reached. And a
//! register that refuses writes with a fence below one it has seen.

use std::sync::Mutex;
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

/// Holders inside a semaphore of `limit` permits; see the module docs.
pub struct Occupancy {
    limit: u64,
    inside: AtomicU64,
    most: AtomicU64,
    over: AtomicU64,
    entries: AtomicU64,
}

impl Occupancy {
    /// For a semaphore admitting `limit` at once.
    pub fn new(limit: u32) -> Self {
        Occupancy {
            limit: u64::from(limit),
            inside: AtomicU64::new(0),
            most: AtomicU64::new(0),
            over: AtomicU64::new(0),
            entries: AtomicU64::new(0),
        }
    }

    /// One holder inside for `stay`; call it while holding a permit.
    pub async fn visit(&self, stay: std::time::Duration) {
        let now = self.inside.fetch_add(1, Ordering::SeqCst) + 1;
        self.entries.fetch_add(1, Ordering::SeqCst);
        self.most.fetch_max(now, Ordering::SeqCst);
        if now > self.limit {
            self.over.fetch_add(1, Ordering::SeqCst);
        }
        tokio::time::sleep(stay).await;
        self.inside.fetch_sub(1, Ordering::SeqCst);
    }

    /// The most holders inside at once.
    pub fn most(&self) -> u64 {
        self.most.load(Ordering::SeqCst)
    }

    /// Entries that made more than the limit inside.
    pub fn over(&self) -> u64 {
        self.over.load(Ordering::SeqCst)
    }

    /// Entries in all.
    pub fn entries(&self) -> u64 {
        self.entries.load(Ordering::SeqCst)
    }
}

/// Storage that checks fencing tokens: it takes a write only if its token
/// is at least the greatest it has taken.
#[derive(Default)]
pub struct FencedRegister {
    newest: Mutex<u64>,
}

impl FencedRegister {
    /// A write with `fence`; `Err` with the newest token seen if it is stale.
    pub fn write(&self, fence: u64) -> Result<(), u64> {
        let mut newest = self.newest.lock().unwrap_or_else(|e| e.into_inner());
        if fence < *newest {
            return Err(*newest);
        }
        *newest = fence;
        Ok(())
    }
}
