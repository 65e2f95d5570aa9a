//! The engine's copy of the bucket's live keys, kept by one watch.
//!
//! One ordered consumer per engine reads the bucket from the last message
//! of each key on, then every change as the stream orders it. The copy is
//! whole up to a revision once that first read is done, then up to each
//! message it applies. A request that wrote at revision `r` reads its line
//! only from a copy whole up to `r`: it holds every key written before, so
//! a contender that finds none ahead of it in the copy has none ahead on
//! the server (a key the copy still shows may since have gone, which only
//! makes it wait). A
//! change to a line wakes that line's waiters at once: the handoff is the
//! release's message reaching them. A reconnection reads the bucket
//! again from the start.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use async_nats::jetstream::{self, consumer::DeliverPolicy, consumer::push::OrderedConfig};
use futures_util::StreamExt;
use tokio::sync::{Notify, watch};

use super::keys::{Line, Stake};

/// A live key, as its last message left it.
#[derive(Clone, Debug)]
pub(crate) struct Found {
    pub key: String,
    /// Its last message's revision.
    pub revision: u64,
    /// Its first message's: its place in line and fence.
    pub created: u64,
    pub stake: Stake,
}

#[derive(Default)]
struct Copy {
    /// The revision up to which the copy is whole; 0 while it is read.
    whole: u64,
    keys: HashMap<String, Found>,
    /// Each line's contenders by place, and the signal its waiters await.
    lines: HashMap<Line, Queue>,
    /// Each watched group's signal (by its escaped name): a hold or a
    /// request began or ended, or changed its mode or mark.
    groups: HashMap<String, watch::Sender<()>>,
}

struct Queue {
    order: BTreeMap<u64, String>,
    /// The writers' places: whether one is ahead is one look, however long
    /// the line.
    writers: BTreeSet<u64>,
    changed: watch::Sender<()>,
}

impl Default for Queue {
    fn default() -> Self {
        Queue {
            order: BTreeMap::new(),
            writers: BTreeSet::new(),
            changed: watch::channel(()).0,
        }
    }
}

/// Where a request's key stands in its line.
pub(crate) struct Standing {
    /// Whether the key is in the copy.
    pub present: bool,
    /// The revision the copy is whole up to.
    pub whole: u64,
    /// Keys ahead of it, counted up to the cap asked for.
    pub ahead: usize,
    /// Whether a writer is ahead of it.
    pub writer_ahead: bool,
    /// A permit count other than `count` among the first keys of the line.
    pub other_count: Option<u32>,
}

/// The copy, shared with the task that keeps it.
pub(crate) struct Mirror {
    copy: Arc<Mutex<Copy>>,
    /// [`Copy::whole`], to wait on.
    applied: watch::Receiver<u64>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Mirror {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Mirror {
    /// Starts the watch of `bucket` (its `stream`); `reconnected` fires
    /// when the client connects again.
    pub fn start(
        js: jetstream::Context,
        stream: jetstream::stream::Stream,
        bucket: String,
        reconnected: Arc<Notify>,
    ) -> Mirror {
        let copy = Arc::new(Mutex::new(Copy::default()));
        let (applied_tx, applied) = watch::channel(0);
        let task = tokio::spawn(keep(
            js,
            stream,
            bucket,
            Arc::downgrade(&copy),
            applied_tx,
            reconnected,
        ));
        Mirror { copy, applied, task }
    }

    /// Waits until the copy has applied revision `revision`, or `limit`.
    pub async fn caught_up(&self, revision: u64, limit: Duration) -> Result<(), String> {
        let mut applied = self.applied.clone();
        let wait = applied.wait_for(|at| *at >= revision);
        match tokio::time::timeout(limit, wait).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(_)) => Err("the bucket's watch ended".to_owned()),
            Err(_) => Err(format!(
                "the bucket's watch did not reach revision {revision} within {limit:?}"
            )),
        }
    }

    /// A receiver that fires when a key of `line` goes, or changes its
    /// mode or mark.
    pub fn changes(&self, line: &Line) -> watch::Receiver<()> {
        let mut copy = self.copy.lock().unwrap();
        if copy.lines.len() > 2 * copy.keys.len() + 1024 {
            // Lines a waiter left while still watching, now empty.
            copy.lines
                .retain(|_, queue| !queue.order.is_empty() || queue.changed.receiver_count() > 0);
        }
        let mut rx = copy.lines.entry(line.clone()).or_default().changed.subscribe();
        rx.mark_unchanged();
        rx
    }

