//! The ZooKeeper engine's settings, and connecting.

use std::time::Duration;

use dlock_core::Error;
use dlock_core::kit::{ClientSettings, Connecting, Credentials, Kinds, TlsFiles, TlsMode, default_root};
use serde::Deserialize;
use zookeeper_client::Acls;

use super::ZooKeeperEngine;
use super::keeper::Keeper;
use super::session::Sessions;
use super::tls::Transport;

/// Settings of the ZooKeeper engine, `kind = "zookeeper"`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ZooKeeperConfig {
    /// `host:port[,host:port...]`, optionally followed by a chroot path.
    pub connect: String,
    /// Parent of every lock path; Curator peers name `<root>/<group>/<name>`.
    #[serde(default = "default_root")]
    pub root: String,
    /// The session timeout asked of the server: a crashed or cut-off
    /// process's locks are free after it, and this engine gives its holds
    /// up as lost after half of it without the server.
    #[serde(default = "default_session_timeout", with = "humantime_serde")]
    pub session_timeout: Duration,
    /// How long the LockKeeper keeps a lock's state after its last request.
    #[serde(default = "default_keeper_idle", with = "humantime_serde")]
    pub keeper_idle: Duration,
    /// `user:password` for ZooKeeper digest authentication.
    #[serde(default)]
    pub digest: Option<String>,
    /// The same as `username` and `password` (or `password_file`), in
    /// place of `digest`.
    #[serde(flatten)]
    pub credentials: Credentials,
    /// `connect_timeout` bounds connecting and opening a session;
    /// `client_name` is the label this process's nodes carry.
    #[serde(flatten)]
    pub client: ClientSettings,
    /// TLS, for a server's `secureClientPort` (cargo feature
    /// `zookeeper-tls`): `require`, `verify-ca` or `verify-full`; default
    /// `disable`. A secure port speaks TLS alone, so `prefer` is refused.
    #[serde(default)]
    pub tls_mode: Option<TlsMode>,
    /// The CA that signed the server's certificate (needed: the client
    /// knows no system roots), and this client's certificate and key for
    /// a server that asks for one (`ssl.clientAuth`).
    #[serde(flatten)]
    pub tls: TlsFiles,
}

impl ZooKeeperConfig {
    /// Defaults for everything but the connect string.
    pub fn new(connect: impl Into<String>) -> Self {
        ZooKeeperConfig {
            connect: connect.into(),
            root: default_root(),
            session_timeout: default_session_timeout(),
            keeper_idle: default_keeper_idle(),
            digest: None,
            credentials: Credentials::default(),
            client: ClientSettings::default(),
            tls_mode: None,
            tls: TlsFiles::default(),
        }
    }
}

fn default_session_timeout() -> Duration {
    Duration::from_secs(10)
}

fn default_keeper_idle() -> Duration {
    Duration::from_secs(60)
}

/// Registers `kind = "zookeeper"`.
pub fn register(kinds: &mut Kinds) {
    kinds.register("zookeeper", |name, config: ZooKeeperConfig| async move {
        ZooKeeperEngine::connect(&name, &config).await
    });
}

impl ZooKeeperEngine {
    /// Connects engine `name` (for error messages) and opens its session.
    pub async fn connect(name: &str, config: &ZooKeeperConfig) -> Result<Self, Error> {
        let at = Connecting {
            name,
            kind: "zookeeper",
        };
        let label = config.client.label(&at)?;
        if config.connect.trim().is_empty() {
            return Err(at.bad("connect", "name at least one host:port"));
        }
        let root = config.root.trim_end_matches('/');
        if !root.starts_with('/') || root.contains("//") {
            return Err(at.bad(
                "root",
                format!("`{}` is not an absolute ZooKeeper path", config.root),
            ));
        }
        if config.digest.as_ref().is_some_and(|d| !d.contains(':')) {
            return Err(at.bad("digest", "write it as `user:password`"));
        }
        let mut config = config.clone();
        match (&config.credentials.username, config.credentials.password(&at)?) {
            (None, None) => {}
            (Some(_), Some(_)) if config.digest.is_some() => {
                return Err(at.bad("digest", "set digest, or username and password, not both"));
            }
            (Some(user), Some(password)) => config.digest = Some(format!("{user}:{password}")),
            (None, Some(_)) => return Err(at.bad("username", "set username with password")),
            (Some(_), None) => return Err(at.bad("password", "set password or password_file with username")),
        }
        let config = &config;
        let transport = Transport::new(&at, config)?;
        let sessions = Sessions::connect(config.clone(), transport)
            .await
            .map_err(|e| at.unreachable(&config.connect, e))?;
        Ok(ZooKeeperEngine {
            sessions,
            root: root.to_owned(),
            acls: if config.digest.is_some() {
                Acls::creator_all()
            } else {
                Acls::anyone_all()
            },
            keeper: Keeper::new(config.keeper_idle),
            address: config.connect.clone(),
            label,
        })
    }
}
