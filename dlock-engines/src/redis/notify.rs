//! Release notifications: one subscriber connection per engine, one channel
//! per lock (`<prefix>:n`), fanned out in process to that lock's waiters.
//! Notifications only make waiters try sooner; polling stays the safety net,
//! so a dropped subscriber costs latency, never correctness.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::StreamExt;
use redis::Client;
use redis::aio::PubSubSink;
use tokio::sync::watch;

/// How long a channel nobody waits on stays subscribed, so a waiter that
/// polls again soon finds it still there.
const LINGER: Duration = Duration::from_secs(1);

pub(crate) struct Notifier {
    client: Client,
    live: tokio::sync::Mutex<Option<Live>>,
}

#[derive(Clone)]
struct Live {
    sink: Arc<tokio::sync::Mutex<PubSubSink>>,
    channels: Arc<Mutex<HashMap<String, watch::Sender<u64>>>>,
}

impl Notifier {
    pub fn new(client: Client) -> Self {
        Notifier {
            client,
            live: tokio::sync::Mutex::new(None),
        }
    }

    /// A receiver that changes on the next notification for `channel`, if the
    /// channel is already subscribed (cheap: no round trip).
    pub fn existing(&self, channel: &str) -> Option<watch::Receiver<u64>> {
        let live = self.live.try_lock().ok()?.clone()?;
        let channels = live.channels.lock().unwrap_or_else(|e| e.into_inner());
        channels.get(channel).map(watch::Sender::subscribe)
    }

    /// Subscribes to `channel` (connecting the subscriber if needed) and
    /// returns a receiver; `None` if the subscriber cannot be set up now.
    pub async fn subscribe(&self, channel: &str) -> Option<watch::Receiver<u64>> {
        let live = self.live().await?;
        let receiver = {
            let mut channels = live.channels.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(sender) = channels.get(channel) {
                return Some(sender.subscribe());
            }
            let (sender, receiver) = watch::channel(0);
            channels.insert(channel.to_owned(), sender);
            receiver
        };
        if live.sink.lock().await.subscribe(channel).await.is_err() {
            *self.live.lock().await = None;
            return None;
        }
        Some(receiver)
    }

    async fn live(&self) -> Option<Live> {
        let mut slot = self.live.lock().await;
        if let Some(live) = &*slot {
            return Some(live.clone());
        }
        let (sink, mut stream) = self.client.get_async_pubsub().await.ok()?.split();
        let live = Live {
            sink: Arc::new(tokio::sync::Mutex::new(sink)),
            channels: Arc::default(),
        };
        let dispatch = live.clone();
        tokio::spawn(async move {
            let mut sweep = tokio::time::interval(LINGER);
            loop {
                tokio::select! {
                    message = stream.next() => match message {
                        Some(message) => dispatch.wake(message.get_channel_name()),
                        // Connection gone: wake everyone (they poll) and let the next waiter reconnect.
                        None => return dispatch.channels.lock().unwrap_or_else(|e| e.into_inner()).clear(),
                    },
                    _ = sweep.tick() => dispatch.sweep().await,
                }
            }
        });
        *slot = Some(live.clone());
        Some(live)
    }
}

impl Live {
    fn wake(&self, channel: &str) {
        if let Some(sender) = self
            .channels
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(channel)
        {
            sender.send_modify(|generation| *generation += 1);
        }
    }

    /// Unsubscribes channels that no waiter has watched since the last sweep.
    async fn sweep(&self) {
        let idle: Vec<String> = {
            let mut channels = self.channels.lock().unwrap_or_else(|e| e.into_inner());
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
