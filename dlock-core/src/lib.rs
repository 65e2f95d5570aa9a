//! The engine-agnostic core of dlock.
//!
//! The layers read in one direction, each using only those before it:
//! [`config`] (settings) → [`registry`] (engine kinds, engines, groups) →
//! `hold` (the reentrancy table, release, downgrade) → `watchdog` (lease
//! renewal, the lost signal) → [`guard`] (what the caller holds) → `acquire`
//! (reenter, or ask the engine and wait) → [`lock`] (the handles users call).
//! [`engine`] is the interface engines implement; [`metrics`] is what gets
//! recorded.
//!
//! Users normally depend on the `dlock` facade crate, which re-exports this one.

#![warn(missing_docs)]

mod acquire;
pub mod config;
pub mod engine;
mod error;
pub mod guard;
mod hold;
mod key;
mod local_queue;
pub mod lock;
pub mod metrics;
mod mode;
pub mod registry;
mod run_on;
pub mod session;
mod trace;
mod waiters;
mod watchdog;

pub use config::{Config, MIN_LEASE, Settings, Wait};
pub use engine::{
    Capabilities, Engine, EngineError, Expiry, Fairness, Fencing, LostSignal, OwnerId, Poll, Request,
    RequestState, Wake, Woken,
};
pub use error::{BoxError, Error, LostReason};
pub use guard::{Guard, HeldLock, Share, held_locks, with_shares};
pub use key::{KeyHasher, KeyHashing, LockKey, MAX_GROUP_LEN, MAX_NAME_LEN, percent_escape};
pub use lock::{Lock, Locks};
pub use mode::Mode;
pub use registry::{Kinds, Registry};
pub use waiters::Waiters;

/// Re-exported for engine crates, so they share the core's version.
pub use async_trait::async_trait;
