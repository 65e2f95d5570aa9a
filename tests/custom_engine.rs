//! An engine defined outside dlock-engines, with nothing but the `dlock`
//! crate: registered as a kind, routed to from TOML, and put through the
//! conformance suite, which skips by its capabilities (exclusive only, no
//! queue, leases in whole 100 ms units) and checks the typed errors. It
//! offers one facet, hold at least, and writes nothing for the others.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use dlock::kit::{
    Engine, EngineError, Facets, Fencing, Guarantees, HoldAtLeast, Kinds, Lifecycle, LostSignal, OwnerId,
    Poll, Records, Renewal, Request, Woken, async_trait,
};
use dlock::{Config, Error, LockKey, Registry};
use tokio::sync::Notify;
use tokio::time::Instant;

/// Exclusive locks in a table, no queue: whoever asks first after a release
/// (or a lease running out) gets in.
struct TableEngine {
    holders: Mutex<HashMap<LockKey, (OwnerId, Instant)>>,
    fence: AtomicU64,
    released: Arc<Notify>,
    unit: Duration,
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct TableSettings {
    #[serde(with = "humantime_serde")]
    lease_unit: Duration,
}

impl TableEngine {
    fn new(unit: Duration) -> Self {
        TableEngine {
            holders: Mutex::default(),
            fence: AtomicU64::new(0),
            released: Arc::default(),
            unit,
        }
    }

    /// Leases count whole units, rounded up.
    fn expiry(&self, lease: Duration) -> Instant {
        let units = lease.as_nanos().div_ceil(self.unit.as_nanos()) as u32;
        Instant::now() + self.unit * units
    }

    fn holders(&self) -> std::sync::MutexGuard<'_, HashMap<LockKey, (OwnerId, Instant)>> {
        self.holders.lock().unwrap()
    }

    /// Runs `f` on `req`'s holder entry if `req` holds a live lease.
    fn if_holding(&self, req: &Request, f: impl FnOnce(&mut (OwnerId, Instant))) -> bool {
        match self.holders().get_mut(&req.key) {
            Some(entry) if entry.0 == req.owner && entry.1 > Instant::now() => {
                f(entry);
                true
            }
            _ => false,
        }
    }

    fn let_go(&self, req: &Request) -> bool {
        let mut holders = self.holders();
        let mine = holders
            .get(&req.key)
            .is_some_and(|(owner, _)| *owner == req.owner);
        if mine {
            holders.remove(&req.key);
            self.released.notify_waiters();
        }
        mine
    }
}

#[async_trait]
impl Engine for TableEngine {
    fn kind(&self) -> &'static str {
        "table"
    }

    fn address(&self) -> String {
        "in-process table".to_owned()
    }

    fn guarantees(&self) -> Guarantees {
        Guarantees {
            fencing: Fencing::Strict,
            lease_unit: self.unit,
            ..Guarantees::default()
        }
    }

    fn facets(&self) -> Facets<'_> {
        Facets {
            hold_at_least: Some(self),
            ..Facets::default()
        }
    }

    async fn downgrade(&self, _req: &Request) -> Result<bool, EngineError> {
        unreachable!("the core never asks an engine without read mode to downgrade")
    }
}

#[async_trait]
impl Lifecycle for TableEngine {
    async fn acquire(&self, req: &Request) -> Result<Poll, EngineError> {
        let mut holders = self.holders();
        let now = Instant::now();
        match holders.get(&req.key) {
            Some((_, expires)) if *expires > now => {
                let expires = *expires;
                let released = self.released.clone().notified_owned();
                Ok(Poll::Waiting(Box::pin(async move {
                    tokio::select! {
                        _ = released => {}
                        _ = tokio::time::sleep_until(expires) => {}
                    }
                    Woken::Retry
                })))
            }
            _ => {
                holders.insert(req.key.clone(), (req.owner, self.expiry(req.lease)));
                Ok(Poll::Held(self.fence.fetch_add(1, Ordering::SeqCst) + 1))
            }
        }
    }

    async fn poll(&self, req: &Request) -> Result<Poll, EngineError> {
        self.acquire(req).await
    }

