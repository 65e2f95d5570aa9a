//! What the attribute tests that own the global registry share.

use std::sync::{Arc, OnceLock};

use dlock::engines::conformance::Faults;
use dlock::engines::memory::MemoryEngine;
use dlock::{Error, Registry, Settings};
use tokio::sync::{Mutex, MutexGuard};

/// An application error that carries lock errors, as annotated functions need.
#[derive(Debug)]
pub enum AppError {
    Lock(#[allow(dead_code, reason = "shown through Debug when a test fails")] Error),
}

impl From<Error> for AppError {
    fn from(e: Error) -> Self {
        AppError::Lock(e)
    }
}

/// The engine behind the global registry (installed with `settings` on first
/// use), and a turn to use it alone: tests count its calls or cut it off.
pub async fn engine(settings: Settings) -> (&'static Faults, MutexGuard<'static, ()>) {
    static FAULTS: OnceLock<Arc<Faults>> = OnceLock::new();
    static TURN: Mutex<()> = Mutex::const_new(());
    let faults = FAULTS.get_or_init(|| {
        let faults = Arc::new(Faults::new(Arc::new(MemoryEngine::new())));
        let registry = Registry::with_engine("main", faults.clone(), settings).expect("registry");
        dlock::install(registry).expect("install");
        faults
    });
    (faults, TURN.lock().await)
}
