//! The conformance suite on a real memcached, started on a free loopback
//! port. It has no read mode and no queue: those cases skip, saying so.

#![cfg(feature = "memcached")]

dlock_testkit::conformance_suite!(dlock_testkit::fixtures::memcached::Memcached);
