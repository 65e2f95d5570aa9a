//! The engine kinds a build knows, and how an engine is built from its
//! `[engines.<name>]` table.

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use serde::de::DeserializeOwned;

use super::{ClientSettings, Credentials, Engine, TlsFiles};
use crate::Error;
use crate::config::EngineConfig;
use crate::typo::{field_names, typo_of, with_suggestion};

type Built = Pin<Box<dyn Future<Output = Result<Arc<dyn Engine>, Error>> + Send>>;
type Build = dyn Fn(&str, &EngineConfig) -> Built + Send + Sync;

/// The engine kinds a build knows, by the `kind` written in config. Built-in
/// engines register here the same way an engine from another crate does:
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), dlock::Error> {
/// use dlock::engines::memory::MemoryEngine;
/// use dlock::{Config, Registry};
///
/// #[derive(serde::Deserialize)]
/// struct MySettings {
///     url: String,
/// }
///
/// let mut kinds = dlock::engines::kinds(); // the built-in kinds, and:
/// // `[engines.<name>]` with `kind = "mine"` lands here, `url` parsed.
/// kinds.register("mine", |_name: String, settings: MySettings| async move {
///     assert_eq!(settings.url, "mine://10.0.0.5");
///     Ok::<_, dlock::Error>(MemoryEngine::new()) // connect to settings.url here
/// });
/// let config = Config::parse("[engines.main]\nkind = \"mine\"\nurl = \"mine://10.0.0.5\"", [])?;
/// let registry = Registry::build(&config, &kinds).await?;
/// assert!(registry.engine("main").is_some());
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Default)]
pub struct Kinds {
    builders: BTreeMap<&'static str, Arc<Build>>,
    /// Kinds this build leaves out, with the cargo feature that brings each.
    left_out: BTreeMap<&'static str, &'static str>,
}

impl Kinds {
    /// No kinds at all; `dlock::engines::kinds()` gives the built-in ones.
    pub fn new() -> Self {
        Self::default()
    }

    /// Registers `kind`. An engine of that kind is built by `build(name,
    /// settings)`, with `settings` parsed from its `[engines.<name>]` table
    /// (less `kind`); a bad field fails naming `engines.<name>.<field>`.
    /// A later registration of the same kind replaces the earlier.
    pub fn register<S, E, F, Fut>(&mut self, kind: &'static str, build: F) -> &mut Self
    where
        S: DeserializeOwned + Send + 'static,
        E: Engine,
        F: Fn(String, S) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<E, Error>> + Send + 'static,
    {
        let build = Arc::new(build);
        let builder = move |name: &str, config: &EngineConfig| -> Built {
            let settings = config
                .settings::<S>(name)
                .map_err(|e| shared_field_at_fault(name, config, e));
            let (build, name) = (build.clone(), name.to_owned());
            Box::pin(async move {
                build(name, settings?)
                    .await
                    .map(|e| Arc::new(e) as Arc<dyn Engine>)
            })
        };
        self.builders.insert(kind, Arc::new(builder));
        self
    }

    /// Says that `kinds` exist but are not in this build: config naming one
    /// fails saying which cargo feature of dlock brings it.
    pub fn left_out(&mut self, kinds: &[&'static str], feature: &'static str) -> &mut Self {
        for kind in kinds {
            self.left_out.insert(kind, feature);
        }
        self
    }

    /// The kinds registered, in order.
    pub fn names(&self) -> Vec<&'static str> {
        self.builders.keys().copied().collect()
    }

    /// Builds engine `name` as its config says.
    pub async fn build(&self, name: &str, config: &EngineConfig) -> Result<Arc<dyn Engine>, Error> {
        self.builder(name, config)?(name, config).await
    }

    /// Checks that engine `name`'s kind is known, before anything connects.
    pub(crate) fn check(&self, name: &str, config: &EngineConfig) -> Result<(), Error> {
        self.builder(name, config).map(drop)
    }

    fn builder(&self, name: &str, config: &EngineConfig) -> Result<&Build, Error> {
        let unknown = || {
            let kind = config.kind.as_str();
            let problem = match self.left_out.get(kind) {
                Some(feature) => format!(
                    "engine kind `{kind}` is not in this build: enable the cargo feature `{feature}` of dlock-rs (`cargo add dlock-rs --features {feature}`)"
                ),
                None => format!("unknown engine kind `{kind}`"),
            };
            Error::config(
                format!("engines.{name}.kind"),
                format!("{problem}; this build offers: {}", self.names().join(", ")),
            )
        };
        self.builders
            .get(config.kind.as_str())
            .map(|b| &**b)
            .ok_or_else(unknown)
    }
}

/// serde reports an error inside settings flattened into an engine's
/// table without the field's name; the shared settings, read on their own,
/// name it. An unknown field comes back without its name too, and only
/// after any missing one: a missing field with a key one typo away is
/// reported as that key.
fn shared_field_at_fault(name: &str, config: &EngineConfig, error: Error) -> Error {
    let Error::Config { field, message } = &error else {
        return error;
    };
    if *field != format!("engines.{name}") {
        return error;
    }
    let quoted = |prefix: &str| Some(message.strip_prefix(prefix)?.split('`').next()?.to_owned());
    if let Some(unknown) = quoted("unknown field `") {
        let shared = [
            field_names::<ClientSettings>(),
            field_names::<Credentials>(),
            field_names::<TlsFiles>(),
        ];
        let message = with_suggestion(message.clone(), &shared.concat());
        return Error::config(format!("{field}.{unknown}"), message);
    }
    if let Some(missing) = quoted("missing field `") {
        let typo = config.settings.keys().find(|key| typo_of(key, &missing));
        if let Some(key) = typo {
            return Error::config(
                format!("{field}.{key}"),
                format!("unknown field `{key}`; did you mean `{missing}`?"),
            );
        }
    }
    let shared = config.settings::<ClientSettings>(name).err();
    let shared = shared.or_else(|| config.settings::<Credentials>(name).err());
    shared
        .or_else(|| config.settings::<TlsFiles>(name).err())
        .unwrap_or(error)
}
