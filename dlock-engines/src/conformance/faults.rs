//! A wrapper engine that counts calls and injects faults between the core and
//! a real engine: the network cut, answers that never come back, or the
//! server forgetting leases early. The engine behind it is real; only the
//! path to it is disturbed.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};

use dlock_core::kit::{
    Changed, Control, ElectionValues, Engine, EngineError, Facets, Guarantees, HoldAtLeast, Inspect,
    Lifecycle, List, LostSignal, PermitControl, Poll, Renewal, Request, RevokedSignal, Semaphores, Watch,
    async_trait,
};
use dlock_core::{LockKey, LockView, Only};

/// The fault wrapper: an [`Engine`] that passes every call to `inner`
/// unless told to fail it; see the module docs.
pub struct Faults {
    inner: Arc<dyn Engine>,
    calls: AtomicU64,
    queued: AtomicU64,
    cut: AtomicBool,
    hung: AtomicBool,
    /// Milliseconds each call waits before it reaches the engine.
    delay_ms: AtomicU64,
    lease_divisor: AtomicU32,
}

impl Faults {
    /// Wraps `inner`, with no fault on.
    pub fn new(inner: Arc<dyn Engine>) -> Self {
        Faults {
            inner,
            calls: AtomicU64::new(0),
            queued: AtomicU64::new(0),
            cut: AtomicBool::new(false),
            hung: AtomicBool::new(false),
            delay_ms: AtomicU64::new(0),
            lease_divisor: AtomicU32::new(1),
        }
    }

    /// Engine calls made so far.
    pub fn calls(&self) -> u64 {
        self.calls.load(Ordering::SeqCst)
    }

    /// Acquisitions the engine answered with "waiting": requests now in
    /// its queue, whose place no later request can take.
    pub fn queued(&self) -> u64 {
        self.queued.load(Ordering::SeqCst)
    }

    /// While cut, every call fails as if the server were unreachable.
    pub fn set_cut(&self, cut: bool) {
        self.cut.store(cut, Ordering::SeqCst);
    }

    /// While hung, every call reaches the engine but its answer never comes
    /// back, as with a server that stops answering mid-call.
    pub fn set_hung(&self, hung: bool) {
        self.hung.store(hung, Ordering::SeqCst);
    }

    /// Every call waits `delay` before it reaches the engine, as over a slow link.
    pub fn set_delay(&self, delay: std::time::Duration) {
        self.delay_ms.store(delay.as_millis() as u64, Ordering::SeqCst);
    }

    /// Passes leases `divisor` times shorter to the engine than the core asked
    /// for: the server drops holds before the holder expects it.
    pub fn shorten_leases(&self, divisor: u32) {
        self.lease_divisor.store(divisor, Ordering::SeqCst);
    }

    /// Counts a call; fails it while cut.
    fn reach(&self) -> Result<(), EngineError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        if self.cut.load(Ordering::SeqCst) {
            return Err(EngineError::failed(
                "connection refused (conformance: network cut)",
            ));
        }
        Ok(())
    }

    fn pass(&self, req: &Request) -> Result<Request, EngineError> {
        self.reach()?;
        let mut req = req.clone();
        req.lease /= self.lease_divisor.load(Ordering::SeqCst);
        Ok(req)
    }

    async fn slow(&self) {
        let delay = self.delay_ms.load(Ordering::SeqCst);
        if delay > 0 {
            tokio::time::sleep(std::time::Duration::from_millis(delay)).await;
        }
    }

    /// The wrapped engine's facet, which `facets` offers only where it has it.
    fn wrapped<'a, T: ?Sized>(
        &'a self,
        pick: impl FnOnce(Facets<'a>) -> Option<&'a T>,
    ) -> Result<&'a T, EngineError> {
        pick(self.inner.facets()).ok_or_else(|| EngineError::failed("the wrapped engine lacks this facet"))
    }

    /// The engine's answer, unless hung.
    async fn answer<T>(&self, answer: T) -> T {
        if self.hung.load(Ordering::SeqCst) {
            std::future::pending::<()>().await;
        }
        answer
    }
}

// A method with a default that this wrapper did not forward would drop the
// wrapped engine's behaviour without a word: clippy refuses that here.
#[deny(clippy::missing_trait_methods)]
#[async_trait]
impl Engine for Faults {
    fn kind(&self) -> &'static str {
        self.inner.kind()
    }

    fn address(&self) -> String {
        self.inner.address()
    }

    fn guarantees(&self) -> Guarantees {
        self.inner.guarantees()
    }

    /// The wrapped engine's facets, each through this wrapper, so that
    /// faults reach their calls too.
    fn facets(&self) -> Facets<'_> {
        let Facets {
            semaphores,
            inspect,
            list,
            control,
            permit_control,
            hold_at_least,
            election_values,
            watch,
            held_writes,
        } = self.inner.facets();
        Facets {
            semaphores: semaphores.map(|_| self as _),
            inspect: inspect.map(|_| self as _),
            list: list.map(|_| self as _),
            control: control.map(|_| self as _),
            permit_control: permit_control.map(|_| self as _),
            hold_at_least: hold_at_least.map(|_| self as _),
            election_values: election_values.map(|_| self as _),
            watch: watch.map(|_| self as _),
            // A held write goes to the store itself, past the faults, as a
            // paused holder's resumed write would.
            held_writes,
        }
    }

    async fn downgrade(&self, req: &Request) -> Result<bool, EngineError> {
        let req = self.pass(req)?;
        self.slow().await;
        let answer = self.inner.downgrade(&req).await;
        self.answer(answer).await
    }
}

