//! The conformance suite on a real PostgreSQL that takes TLS connections
//! only, each with a client certificate, reached with `verify-full`.

#![cfg(feature = "postgres")]

dlock_testkit::conformance_suite!(dlock_testkit::fixtures::postgres::PostgresTls);
