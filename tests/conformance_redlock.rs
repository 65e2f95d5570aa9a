//! The conformance suite on RedLock over 5 real redis-servers on loopback.
//! It has no read mode and no queue: those cases skip, saying so.

#![cfg(feature = "redlock")]

dlock_testkit::conformance_suite!(dlock_testkit::fixtures::redlock::RedLock);
