//! The conformance suite on a real etcd member, started on free loopback
//! ports.

#![cfg(feature = "etcd")]

dlock_testkit::conformance_suite!(dlock_testkit::fixtures::etcd::Etcd);
