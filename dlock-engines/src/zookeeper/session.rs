//! The engine's ZooKeeper session: one per engine, replaced when it ends.
//!
//! A session *ends* for dlock when the server expired or closed it, or when
//! the client has been cut off for half the session timeout. The server
//! expires a session one timeout after it last heard from it, and the client
//! is heard at least every 3/20 of it (its ping interval), so a holder cut
//! off learns of the loss before the server can give the lock to anyone
//! else: by 0.35 of the timeout when the cut is seen at once, by 0.1 of it
//! when the client only notices through silence (after 0.4). Every hold
//! taken on a session is lost when it ends; a shorter blip ends nothing.

use std::sync::{Arc, RwLock};
use std::time::Duration;

use tokio::sync::{Mutex, watch};
use zookeeper_client::{Client, Error as ZkError, SessionState, StateWatcher};

use dlock_core::EngineError;

use super::ZooKeeperConfig;

pub(crate) struct Session {
    pub client: Client,
    end: Arc<watch::Sender<bool>>,
    ended: watch::Receiver<bool>,
}

impl Session {
    pub fn is_ended(&self) -> bool {
        *self.ended.borrow()
    }

    /// An operation's failure; one that says the session expired ends it at
    /// once (the state watcher may hear of it later).
    pub fn failed(&self, e: ZkError) -> EngineError {
        if matches!(e, ZkError::SessionExpired) {
            self.end.send_replace(true);
        }
        EngineError::failed(e)
    }

    /// Resolves when the session ends.
    pub fn ended(&self) -> impl Future<Output = ()> + Send + 'static {
        let mut ended = self.ended.clone();
        async move {
            let _ = ended.wait_for(|ended| *ended).await;
        }
    }
}

impl Session {
    /// Runs `op` again while it fails for want of a connection and the
    /// session lives: ZooKeeper keeps a session across reconnects (to another
    /// ensemble member, say), so such a failure says nothing about the lock
    /// yet. Only for operations that are safe to repeat.
    pub async fn retry<T, F, Fut>(&self, mut op: F) -> Result<T, ZkError>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, ZkError>>,
    {
        let mut pause = Duration::from_millis(20);
        loop {
            match op().await {
                Err(e) if transient(&e) && !self.is_ended() => {
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(Duration::from_millis(500));
                }
                done => return done,
            }
        }
    }
}

/// A failure of the connection, not of the operation.
pub(crate) fn transient(e: &ZkError) -> bool {
    matches!(e, ZkError::ConnectionLoss | ZkError::Timeout | ZkError::Custom(_))
}

/// The current session, and how to make the next one.
pub(crate) struct Sessions {
    config: ZooKeeperConfig,
    current: RwLock<Arc<Session>>,
    reconnecting: Mutex<()>,
}

impl Sessions {
    pub async fn connect(config: ZooKeeperConfig) -> Result<Self, EngineError> {
        let first = open(&config).await?;
        Ok(Sessions {
            config,
            current: RwLock::new(Arc::new(first)),
            reconnecting: Mutex::new(()),
        })
    }

    /// The live session, opening a new one if the current one has ended.
    pub async fn live(&self) -> Result<Arc<Session>, EngineError> {
        let current = self.current();
        if !current.is_ended() {
            return Ok(current);
        }
        let _one_at_a_time = self.reconnecting.lock().await;
        let current = self.current();
        if !current.is_ended() {
            return Ok(current);
        }
        let fresh = Arc::new(open(&self.config).await?);
        *self.current.write().expect("not poisoned") = fresh.clone();
        Ok(fresh)
    }

    fn current(&self) -> Arc<Session> {
        self.current.read().expect("not poisoned").clone()
    }
}

async fn open(config: &ZooKeeperConfig) -> Result<Session, EngineError> {
    let mut connector = Client::connector()
        .with_session_timeout(config.session_timeout)
        .with_connection_timeout(config.connect_timeout);
    if let Some(auth) = &config.digest {
        connector = connector.with_auth("digest", auth.as_bytes());
    }
    let client = tokio::time::timeout(config.connect_timeout, connector.connect(&config.connect))
        .await
        .map_err(|_| format!("no session within {:?}", config.connect_timeout))
        .and_then(|connected| connected.map_err(|e| e.to_string()))
        .map_err(|why| {
            EngineError::failed(format!(
                "cannot connect to ZooKeeper at {}: {why}",
                config.connect
            ))
        })?;
    let (end, ended) = watch::channel(false);
    let end = Arc::new(end);
    tokio::spawn(watch_state(
        client.state_watcher(),
        client.session_timeout() / 2,
        end.clone(),
    ));
    Ok(Session { client, end, ended })
}

/// Marks the session ended on a terminal state or a disconnection that
/// lasts `grace`; stops early once nobody uses the session.
async fn watch_state(mut states: StateWatcher, grace: Duration, end: Arc<watch::Sender<bool>>) {
    let mut state = states.peek_state();
    loop {
        let next = async {
            match state {
                SessionState::Expired | SessionState::Closed | SessionState::AuthFailed => None,
                SessionState::Disconnected => tokio::time::timeout(grace, states.changed()).await.ok(),
                _ => Some(states.changed().await),
            }
        };
        tokio::select! {
            next = next => match next {
                Some(next) => state = next,
                None => break,
            },
            _ = end.closed() => return,
        }
    }
    let _ = end.send(true);
}
