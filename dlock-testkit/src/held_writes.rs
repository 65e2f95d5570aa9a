//! The scenario every engine's held writes pass: a holder paused past its
//! lease, then resumed, has its write refused by the server itself, and the
//! write of the holder that took over lands.
//!
//! The paused holder runs on a runtime of its own thread, with an engine
//! of its own, and is paused by blocking that thread: every task of its
//! client stops (renewals, keep-alives, session pings), as in a process
//! stopped by SIGSTOP, while its connections stay open. Its held write is
//! the first thing it does when it resumes, and nothing in dlock checks the
//! hold before sending it: only the server can refuse it.
//!
//! The same scenario drives writes that the user's own storage fences
//! (`dlock::fenced`): there the storage refuses the stale token
//! ([`paused_holder_scenario`] with the adapter's refusal).

use std::fmt::Debug;
use std::sync::Arc;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use dlock_core::kit::async_trait;
use dlock_core::{Config, Error, Guard, LostReason, Registry};
use dlock_engines::conformance::SETTINGS;

use crate::Fixture;

/// An engine's held writes, or a fenced store's writes (refused with `E`),
/// as the scenario drives them.
#[async_trait]
pub trait HeldStore<E: Send + 'static = Error>: Send + Sync + 'static {
    /// Writes `value` to the one place the scenario uses, through the
    /// engine's held writes for `guard`'s hold, or with its fence.
    async fn write(&self, guard: &Guard, value: &str) -> Result<(), E>;

    /// What that place holds now, read straight from the server.
    async fn read(&self) -> Option<String>;
}

/// What the scenario saw, for the test's figures.
#[derive(Debug)]
pub struct Report {
    /// How long after the holder's pause the next holder got in.
    pub taken_over_after: Duration,
    /// What the resumed holder's write answered.
    pub stale_write: String,
}

/// Runs the scenario on lock `name` of a random group (see the module
/// docs), and checks its outcome: the paused holder's write is refused with
/// `Error::Lost`, the new holder's fence is greater and its write is what
/// the store keeps. Prints the figures.
pub fn paused_holder_is_refused<F: Fixture>(fixture: &F, store: Arc<dyn HeldStore>) -> Report {
    // `Rejected`: the server refused it; nothing judged it stale first.
    let report = paused_holder_scenario(fixture, store, |stale| match stale {
        Err(
            error @ Error::Lost {
                reason: LostReason::Rejected,
                ..
            },
        ) => error.to_string(),
        other => {
            panic!("the paused holder's write after its lease: expected Lost (Rejected), got {other:?}")
        }
    });
    println!(
        "{}: taken over {:?} after the pause; the stale write: {}",
        F::NAME,
        report.taken_over_after,
        report.stale_write
    );
    report
}

/// The scenario, with locks on `fixture`'s engine, writes through `store`,
/// and `refused` checking what the resumed holder's write answered (it
/// panics on anything but the expected refusal) and describing it.
pub fn paused_holder_scenario<E: Debug + Send + 'static>(
    fixture: &impl Fixture,
    store: Arc<dyn HeldStore<E>>,
    refused: impl FnOnce(Result<(), E>) -> String,
) -> Report {
    let config = format!("[engines.main]\n{}", fixture.engine_config());
    let group = format!("held-{:08x}", rand::random::<u32>());
    let (to_holder, resume) = mpsc::channel::<()>();
    let (holding, from_holder) = mpsc::channel::<u64>();
    let (stale_tx, stale_rx) = mpsc::channel::<Result<(), E>>();
    let holder = {
        let (config, group, store) = (config.clone(), group.clone(), store.clone());
        std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            runtime.block_on(async move {
                let registry = registry(&config, "holder").await;
                let guard = registry
                    .locks(&group)
                    .get("held")
                    .lock()
                    .await
                    .expect("the holder gets in");
                store
                    .write(&guard, "first")
                    .await
                    .expect("the holder's write while it holds");
                holding.send(guard.fence()).expect("the test listens");
                // Blocks this runtime's only thread: the pause.
                resume.recv().expect("the test resumes the holder");
                let stale = store.write(&guard, "stale").await;
                stale_tx.send(stale).expect("the test listens");
            });
        })
    };
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let report = runtime.block_on(async move {
        let first_fence = from_holder
            .recv_timeout(Duration::from_secs(30))
            .expect("the holder holds");
        assert_eq!(
            store.read().await.as_deref(),
            Some("first"),
            "the holder's write landed"
        );
        let paused = Instant::now();
        let registry = registry(&config, "taker").await;
        let guard = registry
            .locks(&group)
            .get("held")
            .lock()
            .await
            .expect("the next holder gets in");
        let taken_over_after = paused.elapsed();
        assert!(
            guard.fence() > first_fence,
            "the next holder's fence {} is not above the paused one's {first_fence}",
            guard.fence()
        );
        store
            .write(&guard, "taker")
            .await
            .expect("the new holder's write");
        to_holder.send(()).expect("the holder waits");
        let stale = tokio::task::spawn_blocking(move || stale_rx.recv_timeout(Duration::from_secs(30)))
            .await
            .expect("join")
            .expect("the resumed holder answers");
        let stale_write = refused(stale);
        assert_eq!(
            store.read().await.as_deref(),
            Some("taker"),
            "the new holder's write is what the store keeps"
        );
        store
            .write(&guard, "taker again")
            .await
            .expect("the new holder writes on");
        guard.release().await.expect("release");
        Report {
            taken_over_after,
            stale_write,
        }
    });
    holder.join().expect("the holder's thread");
    report
}

/// A registry on its own engine built from `config`, as another process's.
async fn registry(config: &str, name: &str) -> Registry {
    let config = Config::parse(config, std::iter::empty()).expect("the fixture's config parses");
    let engine = dlock_engines::kinds()
        .build("main", &config.engines["main"])
        .await
        .expect("the fixture's engine connects");
    Registry::with_engine(name, engine, SETTINGS).expect("the engine serves the settings")
}
