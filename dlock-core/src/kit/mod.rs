//! The engine author's kit: what it takes to write an engine and nothing a
//! user of locks needs. Implement [`Engine`] and its [`Lifecycle`], declare its [`Guarantees`],
//! offer its [`Facets`], register its kind in [`Kinds`], and connect with [`Connecting`] and the
//! shared settings. [`session`] and [`Waiters`] serve engines whose holds
//! live on a server session, or that wake their own waiters; [`Deferred`]
//! those that record a hold only once it has lasted.
//!
//! # The protocol
//!
//! An engine only keeps the shared state of a lock on its server. Waiting,
//! timeouts, reentrancy, the renewal schedule, the lost signal and metrics all
//! live once in dlock-core and drive an engine through this small protocol:
//!
//! 1. [`acquire`](Lifecycle::acquire) joins the lock's queue (or takes the lock at
//!    once) and answers [`Poll::Held`] with a fencing token, or [`Poll::Waiting`]
//!    with a *wake* future that resolves when trying again is worthwhile, or
//!    with the lock itself when another client handed it over ([`Woken`]).
//! 2. The core awaits the wake (or its safety-net poll interval) and calls
//!    [`poll`](Lifecycle::poll), until held or the wait timeout; then
//!    [`cancel`](Lifecycle::cancel) withdraws the request.
//! 3. While held, the core's watchdog calls [`renew`](Lifecycle::renew) every
//!    lease/3; [`Renewal::Gone`] or a whole lease without success means
//!    lost, and [`forced_out`](Control::forced_out) tells whether an operator
//!    ended it ([`force_release`](Control::force_release)).
//!    [`Renewal::Revoked`] tells the holder it was asked to let go.
//! 4. [`release`](Lifecycle::release) lets go; [`downgrade`](Engine::downgrade)
//!    turns a write hold into a read hold without letting go.
//!
//! The core bounds every call: acquire and poll by the wait, renew by the
//! lease, release and cancel by `call_timeout`. An engine never needs its
//! own timeouts around a call that may block. Nor is a call dropped
//! half-way, when its bound passes or its caller goes away: it runs on to
//! its end (for `call_timeout` more at most) before the request is
//! withdrawn or the next call for it is made. So an engine needs no guard
//! for being cut between two awaits.
//!
//! A request says what it asks for ([`Kind`]): a lock, a permit of a
//! semaphore, or a campaign. The core matches on it once, to pick the
//! lifecycle that serves it ([`serving`](Engine#method.serving)): a permit's comes from the
//! engine's [`Semaphores`] facet, with the semaphore's count. So no engine
//! method asks what a request is.
//!
//! Each request carries a fresh random [`OwnerId`], and a place for what the
//! engine must remember about it from acquire to release (a node, a
//! connection, a lease): [`Request::state`].
//!
//! What an engine promises about its locks is declared once, in
//! [`Guarantees`]; what it offers beyond them are its [`Facets`], each a
//! small trait it implements or leaves alone. The core refuses requests an
//! engine cannot serve, and the conformance suite runs or skips its cases,
//! by the [`Capabilities`] derived from both.

mod capabilities;
mod connecting;
mod deferred;
mod engine;
mod facets;
mod held;
mod kinds;
mod request;
pub mod session;
mod waiters;

pub use crate::config::{LABEL_MAX, check_label};
pub use crate::secret::without_password;
pub use capabilities::{Capabilities, Expiry, Fairness, Fencing, Guarantees, Records};
pub use connecting::{ClientSettings, Connecting, Credentials, TlsFiles, TlsMode, TlsPem, process_label};
pub use deferred::{Deferrals, Deferred, RECORD_AFTER, RECORD_WAIT};
pub(crate) use engine::{Call, within};
pub use engine::{
    Engine, EngineError, Lifecycle, LostSignal, Poll, Renewal, RevokedSignal, Serving, Wake, Woken,
};
pub use facets::{
    Changed, Control, ElectionValues, Facets, HeldWrites, HoldAtLeast, Inspect, List, PermitControl,
    Semaphores, Watch, unwatched,
};
pub use held::{HeldBy, held_by};
pub use kinds::Kinds;
pub use request::{Kind, OwnerId, Request, RequestState};
pub use waiters::Waiters;

pub use crate::key::{KeyHasher, KeyHashing, percent_escape, percent_unescape};
/// Re-exported so that engines share the core's version.
pub use async_trait::async_trait;

/// The parent of every lock's path on servers that keep a tree of names
/// (ZooKeeper, etcd), unless the engine's `root` says otherwise.
pub fn default_root() -> String {
    "/locks".to_owned()
}
