//! A wrapper engine that counts calls and injects faults between the core and
//! a real engine: the network cut, or the server forgetting leases early.
//! The engine behind it is real; only the path to it is disturbed.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};

use dlock_core::engine::Expiry;
use dlock_core::{Engine, EngineError, Poll, Request, Wake, async_trait};

pub struct Faults {
    inner: Arc<dyn Engine>,
    calls: AtomicU64,
    cut: AtomicBool,
    lease_divisor: AtomicU32,
}

impl Faults {
    pub fn new(inner: Arc<dyn Engine>) -> Self {
        Faults {
            inner,
            calls: AtomicU64::new(0),
            cut: AtomicBool::new(false),
            lease_divisor: AtomicU32::new(1),
        }
    }

    /// Engine calls made so far.
    pub fn calls(&self) -> u64 {
        self.calls.load(Ordering::SeqCst)
    }

    /// While cut, every call fails as if the server were unreachable.
    pub fn set_cut(&self, cut: bool) {
        self.cut.store(cut, Ordering::SeqCst);
    }

    /// Passes leases `divisor` times shorter to the engine than the core asked
    /// for: the server drops holds before the holder expects it.
    pub fn shorten_leases(&self, divisor: u32) {
        self.lease_divisor.store(divisor, Ordering::SeqCst);
    }

    fn pass(&self, req: &Request) -> Result<Request, EngineError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        if self.cut.load(Ordering::SeqCst) {
            return Err(EngineError::failed(
                "connection refused (conformance: network cut)",
            ));
        }
        let mut req = req.clone();
        req.lease /= self.lease_divisor.load(Ordering::SeqCst);
        Ok(req)
    }
}

#[async_trait]
impl Engine for Faults {
    fn kind(&self) -> &'static str {
        self.inner.kind()
    }

    fn address(&self) -> String {
        self.inner.address()
    }

    fn supports_read(&self) -> bool {
        self.inner.supports_read()
    }

    fn expiry(&self) -> Expiry {
        self.inner.expiry()
    }

    async fn acquire(&self, req: &Request) -> Result<Poll, EngineError> {
        self.inner.acquire(&self.pass(req)?).await
    }

    async fn poll(&self, req: &Request) -> Result<Poll, EngineError> {
        self.inner.poll(&self.pass(req)?).await
    }

    async fn cancel(&self, req: &Request) -> Result<(), EngineError> {
        self.inner.cancel(&self.pass(req)?).await
    }

    async fn renew(&self, req: &Request) -> Result<bool, EngineError> {
        self.inner.renew(&self.pass(req)?).await
    }

    async fn downgrade(&self, req: &Request) -> Result<bool, EngineError> {
        self.inner.downgrade(&self.pass(req)?).await
    }

    async fn release(&self, req: &Request) -> Result<bool, EngineError> {
        self.inner.release(&self.pass(req)?).await
    }

    fn lost(&self, req: &Request) -> Option<Wake> {
        self.inner.lost(req)
    }
}
