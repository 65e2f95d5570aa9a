//! The conformance suite on Amazon's DynamoDB Local, started on a free
//! loopback port. It has no queue: those cases skip, saying so.

#![cfg(feature = "dynamodb")]

dlock_testkit::conformance_suite!(dlock_testkit::fixtures::dynamodb::DynamoDb);
