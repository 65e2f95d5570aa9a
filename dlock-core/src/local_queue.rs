//! The local queue (`queue = "local"`): this process's requests for one lock,
//! in arrival order. A request goes to the engine only when its turn has come here: a writer
//! when first, a reader when no writer is ahead. An engine then sees at most
//! one writer or one run of readers per process and lock, so ten thousand
//! waiting tasks cost it one waiter instead of ten thousand, each polling
//! (or, on ZooKeeper, each listing all the others). Order stays FIFO within
//! a process and, on a fair engine, FIFO among the processes' heads.

use std::collections::{HashMap, VecDeque};
use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, Mutex, MutexGuard};

use tokio::sync::Notify;

use crate::{LockKey, Mode};

const SHARDS: usize = 64;

type Queues = HashMap<(usize, LockKey), VecDeque<Waiter>>;

static QUEUES: LazyLock<[Mutex<Queues>; SHARDS]> =
    LazyLock::new(|| std::array::from_fn(|_| Mutex::default()));
static NEXT_ID: AtomicU64 = AtomicU64::new(0);

struct Waiter {
    id: u64,
    mode: Mode,
    turn: Arc<Notify>,
}

/// A request's place in its lock's local queue; leaves it when dropped.
pub(crate) struct Place {
    engine: usize,
    key: LockKey,
    id: u64,
}

impl Place {
    /// Joins the queue of `key` on engine `engine` and waits for its turn.
    /// Cancel-safe: a dropped wait leaves the queue.
    pub async fn take(engine: usize, key: &LockKey, mode: Mode) -> Place {
        let turn = Arc::new(Notify::new());
        let place = Place {
            engine,
            key: key.clone(),
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
        };
        let through = {
            let mut queues = place.shard();
            let queue = queues.entry((engine, key.clone())).or_default();
            queue.push_back(Waiter {
                id: place.id,
                mode,
                turn: turn.clone(),
            });
            turn_has_come(queue, queue.len() - 1)
        };
        if !through {
            // Woken by `notify_one`, which keeps a permit if the wake comes first.
            turn.notified().await;
        }
        place
    }

    /// Takes a place only if its turn comes at once.
    pub fn try_take(engine: usize, key: &LockKey, mode: Mode) -> Option<Place> {
        let place = Place {
            engine,
            key: key.clone(),
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
        };
        let mut queues = place.shard();
        let queue = queues.entry((engine, key.clone())).or_default();
        let free = match mode {
            Mode::Write => queue.is_empty(),
            Mode::Read => queue.iter().all(|w| w.mode == Mode::Read),
        };
        if !free {
            if queue.is_empty() {
                queues.remove(&(engine, key.clone()));
            }
            return None;
        }
        queue.push_back(Waiter {
            id: place.id,
            mode,
            turn: Arc::new(Notify::new()),
        });
        drop(queues);
        Some(place)
    }

    /// The holder now reads: readers behind it may go.
    pub fn downgrade(&self) {
        let mut queues = self.shard();
        if let Some(queue) = queues.get_mut(&(self.engine, self.key.clone())) {
            if let Some(me) = queue.iter_mut().find(|w| w.id == self.id) {
                me.mode = Mode::Read;
            }
            wake_the_turned(queue);
        }
    }

    fn shard(&self) -> MutexGuard<'static, Queues> {
        let mut hasher = std::hash::DefaultHasher::new();
        (self.engine, &self.key).hash(&mut hasher);
        QUEUES[hasher.finish() as usize % SHARDS]
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        let mut queues = self.shard();
        let slot = (self.engine, self.key.clone());
        let Some(queue) = queues.get_mut(&slot) else {
            return;
        };
        queue.retain(|w| w.id != self.id);
        if queue.is_empty() {
            queues.remove(&slot);
        } else {
            wake_the_turned(queue);
        }
    }
}

/// A writer's turn comes when it is first; a reader's when no writer is ahead.
fn turn_has_come(queue: &VecDeque<Waiter>, at: usize) -> bool {
    match queue[at].mode {
        Mode::Write => at == 0,
        Mode::Read => queue.iter().take(at).all(|w| w.mode == Mode::Read),
    }
}

/// Wakes every waiter whose turn has come: the first writer, or the readers
/// up to the first writer. A waiter already through gets a harmless permit.
fn wake_the_turned(queue: &VecDeque<Waiter>) {
    for (at, waiter) in queue.iter().enumerate() {
        if !turn_has_come(queue, at) {
            break;
        }
        waiter.turn.notify_one();
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
}
