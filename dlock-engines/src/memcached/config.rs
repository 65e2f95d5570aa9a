//! The memcached engine's settings, and connecting.

use std::sync::Arc;

use dlock_core::Error;
use dlock_core::kit::{ClientSettings, Connecting, Credentials, Kinds, TlsFiles, TlsMode};
use serde::Deserialize;
use tokio_rustls::TlsConnector;

use super::MemcachedEngine;
use super::wire::{Opening, Pool};

/// Settings of the memcached engine, `kind = "memcached"`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MemcachedConfig {
    /// `host:port` of one memcached server.
    pub address: String,
    /// Connections kept open; requests on one connection wait for each other.
    #[serde(default = "default_connections")]
    pub connections: usize,
    /// `connect_timeout` bounds opening each connection; `client_name` is
    /// the label its holder records carry.
    #[serde(flatten)]
    pub client: ClientSettings,
    /// TLS, for a server run with `-Z`: `require`, `verify-ca` or
    /// `verify-full`; default `disable`. memcached cannot offer TLS on a
    /// port that speaks plain too, so `prefer` is refused.
    #[serde(default)]
    pub tls_mode: Option<TlsMode>,
    /// The CA that signed the server's certificate (default: the
    /// system's), and this client's certificate and key for a server that
    /// asks for one (`ssl_verify_mode=2`).
    #[serde(flatten)]
    pub tls: TlsFiles,
    /// `username` and `password` (or `password_file`), for a server run
    /// with `-Y <authfile>`.
    #[serde(flatten)]
    pub credentials: Credentials,
}

impl MemcachedConfig {
    /// Defaults for everything but the address.
    pub fn new(address: impl Into<String>) -> Self {
        MemcachedConfig {
            address: address.into(),
            connections: default_connections(),
            client: ClientSettings::default(),
            tls_mode: None,
            tls: TlsFiles::default(),
            credentials: Credentials::default(),
        }
    }
}

/// How each connection opens: TLS and the login, as `config` says.
fn opening(at: &Connecting<'_>, config: &MemcachedConfig) -> Result<Opening, Error> {
    let tls = match config.tls_mode.unwrap_or(TlsMode::Disable) {
        TlsMode::Disable if config.tls.any() => {
            return Err(at.bad(
                "tls_mode",
                "set it to require, verify-ca or verify-full to use the tls_ files",
            ));
        }
        TlsMode::Disable => None,
        TlsMode::Prefer => {
            return Err(at.bad(
                "tls_mode",
                "memcached cannot offer TLS on a port that speaks plain too: choose disable, require, verify-ca or verify-full",
            ));
        }
        mode => {
            let mut client = crate::tls::client_config(at, &config.tls, mode)?;
            // memcached 1.6 answers a resumed TLS 1.3 session with an
            // internal_error alert: every connection shakes hands in full.
            client.resumption = rustls::client::Resumption::disabled();
            let name = crate::tls::server_name(&config.address).ok_or_else(|| {
                at.bad(
                    "address",
                    format!("`{}` names no host to check a certificate for", config.address),
                )
            })?;
            Some((TlsConnector::from(Arc::new(client)), name))
        }
    };
    let login = match (&config.credentials.username, config.credentials.password(at)?) {
        (None, None) => None,
        (Some(user), Some(password)) => {
            if user.contains(char::is_whitespace) {
                return Err(at.bad(
                    "username",
                    "memcached's login takes no white space in the user name",
                ));
            }
            if password.contains(['\r', '\n']) {
                let field = if config.credentials.password_file.is_some() {
                    "password_file"
                } else {
                    "password"
                };
                return Err(at.bad(field, "memcached's login takes no line break in the password"));
            }
            let data = format!("{user} {password}");
            Some(format!("set dlock-login 0 0 {}\r\n{data}\r\n", data.len()).into_bytes())
        }
        (Some(_), None) => return Err(at.bad("password", "set password or password_file with username")),
        (None, Some(_)) => return Err(at.bad("username", "set username with password")),
    };
    Ok(Opening { tls, login })
}

fn default_connections() -> usize {
    4
}

/// Registers `kind = "memcached"`.
pub fn register(kinds: &mut Kinds) {
    kinds.register("memcached", |name, config: MemcachedConfig| async move {
        MemcachedEngine::connect(&name, &config).await
    });
}

impl MemcachedEngine {
    /// Connects engine `name` (for error messages).
    pub async fn connect(name: &str, config: &MemcachedConfig) -> Result<Self, Error> {
        let at = Connecting {
            name,
            kind: "memcached",
        };
        let label = config.client.label(&at)?;
        if config.address.trim().is_empty() {
            return Err(at.bad("address", "name the server as host:port"));
        }
        if config.connections == 0 {
            return Err(at.bad("connections", "must be at least 1"));
        }
        let pool = Pool::new(
            config.address.clone(),
            config.connections,
            config.client.connect_timeout,
            opening(&at, config)?,
        );
        // One round trip proves the server speaks the meta protocol; the
        // connect timeout bounds it whole, answer included.
        let probe = pool.call(b"mn\r\n", 1);
        let replies = at
            .within(&config.address, config.client.connect_timeout, probe)
            .await?;
        if replies[0].code() != "MN" {
            return Err(at.unreachable(
                &config.address,
                format!(
                    "not a memcached with the meta protocol (answered {:?})",
                    replies[0].code()
                ),
            ));
        }
        Ok(MemcachedEngine {
            pool,
            address: config.address.clone(),
            label,
        })
    }
}
