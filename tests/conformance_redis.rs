//! The conformance suite on a real redis-server, started on a free loopback port.

#![cfg(feature = "redis")]

dlock::engines::conformance_suite!(fixture = dlock::engines::redis::fixture::Redis);
