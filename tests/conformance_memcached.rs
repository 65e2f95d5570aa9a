//! The conformance suite on a real memcached, started on a free loopback
//! port. It has no read mode and no queue: those cases skip, saying so.

#![cfg(feature = "memcached")]

dlock::engines::conformance_suite!(fixture = dlock::engines::memcached::fixture::Memcached);
