//! A write put off until it is worth its cost. Engines whose uncontended
//! holds keep no record of their own write one only once a hold has lasted
//! [`RECORD_AFTER`]: a short hold then writes nothing, and a longer one
//! pays a write and a delete, a small share of its length. Readers of
//! records wait [`RECORD_WAIT`] for holds too young to have written.
//!
//! One task per engine ([`Deferrals`]) keeps the writes in line and starts
//! each when it is due: a hold that ends sooner costs a place in a queue,
//! not a task and a timer of its own.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// How long a hold lasts before it writes its record.
pub const RECORD_AFTER: Duration = Duration::from_millis(50);

/// How long a reader waits for a young hold to write its record: the
/// hold's wait, and time to spare for the write.
pub const RECORD_WAIT: Duration = RECORD_AFTER.saturating_mul(3);

// A write's phase.
const WAITING: u8 = 0;
const WRITING: u8 = 1;
const STOPPED: u8 = 2;

// What a started write did.
const UNKNOWN: u8 = 0;
const WROTE: u8 = 1;
const NOTHING: u8 = 2;

type Write = Pin<Box<dyn Future<Output = bool> + Send>>;

/// One engine's put-off writes, each run `delay` after it was put off
/// unless stopped before. Dropping it drops the writes not yet started.
pub struct Deferrals {
    line: Arc<Line>,
    task: JoinHandle<()>,
}

struct Line {
    delay: Duration,
    queue: Mutex<VecDeque<(Instant, Arc<State>, Write)>>,
    /// Something joined an empty line.
    joined: Notify,
    /// Times the task woke for a write falling due.
    #[cfg(test)]
    wakes: std::sync::atomic::AtomicUsize,
}

/// One put-off write.
pub struct Deferred(Arc<State>);

#[derive(Default)]
struct State {
    phase: AtomicU8,
    outcome: AtomicU8,
    done: Notify,
}

impl Deferrals {
    /// Writes run `delay` after they are put off, by a task of their own on
    /// this runtime.
    pub fn new(delay: Duration) -> Deferrals {
        let line = Arc::new(Line {
            delay,
            queue: Mutex::default(),
            joined: Notify::new(),
            #[cfg(test)]
            wakes: Default::default(),
        });
        let task = tokio::spawn(line.clone().run());
        Deferrals { line, task }
    }

    /// Runs `write` once the delay has passed, unless stopped before.
    /// `write` answers whether it wrote; it is not polled before the delay.
    pub fn after<W>(&self, write: W) -> Deferred
    where
        W: Future<Output = bool> + Send + 'static,
    {
        let state = Arc::new(State::default());
        let due = Instant::now() + self.line.delay;
        let was_empty = {
            let mut queue = self.line.queue.lock().unwrap_or_else(|e| e.into_inner());
            queue.push_back((due, state.clone(), Box::pin(write)));
            queue.len() == 1
        };
        if was_empty {
            self.line.joined.notify_one();
        }
        Deferred(state)
    }
}

impl Drop for Deferrals {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Line {
    /// Starts each write when due: all have the same delay, so the line is
    /// in the order they fall due.
    async fn run(self: Arc<Self>) {
        loop {
            let front = {
                let mut queue = self.locked();
                // Writes stopped already leave now, wherever they are due:
                // short holds, one after another, then wake the task once
                // per delay, not at every timer tick.
                while queue
                    .front()
                    .is_some_and(|(_, state, _)| state.phase.load(Ordering::SeqCst) == STOPPED)
                {
                    queue.pop_front();
                }
                queue.front().map(|(due, ..)| *due)
            };
            let Some(due) = front else {
                self.joined.notified().await;
                continue;
            };
            tokio::time::sleep_until(due).await;
            #[cfg(test)]
            self.wakes.fetch_add(1, Ordering::SeqCst);
            let now = Instant::now();
            let mut queue = self.locked();
            while queue.front().is_some_and(|(due, ..)| *due <= now) {
                let (_, state, write) = queue.pop_front().expect("a front");
                if state
                    .phase
                    .compare_exchange(WAITING, WRITING, Ordering::SeqCst, Ordering::SeqCst)
                    .is_ok()
                {
                    tokio::spawn(async move {
                        let mut outcome = Outcome(state, WROTE);
                        outcome.1 = if write.await { WROTE } else { NOTHING };
                    });
                }
            }
        }
    }

