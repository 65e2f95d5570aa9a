//! The conformance suite on a real etcd member, started on free loopback
//! ports.

#![cfg(feature = "etcd")]

dlock::engines::conformance_suite!(fixture = dlock::engines::etcd::fixture::Etcd);
