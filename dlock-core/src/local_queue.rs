//! The local queue (`queue = "local"`): this process's requests for one lock,
//! in arrival order. A request goes to the engine only when its turn has come here: a writer
//! when first, a reader when no writer is ahead. An engine then sees at most
//! one writer or one run of readers per process and lock, so ten thousand
//! waiting tasks cost it one waiter instead of ten thousand, each polling
//! (or, on ZooKeeper, each listing all the others). Order stays FIFO within
//! a process and, on a fair engine, FIFO among the processes' heads.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, Mutex, MutexGuard};

use tokio::sync::Notify;

use crate::key::shard_of;
use crate::kit::KeyHashing;
use crate::{LockKey, Mode};

const SHARDS: usize = 64;

type Queues = HashMap<(usize, LockKey), Line, KeyHashing>;

static QUEUES: LazyLock<[Mutex<Queues>; SHARDS]> =
    LazyLock::new(|| std::array::from_fn(|_| Mutex::default()));
static NEXT_ID: AtomicU64 = AtomicU64::new(0);

struct Waiter {
    id: u64,
    mode: Mode,
    /// Wakes a waiter whose turn comes later; one let through as it came
    /// needs none.
    turn: Option<Arc<Notify>>,
}

/// One lock's line. The first `through` waiters have had their turn: one
/// writer, or a run of readers. Turns are counted, not searched for, so a
/// release costs the same behind ten thousand waiters as behind one.
#[derive(Default)]
struct Line {
    waiters: VecDeque<Waiter>,
    through: usize,
}

impl Line {
    /// Whether the next waiter's turn has come: a writer's when nobody is
    /// through, a reader's when only readers are.
    fn next_may_pass(&self) -> bool {
        let Some(next) = self.waiters.get(self.through) else {
            return false;
        };
        self.through == 0 || (next.mode == Mode::Read && self.waiters[0].mode == Mode::Read)
    }

    /// Lets through every waiter whose turn has come, waking each.
    fn pass(&mut self) {
        while self.next_may_pass() {
            if let Some(turn) = &self.waiters[self.through].turn {
                turn.notify_one();
            }
            self.through += 1;
        }
    }

    /// Removes waiter `id` (usually the first: the holder letting go).
    fn leave(&mut self, id: u64) {
        let at = if self.waiters.front().is_some_and(|w| w.id == id) {
            0
        } else {
            match self.waiters.iter().position(|w| w.id == id) {
                Some(at) => at,
                None => return,
            }
        };
        self.waiters.remove(at);
        if at < self.through {
            self.through -= 1;
        }
        self.pass();
    }
}

/// A request's place in its lock's local queue; leaves it when dropped.
pub(crate) struct Place {
    engine: usize,
    key: LockKey,
    id: u64,
}

impl Place {
    fn new(engine: usize, key: &LockKey) -> Place {
        Place {
            engine,
            key: key.clone(),
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
        }
    }

    /// Joins the queue of `key` on engine `engine` and waits for its turn.
    /// Cancel-safe: a dropped wait leaves the queue.
    pub async fn take(engine: usize, key: &LockKey, mode: Mode) -> Place {
        let place = Place::new(engine, key);
        let waiting = {
            let mut queues = place.shard();
            let line = queues.entry((engine, key.clone())).or_default();
            line.waiters.push_back(Waiter {
                id: place.id,
                mode,
                turn: None,
            });
            line.pass();
            (line.through < line.waiters.len()).then(|| {
                let turn = Arc::new(Notify::new());
                line.waiters.back_mut().expect("just pushed").turn = Some(turn.clone());
                turn
            })
        };
        if let Some(turn) = waiting {
            // Woken by `notify_one`, which keeps a permit if the wake comes first.
            turn.notified().await;
        }
        place
    }

