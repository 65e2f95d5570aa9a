//! Release notifications: one subscriber connection per engine, one channel
//! per lock and engine (`<prefix>:n:<engine id>`), fanned out in process to
//! that lock's waiters. A message goes only to the engine of the waiter now
//! first in line and names it (or `*` for a run of readers), and only that
//! waiter tries again: no herd of processes or polls on release.
//! Notifications only make waiters try sooner; polling stays the safety net,
//! so a dropped subscriber or message costs latency, never correctness.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use std::convert::Infallible;

use dlock_core::kit::{OwnerId, Wake, Woken};
use redis::aio::MultiplexedConnection;
use redis::cluster_async::ClusterConnection;
use redis::{
    AsyncConnectionConfig, Client, FromRedisValue, ProtocolVersion, PushInfo, PushKind, RedisResult,
};
use tokio::sync::broadcast;

/// How long a channel nobody waits on stays subscribed, so a waiter that
/// polls again soon finds it still there.
const LINGER: Duration = Duration::from_secs(1);

/// Messages buffered per lock for a waiter busy polling; one that falls
/// further behind just polls.
const BACKLOG: usize = 64;

/// Who a message wakes: the id of the waiter first in line, or `*` for all.
pub(crate) type Receiver = broadcast::Receiver<Arc<str>>;

type Channels = Arc<Mutex<HashMap<String, broadcast::Sender<Arc<str>>>>>;

/// Where the subscriber connects. A single server: classic pub/sub, which
/// there behaves as sharded pub/sub does. A cluster: sharded pub/sub, each
/// channel served by the node owning its slot, never broadcast cluster-wide.
pub(crate) enum Source {
    Single(Box<Client>),
    Cluster(super::connection::Seeds),
    /// The primary Sentinel names when the subscriber (re)connects.
    Sentinel(Arc<super::connection::Primary>),
}

impl Source {
    /// How often the server moved: a subscriber on an old primary that
    /// still answers hears nothing published on the new one.
    fn moves(&self) -> u64 {
        match self {
            Source::Sentinel(primary) => primary.switches(),
            _ => 0,
        }
    }
}

/// The subscriber connection, RESP3: messages arrive as pushes.
enum Sink {
    Single(MultiplexedConnection),
    Cluster(ClusterConnection),
}

impl Sink {
    async fn subscribe(&mut self, channel: &str) -> RedisResult<()> {
        match self {
            Sink::Single(connection) => connection.subscribe(channel).await,
            Sink::Cluster(connection) => connection.ssubscribe(channel).await,
        }
    }

    async fn unsubscribe(&mut self, channels: &[String]) -> RedisResult<()> {
        match self {
            Sink::Single(connection) => connection.unsubscribe(channels).await,
            Sink::Cluster(connection) => connection.sunsubscribe(channels).await,
        }
    }
}

/// Connects the subscriber. Its pushes are dispatched to `channels` right
/// where the connection reads them, without a task in between: a handoff
/// reaches its waiter one task switch sooner.
async fn connect(source: &Source, channels: Channels, closed: Arc<AtomicBool>) -> Option<Sink> {
    let dispatch = move |push: PushInfo| -> Result<(), Infallible> {
        match push.kind {
            PushKind::Message | PushKind::SMessage => {
                if let [channel, payload] = &push.data[..]
                    && let (Ok(channel), Ok(payload)) = (
                        String::from_redis_value_ref(channel),
                        String::from_redis_value_ref(payload),
                    )
                    && let Some(sender) = lock(&channels).get(&channel)
                {
                    let _ = sender.send(payload.into());
                }
            }
            // Connection gone: dropping the senders wakes every waiter (they
            // poll), and the first to wait again reconnects.
            PushKind::Disconnection => {
                closed.store(true, Ordering::Relaxed);
                lock(&channels).clear();
            }
            _ => {}
        }
        Ok(())
    };
    match source {
        Source::Single(client) => single_sink(client, dispatch).await,
        Source::Sentinel(primary) => single_sink(&primary.client().await.ok()?, dispatch).await,
        Source::Cluster(seeds) => {
            let client = seeds
                .builder()
                .use_protocol(ProtocolVersion::RESP3)
                .push_sender(dispatch)
                .build()
                .ok()?;
            Some(Sink::Cluster(client.get_async_connection().await.ok()?))
        }
    }
}

/// A RESP3 subscriber connection to one server.
async fn single_sink(
    client: &Client,
    dispatch: impl Fn(PushInfo) -> Result<(), Infallible> + Send + Sync + 'static,
) -> Option<Sink> {
    let info = client.get_connection_info().clone();
    let resp3 = info.redis_settings().clone().set_protocol(ProtocolVersion::RESP3);
    let client = Client::open(info.set_redis_settings(resp3)).ok()?;
    let config = AsyncConnectionConfig::new().set_push_sender(dispatch);
    let connection = client
        .get_multiplexed_async_connection_with_config(&config)
        .await
        .ok()?;
    Some(Sink::Single(connection))
}

fn lock(channels: &Channels) -> MutexGuard<'_, HashMap<String, broadcast::Sender<Arc<str>>>> {
    channels.lock().unwrap_or_else(|e| e.into_inner())
}

