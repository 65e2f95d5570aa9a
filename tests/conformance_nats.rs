//! The conformance suite on a nats-server with JetStream, started on a
//! free loopback port.

#![cfg(feature = "nats")]

dlock_testkit::conformance_suite!(dlock_testkit::fixtures::nats::Nats);
