//! dlock's lock engines, one module per engine, each behind its cargo feature,
//! and `conformance`, the behaviour suite every engine passes unchanged.
//!
//! Each engine is a module behind the cargo feature of its name; [`ENGINES`]
//! lists them with the kinds they register. `redis-tls`, `zookeeper-tls` and
//! `etcd-tls` add TLS to those three, and `etcd` needs `protoc` to build.
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

use dlock_core::kit::Kinds;

#[cfg(feature = "conformance")]
pub mod conformance;
/// One crypto provider for the clients that use rustls's process default.
#[cfg(any(
    feature = "mysql",
    feature = "nats",
    feature = "redis-tls",
    feature = "zookeeper-tls"
))]
mod crypto;
/// The rustls client config of the engines whose client takes one.
#[cfg(any(feature = "postgres", feature = "memcached", feature = "zookeeper-tls"))]
mod tls;

/// The one list of engines. A row is a module, its cargo feature (the same
/// name) and the kinds it registers (`kind = ...` in config); the module
/// lines, [`kinds`] and [`ENGINES`] come from it, and `tests/engines.rs`
/// holds the cargo features, the fixtures and the docs to it.
macro_rules! engines {
    ($($module:ident $feature:literal [$($kind:literal),+],)*) => {
        $(
            #[cfg(feature = $feature)]
            pub mod $module;
        )*

        /// Every engine kind compiled into this build, each registered by
        /// its own module through the same [`Kinds::register`] an engine
        /// from another crate uses; a kind whose feature is off is named
        /// with the feature that would bring it.
        pub fn kinds() -> Kinds {
            let mut kinds = Kinds::new();
            $(
                #[cfg(feature = $feature)]
                $module::register(&mut kinds);
                #[cfg(not(feature = $feature))]
                kinds.left_out(&[$($kind),+], $feature);
            )*
            kinds
        }

        /// Every engine this crate has, compiled in or not: its cargo
        /// feature and the kinds it registers.
        pub const ENGINES: &[(&str, &[&str])] = &[$(($feature, &[$($kind),+])),*];
    };
}

engines! {
    dynamodb "dynamodb" ["dynamodb"],
    etcd "etcd" ["etcd"],
    memcached "memcached" ["memcached"],
    memory "memory" ["memory"],
    mysql "mysql" ["mysql"],
    nats "nats" ["nats"],
    postgres "postgres" ["postgres"],
    redis "redis" ["redis", "redis-cluster", "redis-sentinel"],
    redlock "redlock" ["redlock"],
    zookeeper "zookeeper" ["zookeeper"],
}
