//! Declarative distributed locks for async Rust.
//!
//! Locks are **fair** (FIFO), **read/write**, **reentrant per async task**
//! (never per thread: tokio moves tasks between threads), **fenced** (every
//! acquisition gets a strictly increasing token to hand to storage) and
//! **report loss**. A watchdog renews the lease while you hold the lock.
//! Engines are chosen by configuration at startup; with no configuration the
//! embedded memory engine serves.
//!
//! The design follows ylock, which carries Java's `ReentrantReadWriteLock`
//! semantics across processes: a queue of waiters on the lock server, kept
//! the way Java's `AbstractQueuedSynchronizer` keeps its own, a watchdog
//! that renews the lease, and an annotation that wraps a method in the
//! lock (here the [`distributed_lock`] attribute).
//!
//! The package is published as `dlock-rs` (`cargo add dlock-rs`); its library
//! is `dlock`, so code writes `use dlock::...`. Keep the dependency under
//! that name: the attribute's expansion refers to the crate as `::dlock`.
//!
//! # The attribute
//!
//! [`distributed_lock`] wraps an `async fn` in a lock whose name comes from
//! its arguments:
//!
//! ```
//! use dlock::distributed_lock;
//!
//! # #[derive(Debug)]
//! # struct AppError(dlock::Error);
//! # impl From<dlock::Error> for AppError {
//! #     fn from(e: dlock::Error) -> Self { AppError(e) }
//! # }
//! # struct Ledger;
//! # impl Ledger {
//! #     async fn debit(&self, _: u64, _: u64, fence: u64) -> Result<u64, AppError> { Ok(fence) }
//! # }
//! # static LEDGER: Ledger = Ledger;
//! struct Order {
//!     id: u64,
//! }
//!
//! #[distributed_lock(group = "order", key = "<tenant>:<order.id>", mode = "write", wait = "5s")]
//! async fn pay(tenant: &str, order: &Order, cents: u64) -> Result<u64, AppError> {
//!     // Held here; renewed by the watchdog; released on return, `?`, panic or cancellation.
//!     LEDGER.debit(order.id, cents, dlock::fence().unwrap()).await
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), AppError> {
//! pay("acme", &Order { id: 42 }, 1_000).await?; // holds lock "order/acme:42" meanwhile
//! # Ok(())
//! # }
//! ```
//!
//! The function returns `Result<T, E>` with `E: From<dlock::Error>`: lock
//! errors (timeout, engine failure, loss) come back through it. Options:
//! `group` (required), `key` or `keys`, `permits`, `mode`, `wait`, `lease`,
//! `engine`, `on_lost`, `on_revoke`, and for run-once jobs `if_held`,
//! `hold_at_least` and `hold_at_most`; [`distributed_lock`] lists them
//! with their defaults. With `permits = N` the function takes a permit of a
//! [`Semaphore`] that admits `N` at once, instead of the lock.
//! Several locks on one function (`keys = ["<from>", "<to>"]`, or several
//! attributes) are taken as one [`LockSet`]: by group then name, whatever
//! order they were written in, so no two calls deadlock each other; each
//! keeps its own fence ([`held_lock`]). Misuse
//! is a compile error at the offending token. Annotated functions calling
//! each other in one task reenter with no engine call; inside the body,
//! [`fence`] and [`current`] give the held lock.
//!
//! # The Lock API
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), dlock::Error> {
//! use std::time::Duration;
//!
//! let lock = dlock::lock("order", "42"); // group + name
//! let guard = lock.lock().await?; // write; waits at most the configured wait
//! let fence = guard.fence(); // storage rejects writes with an older fence
//! tokio::select! {
//!     reason = guard.lost() => panic!("renewal refused, lease elapsed or session gone: {reason}"),
//!     _ = tokio::time::sleep(Duration::from_millis(5)) => { /* the work */ }
//! }
//! guard.release().await?; // Err(Lost) if the lock was lost meanwhile
//!
//! let reader = dlock::locks("catalog").get("sku-1").read().await?; // shared
//! if let Some(guard) = lock.try_lock().await? { // None if taken: never waits
//!     guard.release().await?;
//! }
//! let guard = lock.lock_for(Duration::from_millis(250)).await?; // Err(Timeout) after 250 ms
//! # let _ = (fence, reader, guard);
//! # Ok(())
//! # }
//! ```
//!
//! - **Reentrant per task**: a task holding a lock takes it again (or takes
//!   read under write) with no engine call; the hold ends with the outermost
//!   guard. Asking for write while holding read is an immediate
//!   [`Error::Upgrade`], never a deadlock. Releasing the write guard while a
//!   nested read guard lives downgrades the hold. [`held_locks`] lists every
//!   lock the task holds.
//! - **Spawned tasks** do not inherit locks: a spawned task asking for a lock
//!   its parent holds queues behind the parent, and a parent awaiting it
//!   waits forever. Hand the hold over with [`spawn`] or [`HeldLock::share`]
//!   ([`Share`]). A task that waits `deadlock_warning` (10 s) for a lock
//!   another task of its process holds logs a `tracing` warning.
//! - **Guards** ([`Guard`]) release on drop, in the background, also when the
//!   task is cancelled; [`Guard::release`] releases in place and reports
//!   errors.
//! - **Fairness**: FIFO per lock on engines with a queue; a writer never
//!   waits behind readers that arrived after it; a run of queued readers is
//!   admitted together. By default (`queue = "local"`) a process lines its
//!   own waiters up first and sends only its head to the engine: FIFO within
//!   the process and among the processes' heads, at a server cost that grows
//!   with the processes, not the waiters. `queue = "engine"` gives strict
//!   FIFO across all waiters, each in the engine's queue.
//! - **Every engine call is bounded**: acquire and poll by the wait and
//!   `call_timeout`, renewals by the lease, release and cancel by
//!   `call_timeout`. Engine errors while waiting are retried on the polling
//!   schedule until the wait runs out (with no wait limit, for at most one
//!   lease), then returned as [`Error::Engine`].
//! - **Lease and watchdog**: the default lease is 30 s, renewed every
//!   lease/3. If no renewal succeeds for a whole lease, the engine refuses
//!   one, or the engine reports its session gone, [`Guard::lost`] fires.
//!
//! # Semaphores
//!
//! At most `n` holders at once, across processes: `permits = n` in the
//! attribute, or [`semaphore`] in the Lock API. Each permit has its own
//! lease, renewed like a lock's, so a crashed holder's permit comes back
//! within its lease; permits are reentrant per task, fenced, report loss,
//! and come first come, first served where the engine keeps a queue.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), dlock::Error> {
//! let partner = dlock::semaphore("partner-api", "acme", 3); // 3 calls at once
//! let permit = partner.acquire().await?;
//! assert_eq!(permit.permits(), Some(3));
//! // ... call the partner; permit.lost() fires if the permit is lost ...
//! permit.release().await?;
//! // Every client gives the same count while the semaphore is in use:
//! let _held = partner.acquire().await?;
//! let other = dlock::semaphore("partner-api", "acme", 5);
//! let refused = tokio::spawn(async move { other.try_acquire().await.map(|p| p.is_some()) });
//! assert!(matches!(
//!     refused.await.expect("task"),
//!     Err(dlock::Error::PermitCount { asked: 5, in_use: 3, .. })
//! ));
//! # Ok(())
//! # }
//! ```
//!
//! **Fencing a pool.** A fence that rises across all `n` permits cannot
//! fence anything: a store keeping the greatest token seen would refuse
//! sound holders as soon as another permit went through. Where the engine
//! puts permits in slots ([`kit::Capabilities::slots`]; every engine
//! dlock ships), each permit is one of `n` slots, held by one holder at a
//! time, and [`Guard::slot`] names it. Give each of the `n` resources a slot, send the permit's
//! fence with every write to its slot's resource, and have the resource
//! refuse a token below the greatest it has seen, as a lock's store does:
//! a holder whose permit ran out while it was paused is refused once its
//! slot's next holder has written.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), dlock::Error> {
//! let replicas = dlock::semaphore("replicas", "reporting-db", 2);
//! let permit = replicas.acquire().await?;
//! let slot = permit.slot().expect("the memory engine's permits have slots");
//! // ... write to replica `slot`, with `permit.fence()` as the token ...
//! # assert!(slot < 2);
//! permit.release().await?;
//! # Ok(())
//! # }
//! ```
//!
//! # Leader election
//!
//! One leader at a time among the processes that campaign: [`election`].
//! The leader's term is a fencing token, greater than every earlier
//! leader's; [`Election::run_while_leader`] runs work while leading and
//! cancels it when the term is lost; [`Election::observe`] reports who
//! leads to anyone. On etcd an election is `etcdctl elect`'s, on ZooKeeper
//! Curator's `LeaderLatch`, so dlock and those candidates take turns.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), dlock::Error> {
//! let election = dlock::election("scheduler", "leader");
//! let mut observer = election.observe();
//! assert_eq!(observer.next().await?, None); // nobody leads yet
//! let term = election.campaign().await?;
//! assert_eq!(observer.next_leader().await?.term, term.number());
//! term.resign().await?;
//! assert_eq!(observer.next().await?, None);
//! # Ok(())
//! # }
//! ```
//!
//! # Configuration
//!
//! ```toml
//! [defaults]
//! engine = "main"
//! lease = "30s"
//! wait = "10s"                                                  # or "forever" (the default)
//! poll = { strategy = "exponential", initial = "10ms", max = "200ms" }   # or constant + interval
//! queue = "local"                                               # or "engine": every waiter in the server's queue
//! call_timeout = "5s"                                           # the longest one engine call may take
//! deadlock_warning = "10s"                                      # warn when waiting this long for a lock another task here holds
//! deadlock_check = "1s"                                         # a task holding locks, waiting this long, looks for a cycle of waits
//! client_name = "billing"                                       # this process's label in holder records; default <host>:<pid>
//!
//! [engines.main]
//! kind = "memory"                    # built in (default feature `memory`)
//!
//! [groups.payment]
//! engine = "main"
//! lease = "5s"
//! wait = "forever"
//! ```
//!
//! [`init_from_file`] (or [`init`] with a [`Config`]) builds the engines
//! once at startup, before the first lock. `DLOCK_SECTION__KEY=value`
//! overrides any field, e.g. `DLOCK_DEFAULTS__LEASE=5s`. A bad config fails
//! there, naming the field ([`Error::Config`]).
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), dlock::Error> {
//! let config = dlock::Config::parse(
//!     r#"
//!     [engines.main]
//!     kind = "memory"
//!
//!     [groups.payment]
//!     lease = "5s"
//!     "#,
//!     std::env::vars(),
//! )?;
//! dlock::init(config).await?;
//! let payment = dlock::locks("payment");
//! assert_eq!(payment.engine(), "main");
//! # Ok(())
//! # }
//! ```
//!
//! # Engines
//!
//! Each engine is behind a cargo feature of this crate (`memory` is on by
//! default; `all-engines` turns on every one) and named by `kind` in config:
//!
//! | kind | cargo feature | server | semaphores |
//! |---|---|---|---|
//! | `memory` | `memory` (default) | none: locks live in this process | yes |
//! | `redis`, `redis-cluster`, `redis-sentinel` | `redis` (`redis-tls` for `rediss://`) | Redis, a Redis Cluster, Redis behind Sentinel | yes |
//! | `redlock` | `redlock` | independent Redis masters, RedLock | yes, no queue |
//! | `zookeeper` | `zookeeper` (`zookeeper-tls` for TLS) | ZooKeeper, compatible with Apache Curator's lock and semaphore | yes |
//! | `etcd` | `etcd` (`etcd-tls` for `https://`; needs `protoc`, Debian `protobuf-compiler` and `libprotobuf-dev`, to build) | etcd, compatible with `etcdctl lock` | yes |
//! | `postgres` | `postgres` | PostgreSQL advisory locks | yes |
//! | `mysql` | `mysql` | MySQL 8, MariaDB 10.6+ | yes |
//! | `memcached` | `memcached` | memcached | yes, no queue |
//! | `dynamodb` | `dynamodb` (a heavy build: the AWS SDK) | Amazon DynamoDB | yes, no queue |
//! | `nats` | `nats` | NATS JetStream 2.11+ | yes |
//!
//! Each module of [`engines`] documents its engine's settings and how it
//! keeps its promises. A config naming a kind this build leaves out fails
//! naming the cargo feature to turn on.
//!
//! ```no_run
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), dlock::Error> {
//! // dlock.toml, with cargo feature `redis`:
//! //
//! //   [engines.main]
//! //   kind = "redis"
//! //   url = "redis://127.0.0.1:6379"
//! dlock::init_from_file("dlock.toml").await?;
//! let guard = dlock::lock("order", "42").lock().await?;
//! # guard.release().await
//! # }
//! ```
//!
//! An engine of your own implements [`kit::Engine`], declares its
//! [`kit::Guarantees`], offers its [`kit::Facets`] and registers its kind
//! with [`init_with`]; one built by hand goes in with [`install`].
//!
//! # Guarantees
//!
//! What an engine can promise is declared once, in its [`kit::Guarantees`]: read
//! mode or exclusive only, a FIFO queue on the server or none, strict or
//! best-effort fencing, and what ends an unrenewed hold (its lease, or the
//! client's session). The core refuses what an engine lacks with
//! [`Error::Unsupported`] (read mode on memcached, a lease shorter than the
//! engine's unit). Every engine passes the same conformance suite, skipping
//! only the cases its capabilities rule out.
//!
//! | kind | capabilities |
//! |---|---|
//! | `memory`, `redis` (and cluster, sentinel), `postgres`, `mysql`, `nats` | read write, fifo, fence strict, ends with lease |
//! | `zookeeper`, `etcd` | read write, fifo, fence strict, ends with session |
//! | `memcached` | write only, no queue, fence best effort, ends with lease, lease unit 1s |
//! | `dynamodb` | read write, no queue, fence strict, ends with lease |
//! | `redlock` | write only, no queue, fence best effort (none with `fence = false`), ends with lease |
//!
//! A fencing token protects storage only if storage checks it: pass
//! [`Guard::fence`] (or [`fence`]) with every write and have storage refuse
//! a token below the greatest it has seen. `docs/guarantees.md`, in the
//! repository, names the test that shows each guarantee on each engine,
//! under faults (holders killed or paused past their lease, servers
//! restarted).
//!
//! # Metrics
//!
//! Recorded through the [`metrics`](https://docs.rs/metrics) facade; the
//! application installs the exporter (Prometheus, StatsD, ...). Labels
//! `group`, `mode`, `engine`. Handles are registered on first use: install
//! the recorder before the first lock.
//!
//! | series | kind | meaning |
//! |---|---|---|
//! | `dlock_events_total{event}` | counter | `attempt`, `acquired`, `reentered`, `timed_out`, `busy`, `failed`, `released`, `renewed`, `renewal_failed`, `lost`, `revoked` |
//! | `dlock_wait_seconds` | histogram | first attempt → granted |
//! | `dlock_hold_seconds` | histogram | outermost grant → final release (one span per hold, not per nesting level) |
//! | `dlock_release_seconds` | histogram | the release call |
//! | `dlock_held`, `dlock_waiting` | gauges | holds and waiting requests in this process |
//!
//! [`metrics::describe`] adds units and help texts; the names are constants
//! in [`metrics`].
//!
//! # Tracing
//!
//! dlock reports to [`tracing`](https://docs.rs/tracing) under the target
//! `dlock` (`RUST_LOG=dlock=debug`):
//!
//! | span or event | level | fields |
//! |---|---|---|
//! | span `acquire`: one engine acquisition, until granted or given up | debug | `group`, `key`, `mode`, `engine`; then `wait_ms`, `outcome` |
//! | span `hold`: from the grant to the hold's end | debug | `group`, `key`, `mode`, `engine`, `fence` |
//! | event "lock wait ended without the lock", in `acquire` | debug | `error` |
//! | event "lock renewal failed; retrying", in `hold` | warn | `error` |
//! | event "lock lost", in `hold` | warn | `reason` |
//!
//! An annotated function's body runs inside its `hold` span, so whatever it
//! logs carries the lock's key and fence; with the Lock API, instrument the
//! work with [`HeldLock::span`]. Reentries make no span: they never reach
//! the engine.

#![warn(missing_docs)]

use std::path::Path;

use once_cell::sync::OnceCell;

pub use dlock_core::kit;
pub use dlock_core::{
    Acted, Config, Cycle, Election, Error, Guard, Guards, HeldLock, HolderRecord, Leader, Link, Lock,
    LockKey, LockSet, LockView, Locks, LostReason, Mode, Observer, Only, Reached, Registry, Semaphore,
    Settings, Share, Term, WAITS_GROUP, Wait, WaiterRecord, config, held_locks, metrics,
};
pub use dlock_core::{BoxError, MIN_LEASE};
pub use dlock_engines as engines;
pub use dlock_macros::distributed_lock;

#[doc(hidden)]
pub mod __private;
mod ran;

pub use ran::Ran;

#[cfg(feature = "admin")]
pub mod admin;
#[cfg(any(
    feature = "fenced-postgres",
    feature = "fenced-sqlx",
    feature = "fenced-redis",
    feature = "fenced-http"
))]
pub mod fenced;

