//! dlock's lock engines, one module per engine, each behind its cargo feature,
//! and `conformance`, the behaviour suite every engine passes unchanged.
//!
//! | module | kinds (`kind` in config) | cargo feature |
//! |---|---|---|
//! | `memory` | `memory` | `memory` (default) |
//! | `redis` | `redis`, `redis-cluster`, `redis-sentinel` | `redis` (`redis-tls` for `rediss://`) |
//! | `redlock` | `redlock` | `redlock` |
//! | `zookeeper` | `zookeeper` | `zookeeper` |
//! | `etcd` | `etcd` | `etcd` (`etcd-tls` for `https://`; needs `protoc` to build) |
//! | `postgres` | `postgres` | `postgres` |
//! | `mysql` | `mysql` | `mysql` |
//! | `memcached` | `memcached` | `memcached` |
//! | `conformance` | (the behaviour suite every engine passes) | `conformance` |
//!
//! Applications use this crate through the `dlock` library (package
//! `dlock-rs`), whose features of the same names turn these on, as
//! `dlock::engines`. Engines are usually built from config by
//! `dlock::init`; each engine type can also be connected by hand:
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), dlock::Error> {
//! use std::sync::Arc;
//! use dlock::engines::memory::MemoryEngine;
//!
//! dlock::install(dlock::Registry::with_engine("main", Arc::new(MemoryEngine::new()), Default::default())?)?;
//! let guard = dlock::lock("order", "42").lock().await?;
//! guard.release().await
//! # }
//! ```

#![warn(missing_docs)]

use dlock_core::Kinds;

#[cfg(feature = "conformance")]
pub mod conformance;
mod defaults;
#[cfg(feature = "etcd")]
pub mod etcd;
#[cfg(feature = "memcached")]
pub mod memcached;
#[cfg(feature = "memory")]
pub mod memory;
#[cfg(feature = "mysql")]
pub mod mysql;
#[cfg(feature = "postgres")]
pub mod postgres;
#[cfg(feature = "redis")]
pub mod redis;
#[cfg(feature = "redlock")]
pub mod redlock;
#[cfg(feature = "zookeeper")]
pub mod zookeeper;

/// Every engine kind compiled into this build, each registered by its own
/// module through the same [`Kinds::register`] an engine from another
/// crate uses.
pub fn kinds() -> Kinds {
    #[allow(unused_mut)]
    let mut kinds = Kinds::new();
    #[cfg(feature = "etcd")]
    etcd::register(&mut kinds);
    #[cfg(feature = "memcached")]
    memcached::register(&mut kinds);
    #[cfg(feature = "memory")]
    memory::register(&mut kinds);
    #[cfg(feature = "mysql")]
    mysql::register(&mut kinds);
    #[cfg(feature = "postgres")]
    postgres::register(&mut kinds);
    #[cfg(feature = "redis")]
    redis::register(&mut kinds);
    #[cfg(feature = "redlock")]
    redlock::register(&mut kinds);
    #[cfg(feature = "zookeeper")]
    zookeeper::register(&mut kinds);
    #[cfg(not(feature = "etcd"))]
    kinds.left_out(&["etcd"], "etcd");
    #[cfg(not(feature = "memcached"))]
    kinds.left_out(&["memcached"], "memcached");
    #[cfg(not(feature = "mysql"))]
    kinds.left_out(&["mysql"], "mysql");
    #[cfg(not(feature = "postgres"))]
    kinds.left_out(&["postgres"], "postgres");
    #[cfg(not(feature = "redis"))]
    kinds.left_out(&["redis", "redis-cluster", "redis-sentinel"], "redis");
    #[cfg(not(feature = "redlock"))]
    kinds.left_out(&["redlock"], "redlock");
    #[cfg(not(feature = "zookeeper"))]
    kinds.left_out(&["zookeeper"], "zookeeper");
    kinds
}
