//! The postgres engine's settings, and connecting.

use std::sync::Arc;

use dlock_core::Error;
use dlock_core::kit::{ClientSettings, Connecting, Credentials, EngineError, Kinds, TlsFiles, TlsMode};
use serde::Deserialize;

use super::pool::Pool;
use super::server::{Server, address_of};
use super::{PostgresEngine, objects};

/// Settings of the postgres engine, `kind = "postgres"`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PostgresConfig {
    /// A URL (`postgres://user:password@host:port/db`) or a key/value string
    /// (`host=... port=... user=... password=... dbname=...`). libpq's TLS
    /// words (`sslmode`, `sslrootcert`, `sslcert`, `sslkey`) may stand in
    /// it in place of the TLS settings.
    pub url: String,
    /// Connections kept at most; holds share them, each waiter blocks one.
    #[serde(default = "default_max_connections")]
    pub max_connections: usize,
    /// Where the fence sequence `dlock_fence` and the record table
    /// `dlock_holds` live.
    #[serde(default = "default_schema")]
    pub schema: String,
    /// `connect_timeout` bounds opening each connection; `client_name`
    /// labels the records (else the process label), and is the sessions'
    /// `application_name` (else the URL's, else the label).
    #[serde(flatten)]
    pub client: ClientSettings,
    /// How much TLS to ask of the server, in libpq's words; default
    /// `prefer`, as libpq's.
    #[serde(default)]
    pub tls_mode: Option<TlsMode>,
    /// The CA that signed the server's certificate (default: the
    /// system's), and this client's certificate and key for servers that
    /// ask for one (`clientcert=verify-full` in `pg_hba.conf`).
    #[serde(flatten)]
    pub tls: TlsFiles,
    /// The `username` and `password` (or `password_file`), in place of
    /// the url's.
    #[serde(flatten)]
    pub credentials: Credentials,
}

impl PostgresConfig {
    /// Defaults for everything but the url.
    pub fn new(url: impl Into<String>) -> Self {
        PostgresConfig {
            url: url.into(),
            max_connections: default_max_connections(),
            schema: default_schema(),
            client: ClientSettings::default(),
            tls_mode: None,
            tls: TlsFiles::default(),
            credentials: Credentials::default(),
        }
    }
}

fn default_max_connections() -> usize {
    10
}

fn default_schema() -> String {
    "public".to_owned()
}

/// Registers `kind = "postgres"`.
pub fn register(kinds: &mut Kinds) {
    kinds.register("postgres", |name, config: PostgresConfig| async move {
        PostgresEngine::connect(&name, &config).await
    });
}

impl PostgresEngine {
    /// Connects engine `name` (for error messages): checks the settings,
    /// makes the fence sequence and the record table if missing, and
    /// opens one connection.
    pub async fn connect(name: &str, config: &PostgresConfig) -> Result<Self, Error> {
        let at = Connecting {
            name,
            kind: "postgres",
        };
        if config.max_connections < 2 {
            return Err(at.bad(
                "max_connections",
                "must be at least 2: one connection stays free for short statements while the others wait",
            ));
        }
        let mut server = Server::new(
            &at,
            &config.url,
            &config.credentials,
            (config.tls_mode, &config.tls),
        )?;
        let pg = &mut server.config;
        pg.connect_timeout(config.client.connect_timeout);
        let label = config.client.label(&at)?;
        if config.client.client_name.is_some() || pg.get_application_name().is_none() {
            pg.application_name(&label);
        }
        let address = address_of(pg);
        let server = Arc::new(server);
        let unavailable = |e: EngineError| at.unreachable(&address, e);
        // The connect timeout bounds only the TCP connect: a server that
        // accepts and never answers would hold up startup for good.
        let start = async {
            server.check_sessions_are_own(&at).await?;
            let objects = objects::make(&server, &config.schema, &at.field("schema"), unavailable).await?;
            let pool = Arc::new(Pool::new(server.clone(), objects, label, config.max_connections));
            pool.open_one().await.map_err(unavailable)?;
            Ok(pool)
        };
        let pool = at.in_time(&address, config.client.connect_timeout, start).await?;
        Ok(PostgresEngine { pool, address })
    }
}
