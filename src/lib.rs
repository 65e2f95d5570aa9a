//! dlock: declarative distributed locks for async Rust.
//!
//! Locks are fair (FIFO), read/write, reentrant per async task, fenced (every
//! acquisition gets a strictly increasing token) and report loss. Engines are
//! chosen by configuration at startup; with no configuration, the embedded
//! memory engine serves.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), dlock::Error> {
//! let lock = dlock::lock("order", "42");
//! let guard = lock.lock().await?;
//! assert!(guard.fence() > 0);
//! guard.release().await?;
//! # Ok(())
//! # }
//! ```

use std::path::Path;

use once_cell::sync::OnceCell;

/// What an engine author needs: implement [`Engine`], declare its
/// [`Capabilities`], and register its kind in [`Kinds`].
pub use dlock_core::{
    BoxError, Capabilities, Engine, EngineError, Expiry, Fairness, Fencing, Kinds, LostSignal, MIN_LEASE,
    OwnerId, Poll, Request, Waiters, Wake, Woken, async_trait, engine,
};
pub use dlock_core::{
    Config, Error, Guard, HeldLock, Lock, LockKey, Locks, LostReason, Mode, Registry, Settings, Share, Wait,
    config, held_locks, metrics,
};
pub use dlock_engines as engines;
pub use dlock_macros::distributed_lock;

#[doc(hidden)]
pub mod __private;

static REGISTRY: OnceCell<Registry> = OnceCell::new();

/// Builds the configured engines into the global registry. Call once at
/// startup, before the first lock; a bad config fails here, naming the field.
pub async fn init(config: Config) -> Result<(), Error> {
    init_with(config, &engines::kinds()).await
}

/// [`init`] with engine kinds of your own besides the built-in ones:
/// `let mut kinds = dlock::engines::kinds(); kinds.register("mine", ...);`.
pub async fn init_with(config: Config, kinds: &Kinds) -> Result<(), Error> {
    install(Registry::build(&config, kinds).await?)
}

/// Makes `registry` the global one: for engines built by hand (a custom
/// engine, a wrapper). Same rules as [`init`]: once, before the first lock.
pub fn install(registry: Registry) -> Result<(), Error> {
    REGISTRY.set(registry).map_err(|_| {
        Error::config(
            "init",
            "dlock is already initialised (by an earlier init or a lock taken before init)",
        )
    })
}

/// [`init`] from a TOML file, with `DLOCK_*` environment overrides.
pub async fn init_from_file(path: impl AsRef<Path>) -> Result<(), Error> {
    init(Config::from_file(path)?).await
}

/// The global registry: the one [`init`] built, else the embedded memory engine.
pub fn registry() -> &'static Registry {
    REGISTRY.get_or_init(default_registry)
}

#[cfg(feature = "memory")]
fn default_registry() -> Registry {
    let engine = std::sync::Arc::new(engines::memory::MemoryEngine::new());
    Registry::with_engine(config::IMPLICIT_ENGINE, engine, Settings::default())
        .expect("the memory engine serves the default settings")
}

#[cfg(not(feature = "memory"))]
fn default_registry() -> Registry {
    panic!("dlock::init was not called and the `memory` engine is not compiled in")
}

/// The lock family of `group` from the global registry.
pub fn locks(group: &str) -> Locks {
    registry().locks(group)
}

/// The lock `name` of `group` from the global registry.
pub fn lock(group: &str, name: &str) -> Lock {
    locks(group).get(name)
}

/// The innermost lock held by a `#[distributed_lock]` function running in
/// this task; `None` outside one. Every lock the task holds, however taken:
/// [`held_locks`]. Spawned tasks inherit neither, unless spawned with
/// [`spawn`].
pub fn current() -> Option<HeldLock> {
    __private::CURRENT.try_with(HeldLock::clone).ok()
}

/// The fencing token of [`current`]: pass it to storage with every write.
pub fn fence() -> Option<u64> {
    current().map(|held| held.fence())
}

/// Spawns `fut` as a task that shares every lock this task holds (see
/// [`Share`]): its acquisitions of those locks reenter them, in their mode,
/// with no engine call, instead of waiting behind this task (and, if this
/// task awaits it, forever). The holds last until this task's guards and
/// the spawned task are both done. Inside, [`fence`] and [`current`] give
/// this task's innermost annotated lock.
pub fn spawn<F>(fut: F) -> tokio::task::JoinHandle<F::Output>
where
    F: std::future::Future + Send + 'static,
    F::Output: Send + 'static,
{
    let shares = held_locks().iter().filter_map(|held| held.share().ok()).collect();
    let shared = dlock_core::with_shares(shares, fut);
    match current() {
        Some(innermost) => tokio::spawn(__private::CURRENT.scope(innermost, shared)),
        None => tokio::spawn(shared),
    }
}