pub(crate) struct Notifier {
    source: Source,
    /// The connected subscriber; a plain mutex so every waiter's look-up
    /// succeeds at once (a `try_lock` that fails under contention would send
    /// waiters back to polling).
    live: Mutex<Option<Live>>,
    /// Held while connecting, so concurrent first waiters connect once.
    connecting: tokio::sync::Mutex<()>,
}

#[derive(Clone)]
struct Live {
    sink: Arc<tokio::sync::Mutex<Sink>>,
    channels: Channels,
    /// Set when the connection drops.
    closed: Arc<AtomicBool>,
    /// The source's moves when it connected (see [`Source::moves`]).
    moves: u64,
}

impl Notifier {
    pub fn new(source: Source) -> Self {
        Notifier {
            source,
            live: Mutex::new(None),
            connecting: tokio::sync::Mutex::new(()),
        }
    }

    /// A receiver of the next notifications for `channel`, if the channel is
    /// already subscribed (cheap: no round trip).
    pub fn existing(&self, channel: &str) -> Option<Receiver> {
        let live = self.current()?;
        live.channels().get(channel).map(broadcast::Sender::subscribe)
    }

    fn current(&self) -> Option<Live> {
        let live = self.live.lock().unwrap_or_else(|e| e.into_inner()).clone()?;
        (!live.closed.load(Ordering::Relaxed) && live.moves == self.source.moves()).then_some(live)
    }

    fn set(&self, live: Option<Live>) {
        *self.live.lock().unwrap_or_else(|e| e.into_inner()) = live;
    }

    /// Subscribes to `channel` (connecting the subscriber if needed) and
    /// returns a receiver; `None` if the subscriber cannot be set up now.
    pub async fn subscribe(&self, channel: &str) -> Option<Receiver> {
        let live = self.live().await?;
        let receiver = {
            let mut channels = live.channels();
            if let Some(sender) = channels.get(channel) {
                return Some(sender.subscribe());
            }
            let (sender, receiver) = broadcast::channel(BACKLOG);
            channels.insert(channel.to_owned(), sender);
            receiver
        };
        if live.sink.lock().await.subscribe(channel).await.is_err() {
            self.set(None);
            return None;
        }
        Some(receiver)
    }

    async fn live(&self) -> Option<Live> {
        if let Some(live) = self.current() {
            return Some(live);
        }
        let _connecting = self.connecting.lock().await;
        if let Some(live) = self.current() {
            return Some(live);
        }
        let (channels, closed) = (Channels::default(), Arc::new(AtomicBool::new(false)));
        let moves = self.source.moves();
        let sink = connect(&self.source, channels.clone(), closed.clone()).await?;
        let live = Live {
            sink: Arc::new(tokio::sync::Mutex::new(sink)),
            channels,
            closed,
            moves,
        };
        // Sweeps idle channels for as long as this subscriber is the live one.
        let (sink, channels) = (Arc::downgrade(&live.sink), live.channels.clone());
        tokio::spawn(async move {
            let mut sweep = tokio::time::interval(LINGER);
            loop {
                sweep.tick().await;
                let Some(sink) = sink.upgrade() else { return };
                unsubscribe_idle(&sink, &channels).await;
            }
        });
        self.set(Some(live.clone()));
        Some(live)
    }
}

impl Live {
    fn channels(&self) -> MutexGuard<'_, HashMap<String, broadcast::Sender<Arc<str>>>> {
        lock(&self.channels)
    }
}

/// Unsubscribes channels that no waiter has listened to since the last sweep.
async fn unsubscribe_idle(sink: &tokio::sync::Mutex<Sink>, channels: &Channels) {
    let idle: Vec<String> = {
        let mut channels = lock(channels);
        let idle: Vec<String> = channels
            .iter()
            .filter(|(_, s)| s.receiver_count() == 0)
            .map(|(c, _)| c.clone())
            .collect();
        for channel in &idle {
            channels.remove(channel);
        }
        idle
    };
    if !idle.is_empty() {
        let _ = sink.lock().await.unsubscribe(&idle).await;
    }
}

/// Resolves when a message names `owner` (`<owner>`: try again;
/// `<owner>:<fence>`: the lock was handed over, valid for `valid_for` from
/// the waiter's last call; with `None`, a handover is only a reason to try
/// again) or everyone (`*`), or when messages were lost (lagged, subscriber
/// gone): then trying again is the safe move.
pub(crate) fn wake_for(mut receiver: Receiver, owner: OwnerId, valid_for: Option<Duration>) -> Wake {
    let me = owner.to_string();
    Box::pin(async move {
        while let Ok(message) = receiver.recv().await {
            let (target, fence) = match message.split_once(':') {
                Some((target, fence)) => (target, fence.parse().ok()),
                None => (&*message, None),
            };
            if target == me
                && let (Some(fence), Some(valid_for)) = (fence, valid_for)
            {
                return Woken::Granted { fence, valid_for };
            }
            if target == me || target == "*" {
                return Woken::Retry;
            }
        }
        Woken::Retry
    })
}

/// `wake`, or a retry once `after` has passed, whichever comes first.
pub(crate) fn or_at(wake: Wake, after: Duration) -> Wake {
    Box::pin(async move {
        tokio::select! {
            woken = wake => woken,
            _ = tokio::time::sleep(after) => Woken::Retry,
        }
    })
}
