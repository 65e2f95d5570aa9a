//! The NATS engine's settings, and connecting: the client, its
//! credentials and TLS, and the bucket, checked (or made) at startup.

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use async_nats::jetstream::{self, kv, stream::StorageType};
use async_nats::{ConnectOptions, Event, ServerAddr};
use dlock_core::Error;
use dlock_core::kit::{ClientSettings, Connecting, Credentials, Kinds, TlsFiles};
use serde::Deserialize;

use super::NatsEngine;
use super::mirror::Mirror;

/// Settings of the NATS engine, `kind = "nats"`.
#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NatsConfig {
    /// The servers, e.g. `["nats://10.0.0.1:4222"]`; `tls://` asks for TLS.
    pub servers: Vec<String>,
    /// The key-value bucket of the locks. Default `dlock`.
    #[serde(default = "default_bucket")]
    pub bucket: String,
    /// Make the bucket at startup if it is missing (needs the JetStream
    /// API's `STREAM.CREATE`). Default: yes.
    #[serde(default = "yes")]
    pub create_bucket: bool,
    /// The replicas of a bucket made at startup: 1, or 3 or 5 in a cluster.
    #[serde(default = "one")]
    pub replicas: usize,
    /// A user and password (`username`, `password` or `password_file`);
    /// never shown.
    #[serde(flatten)]
    pub credentials: Credentials,
    /// A token; never shown.
    #[serde(default)]
    pub token: Option<String>,
    /// A file holding the token (its first line).
    #[serde(default)]
    pub token_file: Option<PathBuf>,
    /// A file holding an NKey seed (`SU...`).
    #[serde(default)]
    pub nkey_seed_file: Option<PathBuf>,
    /// A `.creds` file (a user JWT and its seed), as `nsc` writes it.
    #[serde(default)]
    pub credentials_file: Option<PathBuf>,
    /// TLS: the CA, and a client certificate for servers that verify
    /// clients. Any of them asks for TLS.
    #[serde(flatten)]
    pub tls: TlsFiles,
    /// `connect_timeout` bounds connecting and the check of the bucket at
    /// startup, and every later request; `client_name` is the label each
    /// hold records, and the connection's name on the server.
    #[serde(flatten)]
    pub client: ClientSettings,
}

fn default_bucket() -> String {
    "dlock".to_owned()
}

fn yes() -> bool {
    true
}

fn one() -> usize {
    1
}

impl fmt::Debug for NatsConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NatsConfig")
            .field("servers", &self.servers)
            .field("bucket", &self.bucket)
            .field("create_bucket", &self.create_bucket)
            .field("replicas", &self.replicas)
            .field("credentials", &self.credentials)
            .field("token", &self.token.as_ref().map(|_| "***"))
            .field("token_file", &self.token_file)
            .field("nkey_seed_file", &self.nkey_seed_file)
            .field("credentials_file", &self.credentials_file)
            .field("tls", &self.tls)
            .field("client", &self.client)
            .finish()
    }
}

impl NatsConfig {
    /// Defaults for everything but the servers.
    pub fn new(servers: &[String]) -> Self {
        NatsConfig {
            servers: servers.to_vec(),
            bucket: default_bucket(),
            create_bucket: true,
            replicas: 1,
            credentials: Credentials::default(),
            token: None,
            token_file: None,
            nkey_seed_file: None,
            credentials_file: None,
            tls: TlsFiles::default(),
            client: ClientSettings::default(),
        }
    }

