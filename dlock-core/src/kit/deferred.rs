//! A write put off until it is worth its cost. Engines whose uncontended
//! holds keep no record of their own write one only once a hold has lasted
//! [`RECORD_AFTER`]: a short hold then writes nothing, and a longer one
//! pays a write and a delete, a small share of its length. Readers of
//! records wait [`RECORD_WAIT`] for holds too young to have written.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::Duration;

use tokio::task::JoinHandle;

/// How long a hold lasts before it writes its record.
pub const RECORD_AFTER: Duration = Duration::from_millis(50);

/// How long a reader waits for a young hold to write its record: the
/// hold's wait, and time to spare for the write.
pub const RECORD_WAIT: Duration = RECORD_AFTER.saturating_mul(3);

const WAITING: u8 = 0;
const WRITING: u8 = 1;
const STOPPED: u8 = 2;

/// A write that runs on a task of its own after a delay, unless stopped
/// before.
pub struct Deferred {
    phase: Arc<AtomicU8>,
    task: JoinHandle<bool>,
}

impl Deferred {
    /// Runs `write` once `delay` has passed, unless stopped before.
    /// `write` answers whether it wrote; it is not polled before the delay.
    pub fn after<W>(delay: Duration, write: W) -> Deferred
    where
        W: Future<Output = bool> + Send + 'static,
    {
        let phase = Arc::new(AtomicU8::new(WAITING));
        let task = tokio::spawn({
            let phase = phase.clone();
            async move {
                tokio::time::sleep(delay).await;
                if phase
                    .compare_exchange(WAITING, WRITING, Ordering::SeqCst, Ordering::SeqCst)
                    .is_err()
                {
                    return false;
                }
                write.await
            }
        });
        Deferred { phase, task }
    }

    /// Stops it: whether it wrote, and so what it wrote must be removed.
    /// Stopped before its delay, it neither waits nor writes; stopped while
    /// writing, it waits for the write. A write that panicked counts as
    /// written, since it may have been.
    pub async fn stop(self) -> bool {
        if self.phase.swap(STOPPED, Ordering::SeqCst) == WAITING {
            self.task.abort();
            return false;
        }
        self.task.await.unwrap_or(true)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicBool;

    use super::*;

    fn counted(done: &Arc<AtomicBool>) -> impl Future<Output = bool> + Send + 'static {
        let done = done.clone();
        async move {
            done.store(true, Ordering::SeqCst);
            true
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_write_runs_only_once_its_delay_has_passed() {
        let done = Arc::new(AtomicBool::new(false));
        let early = Deferred::after(RECORD_AFTER, counted(&done));
        tokio::time::sleep(RECORD_AFTER / 2).await;
        assert!(!early.stop().await, "stopped before its delay");
        tokio::time::sleep(RECORD_AFTER).await;
        assert!(!done.load(Ordering::SeqCst), "a stopped write never runs");

        let late = Deferred::after(RECORD_AFTER, counted(&done));
        tokio::time::sleep(RECORD_AFTER * 2).await;
        assert!(late.stop().await, "written, so to be removed");
        assert!(done.load(Ordering::SeqCst));
    }

    #[tokio::test(start_paused = true)]
    async fn stopping_while_writing_waits_for_the_write() {
        let slow = Deferred::after(Duration::ZERO, async {
            tokio::time::sleep(RECORD_AFTER).await;
            false
        });
        tokio::time::sleep(Duration::from_millis(1)).await;
        assert!(!slow.stop().await, "the write's own answer: nothing written");
    }
}
