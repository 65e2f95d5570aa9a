//! The conformance suite on a real MariaDB, its data directory made by
//! `mariadb-install-db` in a temporary folder, started on a free loopback
//! port. The engine's ticket queue serves `fifo_order` and the reader cases.

#![cfg(feature = "mysql")]

dlock_testkit::conformance_suite!(dlock_testkit::fixtures::mysql::Mysql);