    /// A receiver that fires at the next change to group `group` (its
    /// escaped name, as in keys).
    pub fn group_changes(&self, group: &str) -> watch::Receiver<()> {
        let mut copy = self.copy.lock().unwrap();
        copy.groups.retain(|_, signal| signal.receiver_count() > 0);
        let signal = copy
            .groups
            .entry(group.to_owned())
            .or_insert_with(|| watch::channel(()).0);
        let mut rx = signal.subscribe();
        rx.mark_unchanged();
        rx
    }

    /// Resolves once `key` of `line` goes from the copy, or is marked
    /// asked to let go while it was not: what its holder must hear of
    /// before its next renewal. Its own renewals change neither. A key not
    /// in the copy yet (the copy being read again) is waited for first, so
    /// that its absence then is not taken for a removal over and over.
    pub fn marked(&self, line: &Line, key: &str) -> impl Future<Output = ()> + Send + 'static {
        let mut changes = self.changes(line);
        let (copy, key) = (self.copy.clone(), key.to_owned());
        let mut before = marked(&copy.lock().unwrap(), &key);
        async move {
            loop {
                let now = marked(&copy.lock().unwrap(), &key);
                match (before, now) {
                    (Some(_), None) | (Some(false), Some(true)) => return,
                    _ => before = now,
                }
                if changes.changed().await.is_err() {
                    return;
                }
            }
        }
    }

    /// Where `key`, first written at `created`, stands in `line`, from a
    /// copy whole up to `revision`: keys ahead counted up to `cap`, and
    /// the permit counts of the first `cap` keys checked against `count`;
    /// `None` if the copy is not whole (it is being read again). A few
    /// looks, however long the line.
    pub fn standing(
        &self,
        line: &Line,
        (key, created): (&str, u64),
        revision: u64,
        (cap, count): (usize, Option<u32>),
    ) -> Option<Standing> {
        let copy = self.copy.lock().unwrap();
        if copy.whole < revision {
            return None;
        }
        let mut standing = Standing {
            present: copy.keys.contains_key(key),
            whole: copy.whole,
            ahead: 0,
            writer_ahead: false,
            other_count: None,
        };
        if let Some(queue) = copy.lines.get(line) {
            standing.ahead = queue.order.range(..created).take(cap).count();
            standing.writer_ahead = queue.writers.range(..created).next().is_some();
            standing.other_count = count.and_then(|count| {
                let first = queue.order.values().take(cap).filter_map(|k| copy.keys.get(k));
                first.filter_map(|f| f.stake.k).find(|k| *k != count)
            });
        }
        Some(standing)
    }

    /// `line`'s live contenders, first in line first, from a copy whole
    /// up to `revision`, and the revision it is whole up to; `None` if it
    /// is not (it is being read again).
    pub fn line(&self, line: &Line, revision: u64) -> Option<(Vec<Found>, u64)> {
        let copy = self.copy.lock().unwrap();
        if copy.whole < revision {
            return None;
        }
        let found = match copy.lines.get(line) {
            Some(queue) => queue
                .order
                .values()
                .filter_map(|key| copy.keys.get(key).cloned())
                .collect(),
            None => Vec::new(),
        };
        Some((found, copy.whole))
    }
    /// The live key `key`.
    pub fn get(&self, key: &str) -> Option<Found> {
        self.copy.lock().unwrap().keys.get(key).cloned()
    }

    /// Every line whose prefix starts with `prefix`, with its contenders.
    pub fn lines(&self, prefix: &str) -> Vec<(Line, Vec<Found>)> {
        let copy = self.copy.lock().unwrap();
        copy.lines
            .iter()
            .filter(|(line, queue)| line.0.starts_with(prefix) && !queue.order.is_empty())
            .map(|(line, queue)| {
                let found = queue
                    .order
                    .values()
                    .filter_map(|k| copy.keys.get(k).cloned())
                    .collect();
                (line.clone(), found)
            })
            .collect()
    }
}

/// Whether `key` is marked asked to let go; `None` if it is gone.
fn marked(copy: &Copy, key: &str) -> Option<bool> {
    copy.keys.get(key).map(|found| found.stake.x)
}

impl Copy {
    fn clear(&mut self) {
        self.whole = 0;
        for signal in self.groups.values() {
            signal.send_replace(());
        }
        self.keys.clear();
        for queue in self.lines.values_mut() {
            queue.order.clear();
            queue.writers.clear();
            queue.changed.send_replace(());
        }
        self.lines.retain(|_, queue| queue.changed.receiver_count() > 0);
    }

