//! What an engine offers beyond the lock's lifecycle, one small trait a
//! facet. An engine offers a facet by implementing its trait and naming
//! itself in [`Engine::facets`]; one that does not writes nothing for it.
//! Having the facet is the capability: the core routes each call to it,
//! and refuses with a typed `Error::Unsupported` where it is missing.

use std::any::Any;
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use async_trait::async_trait;

use super::{Engine, EngineError, Lifecycle, Renewal, Request};
use crate::{LockKey, LockView, Only};

/// The facets an engine offers: each `Some(self)` where it implements the
/// facet's trait, `None` by default, so a facet added to the kit later is
/// missing on every engine until it implements it.
///
/// ```
/// # use dlock::kit::Facets;
/// # struct Mine;
/// # #[dlock::kit::async_trait]
/// # impl dlock::kit::Control for Mine {
/// #     async fn forced_out(&self, _: &dlock::kit::Request) -> Result<bool, dlock::kit::EngineError> { Ok(false) }
/// #     async fn force_release(&self, _: &dlock::LockKey, _: &dlock::Only) -> Result<u32, dlock::kit::EngineError> { Ok(0) }
/// #     async fn revoke(&self, _: &dlock::LockKey, _: &dlock::Only) -> Result<u32, dlock::kit::EngineError> { Ok(0) }
/// # }
/// # impl Mine { fn facets(&self) -> Facets<'_> {
/// Facets { control: Some(self), ..Facets::default() }
/// # } }
/// ```
///
/// A wrapper engine names every field, so that a new facet makes it decide.
#[derive(Clone, Copy, Default)]
pub struct Facets<'a> {
    /// See [`Semaphores`].
    pub semaphores: Option<&'a dyn Semaphores>,
    /// See [`Inspect`].
    pub inspect: Option<&'a dyn Inspect>,
    /// See [`List`].
    pub list: Option<&'a dyn List>,
    /// See [`Control`].
    pub control: Option<&'a dyn Control>,
    /// See [`PermitControl`].
    pub permit_control: Option<&'a dyn PermitControl>,
    /// See [`HoldAtLeast`].
    pub hold_at_least: Option<&'a dyn HoldAtLeast>,
    /// See [`ElectionValues`].
    pub election_values: Option<&'a dyn ElectionValues>,
    /// See [`Watch`].
    pub watch: Option<&'a dyn Watch>,
    /// See [`HeldWrites`].
    pub held_writes: Option<&'a dyn HeldWrites>,
}

/// Semaphores: a permit's own [`Lifecycle`], with the same fairness,
/// fencing and expiry as the engine's locks. The core takes every request
/// of [`Kind::Semaphore`](super::Kind::Semaphore) there, and never to the
/// engine's lock lifecycle. A semaphore and a lock with the same key are
/// two things: the engine keeps them apart on its server.
pub trait Semaphores: Send + Sync {
    /// The lifecycle of a permit of a semaphore of `count` permits, for
    /// one call: cheap to make.
    fn permits(&self, count: u32) -> Box<dyn Lifecycle + '_>;

    /// Whether each permit is one of `count` slots that its lifecycle names
    /// ([`Lifecycle::slot`]), held by one holder at a time, with fences
    /// that rise across the slot's holders: what a store fencing a pool of
    /// `count` resources keys on. `false`, the default: one fence across
    /// all permits, which no store can use to refuse a stale holder.
    fn slots(&self) -> bool {
        false
    }
}

/// Records by name: who holds and who waits for one lock or semaphore.
#[async_trait]
pub trait Inspect: Send + Sync {
    /// Whether a record shows the hold's fence: not where the token is
    /// taken after the hold is written, in the same round trip (memcached).
    fn shows_fences(&self) -> bool;

    /// Whether a record shows the hold's lease and when it was last renewed
    /// ([`HolderRecord::renewed`](crate::HolderRecord::renewed)).
    fn shows_renewals(&self) -> bool {
        false
    }

    /// Who holds and who waits for the lock `key`, or with `permits`, the
    /// semaphore `key`.
    async fn inspect(&self, key: &LockKey, permits: Option<u32>) -> Result<LockView, EngineError>;
}

/// Records listed: a group's locks and semaphores. Offered with [`Inspect`].
#[async_trait]
pub trait List: Send + Sync {
    /// Every lock and semaphore of `group` that someone holds or waits for,
    /// in any order; free ones may be among them (the core leaves them out
    /// and sorts the rest by name).
    async fn list(&self, group: &str) -> Result<Vec<LockView>, EngineError>;
}

