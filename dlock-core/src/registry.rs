//! The engines built from config at startup, and the routing of groups to
//! them.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::config::{Config, EngineConfig, GroupConfig, IMPLICIT_ENGINE, Settings, check_lease};
use crate::kit::{Capabilities, Engine, EngineError, Facets, Kinds, Request};
use crate::metrics::Labels;
use crate::{Error, LockKey};

/// What every lock of one group on one engine shares.
pub(crate) struct Group {
    pub name: Arc<str>,
    /// The engine's configured name, for messages and metrics.
    pub engine_name: Arc<str>,
    pub engine: Arc<dyn Engine>,
    pub capabilities: Capabilities,
    pub settings: Settings,
    pub labels: Labels,
    /// Every engine of the registry, by name: where a deadlock's waits
    /// are looked for (`deadlock.rs`).
    pub engines: Arc<Engines>,
}

/// A registry's engines, by their configured names.
pub(crate) type Engines = BTreeMap<String, Arc<dyn Engine>>;

impl Group {
    /// A group named `name` on this group's engine, with its settings:
    /// where the core keeps records of its own (a deadlock's waits).
    pub fn beside(&self, name: &str) -> Group {
        let name: Arc<str> = name.into();
        Group {
            labels: Labels::new(name.clone(), self.engine_name.clone()),
            name,
            engine_name: self.engine_name.clone(),
            engine: self.engine.clone(),
            capabilities: self.capabilities,
            settings: self.settings,
            engines: self.engines.clone(),
        }
    }

    /// Names this group's engine, its address and the lock in an engine failure.
    pub fn engine_error(&self, req: &Request, error: EngineError) -> Error {
        self.engine_error_at(req.key.clone(), req.permits(), error)
    }

    /// [`engine_error`](Self::engine_error) for a call on `key` that is no request.
    pub fn engine_error_at(&self, key: LockKey, permits: Option<u32>, error: EngineError) -> Error {
        match error {
            EngineError::Failed(source) => Error::Engine {
                engine: self.engine_name.to_string(),
                kind: self.engine.kind(),
                address: self.engine.address(),
                key,
                source,
            },
            EngineError::PermitsDiffer { in_use } => Error::PermitCount {
                key,
                asked: permits.unwrap_or(1),
                in_use,
            },
        }
    }

    /// Names this group's engine, its address and the group in a failed listing.
    pub fn listing_error(&self, error: EngineError) -> Error {
        Error::Listing {
            engine: self.engine_name.to_string(),
            kind: self.engine.kind(),
            address: self.engine.address(),
            group: self.name.to_string(),
            source: match error {
                EngineError::Failed(source) => source,
                other => other.into(),
            },
        }
    }

    /// The facet `pick` takes from this group's engine, or the typed
    /// refusal naming `what` where the engine does not offer it.
    pub fn facet<'a, T: ?Sized>(
        &'a self,
        what: &str,
        pick: impl FnOnce(Facets<'a>) -> Option<&'a T>,
    ) -> Result<&'a T, Error> {
        pick(self.engine.facets()).ok_or_else(|| self.unsupported(what.to_owned()))
    }

    pub fn unsupported(&self, feature: String) -> Error {
        Error::Unsupported {
            engine: self.engine_name.to_string(),
            kind: self.engine.kind(),
            feature,
        }
    }

    /// Refuses a lease the core or the engine cannot keep.
    pub fn check_lease(&self, lease: Duration) -> Result<(), Error> {
        check_lease("lease", lease)?;
        let unit = self.capabilities.lease_unit;
        if lease < unit {
            return Err(self.unsupported(format!("a lease of {lease:?}: its leases count whole {unit:?}")));
        }
        Ok(())
    }
}