    /// Applies one message: `stake` is `None` for a key deleted, purged or
    /// expired.
    fn apply(&mut self, key: &str, revision: u64, stake: Option<Stake>) {
        let line = Line::of(key);
        let old = self.keys.remove(key);
        if let Some(old) = &old
            && let Some(line) = &line
            && let Some(queue) = self.lines.get_mut(line)
        {
            queue.order.remove(&old.created);
            queue.writers.remove(&old.created);
        }
        let same = |old: &Found, new: &Stake| old.stake.m == new.m && old.stake.x == new.x;
        let changed = match (&old, &stake) {
            (Some(old), Some(new)) => !same(old, new),
            (None, None) => false,
            _ => true,
        };
        // What can let a waiter in or tell a holder something: a key gone,
        // a mode or a mark changed. A key joining behind, or written again
        // as it was, wakes no one.
        let moved = changed && old.is_some();
        if changed
            && let Some(group) = key.split('.').nth(1)
            && let Some(signal) = self.groups.get(group)
        {
            signal.send_replace(());
        }
        if let Some(stake) = stake {
            let created = stake.c.unwrap_or(revision);
            if let Some(line) = &line {
                let queue = self.lines.entry(line.clone()).or_default();
                queue.order.insert(created, key.to_owned());
                if stake.is_writer() {
                    queue.writers.insert(created);
                }
            }
            let found = Found {
                key: key.to_owned(),
                revision,
                created,
                stake,
            };
            self.keys.insert(key.to_owned(), found);
        }
        if let Some(line) = &line
            && let Some(queue) = self.lines.get(line)
        {
            if moved {
                queue.changed.send_replace(());
            }
            if queue.order.is_empty() && queue.changed.receiver_count() == 0 {
                self.lines.remove(line);
            }
        }
    }
}

/// Keeps the copy until the engine is dropped: reads the bucket, follows
/// it, and on an error or a reconnection reads it again.
async fn keep(
    js: jetstream::Context,
    stream: jetstream::stream::Stream,
    bucket: String,
    copy: Weak<Mutex<Copy>>,
    applied: watch::Sender<u64>,
    reconnected: Arc<Notify>,
) {
    loop {
        let followed = tokio::select! {
            result = follow(&js, &stream, &bucket, &copy, &applied) => result,
            () = reconnected.notified() => Ok(()),
        };
        if copy.strong_count() == 0 {
            return;
        }
        if followed.is_err() {
            // The server is away: the next try reads the bucket again.
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// Reads the bucket from each key's last message, then follows it.
async fn follow(
    js: &jetstream::Context,
    stream: &jetstream::stream::Stream,
    bucket: &str,
    copy: &Weak<Mutex<Copy>>,
    applied: &watch::Sender<u64>,
) -> Result<(), String> {
    let mut stream = stream.clone();
    let last = stream
        .info()
        .await
        .map_err(|e| e.to_string())?
        .state
        .last_sequence;
    let consumer = stream
        .create_consumer(OrderedConfig {
            deliver_subject: js.client().new_inbox(),
            filter_subject: format!("$KV.{bucket}.>"),
            deliver_policy: DeliverPolicy::LastPerSubject,
            ..OrderedConfig::default()
        })
        .await
        .map_err(|e| e.to_string())?;
    let mut reading = consumer.cached_info().num_pending > 0;
    let Some(shared) = copy.upgrade() else {
        return Ok(());
    };
    {
        let mut copy = shared.lock().unwrap();
        copy.clear();
        if !reading {
            copy.whole = last;
        }
        applied.send_replace(copy.whole);
    }
    drop(shared);
    let mut messages = consumer.messages().await.map_err(|e| e.to_string())?;
    let prefix = format!("$KV.{bucket}.");
    while let Some(message) = messages.next().await {
        let message = message.map_err(|e| e.to_string())?;
        let info = message.info().map_err(|e| e.to_string())?;
        let (revision, left) = (info.stream_sequence, info.pending);
        let headers = message.headers.as_ref();
        let removed =
            headers.is_some_and(|h| h.get("KV-Operation").is_some() || h.get("Nats-Marker-Reason").is_some());
        let stake = match removed {
            true => None,
            false => serde_json::from_slice::<Stake>(&message.payload).ok(),
        };
        // The first read goes by each key's last message, so it is whole
        // only once it is done: at the revision it began from, or none left.
        reading = reading && revision < last && left > 0;
        let Some(shared) = copy.upgrade() else {
            return Ok(());
        };
        let mut copy = shared.lock().unwrap();
        // A user's key (`held.rs`) is no part of any line.
        if let Some(key) = message.subject.strip_prefix(prefix.as_str())
            && !key.starts_with(super::held::DATA)
        {
            copy.apply(key, revision, stake);
        }
        if !reading {
            copy.whole = copy.whole.max(revision).max(last);
            applied.send_replace(copy.whole);
        }
    }
    Err("the bucket's watch ended".to_owned())
}
