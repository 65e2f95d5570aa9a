//! Release notifications: one subscriber connection per engine, one channel
//! per lock and engine (`<prefix>:n:<engine id>`), fanned out in process to
//! that lock's waiters. A message goes only to the engine of the waiter now
//! first in line and names it (or `*` for a run of readers), and only that
//! waiter tries again: no herd of processes or polls on release.
//! Notifications only make waiters try sooner; polling stays the safety net,
//! so a dropped subscriber or message costs latency, never correctness.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use dlock_core::{OwnerId, Wake};
use futures_util::StreamExt;
use futures_util::stream::BoxStream;
use redis::aio::PubSubSink;
use redis::cluster::ClusterClientBuilder;
use redis::cluster_async::ClusterConnection;
use redis::{Client, FromRedisValue, ProtocolVersion, PushKind, RedisResult};
use tokio::sync::{broadcast, mpsc};

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
    Cluster(Vec<String>),
}

/// The subscribing half of the subscriber connection.
enum Sink {
    Single(PubSubSink),
    Cluster(ClusterConnection),
}

impl Sink {
    async fn subscribe(&mut self, channel: &str) -> RedisResult<()> {
        match self {
            Sink::Single(sink) => sink.subscribe(channel).await,
            Sink::Cluster(connection) => connection.ssubscribe(channel).await,
        }
    }

    async fn unsubscribe(&mut self, channels: &[String]) -> RedisResult<()> {
        match self {
            Sink::Single(sink) => sink.unsubscribe(channels).await,
            Sink::Cluster(connection) => connection.sunsubscribe(channels).await,
        }
    }
}

/// (channel, payload) of every message the subscriber receives.
type Messages = BoxStream<'static, (String, String)>;

async fn connect(source: &Source) -> Option<(Sink, Messages)> {
    match source {
        Source::Single(client) => {
            let (sink, stream) = client.get_async_pubsub().await.ok()?.split();
            let messages = stream.map(|m| {
                (
                    m.get_channel_name().to_owned(),
                    m.get_payload().unwrap_or_default(),
                )
            });
            Some((Sink::Single(sink), messages.boxed()))
        }
        Source::Cluster(nodes) => {
            let (pushes, receiver) = mpsc::unbounded_channel();
            let client = ClusterClientBuilder::new(nodes.clone())
                .use_protocol(ProtocolVersion::RESP3)
                .push_sender(pushes)
                .build()
                .ok()?;
            let connection = client.get_async_connection().await.ok()?;
            let messages = futures_util::stream::unfold(receiver, |mut receiver| async move {
                loop {
                    let push = receiver.recv().await?;
                    if push.kind != PushKind::SMessage {
                        continue;
                    }
                    let mut data = push.data.into_iter();
                    if let (Some(channel), Some(payload)) = (data.next(), data.next())
                        && let (Ok(channel), Ok(payload)) = (
                            String::from_redis_value(channel),
                            String::from_redis_value(payload),
                        )
                    {
                        return Some(((channel, payload), receiver));
                    }
                }
            });
            Some((Sink::Cluster(connection), messages.boxed()))
        }
    }
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
        self.live.lock().unwrap_or_else(|e| e.into_inner()).clone()
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
        let (sink, mut stream) = connect(&self.source).await?;
        let live = Live {
            sink: Arc::new(tokio::sync::Mutex::new(sink)),
            channels: Channels::default(),
        };
        let dispatch = live.clone();
        tokio::spawn(async move {
            let mut sweep = tokio::time::interval(LINGER);
            loop {
                tokio::select! {
                    message = stream.next() => match message {
                        Some((channel, target)) => dispatch.wake(&channel, target.into()),
                        // Connection gone: dropping the senders wakes every waiter
                        // (they poll), and the next one to wait reconnects.
                        None => return dispatch.channels().clear(),
                    },
                    _ = sweep.tick() => dispatch.sweep().await,
                }
            }
        });
        self.set(Some(live.clone()));
        Some(live)
    }
}

impl Live {
    fn channels(&self) -> MutexGuard<'_, HashMap<String, broadcast::Sender<Arc<str>>>> {
        self.channels.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn wake(&self, channel: &str, target: Arc<str>) {
        if let Some(sender) = self.channels().get(channel) {
            let _ = sender.send(target);
        }
    }

    /// Unsubscribes channels that no waiter has listened to since the last sweep.
    async fn sweep(&self) {
        let idle: Vec<String> = {
            let mut channels = self.channels();
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
            let _ = self.sink.lock().await.unsubscribe(&idle).await;
        }
    }
}

/// Grants learned from notifications: owner → fence.
#[derive(Clone, Default)]
pub(crate) struct Grants(Arc<Mutex<HashMap<OwnerId, u64>>>);

impl Grants {
    pub fn take(&self, owner: OwnerId) -> Option<u64> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).remove(&owner)
    }

    fn give(&self, owner: OwnerId, fence: u64) {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(owner, fence);
    }
}

/// Resolves when a message names `owner` (`<owner>`: try again;
/// `<owner>:<fence>`: the lock was handed over, recorded in `grants`) or
/// everyone (`*`), or when messages were lost (lagged, subscriber gone):
/// then trying again is the safe move.
pub(crate) fn wake_for(mut receiver: Receiver, owner: OwnerId, grants: Grants) -> Wake {
    let me = owner.to_string();
    Box::pin(async move {
        while let Ok(message) = receiver.recv().await {
            let (target, fence) = match message.split_once(':') {
                Some((target, fence)) => (target, fence.parse().ok()),
                None => (&*message, None),
            };
            if target == "*" {
                return;
            }
            if target == me {
                if let Some(fence) = fence {
                    grants.give(owner, fence);
                }
                return;
            }
        }
    })
}