// Locks and permits alike: each call goes to what serves it in the wrapped engine.
#[deny(clippy::missing_trait_methods)]
#[async_trait]
impl Lifecycle for Faults {
    async fn acquire(&self, req: &Request) -> Result<Poll, EngineError> {
        let req = self.pass(req)?;
        self.slow().await;
        let answer = self.inner.serving(&req)?.acquire(&req).await;
        if let Ok(Poll::Waiting(_)) = answer {
            self.queued.fetch_add(1, Ordering::SeqCst);
        }
        self.answer(answer).await
    }

    async fn poll(&self, req: &Request) -> Result<Poll, EngineError> {
        let req = self.pass(req)?;
        self.slow().await;
        let answer = self.inner.serving(&req)?.poll(&req).await;
        self.answer(answer).await
    }

    async fn cancel(&self, req: &Request) -> Result<(), EngineError> {
        let req = self.pass(req)?;
        self.slow().await;
        let answer = self.inner.serving(&req)?.cancel(&req).await;
        self.answer(answer).await
    }

    async fn renew(&self, req: &Request) -> Result<Renewal, EngineError> {
        let req = self.pass(req)?;
        self.slow().await;
        let answer = self.inner.serving(&req)?.renew(&req).await;
        self.answer(answer).await
    }

    async fn release(&self, req: &Request) -> Result<bool, EngineError> {
        let req = self.pass(req)?;
        self.slow().await;
        let answer = self.inner.serving(&req)?.release(&req).await;
        self.answer(answer).await
    }

    fn lost(&self, req: &Request) -> Option<LostSignal> {
        self.inner.serving(req).ok()?.lost(req)
    }

    fn revoked(&self, req: &Request) -> Option<RevokedSignal> {
        self.inner.serving(req).ok()?.revoked(req)
    }

    fn slot(&self, req: &Request) -> Option<u32> {
        self.inner.serving(req).ok()?.slot(req)
    }
}

impl Semaphores for Faults {
    fn permits(&self, _count: u32) -> Box<dyn Lifecycle + '_> {
        Box::new(self)
    }

    fn slots(&self) -> bool {
        self.inner
            .facets()
            .semaphores
            .is_some_and(|semaphores| semaphores.slots())
    }
}

impl ElectionValues for Faults {}

#[deny(clippy::missing_trait_methods)]
#[async_trait]
impl Inspect for Faults {
    fn shows_fences(&self) -> bool {
        self.inner
            .facets()
            .inspect
            .is_some_and(|inner| inner.shows_fences())
    }

    fn shows_renewals(&self) -> bool {
        self.inner
            .facets()
            .inspect
            .is_some_and(|inner| inner.shows_renewals())
    }

    async fn inspect(&self, key: &LockKey, permits: Option<u32>) -> Result<LockView, EngineError> {
        self.reach()?;
        self.slow().await;
        let answer = self.wrapped(|f| f.inspect)?.inspect(key, permits).await;
        self.answer(answer).await
    }
}

#[async_trait]
impl List for Faults {
    async fn list(&self, group: &str) -> Result<Vec<LockView>, EngineError> {
        self.reach()?;
        self.slow().await;
        let answer = self.wrapped(|f| f.list)?.list(group).await;
        self.answer(answer).await
    }
}

#[async_trait]
impl Watch for Faults {
    async fn watch(&self, group: &str) -> Result<Changed, EngineError> {
        self.reach()?;
        self.slow().await;
        let answer = self.wrapped(|f| f.watch)?.watch(group).await;
        self.answer(answer).await
    }
}

#[async_trait]
impl Control for Faults {
    async fn forced_out(&self, req: &Request) -> Result<bool, EngineError> {
        let req = self.pass(req)?;
        self.slow().await;
        let answer = self.wrapped(|f| f.control)?.forced_out(&req).await;
        self.answer(answer).await
    }

    async fn force_release(&self, key: &LockKey, only: &Only) -> Result<u32, EngineError> {
        self.reach()?;
        self.slow().await;
        let answer = self.wrapped(|f| f.control)?.force_release(key, only).await;
        self.answer(answer).await
    }

    async fn revoke(&self, key: &LockKey, only: &Only) -> Result<u32, EngineError> {
        self.reach()?;
        self.slow().await;
        let answer = self.wrapped(|f| f.control)?.revoke(key, only).await;
        self.answer(answer).await
    }
}

#[async_trait]
impl PermitControl for Faults {
    async fn force_release_permits(
        &self,
        key: &LockKey,
        count: u32,
        only: &Only,
    ) -> Result<u32, EngineError> {
        self.reach()?;
        self.slow().await;
        let inner = self.wrapped(|f| f.permit_control)?;
        let answer = inner.force_release_permits(key, count, only).await;
        self.answer(answer).await
    }

    async fn revoke_permits(&self, key: &LockKey, count: u32, only: &Only) -> Result<u32, EngineError> {
        self.reach()?;
        self.slow().await;
        let answer = self
            .wrapped(|f| f.permit_control)?
            .revoke_permits(key, count, only)
            .await;
        self.answer(answer).await
    }
}

#[async_trait]
impl HoldAtLeast for Faults {
    async fn release_after(&self, req: &Request, keep: std::time::Duration) -> Result<bool, EngineError> {
        let req = self.pass(req)?;
        self.slow().await;
        let answer = self.wrapped(|f| f.hold_at_least)?.release_after(&req, keep).await;
        self.answer(answer).await
    }
}
