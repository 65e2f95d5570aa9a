//! The conformance suite on Redis behind Sentinel: a primary, a replica and
//! 3 sentinels on loopback, the engine finding the primary through them.

#![cfg(feature = "redis")]

dlock_testkit::conformance_suite!(dlock_testkit::fixtures::redis::RedisSentinel);
