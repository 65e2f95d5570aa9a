//! The Redis engines' settings (one server, a cluster, or behind
//! Sentinel), and connecting.

use std::sync::Arc;
use std::time::Duration;

use dlock_core::Error;
use dlock_core::kit::{ClientSettings, Connecting, Credentials, Kinds, TlsFiles, without_password};
use redis::{Client, ConnectionInfo, IntoConnectionInfo};
use serde::Deserialize;

use super::connection::{self, Target};
use super::{RedisEngine, notify};

/// Settings of a single-server Redis engine, `kind = "redis"`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RedisConfig {
    /// `redis://[user:password@]host:port`, or `rediss://` for TLS (feature `redis-tls`).
    pub url: String,
    /// How long the last fencing token is kept after a grant: the next
    /// token is past it even if the server's clock stepped back by less;
    /// see the [module docs](super).
    #[serde(default = "default_fence_retention", with = "humantime_serde")]
    pub fence_retention: Duration,
    /// How long a queued waiter stays in line without polling before the
    /// others drop it as dead.
    #[serde(default = "default_waiter_ttl", with = "humantime_serde")]
    pub waiter_ttl: Duration,
    /// Replicas that must have a grant before it is handed out (`WAIT`).
    #[serde(default)]
    pub replicas_ack: u32,
    /// How long a grant waits for `replicas_ack` replicas; too few in time,
    /// and it is undone and tried again within the wait.
    #[serde(default = "default_replicas_ack_timeout", with = "humantime_serde")]
    pub replicas_ack_timeout: Duration,
    /// `connect_timeout` bounds connecting, and each command's connection
    /// and response in the client; `client_name` is the label its holder
    /// records carry.
    #[serde(flatten)]
    pub client: ClientSettings,
    /// For `rediss://`: the CA that signed the server's certificate
    /// (default: the system's), and this client's certificate and key for
    /// servers that ask for one (`tls-auth-clients`).
    #[serde(flatten)]
    pub tls: TlsFiles,
    /// An ACL `username` and `password` (or `password_file`), in place of
    /// the url's.
    #[serde(flatten)]
    pub credentials: Credentials,
}

impl RedisConfig {
    /// Defaults for everything but the url.
    pub fn new(url: impl Into<String>) -> Self {
        RedisConfig {
            url: url.into(),
            fence_retention: default_fence_retention(),
            waiter_ttl: default_waiter_ttl(),
            replicas_ack: 0,
            replicas_ack_timeout: default_replicas_ack_timeout(),
            client: ClientSettings::default(),
            tls: TlsFiles::default(),
            credentials: Credentials::default(),
        }
    }
}

/// Settings of a Redis Cluster engine, `kind = "redis-cluster"`: seed nodes,
/// from which the client learns the rest.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RedisClusterConfig {
    /// `redis://host:port` of one or more cluster nodes; `rediss://` for
    /// TLS to every node (feature `redis-tls`, the nodes run with
    /// `tls-cluster yes`).
    pub nodes: Vec<String>,
    /// As [`RedisConfig::fence_retention`].
    #[serde(default = "default_fence_retention", with = "humantime_serde")]
    pub fence_retention: Duration,
    /// As [`RedisConfig::waiter_ttl`].
    #[serde(default = "default_waiter_ttl", with = "humantime_serde")]
    pub waiter_ttl: Duration,
    /// As [`RedisConfig::client`].
    #[serde(flatten)]
    pub client: ClientSettings,
    /// As [`RedisConfig::credentials`], for every node.
    #[serde(flatten)]
    pub credentials: Credentials,
    /// As [`RedisConfig::tls`], for every node.
    #[serde(flatten)]
    pub tls: TlsFiles,
}

