//! The engine-agnostic core of dlock.
//!
//! The lock lifecycle reads top to bottom through the modules:
//! [`lock`] (the handles users call) → `acquire` (reenter, or ask the engine
//! and wait) → `hold` (the reentrancy table, release, downgrade) → `watchdog`
//! (lease renewal, the lost signal) → [`guard`] (what the caller holds).
//! [`engine`] is the interface engines implement; [`config`] and [`registry`]
//! build engines at startup; [`metrics`] is what gets recorded.
//!
//! Users normally depend on the `dlock` facade crate, which re-exports this one.

mod acquire;
pub mod config;
pub mod engine;
mod error;
pub mod guard;
mod hold;
mod key;
mod line;
pub mod lock;
pub mod metrics;
mod mode;
pub mod registry;
mod watchdog;

pub use acquire::MIN_LEASE;
pub use config::Config;
pub use engine::{Engine, EngineError, OwnerId, Poll, Request, Wake};
pub use error::{BoxError, Error, LostReason};
pub use guard::{Guard, Held};
pub use key::{LockKey, MAX_GROUP_LEN, MAX_NAME_LEN};
pub use lock::{Lock, Locks};
pub use mode::Mode;
pub use registry::{Factory, Registry, Settings};

/// Re-exported for engine crates, so they share the core's version.
pub use async_trait::async_trait;
