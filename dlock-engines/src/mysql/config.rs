//! The mysql engine's settings, and connecting: the tables made if missing,
//! a table of an older dlock given the columns for records, and this user's
//! rights on them checked.

use std::sync::Arc;
use std::time::Duration;

use dlock_core::Error;
use dlock_core::kit::{
    ClientSettings, Connecting, Credentials, Deferrals, Kinds, RECORD_AFTER, TlsFiles, TlsMode, Waiters,
};
use mysql_async::prelude::Queryable;
use mysql_async::{DriverError, Opts, OptsBuilder, Pool, PoolConstraints, PoolOpts};
use serde::Deserialize;

use super::{MysqlEngine, Shared, gate, sql, sweep, tls};

/// Settings of the mysql engine, `kind = "mysql"`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MysqlConfig {
    /// `mysql://user:password@host:port/database`.
    pub url: String,
    /// Connections kept at most for statements. Each write hold taken at
    /// once keeps one more of its own, its gate's session, while it holds.
    #[serde(default = "default_max_connections")]
    pub max_connections: usize,
    /// A waiter that does not poll within this is dropped from the queue.
    #[serde(default = "default_waiter_ttl", with = "humantime_serde")]
    pub waiter_ttl: Duration,
    /// `connect_timeout` bounds connecting, and then the tables' checks;
    /// `client_name` is the label its holder records carry.
    #[serde(flatten)]
    pub client: ClientSettings,
    /// How much TLS to ask of the server, in libpq's words (MySQL's
    /// `PREFERRED` is `prefer`, `VERIFY_IDENTITY` is `verify-full`);
    /// default `prefer`, as MySQL's clients.
    #[serde(default)]
    pub tls_mode: Option<TlsMode>,
    /// The CA that signed the server's certificate (default: the Mozilla
    /// roots built in), and this client's certificate and key for users
    /// that `REQUIRE X509`.
    #[serde(flatten)]
    pub tls: TlsFiles,
    /// The `username` and `password` (or `password_file`), in place of
    /// the url's.
    #[serde(flatten)]
    pub credentials: Credentials,
}