/// Settings of a Redis engine behind Sentinel, `kind = "redis-sentinel"`:
/// the engine follows the primary the sentinels name, across failovers.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RedisSentinelConfig {
    /// `redis://[user:password@]host:port` of each sentinel (auth, if any,
    /// from the first). `rediss://` for TLS (feature `redis-tls`) to the
    /// sentinels and to the data nodes they name, which then run with
    /// `tls-replication yes`.
    pub sentinels: Vec<String>,
    /// The name the sentinels monitor the primary under.
    pub master_name: String,
    /// Replicas that must have a grant before it is handed out (`WAIT`).
    /// With 1 or more a grant survives a failover, and an old primary that
    /// no replica follows any more grants nothing; but the lock then stops
    /// granting while fewer replicas are up, so it is not the default.
    #[serde(default)]
    pub replicas_ack: u32,
    /// As [`RedisConfig::replicas_ack_timeout`].
    #[serde(default = "default_replicas_ack_timeout", with = "humantime_serde")]
    pub replicas_ack_timeout: Duration,
    /// As [`RedisConfig::fence_retention`].
    #[serde(default = "default_fence_retention", with = "humantime_serde")]
    pub fence_retention: Duration,
    /// As [`RedisConfig::waiter_ttl`].
    #[serde(default = "default_waiter_ttl", with = "humantime_serde")]
    pub waiter_ttl: Duration,
    /// As [`RedisConfig::client`].
    #[serde(flatten)]
    pub client: ClientSettings,
    /// The data nodes' ACL `username` and `password` or `password_file`
    /// (a password alone for `AUTH`).
    #[serde(flatten)]
    pub credentials: Credentials,
    /// As [`RedisConfig::tls`], for the sentinels and the data nodes.
    #[serde(flatten)]
    pub tls: TlsFiles,
}

fn default_fence_retention() -> Duration {
    Duration::from_secs(60)
}

fn default_waiter_ttl() -> Duration {
    Duration::from_secs(3)
}

fn default_replicas_ack_timeout() -> Duration {
    Duration::from_millis(50)
}

/// Registers `kind = "redis"`, `"redis-cluster"` and `"redis-sentinel"`.
pub fn register(kinds: &mut Kinds) {
    kinds.register("redis", |name, config: RedisConfig| async move {
        RedisEngine::connect(&name, &config).await
    });
    kinds.register("redis-cluster", |name, config: RedisClusterConfig| async move {
        RedisEngine::connect_cluster(&name, &config).await
    });
    kinds.register("redis-sentinel", |name, config: RedisSentinelConfig| async move {
        RedisEngine::connect_sentinel(&name, &config).await
    });
}

impl RedisEngine {
    /// Connects single-server engine `name` (for error messages).
    pub async fn connect(name: &str, config: &RedisConfig) -> Result<Self, Error> {
        let at = Connecting { name, kind: "redis" };
        let timings = timings(&at, config.fence_retention, config.waiter_ttl)?;
        let client = client(&at, "url", &config.url, &config.tls, &config.credentials)?;
        let target = Target {
            label: config.client.label(&at)?,
            at,
            address: client.get_connection_info().addr().to_string(),
            timeout: config.client.connect_timeout,
        };
        let connection = connection::single(client.clone(), &target).await?;
        let notifier = notify::Notifier::new(notify::Source::Single(Box::new(client)));
        let engine = Self::new(target, connection, notifier, "PUBLISH", timings).await?;
        Ok(engine.acknowledged_by(config.replicas_ack, config.replicas_ack_timeout))
    }

    /// Connects Redis Cluster engine `name` through its seed nodes.
    pub async fn connect_cluster(name: &str, config: &RedisClusterConfig) -> Result<Self, Error> {
        let at = Connecting {
            name,
            kind: "redis-cluster",
        };
        let timings = timings(&at, config.fence_retention, config.waiter_ttl)?;
        if config.nodes.is_empty() {
            return Err(at.bad("nodes", "name at least one seed node"));
        }
        let urls: Vec<&str> = config.nodes.iter().map(String::as_str).collect();
        wants_tls(&at, "nodes", &urls, &config.tls)?;
        let seeds = connection::Seeds {
            nodes: urls
                .iter()
                .map(|url| connection_info(&at, "nodes", url, &config.credentials))
                .collect::<Result<Vec<_>, _>>()?,
            #[cfg(feature = "redis-tls")]
            certificates: certificates(&at, &config.tls)?,
        };
        let addresses: Vec<String> = config.nodes.iter().map(|url| without_password(url)).collect();
        let target = Target {
            label: config.client.label(&at)?,
            at,
            address: addresses.join(","),
            timeout: config.client.connect_timeout,
        };
        let connection = connection::cluster(&seeds, &target).await?;
        let notifier = notify::Notifier::new(notify::Source::Cluster(seeds));
        Self::new(target, connection, notifier, "SPUBLISH", timings).await
    }

