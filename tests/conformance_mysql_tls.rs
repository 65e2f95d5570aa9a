//! The conformance suite on a real MariaDB that takes TLS connections
//! only (`require_secure_transport`), from a user that must give a client
//! certificate (`REQUIRE X509`), reached with `verify-full`.

#![cfg(feature = "mysql")]

dlock_testkit::conformance_suite!(dlock_testkit::fixtures::mysql::MysqlTls);
