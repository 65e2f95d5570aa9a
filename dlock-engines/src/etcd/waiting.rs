//! A waiter's two watches, on the engine's one stream: the key ahead that
//! matters, or the semaphore's prefix for a permit's next in line (when it
//! changes or goes, the waiter looks again) and its own key
//! (a releasing holder rewrote it: the lock is handed over, see
//! `handoff.rs`; or it went with its lease: the waiter looks, finds it gone
//! and queues again).

use std::sync::Arc;
use std::time::{Duration, Instant};

use dlock_core::kit::{Wake, Woken};
use etcd_client::{Event, EventType, GetOptions, KeyValue, Txn, TxnOp, TxnOpResponse};
use tokio::sync::watch;
use tokio::task::AbortHandle;

use super::session::Session;
use super::watches::Watches;

/// What a waiter's watches said.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Signal {
    Waiting,
    /// Look again.
    Retry,
    /// Handed over: the own key's value at the handoff.
    Granted(Vec<u8>),
}

/// A key as read: its name and create revision.
pub(crate) struct Watched {
    pub key: Vec<u8>,
    pub created: i64,
}

/// What a waiter waits for ahead of it.
pub(crate) enum Ahead {
    /// This key to go or, if `put`, to change (a writer ahead may
    /// downgrade; a permit's waiter ahead be admitted).
    Key { watched: Watched, put: bool },
    /// Any key under `prefix` to go: a permit's next in line, with `count`
    /// permits.
    Deletes { prefix: Vec<u8>, count: u32 },
}

impl Ahead {
    /// The watch: key, whether a prefix, whether deletions only.
    fn watch(&self) -> (Vec<u8>, bool, bool) {
        match self {
            Ahead::Key { watched, put } => (watched.key.clone(), false, !put),
            Ahead::Deletes { prefix, .. } => (prefix.clone(), true, true),
        }
    }

    /// A read of what is ahead of `own`, for the gap before the watch.
    fn read(&self, own: &Watched) -> TxnOp {
        match self {
            Ahead::Key { watched, .. } => {
                TxnOp::get(watched.key.clone(), Some(GetOptions::new().with_keys_only()))
            }
            Ahead::Deletes { prefix, count } => TxnOp::get(
                prefix.clone(),
                Some(
                    GetOptions::new()
                        .with_prefix()
                        .with_keys_only()
                        .with_max_create_revision(own.created - 1)
                        .with_limit(i64::from(*count)),
                ),
            ),
        }
    }

    /// Whether that read shows nothing changed since `seen`.
    fn unchanged(&self, read: &[KeyValue], seen: i64) -> bool {
        match self {
            Ahead::Key { watched, .. } => read
                .first()
                .is_some_and(|kv| kv.create_revision() == watched.created && kv.mod_revision() <= seen),
            Ahead::Deletes { count, .. } => read.len() == *count as usize,
        }
    }
}

/// The watches of one waiter, stopped when dropped.
pub(crate) struct Watching {
    pub signal: watch::Receiver<Signal>,
    pub since: Instant,
    task: AbortHandle,
}

impl Drop for Watching {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Watching {
    /// Watches `own` and `ahead`, both read at revision `seen`.
    pub fn start(
        watches: Arc<Watches>,
        session: Arc<Session>,
        own: Watched,
        ahead: Ahead,
        seen: i64,
    ) -> Watching {
        let (tell, signal) = watch::channel(Signal::Waiting);
        let task = tokio::spawn(async move {
            let said = wait(&watches, &session, &own, &ahead, seen).await;
            tell.send_replace(said);
        })
        .abort_handle();
        Watching {
            signal,
            since: Instant::now(),
            task,
        }
    }

    /// The future the core awaits: resolves once the watches said something.
    pub fn wake(&self, fence: u64, valid_for: Duration) -> Wake {
        let mut signal = self.signal.clone();
        Box::pin(async move {
            match signal.wait_for(|s| *s != Signal::Waiting).await.as_deref() {
                Ok(Signal::Granted(_)) => Woken::Granted { fence, valid_for },
                _ => Woken::Retry,
            }
        })
    }
}

async fn wait(watches: &Watches, session: &Session, own: &Watched, ahead: &Ahead, seen: i64) -> Signal {
    let (key, prefix, no_put) = ahead.watch();
    let (mine, before) = tokio::join!(
        watches.watch(own.key.clone(), false, false),
        watches.watch(key, prefix, no_put)
    );
    let (Some(mut mine), Some(mut before)) = (mine, before) else {
        // The stream broke: look again, after a pause.
        tokio::time::sleep(Duration::from_millis(50)).await;
        return Signal::Retry;
    };
    // A watch starts at the server's revision when it is made: what
    // changed after `seen` and before that is read once. (Starting the
    // watches at `seen` instead leaves them "unsynced" on the server, which
    // catches them up every 100 ms: 30 handoffs in 960 then took 95 ms.)
    if mine.from.max(before.from) > seen
        && let Some(said) = read_gap(session, own, ahead, seen).await
    {
        return said;
    }
    tokio::select! {
        event = mine.changed() => handed(event, own),
        _ = before.changed() => {
            // A release that hands over rewrites this key in the revision
            // that deletes the one ahead; that event is likely right behind.
            for _ in 0..8 {
                tokio::task::yield_now().await;
                if let Some(event) = mine.try_changed() {
                    return handed(Some(event), own);
                }
            }
            Signal::Retry
        }
    }
}

/// What a change of the own key says: a rewrite of it, as created, is a
/// handoff; anything else, look again. Not its creation: a member that
/// lags behind the one that served the put may still send that event.
fn handed(event: Option<Event>, own: &Watched) -> Signal {
    match event {
        Some(e) if e.event_type() == EventType::Put => match e.kv() {
            Some(kv) if kv.create_revision() == own.created && kv.mod_revision() > own.created => {
                Signal::Granted(kv.value().to_vec())
            }
            _ => Signal::Retry,
        },
        _ => Signal::Retry,
    }
}

/// Reads the own key and what is ahead; says what changed since `seen`,
/// if anything did.
async fn read_gap(session: &Session, own: &Watched, ahead: &Ahead, seen: i64) -> Option<Signal> {
    let read = Txn::new().and_then([
        TxnOp::get(own.key.clone(), Some(GetOptions::new())),
        ahead.read(own),
    ]);
    let Ok(answer) = session.txn(read).await else {
        return Some(Signal::Retry);
    };
    let mut found = answer.op_responses().into_iter().map(|op| match op {
        TxnOpResponse::Get(mut got) => got.take_kvs(),
        _ => Vec::new(),
    });
    let (mine, before) = (found.next().unwrap_or_default(), found.next().unwrap_or_default());
    match mine.first() {
        Some(mine) if mine.create_revision() == own.created && mine.mod_revision() > own.created => {
            Some(Signal::Granted(mine.value().to_vec()))
        }
        Some(mine) if mine.create_revision() == own.created && ahead.unchanged(&before, seen) => None,
        _ => Some(Signal::Retry),
    }
}