    /// Connects Sentinel engine `name` to the primary its sentinels name.
    pub async fn connect_sentinel(name: &str, config: &RedisSentinelConfig) -> Result<Self, Error> {
        let at = Connecting {
            name,
            kind: "redis-sentinel",
        };
        let timings = timings(&at, config.fence_retention, config.waiter_ttl)?;
        if config.sentinels.is_empty() {
            return Err(at.bad("sentinels", "name at least one sentinel"));
        }
        let urls: Vec<&str> = config.sentinels.iter().map(String::as_str).collect();
        // Without `redis-tls`, `rediss://` is refused: `tls` is false.
        #[cfg_attr(not(feature = "redis-tls"), expect(unused_variables))]
        let tls = wants_tls(&at, "sentinels", &urls, &config.tls)?;
        #[cfg(feature = "redis-tls")]
        let certificates = certificates(&at, &config.tls)?;
        let mut infos = Vec::new();
        let mut sentinel_auth = None;
        for url in &config.sentinels {
            let info = redis::IntoConnectionInfo::into_connection_info(url.as_str())
                .map_err(|e| at.bad("sentinels", format!("`{}`: {e}", without_password(url))))?;
            let settings = info.redis_settings();
            if sentinel_auth.is_none() && settings.password().is_some() {
                sentinel_auth = Some(settings.clone());
            }
            infos.push(info);
        }
        // Every sentinel is reached with the first one's credentials.
        if let Some(auth) = &sentinel_auth {
            infos = infos
                .into_iter()
                .map(|info| info.set_redis_settings(auth.clone()))
                .collect();
        }
        // The certificates go with each sentinel's address, which the
        // client and the failover listener both connect by.
        #[cfg(feature = "redis-tls")]
        if let Some(certificates) = &certificates {
            infos = infos
                .into_iter()
                .map(|info| {
                    Client::build_with_tls(info, certificates.clone())
                        .map(|c| c.get_connection_info().clone())
                })
                .collect::<Result<_, _>>()
                .map_err(|e| at.bad("sentinels", e.to_string()))?;
        }
        let addresses: Vec<_> = infos.iter().map(|info| info.addr().clone()).collect();
        let mut builder = redis::sentinel::SentinelClientBuilder::new(
            addresses,
            &config.master_name,
            redis::sentinel::SentinelServerType::Master,
        )
        .map_err(|e| at.bad("sentinels", e.to_string()))?;
        if let Some(auth) = &sentinel_auth {
            if let Some(username) = auth.username() {
                builder = builder.set_client_to_sentinel_username(username);
            }
            if let Some(password) = auth.password() {
                builder = builder.set_client_to_sentinel_password(password);
            }
        }
        #[cfg(feature = "redis-tls")]
        if tls {
            builder = builder.set_client_to_redis_tls_mode(redis::TlsMode::Secure);
            if let Some(certificates) = certificates {
                builder = builder.set_client_to_redis_certificates(certificates);
            }
        }
        if let Some(username) = &config.credentials.username {
            builder = builder.set_client_to_redis_username(username);
        }
        if let Some(password) = config.credentials.password(&at)? {
            builder = builder.set_client_to_redis_password(password);
        }
        let sentinel = builder.build().map_err(|e| at.bad("sentinels", e.to_string()))?;
        let timeout = config.client.connect_timeout;
        let target = Target {
            label: config.client.label(&at)?,
            at,
            address: format!(
                "{} (sentinels {})",
                config.master_name,
                config
                    .sentinels
                    .iter()
                    .map(|url| without_password(url))
                    .collect::<Vec<_>>()
                    .join(",")
            ),
            timeout,
        };
        let primary = Arc::new(connection::Primary::new(sentinel, timeout));
        let connection = connection::sentinel(primary.clone(), &target).await?;
        primary.follow(infos, &config.master_name);
        let notifier = notify::Notifier::new(notify::Source::Sentinel(primary));
        let engine = Self::new(target, connection, notifier, "PUBLISH", timings).await?;
        Ok(engine.acknowledged_by(config.replicas_ack, config.replicas_ack_timeout))
    }
}

