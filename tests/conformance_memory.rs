//! The conformance suite on the embedded memory engine.

dlock::engines::conformance_suite!(fixture = dlock::engines::memory::fixture::Memory);