    /// The client's options: credentials, TLS, timeouts. Secrets never
    /// show in an error.
    async fn options(&self, at: &Connecting<'_>, label: &str) -> Result<ConnectOptions, Error> {
        let limit = self.client.connect_timeout;
        let mut options = ConnectOptions::new()
            .name(label)
            .connection_timeout(limit)
            .request_timeout(Some(limit))
            // Back within a second of a server's restart, not the
            // client's default of up to four.
            .reconnect_delay_callback(|attempts| Duration::from_millis(100 * attempts.min(10) as u64));
        let mut ways = Vec::new();
        if let Some(user) = &self.credentials.username {
            let password = self.credentials.password(at)?.unwrap_or_default();
            options = options.user_and_password(user.clone(), password);
            ways.push("username");
        } else if self.credentials.any() {
            return Err(at.bad("username", "set it with password or password_file"));
        }
        if let Some(token) = secret(at, "token", &self.token, &self.token_file)? {
            options = options.token(token);
            ways.push("token");
        }
        if let Some(path) = &self.nkey_seed_file {
            options = options.nkey(at.secret_file("nkey_seed_file", path)?);
            ways.push("nkey_seed_file");
        }
        if let Some(path) = &self.credentials_file {
            options = options
                .credentials_file(path)
                .await
                .map_err(|e| at.bad("credentials_file", format!("cannot read {}: {e}", path.display())))?;
            ways.push("credentials_file");
        }
        if ways.len() > 1 {
            return Err(at.bad(
                ways[1],
                format!("set one way to log in, not {}", ways.join(" and ")),
            ));
        }
        let pem = self.tls.read(at)?;
        let tls = self.tls.any() || self.servers.iter().any(|s| s.starts_with("tls://"));
        if tls {
            options = options.require_tls(true);
        }
        if pem.ca.is_some() {
            options = options.add_root_certificates(self.tls.tls_ca_file.clone().unwrap_or_default());
        }
        if let (Some(cert), Some(key)) = (&self.tls.tls_cert_file, &self.tls.tls_key_file) {
            options = options.add_client_certificate(cert.clone(), key.clone());
        }
        Ok(options)
    }
}

/// A secret given inline or in a file, not both.
fn secret(
    at: &Connecting<'_>,
    field: &str,
    inline: &Option<String>,
    file: &Option<PathBuf>,
) -> Result<Option<String>, Error> {
    match (inline, file) {
        (Some(_), Some(_)) => Err(at.bad(field, format!("set {field} or {field}_file, not both"))),
        (Some(value), None) => Ok(Some(value.clone())),
        (None, Some(path)) => at.secret_file(&format!("{field}_file"), path).map(Some),
        (None, None) => Ok(None),
    }
}

/// Registers `kind = "nats"`.
pub fn register(kinds: &mut Kinds) {
    kinds.register("nats", |name, config: NatsConfig| async move {
        NatsEngine::connect(&name, &config).await
    });
}

/// The oldest server with per-key TTLs (`Nats-TTL`) and markers.
const OLDEST: (u64, u64) = (2, 11);

impl NatsEngine {
    /// Connects engine `name` (for error messages), checks the server and
    /// the bucket, making it if missing and `create_bucket` allows, and
    /// starts the watch of the bucket.
    pub async fn connect(name: &str, config: &NatsConfig) -> Result<Self, Error> {
        let at = Connecting { name, kind: "nats" };
        let label = config.client.label(&at)?;
        if config.servers.is_empty() {
            return Err(at.bad("servers", "name at least one server"));
        }
        let servers = config
            .servers
            .iter()
            .map(|s| {
                s.parse::<ServerAddr>()
                    .map_err(|e| at.bad("servers", format!("{s}: {e}")))
            })
            .collect::<Result<Vec<_>, _>>()?;
        if !valid_bucket(&config.bucket) {
            return Err(at.bad("bucket", "a bucket's name is letters, digits, '-' and '_'"));
        }
        if ![1, 3, 5].contains(&config.replicas) {
            return Err(at.bad("replicas", "1, 3 or 5"));
        }
        let address = config.servers.join(",");
        // The client takes rustls's process default, and a server may ask
        // for TLS that the settings did not.
        crate::crypto::ensure_provider();
        let limit = config.client.connect_timeout;
        let reconnected = std::sync::Arc::new(tokio::sync::Notify::new());
        let told = reconnected.clone();
        let options = config.options(&at, &label).await?.event_callback(move |event| {
            let told = told.clone();
            async move {
                if matches!(event, Event::Connected) {
                    told.notify_one();
                }
            }
        });
        let client = at.within(&address, limit, options.connect(servers)).await?;
        let info = client.server_info();
        let version = version(&info.version);
        if version < OLDEST {
            return Err(at.unreachable(
                &address,
                format!(
                    "nats-server {} is too old: dlock needs {}.{} or later, for per-key TTLs",
                    info.version, OLDEST.0, OLDEST.1
                ),
            ));
        }
        if !info.jetstream {
            return Err(at.unreachable(
                &address,
                format!(
                    "nats-server {} runs without JetStream (start it with -js)",
                    info.version
                ),
            ));
        }
        let js = jetstream::ContextBuilder::new()
            .timeout(limit)
            .build(client.clone());
        let stream = at
            .in_time(&address, limit, bucket(&at, &address, &js, config))
            .await?;
        let mirror = Mirror::start(js.clone(), stream.clone(), config.bucket.clone(), reconnected);
        Ok(NatsEngine {
            js,
            stream,
            bucket: config.bucket.clone(),
            address,
            label,
            mirror,
            limit,
        })
    }
}

