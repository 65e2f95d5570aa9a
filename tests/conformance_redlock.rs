//! The conformance suite on RedLock over 5 real redis-servers on loopback.
//! It has no read mode and no queue: those cases skip, saying so.

#![cfg(feature = "redlock")]

dlock::engines::conformance_suite!(fixture = dlock::engines::redlock::fixture::RedLock);