/// An operator's hand on holders: force release and revoke.
#[async_trait]
pub trait Control: Send + Sync {
    /// Whether `req`'s hold, found gone, was ended by
    /// [`force_release`](Control::force_release) rather than by its lease.
    /// Asked only after a hold turned out gone, so it may cost a round trip.
    async fn forced_out(&self, req: &Request) -> Result<bool, EngineError>;

    /// Ends the holds of the lock `key` that `only` admits, on the server,
    /// so that its next waiter gets in, and leaves word for each holder
    /// that it was forced out, for as long as its lease would have run.
    /// Each hold is ended only while it is the hold that was admitted (its
    /// owner id, and its fence where the records show fences), checked on
    /// the server: a holder that came in since is left alone. The lock's
    /// fencing token goes on from where it was: the next holder's is
    /// greater than every one given before. Answers how many holds it ended.
    async fn force_release(&self, key: &LockKey, only: &Only) -> Result<u32, EngineError>;

    /// Asks the holders of the lock `key` that `only` admits to let go: each
    /// one's next [`renew`](super::Lifecycle::renew) answers
    /// [`Renewal::Revoked`]. Answers how many holders were asked.
    async fn revoke(&self, key: &LockKey, only: &Only) -> Result<u32, EngineError>;
}

/// The engine's own watch on a group's records: what `dlock watch` waits
/// on between its reads, instead of reading on a timer alone.
#[async_trait]
pub trait Watch: Send + Sync {
    /// Listens for changes to the locks and semaphores of `group`, and
    /// answers once the server listens: the future then resolves at the
    /// first change after that (a hold or a request that begins or ends),
    /// or when the engine can tell no longer (its stream broke), so the
    /// caller reads the records again either way.
    async fn watch(&self, group: &str) -> Result<Changed, EngineError>;
}

/// Resolves at a change (see [`Watch`]).
pub type Changed = Pin<Box<dyn Future<Output = ()> + Send>>;

/// What a [`Watch`] answers when it cannot listen now (its stream broke,
/// its server could not set it): resolves after a short pause, so the
/// caller reads again and watches anew, not at once and in a loop.
pub fn unwatched() -> Changed {
    Box::pin(tokio::time::sleep(Duration::from_millis(50)))
}

/// An operator's hand on a semaphore's holders, as [`Control`] is on a
/// lock's: force release and revoke, of every permit's holder or of those
/// an [`Only`] names. A permit forced out learns it as a lock's holder
/// does, through [`Control::forced_out`].
#[async_trait]
pub trait PermitControl: Send + Sync {
    /// Ends the permits of the semaphore `key` of `count` permits that
    /// `only` admits, each only while it is the hold that was admitted, and
    /// leaves word for each holder that it was forced out; the next waiter
    /// gets the permit, with a greater fence. Answers how many it ended.
    async fn force_release_permits(&self, key: &LockKey, count: u32, only: &Only)
    -> Result<u32, EngineError>;

    /// Asks the holders of permits of the semaphore `key` of `count`
    /// permits that `only` admits to let go: each one's next
    /// [`renew`](super::Lifecycle::renew) answers [`Renewal::Revoked`].
    /// Answers how many were asked.
    async fn revoke_permits(&self, key: &LockKey, count: u32, only: &Only) -> Result<u32, EngineError>;
}

/// A hold can be let go while the server keeps others out a while longer:
/// a run-once job's `hold_at_least`.
#[async_trait]
pub trait HoldAtLeast: Engine {
    /// Lets go, but so that the server keeps others out for `keep` more,
    /// counted on its own clock, even if this process exits then. The
    /// default renews the hold for `keep` and leaves it to expire: right
    /// for an engine whose renewal sets the server's expiry to the
    /// request's lease. `Ok(false)`: this owner no longer held the lock.
    async fn release_after(&self, req: &Request, keep: Duration) -> Result<bool, EngineError> {
        let mut req = req.clone();
        req.lease = keep;
        Ok(self.renew(&req).await? != Renewal::Gone)
    }
}

/// A campaign can propose a value of its own ([`Kind::Election`](super::Kind::Election)), which
/// the engine writes where its records read it, as the leader's label;
/// without, a leader shows its process's label.
pub trait ElectionValues: Send + Sync {}

/// Writes to the engine's own store that land only while a hold is still
/// current, checked by the server in the same atomic step as the write (an
/// etcd transaction comparing the lock key's revision, say). Each engine
/// offers them through a typed extension of its own, made from a guard with
/// [`held_by`](super::held_by), which finds the engine's part here by its
/// type: no generic key-value layer.
pub trait HeldWrites: Send + Sync {
    /// What the engine's extension writes through, found by its type.
    fn store(&self) -> &(dyn Any + Send + Sync);
}
