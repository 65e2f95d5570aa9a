//! A waiter's two watches, on the engine's one stream: the key ahead that
//! matters (when it changes or goes, the waiter looks again) and its own key
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
    /// Watches `own` and `ahead`, both read at revision `seen`. A writer
    /// waits only for the key ahead to go (`ahead_put` false); a reader also
    /// for it to change, since a writer ahead may downgrade.
    pub fn start(
        watches: Arc<Watches>,
        session: Arc<Session>,
        own: Watched,
        ahead: Watched,
        ahead_put: bool,
        seen: i64,
    ) -> Watching {
        let (tell, signal) = watch::channel(Signal::Waiting);
        let task = tokio::spawn(async move {
            let said = wait(&watches, &session, &own, &ahead, ahead_put, seen).await;
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

async fn wait(
    watches: &Watches,
    session: &Session,
    own: &Watched,
    ahead: &Watched,
    ahead_put: bool,
    seen: i64,
) -> Signal {
    let (mine, before) = tokio::join!(
        watches.watch(own.key.clone(), false),
        watches.watch(ahead.key.clone(), !ahead_put)
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

/// Reads both keys; says what changed since `seen`, if anything did.
async fn read_gap(session: &Session, own: &Watched, ahead: &Watched, seen: i64) -> Option<Signal> {
    let read = Txn::new().and_then([
        TxnOp::get(own.key.clone(), Some(GetOptions::new())),
        TxnOp::get(ahead.key.clone(), Some(GetOptions::new().with_keys_only())),
    ]);
    let Ok(answer) = session.txn(read).await else {
        return Some(Signal::Retry);
    };
    let mut found = answer.op_responses().into_iter().map(|op| match op {
        TxnOpResponse::Get(mut got) => got.take_kvs().into_iter().next(),
        _ => None,
    });
    let (mine, before): (Option<KeyValue>, Option<KeyValue>) =
        (found.next().flatten(), found.next().flatten());
    match (mine, before) {
        (Some(mine), _) if mine.create_revision() == own.created && mine.mod_revision() > own.created => {
            Some(Signal::Granted(mine.value().to_vec()))
        }
        (Some(mine), Some(before))
            if mine.create_revision() == own.created
                && before.create_revision() == ahead.created
                && before.mod_revision() <= seen =>
        {
            None
        }
        _ => Some(Signal::Retry),
    }
}