/// `fence_retention` and `waiter_ttl`, which the scripts use as key
/// expiries: at least a millisecond each.
fn timings(
    at: &Connecting<'_>,
    fence_retention: Duration,
    waiter_ttl: Duration,
) -> Result<(Duration, Duration), Error> {
    for (field, value) in [("fence_retention", fence_retention), ("waiter_ttl", waiter_ttl)] {
        if value < Duration::from_millis(1) {
            return Err(at.bad(field, "must be at least 1ms"));
        }
    }
    Ok((fence_retention, waiter_ttl))
}

/// A client for `url` (the setting `field`), with the credentials and
/// TLS files when given.
pub(crate) fn client(
    at: &Connecting<'_>,
    field: &str,
    url: &str,
    files: &TlsFiles,
    credentials: &Credentials,
) -> Result<Client, Error> {
    wants_tls(at, field, &[url], files)?;
    let info = connection_info(at, field, url, credentials)?;
    #[cfg(feature = "redis-tls")]
    if let Some(certificates) = certificates(at, files)? {
        return Client::build_with_tls(info, certificates).map_err(|e| at.bad(field, e.to_string()));
    }
    Client::open(info).map_err(|e| at.bad(field, e.to_string()))
}

/// Whether `urls` ask for TLS: `rediss://`, all of them or none. The TLS
/// files go only with it, and it needs the cargo feature `redis-tls`.
fn wants_tls(at: &Connecting<'_>, field: &str, urls: &[&str], files: &TlsFiles) -> Result<bool, Error> {
    let secure = urls.iter().filter(|url| url.starts_with("rediss://")).count();
    if secure != 0 && secure != urls.len() {
        return Err(at.bad(field, "write every url as rediss:// for TLS, or none"));
    }
    let tls = secure != 0;
    if !tls && files.any() {
        let field = match files {
            TlsFiles {
                tls_ca_file: Some(_), ..
            } => "tls_ca_file",
            TlsFiles {
                tls_cert_file: Some(_),
                ..
            } => "tls_cert_file",
            _ => "tls_key_file",
        };
        return Err(at.bad(field, "is only used with a rediss:// url"));
    }
    if tls && !cfg!(feature = "redis-tls") {
        return Err(at.bad(field, "rediss:// needs dlock's cargo feature `redis-tls`"));
    }
    #[cfg(feature = "redis-tls")]
    if tls {
        crate::crypto::ensure_provider();
    }
    Ok(tls)
}

/// The certificates the TLS files name; none when no file is set (the
/// system's roots then check the server).
#[cfg(feature = "redis-tls")]
fn certificates(at: &Connecting<'_>, files: &TlsFiles) -> Result<Option<redis::TlsCertificates>, Error> {
    if !files.any() {
        return Ok(None);
    }
    let pem = files.read(at)?;
    Ok(Some(redis::TlsCertificates {
        client_tls: pem
            .identity
            .map(|(client_cert, client_key)| redis::ClientTlsConfig {
                client_cert,
                client_key,
            }),
        root_cert: pem.ca,
    }))
}

/// `url` parsed, with the user and password of `credentials` in place of
/// any it names; a password in both is an error naming `password`.
fn connection_info(
    at: &Connecting<'_>,
    field: &str,
    url: &str,
    credentials: &Credentials,
) -> Result<ConnectionInfo, Error> {
    let info = url.into_connection_info().map_err(|e| {
        at.bad(
            field,
            format!(
                "`{}` is not a Redis url ({e}); write redis://[user:password@]host:port, or rediss:// for TLS",
                without_password(url)
            ),
        )
    })?;
    let mut settings = info.redis_settings().clone();
    if let Some(password) = credentials.password(at)? {
        if settings.password().is_some() {
            let field = if credentials.password_file.is_some() {
                "password_file"
            } else {
                "password"
            };
            return Err(at.bad(
                field,
                format!("`{}` names a password too: keep one", without_password(url)),
            ));
        }
        settings = settings.set_password(password);
    }
    if let Some(username) = &credentials.username {
        settings = settings.set_username(username);
    }
    Ok(info.set_redis_settings(settings))
}