    async fn cancel(&self, req: &Request) -> Result<(), EngineError> {
        self.let_go(req);
        Ok(())
    }

    async fn renew(&self, req: &Request) -> Result<Renewal, EngineError> {
        let expires = self.expiry(req.lease);
        Ok(Renewal::from(self.if_holding(req, |entry| entry.1 = expires)))
    }

    async fn release(&self, req: &Request) -> Result<bool, EngineError> {
        Ok(self.let_go(req))
    }

    /// No signal of its own: a failed renewal tells the core.
    fn lost(&self, _req: &Request) -> Option<LostSignal> {
        None
    }
}

/// Its renewal sets the expiry to the request's lease, so the facet's
/// default serves: renew for what is left, and leave the lock to expire.
#[async_trait]
impl HoldAtLeast for TableEngine {}

fn kinds() -> Kinds {
    let mut kinds = dlock::engines::kinds();
    kinds.register("table", |_name, settings: TableSettings| async move {
        Ok(TableEngine::new(settings.lease_unit))
    });
    kinds
}

const CONFIG: &str = r#"
[defaults]
engine = "main"

[engines.main]
kind = "memory"

[engines.table]
kind = "table"
lease_unit = "100ms"

[groups.orders]
engine = "table"
lease = "2s"
"#;

async fn build(text: &str) -> Result<Registry, Error> {
    Registry::build(&Config::parse(text, std::iter::empty())?, &kinds()).await
}

#[tokio::test]
async fn a_group_routed_to_an_engine_from_another_crate() {
    let registry = build(CONFIG).await.expect("config");
    let orders = registry.locks("orders");
    assert_eq!(orders.engine(), "table");
    assert_eq!(registry.engine("table").expect("built").kind(), "table");
    let guard = orders.get("42").lock().await.expect("lock");
    let other_task = orders.get("42");
    let busy = tokio::spawn(async move { other_task.try_lock().await.expect("try").is_none() });
    assert!(busy.await.expect("task"), "held twice");
    let err = orders
        .get("7")
        .read()
        .await
        .expect_err("read mode on a write-only engine");
    assert!(matches!(err, Error::Unsupported { .. }), "{err}");
    guard.release().await.expect("release");
    // Other groups stay on the default engine.
    assert_eq!(registry.locks("other").engine(), "main");
}

#[tokio::test]
async fn its_settings_and_capabilities_are_checked_at_startup() {
    let field_of = |result: Result<Registry, Error>| match result {
        Err(Error::Config { field, message }) => (field, message),
        Err(other) => panic!("expected a config error, got {other}"),
        Ok(_) => panic!("bad config accepted"),
    };
    let (field, message) = field_of(build(&CONFIG.replace("lease = \"2s\"", "lease = \"50ms\"")).await);
    assert_eq!(field, "groups.orders.lease", "{message}");
    assert!(message.contains("lease unit"), "{message}");
    let (field, _) = field_of(build(&CONFIG.replace("lease_unit", "lease_unti")).await);
    assert_eq!(field, "engines.table.lease_unti");
    let (field, message) = field_of(build(&CONFIG.replace("kind = \"table\"", "kind = \"tabel\"")).await);
    assert_eq!(field, "engines.table.kind");
    assert!(
        message.contains("table"),
        "the offered kinds include it: {message}"
    );
}

#[tokio::test]
async fn it_offers_only_the_facets_it_implements() {
    let capabilities = engine().await.capabilities();
    assert!(capabilities.hold_at_least);
    assert!(!capabilities.semaphore && !capabilities.control && !capabilities.election_values);
    assert_eq!(capabilities.records, Records::None);
    assert!(!capabilities.election(), "no records show its terms");
    let registry = build(CONFIG).await.expect("config");
    let lock = registry.locks("orders").get("9");
    for refused in [lock.inspect().await.map(drop), lock.revoke().await.map(drop)] {
        assert!(matches!(refused, Err(Error::Unsupported { .. })), "{refused:?}");
    }
}

async fn engine() -> Arc<dyn Engine> {
    let registry = build(CONFIG).await.expect("config");
    registry.engine("table").expect("built").clone()
}

dlock::engines::conformance_suite!(engine);
