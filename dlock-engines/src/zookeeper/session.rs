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

use std::time::Duration;

use dlock_core::kit::EngineError;
use dlock_core::kit::session::{self, Ender, Ends, SessionEnd};
use zookeeper_client::{Client, Error as ZkError, SessionState, StateWatcher};

use super::ZooKeeperConfig;
use super::tls::Transport;

pub(crate) struct Session {
    pub client: Client,
    end: SessionEnd,
}

impl Ends for Session {
    fn end(&self) -> &SessionEnd {
        &self.end
    }
}

impl Session {
    pub fn is_ended(&self) -> bool {
        self.end.is_ended()
    }

    /// An operation's failure; one that says the session expired ends it at
    /// once (the state watcher may hear of it later).
    pub fn failed(&self, e: ZkError) -> EngineError {
        if matches!(e, ZkError::SessionExpired) {
            self.end.end();
        }
        EngineError::failed(e)
    }

    /// Resolves when the session ends.
    pub fn ended(&self) -> impl Future<Output = ()> + Send + 'static {
        self.end.ended()
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
    transport: Transport,
    sessions: session::Sessions<Session>,
}

impl Sessions {
    pub async fn connect(config: ZooKeeperConfig, transport: Transport) -> Result<Self, EngineError> {
        let first = open(&config, &transport).await?;
        Ok(Sessions {
            config,
            transport,
            sessions: session::Sessions::new(first),
        })
    }

    /// The live session, opening a new one if the current one has ended.
    pub async fn live(&self) -> Result<std::sync::Arc<Session>, EngineError> {
        self.sessions.live(|| open(&self.config, &self.transport)).await
    }
}

async fn open(config: &ZooKeeperConfig, transport: &Transport) -> Result<Session, EngineError> {
    let mut connector = Client::connector()
        .with_session_timeout(config.session_timeout)
        .with_connection_timeout(config.client.connect_timeout);
    if let Some(auth) = &config.digest {
        connector = connector.with_auth("digest", auth.as_bytes());
    }
    let connected = tokio::time::timeout(
        config.client.connect_timeout,
        transport.connect(connector, &config.connect),
    )
    .await
    .map_err(|_| format!("no session within {:?}", config.client.connect_timeout))
    .and_then(|connected| connected.map_err(|e| e.to_string()));
    let client = match connected {
        Ok(client) => client,
        Err(mut why) => {
            if let Some(tls) = transport.why_not(&config.connect).await {
                why = format!("{why}; {tls}");
            }
            return Err(EngineError::failed(format!(
                "cannot connect to ZooKeeper at {}: {why}",
                config.connect
            )));
        }
    };
    let end = SessionEnd::default();
    tokio::spawn(watch_state(
        client.state_watcher(),
        client.session_timeout() / 2,
        end.ender(),
    ));
    Ok(Session { client, end })
}

/// Marks the session ended on a terminal state or a disconnection that
/// lasts `grace`; stops early once nobody uses the session.
async fn watch_state(mut states: StateWatcher, grace: Duration, end: Ender) {
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
            _ = end.unused() => return,
        }
    }
    end.end();
}