impl MysqlConfig {
    /// Defaults for everything but the url.
    pub fn new(url: impl Into<String>) -> Self {
        MysqlConfig {
            url: url.into(),
            max_connections: default_max_connections(),
            waiter_ttl: default_waiter_ttl(),
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

fn default_waiter_ttl() -> Duration {
    Duration::from_secs(3)
}

/// Registers `kind = "mysql"`.
pub fn register(kinds: &mut Kinds) {
    kinds.register("mysql", |name, config: MysqlConfig| async move {
        MysqlEngine::connect(&name, &config).await
    });
}

impl MysqlEngine {
    /// Connects engine `name` (for error messages): checks the settings,
    /// makes the tables if missing, adds the columns for records to a table
    /// an older dlock made, and checks this user may use them.
    pub async fn connect(name: &str, config: &MysqlConfig) -> Result<Self, Error> {
        let at = Connecting { name, kind: "mysql" };
        let label = config.client.label(&at)?;
        let opts = Opts::from_url(&config.url).map_err(|e| {
            at.bad(
                "url",
                format!("not a MySQL URL (mysql://user:password@host:3306/database): {e}"),
            )
        })?;
        let Some(database) = opts.db_name().map(str::to_owned) else {
            return Err(at.bad("url", "name the database: mysql://user@host:3306/<database>"));
        };
        if config.max_connections == 0 {
            return Err(at.bad("max_connections", "must be at least 1"));
        }
        if config.waiter_ttl < Duration::from_millis(300) {
            return Err(at.bad("waiter_ttl", "must be at least 300ms"));
        }
        let address = format!("{}:{}", opts.ip_or_hostname(), opts.tcp_port());
        let pool_opts = PoolOpts::default()
            .with_constraints(PoolConstraints::new(1, config.max_connections).expect("1 ≤ max"))
            // Idle connections stay a minute: with no ttl, every connection
            // above the minimum closes as it comes back, and the next
            // statement pays a new connection.
            .with_inactive_connection_ttl(Duration::from_secs(60))
            // A reset would drop the prepared statements each time a
            // connection goes back to the pool.
            .with_reset_connection(false);
        if opts.ssl_opts().is_some() {
            return Err(at.bad(
                "url",
                "set TLS with tls_mode and the tls_ files, not the url's require_ssl, verify_ca or verify_identity",
            ));
        }
        let password = config.credentials.password(&at)?;
        if password.is_some() && opts.pass().is_some() {
            return Err(at.bad("password", "the url names a password too: keep one"));
        }
        let mode = config.tls_mode.unwrap_or(TlsMode::Prefer);
        let ssl = tls::ssl_opts(&at, mode, &config.tls)?;
        let mut builder = OptsBuilder::from_opts(opts)
            .pool_opts(pool_opts)
            .prefer_socket(false)
            .init(vec!["SET SESSION TRANSACTION ISOLATION LEVEL REPEATABLE READ"]);
        if password.is_some() {
            builder = builder.pass(password);
        }
        if let Some(user) = &config.credentials.username {
            builder = builder.user(Some(user));
        }
        let limit = config.client.connect_timeout;
        let unavailable = |e: mysql_async::Error| at.unreachable(&address, e);
        let plain = builder.clone();
        let mut builder = builder.ssl_opts(ssl);
        let mut pool = Pool::new(builder.clone());
        let mut conn = match tokio::time::timeout(limit, pool.get_conn()).await {
            // `prefer`: a server without TLS is spoken to in plain.
            Ok(Err(mysql_async::Error::Driver(DriverError::NoClientSslFlagFromServer)))
                if mode == TlsMode::Prefer =>
            {
                builder = plain;
                pool = Pool::new(builder.clone());
                at.within(&address, limit, pool.get_conn()).await?
            }
            Ok(conn) => conn.map_err(unavailable)?,
            Err(_) => return Err(at.unreachable(&address, format!("no answer within {limit:?}"))),
        };
        let gates = gate::Sessions::new(builder.into());
        // Bounded whole: a server that greets and then says nothing would
        // hold up startup for good.
        at.in_time(&address, limit, prepare(&at, &address, &database, &mut conn))
            .await?;
        drop(conn);
        let shared = Arc::new(Shared {
            pool,
            gates,
            waiting: Waiters::default(),
            records: Deferrals::new(RECORD_AFTER),
        });
        tokio::spawn(sweep(Arc::downgrade(&shared)));
        Ok(MysqlEngine {
            shared,
            address,
            waiter_ttl: config.waiter_ttl,
            label: label.into(),
        })
    }
}

/// Makes the tables if missing, adds the columns for records to a table an
/// older dlock made, and checks this user may use them.
async fn prepare(
    at: &Connecting<'_>,
    address: &str,
    database: &str,
    conn: &mut mysql_async::Conn,
) -> Result<(), Error> {
    let unavailable = |e: mysql_async::Error| at.unreachable(address, e);
    let refused = |what: &str, e: mysql_async::Error| match &e {
        mysql_async::Error::Server(server) if [1142, 1044, 1045].contains(&server.code) => {
            at.bad("url", format!("{what}: {}", server.message))
        }
        _ => unavailable(e),
    };
    let exists: Option<(Option<u64>, Option<u64>, Option<u64>)> =
        conn.query_first(sql::TABLES).await.map_err(unavailable)?;
    let (queue, gate_table, forced) = exists.unwrap_or_default();
    for (table, exists, create) in [
        ("dlock_queue", queue, sql::CREATE_TABLE),
        ("dlock_gates", gate_table, sql::CREATE_GATES),
        ("dlock_forced", forced, sql::CREATE_FORCED),
    ] {
        if exists != Some(1) {
            conn.query_drop(create).await.map_err(|e| {
                refused(
                    &format!(
                        "cannot create table {table} in database {database}; grant CREATE on `{database}`.* \
                         to this user, or have an administrator run the CREATE TABLE in the mysql engine's docs"
                    ),
                    e,
                )
            })?;
        }
    }
    let present: Vec<(String, String)> = conn.query(sql::COLUMNS).await.map_err(unavailable)?;
    for table in ["dlock_queue", "dlock_gates"] {
        let missing: Vec<_> = sql::ADDED_COLUMNS
            .iter()
            .filter(|(t, column, _)| *t == table && !present.iter().any(|(pt, pc)| pt == t && pc == column))
            .collect();
        if missing.is_empty() {
            continue;
        }
        let names: Vec<&str> = missing.iter().map(|(_, column, _)| *column).collect();
        let adds: Vec<&str> = missing.iter().map(|(_, _, add)| *add).collect();
        let alter = format!("ALTER TABLE {table} {}", adds.join(", "));
        let fix = format!(
            "the mysql engine's table {table}, made by an older dlock, lacks the columns {}, and this \
             user may not add them; grant ALTER on `{database}`.{table} to this user, or have an \
             administrator run: {alter}",
            names.join(", ")
        );
        match conn.query_drop(&alter).await {
            // 1060: another process starting at once added them first.
            Err(mysql_async::Error::Server(e)) if e.code == 1060 => {}
            altered => altered.map_err(|e| refused(&fix, e))?,
        }
    }
    for (table, what, statement) in sql::PRIVILEGE_CHECKS {
        conn.query_drop(statement)
            .await
            .map_err(|e| refused(&format!("this user may not use table {table} ({what})"), e))?;
    }
    Ok(())
}