    fn locked(&self) -> std::sync::MutexGuard<'_, VecDeque<(Instant, Arc<State>, Write)>> {
        self.queue.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Tells a stopper what a started write did once it ends, however it ends:
/// one that panicked counts as written, since it may have been.
struct Outcome(Arc<State>, u8);

impl Drop for Outcome {
    fn drop(&mut self) {
        self.0.outcome.store(self.1, Ordering::SeqCst);
        self.0.done.notify_waiters();
    }
}

impl Deferred {
    /// Stops it: whether it wrote, and so what it wrote must be removed.
    /// Stopped before its delay, it neither waits nor writes; stopped while
    /// writing, it waits for the write.
    pub async fn stop(self) -> bool {
        if self.0.phase.swap(STOPPED, Ordering::SeqCst) == WAITING {
            return false;
        }
        loop {
            let done = self.0.done.notified();
            match self.0.outcome.load(Ordering::SeqCst) {
                UNKNOWN => done.await,
                outcome => return outcome == WROTE,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicUsize;

    use super::*;

    fn counted(done: &Arc<AtomicUsize>) -> impl Future<Output = bool> + Send + 'static {
        let done = done.clone();
        async move {
            done.fetch_add(1, Ordering::SeqCst);
            true
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_write_runs_only_once_its_delay_has_passed() {
        let deferrals = Deferrals::new(RECORD_AFTER);
        let done = Arc::new(AtomicUsize::new(0));
        let early = deferrals.after(counted(&done));
        tokio::time::sleep(RECORD_AFTER / 2).await;
        assert!(!early.stop().await, "stopped before its delay");
        tokio::time::sleep(RECORD_AFTER).await;
        assert_eq!(done.load(Ordering::SeqCst), 0, "a stopped write never runs");

        let late = deferrals.after(counted(&done));
        tokio::time::sleep(RECORD_AFTER * 2).await;
        assert!(late.stop().await, "written, so to be removed");
        assert_eq!(done.load(Ordering::SeqCst), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn writes_put_off_apart_run_each_at_its_own_time() {
        let deferrals = Deferrals::new(RECORD_AFTER);
        let done = Arc::new(AtomicUsize::new(0));
        let first = deferrals.after(counted(&done));
        tokio::time::sleep(RECORD_AFTER / 2).await;
        let second = deferrals.after(counted(&done));
        tokio::time::sleep(RECORD_AFTER / 2 + Duration::from_millis(1)).await;
        assert_eq!(done.load(Ordering::SeqCst), 1, "only the first is due");
        tokio::time::sleep(RECORD_AFTER / 2).await;
        assert_eq!(done.load(Ordering::SeqCst), 2);
        assert!(first.stop().await && second.stop().await);
    }

    #[tokio::test(start_paused = true)]
    async fn short_holds_one_after_another_wake_the_task_once_per_delay() {
        let deferrals = Deferrals::new(RECORD_AFTER);
        let done = Arc::new(AtomicUsize::new(0));
        let started = Instant::now();
        while started.elapsed() < RECORD_AFTER * 4 {
            let hold = deferrals.after(counted(&done));
            tokio::time::sleep(Duration::from_millis(1)).await;
            assert!(!hold.stop().await);
        }
        let wakes = deferrals.line.wakes.load(Ordering::SeqCst);
        assert!(wakes <= 5, "woke {wakes} times in four delays");
        assert_eq!(done.load(Ordering::SeqCst), 0);
        // A write still runs on time behind the stopped ones.
        let late = deferrals.after(counted(&done));
        tokio::time::sleep(RECORD_AFTER + Duration::from_millis(1)).await;
        assert_eq!(done.load(Ordering::SeqCst), 1);
        assert!(late.stop().await);
    }

    #[tokio::test(start_paused = true)]
    async fn stopping_while_writing_waits_for_the_write() {
        let deferrals = Deferrals::new(Duration::ZERO);
        let slow = deferrals.after(async {
            tokio::time::sleep(RECORD_AFTER).await;
            false
        });
        tokio::time::sleep(Duration::from_millis(1)).await;
        assert!(!slow.stop().await, "the write's own answer: nothing written");
        let panicking = deferrals.after(async { panic!("a failed write") });
        tokio::time::sleep(Duration::from_millis(1)).await;
        assert!(panicking.stop().await, "a write that panicked may have written");
    }
}
