//! Work that is never dropped half-way.
//!
//! An engine call cut in the middle leaves the server and the engine's
//! memory of it apart: a node made but not noted, a key taken out of the
//! request's state but not yet deleted. So the core never cuts one: when
//! whoever awaits a call stops (a deadline, a dropped caller, an aborted
//! watchdog), the call goes on in a task of its own. An engine can then
//! count on every call it starts running to its end.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

type Work<T> = Pin<Box<dyn Future<Output = T> + Send>>;

/// `work`, awaited in place; if dropped before its end, run on to the end
/// in a task of its own (without a runtime it cannot: leases free the lock).
pub(crate) struct RunOn<T: Send + 'static> {
    work: Option<Work<T>>,
    /// How long the rest may take once nobody awaits it (`None`: as long as
    /// it takes; the work bounds itself).
    limit: Option<Duration>,
}

impl<T: Send + 'static> RunOn<T> {
    pub(crate) fn new(work: impl Future<Output = T> + Send + 'static, limit: Option<Duration>) -> Self {
        RunOn {
            work: Some(Box::pin(work)),
            limit,
        }
    }

    pub(crate) fn is_done(&self) -> bool {
        self.work.is_none()
    }

    /// The rest of the work, for the caller to run to its end itself.
    pub(crate) fn into_rest(mut self) -> Option<Work<T>> {
        self.work.take()
    }
}

impl<T: Send + 'static> Future for RunOn<T> {
    type Output = T;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<T> {
        let work = self.work.as_mut().expect("polled after the end");
        let out = std::task::ready!(work.as_mut().poll(cx));
        self.work = None;
        Poll::Ready(out)
    }
}

impl<T: Send + 'static> Drop for RunOn<T> {
    fn drop(&mut self) {
        let Some(work) = self.work.take() else {
            return;
        };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        match self.limit {
            Some(limit) => drop(runtime.spawn(tokio::time::timeout(limit, work))),
            None => drop(runtime.spawn(work)),
        }
    }
}
