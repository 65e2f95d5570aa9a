//! The conformance suite on a real standalone ZooKeeper, started on a free
//! loopback port.

#![cfg(feature = "zookeeper")]

dlock_testkit::conformance_suite!(dlock_testkit::fixtures::zookeeper::ZooKeeper);