fn missing(error: &jetstream::context::GetStreamError) -> bool {
    matches!(error.kind(), jetstream::context::GetStreamErrorKind::JetStream(e)
        if e.error_code() == jetstream::ErrorCode::STREAM_NOT_FOUND)
}

fn valid_bucket(name: &str) -> bool {
    !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
}

/// `2.11.3` as `(2, 11)`; anything unreadable as `(0, 0)`.
fn version(text: &str) -> (u64, u64) {
    let mut parts = text
        .trim_start_matches('v')
        .split('.')
        .map(|p| p.parse::<u64>().ok());
    match (parts.next().flatten(), parts.next().flatten()) {
        (Some(major), Some(minor)) => (major, minor),
        _ => (0, 0),
    }
}

/// The bucket's stream, made if missing and allowed; one made by hand
/// without per-key TTLs is refused, naming what it lacks.
async fn bucket(
    at: &Connecting<'_>,
    address: &str,
    js: &jetstream::Context,
    config: &NatsConfig,
) -> Result<jetstream::stream::Stream, Error> {
    let name = format!("KV_{}", config.bucket);
    let found = match js.get_stream(&name).await {
        Ok(stream) => stream,
        Err(e) if missing(&e) => {
            if !config.create_bucket {
                return Err(at.bad(
                    "bucket",
                    format!(
                        "no bucket {:?} on the server, and create_bucket = false: make it with \
                         per-key TTLs (nats kv add {} --history 1 --marker-ttl 1m) or allow dlock to",
                        config.bucket, config.bucket
                    ),
                ));
            }
            js.create_key_value(kv::Config {
                bucket: config.bucket.clone(),
                description: "dlock's locks".to_owned(),
                history: 1,
                storage: StorageType::File,
                num_replicas: config.replicas,
                limit_markers: Some(super::MARKERS_KEPT),
                ..kv::Config::default()
            })
            .await
            .map_err(|e| {
                at.bad(
                    "bucket",
                    format!(
                        "cannot make bucket {:?}: {e} (the account needs JetStream and \
                         permission to create streams)",
                        config.bucket
                    ),
                )
            })?;
            js.get_stream(&name)
                .await
                .map_err(|e| at.unreachable(address, e))?
        }
        Err(e) => return Err(at.unreachable(address, e)),
    };
    let stream_config = &found.cached_info().config;
    if !stream_config.allow_message_ttl || stream_config.subject_delete_marker_ttl.is_none() {
        return Err(at.bad(
            "bucket",
            format!(
                "bucket {:?} keeps no per-key TTLs: dlock needs a bucket made with them \
                 (allow_msg_ttl and subject_delete_marker_ttl; nats kv add --marker-ttl)",
                config.bucket
            ),
        ));
    }
    Ok(found)
}
