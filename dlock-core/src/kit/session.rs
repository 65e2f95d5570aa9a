//! For engines whose holds live as long as a session with the server
//! (ZooKeeper's session, etcd's lease): the session's end as a signal every
//! hold on it can await, and the current session, replaced by a fresh one
//! once it ends.

use std::future::Future;
use std::sync::{Arc, RwLock};

use tokio::sync::{Mutex, watch};

use crate::kit::EngineError;

/// Whether a session has ended, for everyone using it. Once ended, it stays
/// ended.
pub struct SessionEnd {
    end: Arc<watch::Sender<bool>>,
    ended: watch::Receiver<bool>,
}

impl Default for SessionEnd {
    fn default() -> Self {
        let (end, ended) = watch::channel(false);
        SessionEnd {
            end: Arc::new(end),
            ended,
        }
    }
}

impl SessionEnd {
    /// Whether the session has ended.
    pub fn is_ended(&self) -> bool {
        *self.ended.borrow()
    }

    /// Ends the session: every [`ended`](Self::ended) future resolves.
    pub fn end(&self) {
        self.end.send_replace(true);
    }

    /// Resolves when the session ends.
    pub fn ended(&self) -> impl Future<Output = ()> + Send + 'static {
        let mut ended = self.ended.clone();
        async move {
            let _ = ended.wait_for(|ended| *ended).await;
        }
    }

    /// A handle for the task that keeps the session alive: it can end the
    /// session without keeping it in use.
    pub fn ender(&self) -> Ender {
        Ender(self.end.clone())
    }
}

/// Ends a session from the task that keeps it alive; see [`SessionEnd::ender`].
pub struct Ender(Arc<watch::Sender<bool>>);

impl Ender {
    /// Ends the session, as [`SessionEnd::end`] does.
    pub fn end(&self) {
        self.0.send_replace(true);
    }

    /// Whether the session has ended.
    pub fn is_ended(&self) -> bool {
        *self.0.borrow()
    }

    /// Resolves once the session and every future awaiting its end are
    /// gone: nobody uses the session any more.
    pub async fn unused(&self) {
        self.0.closed().await
    }
}

/// A session kind that can tell whether it has ended.
pub trait Ends {
    /// The session's end signal.
    fn end(&self) -> &SessionEnd;
}

/// An engine's current session, and the next one, opened on demand once the
/// current one has ended (one opening at a time).
pub struct Sessions<S> {
    current: RwLock<Arc<S>>,
    opening: Mutex<()>,
}

impl<S: Ends> Sessions<S> {
    /// Starts with `first` as the current session.
    pub fn new(first: S) -> Self {
        Sessions {
            current: RwLock::new(Arc::new(first)),
            opening: Mutex::new(()),
        }
    }

    /// The current session, even if ended.
    pub fn current(&self) -> Arc<S> {
        self.current.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// The live session, opening one with `open` if the current one has ended.
    pub async fn live<F, Fut>(&self, open: F) -> Result<Arc<S>, EngineError>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<S, EngineError>>,
    {
        let current = self.current();
        if !current.end().is_ended() {
            return Ok(current);
        }
        let _one_at_a_time = self.opening.lock().await;
        let current = self.current();
        if !current.end().is_ended() {
            return Ok(current);
        }
        let fresh = Arc::new(open().await?);
        *self.current.write().unwrap_or_else(|e| e.into_inner()) = fresh.clone();
        Ok(fresh)
    }
}
