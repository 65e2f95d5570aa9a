//! The engine-agnostic core of dlock.
//!
//! The layers read in one direction, each using only those before it:
//! [`config`] (settings) → [`registry`] (engine kinds, engines, groups) →
//! `hold` (the reentrancy table, release, downgrade) → `watchdog` (lease
//! renewal, the lost signal) → [`guard`] (what the caller holds) → `acquire`
//! (reenter, or ask the engine and wait) → [`lock`] (the handles users call) → `lock_set` (several locks as one) and
//! `election` (one leader at a time, over a lock).
//! [`kit`] is what engines are written with; [`metrics`] is what gets
//! recorded.
//!
//! Users normally depend on the `dlock` facade crate, which re-exports this one.

#![warn(missing_docs)]

mod acquire;
mod audit;
pub mod config;
mod deadlock;
mod election;
mod error;
pub mod guard;
mod hold;
mod key;
pub mod kit;
mod local_queue;
pub mod lock;
mod lock_set;
pub mod metrics;
mod mode;
mod records;
pub mod registry;
mod run_on;
mod secret;
mod trace;
mod typo;
mod watchdog;

pub use config::{Config, MIN_LEASE, Settings, Wait};
pub use deadlock::{Cycle, Link, WAITS_GROUP};
pub use election::{Election, Leader, Observer, Term};
pub use error::{BoxError, Error, LostReason};
pub use guard::{Guard, HeldLock, Share, held_locks, with_shares};
pub use key::{LockKey, MAX_GROUP_LEN, MAX_NAME_LEN};
pub use lock::{Lock, Locks, Semaphore};
pub use lock_set::{Guards, LockSet};
pub use mode::Mode;
pub use records::{Acted, HolderRecord, LockView, Only, Reached, WaiterRecord};
pub use registry::Registry;
