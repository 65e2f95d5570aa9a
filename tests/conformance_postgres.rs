//! The conformance suite on a real PostgreSQL, made by `initdb` in a
//! temporary directory and started on a free loopback port. Its own lock
//! queue serves `fifo_order` and the reader cases.

#![cfg(feature = "postgres")]

dlock_testkit::conformance_suite!(dlock_testkit::fixtures::postgres::Postgres);
