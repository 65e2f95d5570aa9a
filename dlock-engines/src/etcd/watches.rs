//! One watch stream per engine, shared by every waiting request. Each waiter
//! watches one key, the contender ahead that matters (or, next in line for
//! a permit, the semaphore's prefix), under a watch id the engine picks
//! (etcd 3.4+), and hears when that key changes or goes. A
//! broken stream tells every waiter to look again; the next watch opens a
//! new stream.

use std::collections::HashMap;
use std::sync::atomic::{AtomicI64, Ordering};

use etcd_client::{
    Client, Event, WatchFilterType, WatchOptions, WatchRequestSender, WatchResponse, WatchResponseStream,
};
use tokio::sync::{mpsc, oneshot};

pub(crate) struct Watches {
    commands: mpsc::UnboundedSender<Command>,
    next_id: AtomicI64,
}

enum Command {
    Watch {
        id: i64,
        key: Vec<u8>,
        prefix: bool,
        no_put: bool,
        created: oneshot::Sender<i64>,
        changed: oneshot::Sender<Event>,
    },
    Cancel(i64),
}

/// One key watched from the revision the server created the watch at.
pub(crate) struct Watch {
    id: i64,
    /// The server's revision when it created the watch: changes after it
    /// are seen, earlier ones are not.
    pub from: i64,
    changed: oneshot::Receiver<Event>,
    commands: mpsc::UnboundedSender<Command>,
}

impl Watch {
    /// Resolves when the key changes or goes, with the change; `None` if
    /// the stream broke or the server ended the watch.
    pub async fn changed(&mut self) -> Option<Event> {
        (&mut self.changed).await.ok()
    }

    /// The change, if one came already.
    pub fn try_changed(&mut self) -> Option<Event> {
        self.changed.try_recv().ok()
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        let _ = self.commands.send(Command::Cancel(self.id));
    }
}

impl Watches {
    pub fn new(client: Client) -> Self {
        let (commands, received) = mpsc::unbounded_channel();
        tokio::spawn(serve(client, received));
        Watches {
            commands,
            next_id: AtomicI64::new(1),
        }
    }

    /// Watches `key` (every key it begins if `prefix`) from now on (only
    /// deletions if `no_put`); `None` if the stream broke first.
    pub async fn watch(&self, key: Vec<u8>, prefix: bool, no_put: bool) -> Option<Watch> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (created, from) = oneshot::channel();
        let (changed_tx, changed) = oneshot::channel();
        let command = Command::Watch {
            id,
            key,
            prefix,
            no_put,
            created,
            changed: changed_tx,
        };
        self.commands.send(command).ok()?;
        // Made before the wait, so that a caller who stops waiting cancels.
        let mut watch = Watch {
            id,
            from: 0,
            changed,
            commands: self.commands.clone(),
        };
        watch.from = from.await.ok()?;
        Some(watch)
    }
}

struct Open {
    created: Option<oneshot::Sender<i64>>,
    changed: oneshot::Sender<Event>,
}

/// The stream's task: sends watch and cancel requests, routes responses.
async fn serve(client: Client, mut commands: mpsc::UnboundedReceiver<Command>) {
    let mut open: HashMap<i64, Open> = HashMap::new();
    let mut stream: Option<(WatchRequestSender, WatchResponseStream)> = None;
    loop {
        let message = async {
            match &mut stream {
                Some((_, responses)) => responses.message().await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            command = commands.recv() => match command {
                None => return,
                Some(Command::Watch { id, key, prefix, no_put, created, changed }) => {
                    let mut options = WatchOptions::new().with_watch_id(id);
                    if prefix {
                        options = options.with_prefix();
                    }
                    if no_put {
                        options = options.with_filters([WatchFilterType::NoPut]);
                    }
                    let sent = match &mut stream {
                        Some((requests, _)) => requests.watch(key, Some(options)).await.is_ok(),
                        None => match client.watch_client().watch(key, Some(options)).await {
                            Ok(opened) => {
                                stream = Some(opened.split());
                                true
                            }
                            Err(_) => false,
                        },
                    };
                    if sent {
                        open.insert(id, Open { created: Some(created), changed });
                    } else {
                        stream = None;
                    }
                }
                Some(Command::Cancel(id)) => {
                    if open.remove(&id).is_some()
                        && let Some((requests, _)) = &mut stream
                    {
                        let _ = requests.cancel(id).await;
                    }
                }
            },
            message = message => match message {
                Ok(Some(response)) => {
                    if let Some(done) = route(&mut open, response)
                        && let Some((requests, _)) = &mut stream
                    {
                        let _ = requests.cancel(done).await;
                    }
                }
                // Broken: dropping every waiter's senders tells them.
                _ => {
                    stream = None;
                    open.clear();
                }
            },
        }
    }
}

/// Hands a response to its waiter; returns the id of a watch that fired and
/// is still open on the server.
fn route(open: &mut HashMap<i64, Open>, response: WatchResponse) -> Option<i64> {
    let id = response.watch_id();
    let entry = open.get_mut(&id)?;
    if response.created()
        && let Some(created) = entry.created.take()
    {
        let revision = response.header().map_or(0, |h| h.revision());
        let _ = created.send(revision);
    }
    if response.canceled() || !response.events().is_empty() {
        let entry = open.remove(&id).expect("found above");
        if let Some(event) = response.events().first() {
            let _ = entry.changed.send(event.clone());
        }
        return (!response.canceled()).then_some(id);
    }
    None
}
