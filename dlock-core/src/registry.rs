//! The engines built from config at startup, and the routing of groups to them.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;

use crate::config::{Config, Defaults, EngineConfig, GroupConfig, IMPLICIT_ENGINE, Polling, Queue};
use crate::lock::{GroupCtx, Locks};
use crate::{Engine, Error};

/// Builds engines by kind; `dlock-engines` provides the one that knows every
/// engine compiled in.
#[async_trait]
pub trait Factory: Sync {
    /// The kinds this build can make.
    fn kinds(&self) -> Vec<&'static str>;

    /// Connects engine `name` of `config.kind`. Errors name the field or the address.
    async fn build(&self, name: &str, config: &EngineConfig) -> Result<Arc<dyn Engine>, Error>;
}

/// The timing of one group's locks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Settings {
    pub lease: Duration,
    /// `None`: wait until granted.
    pub wait: Option<Duration>,
    pub poll: Polling,
    pub waiter_ttl: Duration,
    pub queue: Queue,
}

impl Default for Settings {
    fn default() -> Self {
        Settings::from(&Defaults::default())
    }
}

impl From<&Defaults> for Settings {
    fn from(d: &Defaults) -> Self {
        Settings {
            lease: d.lease,
            wait: d.wait,
            poll: d.poll,
            waiter_ttl: d.waiter_ttl,
            queue: d.queue,
        }
    }
}

/// An engine with the name it was configured under.
#[derive(Clone)]
pub(crate) struct NamedEngine {
    pub name: Arc<str>,
    pub engine: Arc<dyn Engine>,
}

/// Engines by name plus the group routes: where `Locks` come from.
///
/// ```
/// # use std::sync::Arc;
/// # async fn demo(engine: Arc<dyn dlock_core::Engine>) -> Result<(), dlock_core::Error> {
/// let registry = dlock_core::Registry::with_engine("main", engine, Default::default());
/// let guard = registry.locks("order").get("42").lock().await?;
/// guard.release().await
/// # }
/// ```
pub struct Registry {
    engines: BTreeMap<String, NamedEngine>,
    default_engine: String,
    defaults: Settings,
    groups: BTreeMap<String, GroupConfig>,
    /// One context per (group, engine), so its metric handles are registered
    /// once. Groups are business purposes, few by design; names are many.
    contexts: Mutex<HashMap<(String, String), Arc<GroupCtx>>>,
}

impl Registry {
    /// Builds every configured engine (or the implicit memory engine) and the routes.
    pub async fn build(config: &Config, factory: &dyn Factory) -> Result<Self, Error> {
        config.check()?;
        let kinds = factory.kinds();
        let implicit = [(
            IMPLICIT_ENGINE.to_owned(),
            EngineConfig {
                kind: IMPLICIT_ENGINE.to_owned(),
                settings: Default::default(),
            },
        )];
        let configured: Vec<(String, EngineConfig)> = if config.engines.is_empty() {
            implicit.into()
        } else {
            config.engines.clone().into_iter().collect()
        };
        // Every kind is checked before anything connects, so a typo fails at once.
        for (name, engine) in &configured {
            if !kinds.contains(&engine.kind.as_str()) {
                return Err(Error::config(
                    format!("engines.{name}.kind"),
                    format!(
                        "unknown engine kind `{}`; this build offers: {}",
                        engine.kind,
                        kinds.join(", ")
                    ),
                ));
            }
        }
        let mut engines = BTreeMap::new();
        for (name, engine_config) in configured {
            let engine = factory.build(&name, &engine_config).await?;
            let named = NamedEngine {
                name: name.as_str().into(),
                engine,
            };
            engines.insert(name, named);
        }
        Ok(Registry {
            engines,
            default_engine: config.default_engine().to_owned(),
            defaults: Settings::from(&config.defaults),
            groups: config.groups.clone(),
            contexts: Mutex::default(),
        })
    }

    /// A registry of one engine serving every group with `settings`.
    pub fn with_engine(name: &str, engine: Arc<dyn Engine>, settings: Settings) -> Self {
        let named = NamedEngine {
            name: name.into(),
            engine,
        };
        Registry {
            engines: BTreeMap::from([(name.to_owned(), named)]),
            default_engine: name.to_owned(),
            defaults: settings,
            groups: BTreeMap::new(),
            contexts: Mutex::default(),
        }
    }

    /// The lock family of `group`, on the engine its config routes it to.
    pub fn locks(&self, group: &str) -> Locks {
        let group_config = self.groups.get(group);
        let engine = group_config
            .and_then(|g| g.engine.as_deref())
            .unwrap_or(&self.default_engine);
        self.locks_with(group, &self.engines[engine], group_config)
    }

    /// The lock family of `group` on the engine named `engine`, whatever the routes say.
    pub fn locks_on(&self, group: &str, engine: &str) -> Result<Locks, Error> {
        let named = self.engines.get(engine).ok_or_else(|| {
            Error::config(
                "engine",
                format!("engine `{engine}` (asked for by group `{group}`) is not configured"),
            )
        })?;
        Ok(self.locks_with(group, named, self.groups.get(group)))
    }

    /// The engine configured as `name`.
    pub fn engine(&self, name: &str) -> Option<&Arc<dyn Engine>> {
        self.engines.get(name).map(|n| &n.engine)
    }

    fn locks_with(&self, group: &str, engine: &NamedEngine, config: Option<&GroupConfig>) -> Locks {
        let mut contexts = self.contexts.lock().unwrap_or_else(|e| e.into_inner());
        let key = (group.to_owned(), engine.name.to_string());
        let ctx = contexts.entry(key).or_insert_with(|| {
            let mut settings = self.defaults;
            if let Some(g) = config {
                settings.lease = g.lease.unwrap_or(settings.lease);
                settings.wait = g.wait.or(settings.wait);
                settings.queue = g.queue.unwrap_or(settings.queue);
            }
            Arc::new(GroupCtx::new(group.into(), engine.clone(), settings))
        });
        Locks::new(ctx.clone())
    }
}
