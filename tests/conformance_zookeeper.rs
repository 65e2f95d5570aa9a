//! The conformance suite on a real standalone ZooKeeper, started on a free
//! loopback port.

#![cfg(feature = "zookeeper")]

dlock::engines::conformance_suite!(fixture = dlock::engines::zookeeper::fixture::ZooKeeper);
