//! The etcd engine's settings, and connecting: the client, and the lease
//! of the first session.

use std::sync::Arc;
use std::time::Duration;

use dlock_core::Error;
use dlock_core::kit::session::Sessions;
use dlock_core::kit::{ClientSettings, Connecting, Credentials, EngineError, Kinds, TlsFiles, default_root};
use etcd_client::{Client, ConnectOptions};
use serde::Deserialize;

use super::key_numbers::KeyNumbers;
use super::session::Session;
use super::watches::Watches;
use super::{EtcdEngine, tls};

/// Settings of the etcd engine, `kind = "etcd"`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EtcdConfig {
    /// `host:port` or `http://host:port` of one or more cluster members.
    pub endpoints: Vec<String>,
    /// Parent of every lock prefix: `etcdctl lock <root>/<group>/<name>`
    /// takes the same lock as dlock.
    #[serde(default = "default_root")]
    pub root: String,
    /// TTL of the engine's lease, whole seconds: how soon the locks of a
    /// process that died are free.
    #[serde(default = "default_session_ttl", with = "humantime_serde")]
    pub session_ttl: Duration,
    /// `connect_timeout` bounds connecting and opening the first session;
    /// `client_name` is the label in each key's value (else the process
    /// label), which records show.
    #[serde(flatten)]
    pub client: ClientSettings,
    /// `username` (or `user`) and `password`, for clusters with
    /// authentication on; both or neither.
    #[serde(flatten)]
    pub credentials: Credentials,
    /// For `https://` endpoints (cargo feature `etcd-tls`): the CA that
    /// signed the members' certificates (default: the system's), and this
    /// client's certificate and key for members that check them
    /// (`--client-cert-auth`).
    #[serde(flatten)]
    pub tls: TlsFiles,
}

impl EtcdConfig {
    /// Defaults for everything but the endpoints.
    pub fn new(endpoints: &[String]) -> Self {
        EtcdConfig {
            endpoints: endpoints.to_vec(),
            root: default_root(),
            session_ttl: default_session_ttl(),
            client: ClientSettings::default(),
            credentials: Credentials::default(),
            tls: TlsFiles::default(),
        }
    }
}

fn default_session_ttl() -> Duration {
    Duration::from_secs(10)
}

/// Registers `kind = "etcd"`.
pub fn register(kinds: &mut Kinds) {
    kinds.register("etcd", |name, config: EtcdConfig| async move {
        EtcdEngine::connect(&name, &config).await
    });
}

impl EtcdEngine {
    /// Connects engine `name` (for error messages) and grants its lease.
    pub async fn connect(name: &str, config: &EtcdConfig) -> Result<Self, Error> {
        let at = Connecting { name, kind: "etcd" };
        let label = config.client.label(&at)?;
        if config.endpoints.is_empty() || config.endpoints.iter().any(|e| e.trim().is_empty()) {
            return Err(at.bad("endpoints", "name at least one host:port, none empty"));
        }
        let ttl = config.session_ttl;
        if ttl < Duration::from_secs(1) || ttl.subsec_nanos() != 0 {
            return Err(at.bad(
                "session_ttl",
                format!("{ttl:?} is not a whole number of seconds, at least 1 (etcd leases count seconds)"),
            ));
        }
        let login = match (&config.credentials.username, config.credentials.password(&at)?) {
            (Some(user), Some(password)) => Some((user, password)),
            (None, None) => None,
            (Some(_), None) => return Err(at.bad("password", "set both username and password, or neither")),
            (None, Some(_)) => return Err(at.bad("username", "set both username and password, or neither")),
        };
        let tls = tls::options(config, &at)?;
        let address = config.endpoints.join(",");
        let timeout = config.client.connect_timeout;
        let connected = async {
            let mut options = ConnectOptions::new()
                .with_connect_timeout(timeout)
                .with_keep_alive(Duration::from_secs(1), Duration::from_secs(2))
                .with_keep_alive_while_idle(true)
                // A member without a leader answers at once rather than
                // holding the call until an election ends: then it is retried.
                .with_require_leader(true);
            if let Some((user, password)) = login {
                options = options.with_user(user, password);
            }
            options = tls::apply(options, tls);
            let client = Client::connect(&config.endpoints, Some(options))
                .await
                .map_err(EngineError::failed)?;
            let first = Session::open(&client, ttl).await?;
            Ok::<_, EngineError>((client, first))
        };
        let (client, first) = match tokio::time::timeout(timeout, connected).await {
            Ok(connected) => connected.map_err(|e| at.unreachable(&address, e))?,
            Err(_) => {
                let why = format!("no answer within {timeout:?}{}", probe(&config.endpoints).await);
                return Err(at.unreachable(&address, why));
            }
        };
        Ok(EtcdEngine {
            watches: Arc::new(Watches::new(client.clone())),
            client,
            sessions: Sessions::new(first),
            ttl,
            root: config.root.trim_end_matches('/').to_owned(),
            key_numbers: KeyNumbers::default(),
            address,
            label,
        })
    }
}

/// Why each endpoint could not be reached, for the error message.
async fn probe(endpoints: &[String]) -> String {
    let mut why = String::new();
    for endpoint in endpoints {
        let address = endpoint
            .trim_start_matches("http://")
            .trim_start_matches("https://")
            .trim_end_matches('/');
        let attempt = tokio::time::timeout(Duration::from_secs(1), tokio::net::TcpStream::connect(address));
        match attempt.await {
            Ok(Ok(_)) => why += &format!("; {address} accepts connections but did not answer"),
            Ok(Err(e)) => why += &format!("; {address}: {e}"),
            Err(_) => why += &format!("; {address}: no connection within 1s"),
        }
    }
    why
}
