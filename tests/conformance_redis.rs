//! The conformance suite on a real redis-server, started on a free loopback port.

#![cfg(feature = "redis")]

dlock_testkit::conformance_suite!(dlock_testkit::fixtures::redis::Redis);