/// Engines by name plus the group routes: where `Locks` come from
/// (`Registry::locks`).
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), dlock::Error> {
/// use std::sync::Arc;
/// use dlock::engines::memory::MemoryEngine;
///
/// let engine = Arc::new(MemoryEngine::new());
/// let registry = dlock::Registry::with_engine("main", engine, Default::default())?;
/// let guard = registry.locks("order").get("42").lock().await?;
/// guard.release().await
/// # }
/// ```
///
/// The `dlock` functions (`dlock::lock`, the attribute) use one global
/// registry: `dlock::init` builds it from config, `dlock::install` takes
/// one built by hand.
pub struct Registry {
    engines: Arc<Engines>,
    default_engine: String,
    config: Config,
    /// One context per (group, engine), so its metric handles are registered
    /// once. Groups are business purposes, few by design; names are many.
    groups: Mutex<HashMap<(String, String), Arc<Group>>>,
}

impl Registry {
    /// Builds every configured engine (or the implicit memory engine) from
    /// `kinds`, and the routes.
    pub async fn build(config: &Config, kinds: &Kinds) -> Result<Self, Error> {
        config.check()?;
        let mut configured = config.engines.clone();
        if configured.is_empty() {
            let memory = EngineConfig {
                kind: IMPLICIT_ENGINE.to_owned(),
                settings: Default::default(),
            };
            configured.insert(IMPLICIT_ENGINE.to_owned(), memory);
        }
        if let Some(label) = &config.defaults.client_name {
            for engine in configured.values_mut() {
                engine
                    .settings
                    .entry("client_name")
                    .or_insert_with(|| label.clone().into());
            }
        }
        // Every kind is checked before anything connects, so a typo fails at once.
        for (name, engine) in &configured {
            kinds.check(name, engine)?;
        }
        let mut engines = BTreeMap::new();
        for (name, engine_config) in configured {
            let engine = kinds.build(&name, &engine_config).await?;
            engines.insert(name, engine);
        }
        Self::new(engines, config.default_engine().to_owned(), config.clone())
    }

    /// A registry of one engine serving every group with `settings`.
    pub fn with_engine(name: &str, engine: Arc<dyn Engine>, settings: Settings) -> Result<Self, Error> {
        let mut config = Config::default();
        config.defaults.lease = settings.lease;
        config.defaults.wait = settings.wait;
        config.defaults.poll = settings.poll;
        config.defaults.queue = settings.queue;
        config.defaults.call_timeout = settings.call_timeout;
        config.defaults.deadlock_warning = settings.deadlock_warning;
        config.defaults.deadlock_check = settings.deadlock_check;
        config.check()?;
        Self::new(
            BTreeMap::from([(name.to_owned(), engine)]),
            name.to_owned(),
            config,
        )
    }

    /// Checks what depends on both the config and the engines' capabilities.
    fn new(
        engines: BTreeMap<String, Arc<dyn Engine>>,
        default_engine: String,
        config: Config,
    ) -> Result<Self, Error> {
        let registry = Registry {
            default_engine,
            engines: Arc::new(engines),
            config,
            groups: Mutex::default(),
        };
        let defaults = &registry.config.defaults;
        for (name, engine) in registry.engines.iter() {
            let caps = engine.capabilities();
            if let Some(ttl) = caps.waiter_ttl
                && ttl < defaults.poll.max_interval() * 3
            {
                return Err(Error::config(
                    format!("engines.{name}.waiter_ttl"),
                    format!(
                        "{ttl:?} is shorter than 3 poll intervals ({:?}); live waiters would be dropped",
                        defaults.poll.max_interval() * 3
                    ),
                ));
            }
        }
        let default_unit = registry.engines[&registry.default_engine]
            .capabilities()
            .lease_unit;
        if defaults.lease < default_unit {
            return Err(lease_below_unit("defaults.lease", defaults.lease, default_unit));
        }
        for (group, g) in &registry.config.groups {
            let engine = g.engine.as_deref().unwrap_or(&registry.default_engine);
            let unit = registry.engines[engine].capabilities().lease_unit;
            let lease = g.lease.unwrap_or(defaults.lease);
            if lease < unit {
                return Err(lease_below_unit(&format!("groups.{group}.lease"), lease, unit));
            }
        }
        Ok(registry)
    }

    /// Its engines, and the call timeout of its defaults: what a search
    /// for deadlocks reads (`deadlock.rs`).
    pub(crate) fn engines_and_call_timeout(&self) -> (&Engines, Duration) {
        (&self.engines, self.config.defaults.call_timeout)
    }

    /// The engine configured as `name`.
    pub fn engine(&self, name: &str) -> Option<&Arc<dyn Engine>> {
        self.engines.get(name)
    }

    /// The context of `group`, on the engine its config routes it to, or on
    /// `engine` whatever the routes say.
    pub(crate) fn group(&self, group: &str, engine: Option<&str>) -> Result<Arc<Group>, Error> {
        let config = self.config.groups.get(group);
        let engine_name = match engine {
            Some(name) => name,
            None => config
                .and_then(|g| g.engine.as_deref())
                .unwrap_or(&self.default_engine),
        };
        let engine = self.engines.get(engine_name).ok_or_else(|| {
            Error::config(
                "engine",
                format!("engine `{engine_name}` (asked for by group `{group}`) is not configured"),
            )
        })?;
        let mut groups = self.groups.lock().unwrap_or_else(|e| e.into_inner());
        let key = (group.to_owned(), engine_name.to_owned());
        let made = groups
            .entry(key)
            .or_insert_with(|| Arc::new(self.make_group(group, engine_name, engine.clone(), config)));
        Ok(made.clone())
    }

    fn make_group(
        &self,
        group: &str,
        engine_name: &str,
        engine: Arc<dyn Engine>,
        config: Option<&GroupConfig>,
    ) -> Group {
        let (name, engine_name): (Arc<str>, Arc<str>) = (group.into(), engine_name.into());
        Group {
            labels: Labels::new(name.clone(), engine_name.clone()),
            name,
            engine_name,
            capabilities: engine.capabilities(),
            engine,
            settings: self.config.defaults.settings(config),
            engines: self.engines.clone(),
        }
    }
}

fn lease_below_unit(field: &str, lease: Duration, unit: Duration) -> Error {
    Error::config(
        field,
        format!("{lease:?} is shorter than the engine's lease unit ({unit:?})"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_kind_left_out_of_the_build_names_its_cargo_feature() {
        let mut kinds = Kinds::new();
        kinds.left_out(&["redis", "redis-cluster"], "redis");
        let config = EngineConfig {
            kind: "redis-cluster".into(),
            settings: Default::default(),
        };
        let Err(Error::Config { field, message }) = kinds.build("main", &config).await else {
            panic!("a left-out kind was built");
        };
        assert_eq!(field, "engines.main.kind");
        assert!(message.contains("cargo feature `redis`"), "{message}");
    }
}
