//! The conformance suite on the embedded memory engine.

use std::sync::Arc;

use dlock::Engine;
use dlock::engines::memory::MemoryEngine;

dlock::engines::conformance_suite!(|| async { Arc::new(MemoryEngine::new()) as Arc<dyn Engine> });