    /// Takes a place only if its turn comes at once: nobody waits ahead of
    /// it, and a writer finds the line empty, a reader only readers.
    pub fn try_take(engine: usize, key: &LockKey, mode: Mode) -> Option<Place> {
        let place = Place::new(engine, key);
        let mut queues = place.shard();
        let line = queues.entry((engine, key.clone())).or_default();
        let free = line.waiters.is_empty()
            || (mode == Mode::Read
                && line.through == line.waiters.len()
                && line.waiters[0].mode == Mode::Read);
        if !free {
            return None;
        }
        line.waiters.push_back(Waiter {
            id: place.id,
            mode,
            turn: None,
        });
        line.through += 1;
        drop(queues);
        Some(place)
    }

    /// The holder now reads: readers behind it may go.
    pub fn downgrade(&self) {
        let mut queues = self.shard();
        if let Some(line) = queues.get_mut(&(self.engine, self.key.clone())) {
            if let Some(me) = line.waiters.iter_mut().find(|w| w.id == self.id) {
                me.mode = Mode::Read;
            }
            line.pass();
        }
    }

    fn shard(&self) -> MutexGuard<'static, Queues> {
        QUEUES[shard_of::<SHARDS>(&(self.engine, &self.key))]
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        let mut queues = self.shard();
        let slot = (self.engine, self.key.clone());
        let Some(line) = queues.get_mut(&slot) else {
            return;
        };
        line.leave(self.id);
        if line.waiters.is_empty() {
            queues.remove(&slot);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn writers_one_at_a_time_readers_together() {
        let key = LockKey::new("queue", "k").unwrap();
        let writer = Place::take(1, &key, Mode::Write).await;
        assert!(Place::try_take(1, &key, Mode::Read).is_none());
        assert!(
            Place::try_take(2, &key, Mode::Write).is_some(),
            "another engine is another queue"
        );
        let reader = tokio::spawn({
            let key = key.clone();
            async move { Place::take(1, &key, Mode::Read).await }
        });
        let second_writer = tokio::spawn({
            let key = key.clone();
            async move { Place::take(1, &key, Mode::Write).await }
        });
        tokio::task::yield_now().await;
        assert!(!reader.is_finished());
        writer.downgrade();
        let reader = reader.await.unwrap();
        assert!(!second_writer.is_finished());
        drop(writer);
        drop(reader);
        drop(second_writer.await.unwrap());
        let forgotten = |engine| {
            !Place {
                engine,
                key: key.clone(),
                id: u64::MAX,
            }
            .shard()
            .contains_key(&(engine, key.clone()))
        };
        assert!(forgotten(1) && forgotten(2), "an empty queue is forgotten");
    }

    #[tokio::test]
    async fn leaving_from_anywhere_keeps_the_turns_counted() {
        let key = LockKey::new("queue", "leave").unwrap();
        let first_reader = Place::take(1, &key, Mode::Read).await;
        let second_reader = Place::take(1, &key, Mode::Read).await;
        let waiting = |mode| {
            let key = key.clone();
            tokio::spawn(async move { Place::take(1, &key, mode).await })
        };
        let writer = waiting(Mode::Write);
        let cancelled = waiting(Mode::Write);
        let reader_behind = waiting(Mode::Read);
        tokio::task::yield_now().await;
        cancelled.abort();
        assert!(cancelled.await.is_err());
        // The second reader leaves first: the writer still waits for the first.
        drop(second_reader);
        tokio::task::yield_now().await;
        assert!(!writer.is_finished());
        drop(first_reader);
        let writer = writer.await.unwrap();
        tokio::task::yield_now().await;
        assert!(!reader_behind.is_finished(), "a reader passed a writer");
        assert!(Place::try_take(1, &key, Mode::Read).is_none());
        drop(writer);
        let reader = reader_behind.await.unwrap();
        assert!(
            Place::try_take(1, &key, Mode::Read).is_some(),
            "a reader joins readers at once"
        );
        assert!(Place::try_take(1, &key, Mode::Write).is_none());
        drop(reader);
        assert!(Place::try_take(1, &key, Mode::Write).is_some());
    }
}
