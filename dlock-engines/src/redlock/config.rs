//! The RedLock engine's settings, and connecting to its masters.

use std::sync::Arc;
use std::time::Duration;

use dlock_core::Error;
use dlock_core::kit::{ClientSettings, Connecting, Credentials, Kinds, TlsFiles};
use redis::Script;
use serde::Deserialize;
use tokio::sync::OnceCell;

use super::{Master, RedLockEngine, Scripts};
use crate::redis::config::client;

/// Settings of a RedLock engine, `kind = "redlock"`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RedLockConfig {
    /// `redis://` urls of independent masters (no cluster, no replicas): at
    /// least 3, an odd number recommended.
    pub masters: Vec<String>,
    /// Ordered tokens from the quorum (one more round trip per grant).
    #[serde(default = "default_fence")]
    pub fence: bool,
    /// How long one master may take to answer before it counts as a no.
    #[serde(default = "default_master_timeout", with = "humantime_serde")]
    pub master_timeout: Duration,
    /// How long a master keeps a lock's fence counter after the last grant;
    /// see the [module docs](super).
    #[serde(default = "default_fence_retention", with = "humantime_serde")]
    pub fence_retention: Duration,
    /// `connect_timeout` bounds connecting to each master; `client_name`
    /// is the label its holder records carry.
    #[serde(flatten)]
    pub client: ClientSettings,
    /// An ACL `username` and `password` (or `password_file`) for every
    /// master, in place of the urls'.
    #[serde(flatten)]
    pub credentials: Credentials,
    /// For `rediss://` masters (feature `redis-tls`): the CA that signed
    /// their certificates, and this client's certificate and key.
    #[serde(flatten)]
    pub tls: TlsFiles,
}

impl RedLockConfig {
    /// Defaults for everything but the masters.
    pub fn new(masters: Vec<String>) -> Self {
        RedLockConfig {
            masters,
            fence: default_fence(),
            master_timeout: default_master_timeout(),
            fence_retention: default_fence_retention(),
            client: ClientSettings::default(),
            credentials: Credentials::default(),
            tls: TlsFiles::default(),
        }
    }
}

fn default_fence() -> bool {
    true
}

fn default_master_timeout() -> Duration {
    Duration::from_millis(50)
}

fn default_fence_retention() -> Duration {
    Duration::from_secs(60)
}

/// Registers `kind = "redlock"`.
pub fn register(kinds: &mut Kinds) {
    kinds.register("redlock", |name, config: RedLockConfig| async move {
        RedLockEngine::connect(&name, &config).await
    });
}

impl RedLockEngine {
    /// Connects engine `name` (for error messages) to its masters; fails
    /// unless a majority answers.
    pub async fn connect(name: &str, config: &RedLockConfig) -> Result<Self, Error> {
        let at = Connecting {
            name,
            kind: "redlock",
        };
        let label = config.client.label(&at)?;
        if config.masters.len() < 3 {
            return Err(at.bad(
                "masters",
                format!(
                    "RedLock needs at least 3 independent masters, got {}",
                    config.masters.len()
                ),
            ));
        }
        let mut masters = Vec::new();
        for url in &config.masters {
            let client = client(&at, "masters", url, &config.tls, &config.credentials)?;
            masters.push(Arc::new(Master {
                address: client.get_connection_info().addr().to_string(),
                client,
                connection: OnceCell::new(),
                behind: Default::default(),
            }));
        }
        let engine = RedLockEngine {
            quorum: masters.len() / 2 + 1,
            address: masters
                .iter()
                .map(|m| m.address.as_str())
                .collect::<Vec<_>>()
                .join(","),
            masters,
            fence: config.fence,
            master_timeout: config.master_timeout,
            fence_retention: config.fence_retention,
            scripts: Scripts {
                acquire: Arc::new(Script::new(concat!(
                    include_str!("scripts/take.lua"),
                    include_str!("scripts/acquire.lua")
                ))),
                fence: Arc::new(Script::new(include_str!("scripts/fence.lua"))),
                renew: Arc::new(Script::new(include_str!("scripts/renew.lua"))),
                control: Arc::new(Script::new(include_str!("scripts/control.lua"))),
                forced: Arc::new(Script::new(include_str!("scripts/forced.lua"))),
                release: Arc::new(Script::new(include_str!("scripts/release.lua"))),
                permits: Arc::new(Script::new(concat!(
                    include_str!("scripts/take.lua"),
                    include_str!("scripts/permits.lua")
                ))),
                records: Arc::new(Script::new(include_str!("scripts/records.lua"))),
            },
            label,
        };
        let timeout = config.client.connect_timeout;
        let connected = engine
            .masters
            .iter()
            .map(|m| tokio::time::timeout(timeout, m.connection(timeout)));
        let connected = futures_util::future::join_all(connected).await;
        let errors: Vec<String> = connected
            .into_iter()
            .zip(&engine.masters)
            .filter_map(|(c, m)| match c {
                Ok(Ok(_)) => None,
                Ok(Err(e)) => Some(format!("{}: {e}", m.address)),
                Err(_) => Some(format!("{}: no answer within {timeout:?}", m.address)),
            })
            .collect();
        if engine.masters.len() - errors.len() < engine.quorum {
            return Err(at.unreachable(
                &engine.address,
                format!("fewer than a majority of masters answered: {}", errors.join("; ")),
            ));
        }
        Ok(engine)
    }
}
