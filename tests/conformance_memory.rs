//! The conformance suite on the embedded memory engine.

dlock_testkit::conformance_suite!(dlock_testkit::fixtures::memory::Memory);
