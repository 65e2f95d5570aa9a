//! The memory engine's fixture: no server, a fresh engine each time.

use crate::conformance::Fixture;

/// The embedded engine, for the conformance suite (the fault suite needs
/// processes that share a server).
pub struct Memory;

impl Fixture for Memory {
    const NAME: &'static str = "memory";

    fn start() -> Self {
        Memory
    }

    fn engine_config(&self) -> String {
        "kind = \"memory\"".to_owned()
    }
}