static REGISTRY: OnceCell<Registry> = OnceCell::new();

/// Builds the configured engines into the global registry. Call once at
/// startup, before the first lock; a bad config fails here, naming the field.
///
/// Fails too if the global registry is already set: by an earlier `init`, or
/// by a lock taken before it (which settles on the embedded memory engine).
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), dlock::Error> {
/// let config = dlock::Config::parse("[engines.main]\nkind = \"memory\"", std::env::vars())?;
/// dlock::init(config).await?;
/// assert!(dlock::init(dlock::Config::default()).await.is_err()); // once only
/// # Ok(())
/// # }
/// ```
pub async fn init(config: Config) -> Result<(), Error> {
    init_with(config, &engines::kinds()).await
}

/// [`init`] with engine kinds of your own besides the built-in ones.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), dlock::Error> {
/// use dlock::engines::memory::MemoryEngine;
///
/// #[derive(serde::Deserialize)]
/// struct Mine {} // the kind's settings, from its `[engines.<name>]` table
///
/// let mut kinds = dlock::engines::kinds();
/// kinds.register("mine", |_name, _: Mine| async { Ok::<_, dlock::Error>(MemoryEngine::new()) });
/// let config = dlock::Config::parse("[engines.main]\nkind = \"mine\"", std::env::vars())?;
/// dlock::init_with(config, &kinds).await?;
/// # Ok(())
/// # }
/// ```
pub async fn init_with(config: Config, kinds: &kit::Kinds) -> Result<(), Error> {
    install(Registry::build(&config, kinds).await?)
}

/// Makes `registry` the global one: for engines built by hand (a custom
/// engine, a wrapper). Same rules as [`init`]: once, before the first lock.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), dlock::Error> {
/// use std::sync::Arc;
/// use std::time::Duration;
/// use dlock::engines::memory::MemoryEngine;
/// use dlock::{Registry, Settings, Wait};
///
/// let settings = Settings {
///     wait: Wait::For(Duration::from_secs(5)),
///     ..Settings::default()
/// };
/// dlock::install(Registry::with_engine("main", Arc::new(MemoryEngine::new()), settings)?)?;
/// assert_eq!(dlock::locks("order").engine(), "main");
/// # Ok(())
/// # }
/// ```
pub fn install(registry: Registry) -> Result<(), Error> {
    REGISTRY.set(registry).map_err(|_| {
        Error::config(
            "init",
            "dlock is already initialised (by an earlier init or a lock taken before init)",
        )
    })
}

/// [`init`] from a TOML file, with `DLOCK_*` environment overrides
/// ([`Config::from_file`]).
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let path = std::env::temp_dir().join(format!("dlock-doc-{}.toml", std::process::id()));
/// std::fs::write(&path, "[defaults]\nlease = \"10s\"\n\n[engines.main]\nkind = \"memory\"\n")?;
/// dlock::init_from_file(&path).await?;
/// assert_eq!(dlock::locks("order").settings().lease.as_secs(), 10);
/// # std::fs::remove_file(&path)?;
/// # Ok(())
/// # }
/// ```
pub async fn init_from_file(path: impl AsRef<Path>) -> Result<(), Error> {
    init(Config::from_file(path)?).await
}

/// The global registry: the one [`init`] built, else the embedded memory
/// engine with the default settings (30 s lease, no wait limit). The first
/// call settles it: [`init`] after it fails.
///
/// # Panics
///
/// If [`init`] was not called and the `memory` feature is off.
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

/// The lock family of `group` from the global registry; see [`Locks`].
pub fn locks(group: &str) -> Locks {
    registry().locks(group)
}

/// The lock `name` of `group` from the global registry; see [`Lock`].
pub fn lock(group: &str, name: &str) -> Lock {
    locks(group).get(name)
}

/// The semaphore `name` of `group` from the global registry, admitting
/// `permits` holders at once; see [`Semaphore`].
pub fn semaphore(group: &str, name: &str, permits: u32) -> Semaphore {
    locks(group).semaphore(name, permits)
}

/// The election `name` of `group` from the global registry; see [`Election`].
pub fn election(group: &str, name: &str) -> Election {
    locks(group).election(name)
}

/// The innermost lock held by a `#[distributed_lock]` function running in
/// this task; `None` outside one, even while a [`Guard`] of the Lock API is
/// held, and in one with several locks (each has its own fence: see
/// [`held_lock`]). Every lock the task holds, however taken: [`held_locks`].
/// Spawned tasks inherit neither, unless spawned with [`spawn`].
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), dlock::Error> {
/// #[dlock::distributed_lock(group = "order", key = "<id>")]
/// async fn pay(id: u64) -> Result<(), dlock::Error> {
///     let held = dlock::current().expect("inside an annotated fn");
///     assert_eq!(held.key().to_string(), format!("order/{id}"));
///     assert_eq!(dlock::fence(), Some(held.fence()));
///     Ok(())
/// }
///
/// pay(42).await?;
/// assert!(dlock::current().is_none());
/// # Ok(())
/// # }
/// ```
pub fn current() -> Option<HeldLock> {
    __private::CURRENT.try_with(Option::clone).ok().flatten()
}

/// The fencing token of [`current`]: pass it to storage with every write.
/// `None` outside a `#[distributed_lock]` function, and in one with several
/// locks.
pub fn fence() -> Option<u64> {
    current().map(|held| held.fence())
}

/// Lock `name` of `group`, if this task holds it, however taken: in a
/// function with several locks, each one's fence.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), dlock::Error> {
/// #[dlock::distributed_lock(group = "account", keys = ["<from>", "<to>"])]
/// async fn transfer(from: u64, to: u64, cents: u64) -> Result<(), dlock::Error> {
///     let debit = dlock::held_lock("account", &from.to_string()).expect("held");
///     let credit = dlock::held_lock("account", &to.to_string()).expect("held");
///     assert_ne!(debit.fence(), credit.fence()); // hand each store its own
///     assert_eq!(dlock::fence(), None); // which one would be ambiguous
///     Ok(())
/// }
///
/// transfer(7, 3, 100).await?; // takes account/3, then account/7
/// transfer(3, 7, 100).await // the same order: no deadlock with the first
/// # }
/// ```
pub fn held_lock(group: &str, name: &str) -> Option<HeldLock> {
    held_locks()
        .into_iter()
        .find(|held| held.key().group() == group && held.key().name() == name)
}

/// Spawns `fut` as a task that shares every lock this task holds (see
/// [`Share`]): its acquisitions of those locks reenter them, in their mode,
/// with no engine call, instead of waiting behind this task (and, if this
/// task awaits it, forever). The holds last until this task's guards and
/// the spawned task are both done. Inside, [`fence`] and [`current`] give
/// this task's innermost annotated lock.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), dlock::Error> {
/// #[dlock::distributed_lock(group = "order", key = "<id>")]
/// async fn pay(id: u64) -> Result<(), dlock::Error> {
///     // Reenters this task's hold; tokio::spawn would wait behind it, forever.
///     let part = dlock::spawn(charge(id));
///     part.await.expect("charge task")
/// }
///
/// #[dlock::distributed_lock(group = "order", key = "<id>")]
/// async fn charge(id: u64) -> Result<(), dlock::Error> {
///     Ok(())
/// }
///
/// pay(42).await
/// # }
/// ```
pub fn spawn<F>(fut: F) -> tokio::task::JoinHandle<F::Output>
where
    F: std::future::Future + Send + 'static,
    F::Output: Send + 'static,
{
    let shares = held_locks().iter().filter_map(|held| held.share().ok()).collect();
    let shared = dlock_core::with_shares(shares, fut);
    match __private::CURRENT.try_with(Option::clone) {
        Ok(innermost) => tokio::spawn(__private::CURRENT.scope(innermost, shared)),
        Err(_) => tokio::spawn(shared),
    }
}
