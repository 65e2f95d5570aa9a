//! The Redis engine: ylock's AQS-like read/write lock in Redis, improved.
//!
//! Per lock, under one hash tag (see `keys.rs`): a waiter queue (list of
//! `w:<owner>` / `r:<owner>`), the readers (sorted set scored by each
//! reader's own deadline on the server's clock, so a dead reader expires
//! while others renew — ylock's single-TTL set kept it alive), pending
//! readers (the run admitted together), one liveness key per waiter (a dead
//! queue head is kicked), and the gate: the lock's one record, holding the
//! writer with its deadline and the last fencing token, which exists
//! whenever any of the others does. So an idle lock is taken, and a holder
//! nobody waits for lets go, with two commands in a script, and
//! a held lock nobody waits for is one key, as in the plainest lock; a
//! holder that dies with waiters queued leaves the gate behind, and nobody
//! jumps the queue (`scripts/head.lua` has the gate's forms). Every state
//! change is one Lua script, called by SHA and reloaded after `NOSCRIPT`.
//!
//! **Wake-up and handoff.** A release that frees the lock hands it straight
//! to a live writer at the head of the queue and publishes `<owner>:<fence>`;
//! otherwise it publishes the id of the waiter now first in line, to that
//! waiter's engine only (its liveness key names the engine). One subscriber
//! connection per engine passes each message to that waiter alone (see
//! `notify`): a handed-over writer holds without another round trip, a
//! woken one polls. The core's constant or exponential polling stays the
//! safety net.
//!
//! **Fencing without leaks.** The gate keeps the last token for
//! `fence_retention` (default one minute) past its holder's deadline,
//! whether the holder lets go or dies holding. A token is one past the kept
//! one, or, with none kept, the server clock in microseconds (every path
//! that reads the clock anyway takes the later of the two). Once every
//! lease and the retention have run out, the lock leaves no key behind.
//! Assumption: the Redis server's clock never steps back by more than
//! `fence_retention`.
//!
//! **What the server spends.** A lone writer takes an idle lock with one
//! `GET` and one `SET` and lets go with one `PTTL` and one `SET ... GET`
//! (the token it was granted rebuilds the idle record, and a record that
//! turns out not to be its own is put back): no clock read, and the
//! helpers the queue needs are not even made (a script makes its functions
//! anew on every call). The settings every call would repeat (the publish
//! command, the retention, `waiter_ttl`) are constants in the scripts'
//! text, not arguments.
//!
//! Needs Redis 6.2 or later (`SET ... GET`); a cluster needs 7.0
//! (`SPUBLISH`).
//!
//! Config:
//!
//! ```toml
//! [engines.main]
//! kind = "redis"
//! url = "redis://127.0.0.1:6379"   # redis://user:password@host for ACL users
//! # url = "rediss://host:6380"      # TLS, with feature `redis-tls`
//! # tls_ca_file = "/etc/ssl/redis-ca.pem"
//! connect_timeout = "5s"
//! fence_retention = "1m"          # the same in every process sharing these locks
//! waiter_ttl = "3s"                # a queued waiter silent this long is dropped
//!
//! [engines.shared]
//! kind = "redis-cluster"
//! nodes = ["redis://10.0.0.1:7000", "redis://10.0.0.2:7000"]   # seed nodes
//!
//! [engines.ha]
//! kind = "redis-sentinel"
//! sentinels = ["redis://10.0.0.1:26379", "redis://10.0.0.2:26379", "redis://10.0.0.3:26379"]
//! master_name = "mymaster"
//! # username = "locker"            # ACL user and password of the data nodes
//! # password = "..."
//! replicas_ack = 1                 # a grant waits for 1 replica (WAIT); 0: no wait (the default)
//! replicas_ack_timeout = "50ms"    # fewer acknowledge in time: undone, retried within the wait
//! ```
//!
//! **A cluster.** Every key of a lock shares one hash tag, so each lock
//! lives on one node; scripts publish with `SPUBLISH` and the subscriber
//! uses `SSUBSCRIBE`, so a notification goes to the node owning the lock's
//! slot and is never broadcast cluster-wide.
//!
//! **Behind Sentinel** (`redis-sentinel`): the same engine, with the
//! primary found through the sentinels. Every connection, the script cache
//! and the subscription follow the primary across a failover without a
//! restart of the process: after any failure the next call asks the
//! sentinels again, and the engine also listens to every sentinel's
//! `+switch-master`, so it leaves an old primary that came back still
//! writable as soon as one sentinel announces the new one.
//!
//! - `replicas_ack = n` (also on `kind = "redis"`) makes each grant run
//!   `WAIT n` on the connection that wrote it; if fewer replicas acknowledge
//!   in time, the grant is undone and retried within the wait. It narrows
//!   the window in which a failover can forget a grant, but is no
//!   guarantee: replication stays asynchronous. With a single replica, no
//!   grant is possible after a failover until a replica is back, which is
//!   why it is not the default.
//! - The fence across a failover: a token is the primary's clock in µs,
//!   bumped past the last token it kept. A promoted replica that missed the
//!   last grant starts from its own clock, which is still greater whenever
//!   the two servers' clocks agree within the failover's duration.
//! - A held lock survives a failover if its grant was replicated and the
//!   failover is shorter than the lease. Otherwise the next renewal is
//!   refused and `lost` fires; the old holder's writes are refused by
//!   fenced storage, since its token is older.

mod connection;
pub(crate) mod keys;
mod notify;

use std::sync::Arc;
use std::time::Duration;

use dlock_core::Error;
use dlock_core::kit::{Capabilities, Engine, EngineError, Kinds, LostSignal, OwnerId, Poll, Request, Wake, async_trait};
use redis::{Client, Script};
use serde::Deserialize;

use connection::{Connection, Target};

/// Settings of a single-server Redis engine, `kind = "redis"`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RedisConfig {
    /// `redis://[user:password@]host:port`, or `rediss://` for TLS (feature `redis-tls`).
    pub url: String,
    /// PEM file of the CA that signed the server's certificate, for `rediss://`
    /// with a private CA; without it the system's trust store is used.
    #[serde(default)]
    pub tls_ca_file: Option<std::path::PathBuf>,
    /// How long connecting may take; also each command's connection and
    /// response timeout in the client.
    #[serde(default = "crate::defaults::connect_timeout", with = "humantime_serde")]
    pub connect_timeout: Duration,
    /// How long the last fencing token is kept after a grant: the next
    /// token is past it even if the server's clock stepped back by less;
    /// see the [module docs](self).
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
}

impl RedisConfig {
    /// Defaults for everything but the url.
    pub fn new(url: impl Into<String>) -> Self {
        RedisConfig {
            url: url.into(),
            tls_ca_file: None,
            connect_timeout: crate::defaults::connect_timeout(),
            fence_retention: default_fence_retention(),
            waiter_ttl: default_waiter_ttl(),
            replicas_ack: 0,
            replicas_ack_timeout: default_replicas_ack_timeout(),
        }
    }
}

/// Settings of a Redis Cluster engine, `kind = "redis-cluster"`: seed nodes,
/// from which the client learns the rest.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RedisClusterConfig {
    /// `redis://host:port` of one or more cluster nodes.
    pub nodes: Vec<String>,
    /// How long connecting may take; also each command's connection and
    /// response timeout in the client.
    #[serde(default = "crate::defaults::connect_timeout", with = "humantime_serde")]
    pub connect_timeout: Duration,
    /// How long the last fencing token is kept after a grant: the next
    /// token is past it even if the server's clock stepped back by less;
    /// see the [module docs](self).
    #[serde(default = "default_fence_retention", with = "humantime_serde")]
    pub fence_retention: Duration,
    /// How long a queued waiter stays in line without polling before the
    /// others drop it as dead.
    #[serde(default = "default_waiter_ttl", with = "humantime_serde")]
    pub waiter_ttl: Duration,
}

fn default_fence_retention() -> Duration {
    Duration::from_secs(60)
}

fn default_waiter_ttl() -> Duration {
    Duration::from_secs(3)
}

/// Settings of a Redis engine behind Sentinel, `kind = "redis-sentinel"`:
/// the engine follows the primary the sentinels name, across failovers.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RedisSentinelConfig {
    /// `redis://[user:password@]host:port` of each sentinel (auth, if any,
    /// from the first).
    pub sentinels: Vec<String>,
    /// The name the sentinels monitor the primary under.
    pub master_name: String,
    /// ACL user of the data nodes.
    #[serde(default)]
    pub username: Option<String>,
    /// Password of the data nodes (with `username`, or alone for `AUTH`).
    #[serde(default)]
    pub password: Option<String>,
    /// Replicas that must have a grant before it is handed out (`WAIT`).
    /// With 1 or more a grant survives a failover, and an old primary that
    /// no replica follows any more grants nothing; but the lock then stops
    /// granting while fewer replicas are up, so it is not the default.
    #[serde(default)]
    pub replicas_ack: u32,
    /// How long a grant waits for `replicas_ack` replicas; too few in time,
    /// and it is undone and tried again within the wait.
    #[serde(default = "default_replicas_ack_timeout", with = "humantime_serde")]
    pub replicas_ack_timeout: Duration,
    /// How long connecting may take; also each command's connection and
    /// response timeout in the client.
    #[serde(default = "crate::defaults::connect_timeout", with = "humantime_serde")]
    pub connect_timeout: Duration,
    /// How long the last fencing token is kept after a grant: the next
    /// token is past it even if the server's clock stepped back by less;
    /// see the [module docs](self).
    #[serde(default = "default_fence_retention", with = "humantime_serde")]
    pub fence_retention: Duration,
    /// How long a queued waiter stays in line without polling before the
    /// others drop it as dead.
    #[serde(default = "default_waiter_ttl", with = "humantime_serde")]
    pub waiter_ttl: Duration,
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

/// A script: this engine's settings as Lua constants (one script per
/// setting in use, not per process), the names all scripts share
/// (`scripts/head.lua`), its lone-writer path, then the helpers
/// (`scripts/common.lua`) where its `-- helpers --` line is, and the rest.
fn script(body: &str, settings: &str) -> Script {
    let (fast, rest) = body
        .split_once("-- helpers --\n")
        .expect("every script marks where its helpers go");
    Script::new(
        &[
            settings,
            include_str!("scripts/head.lua"),
            fast,
            include_str!("scripts/common.lua"),
            rest,
        ]
        .concat(),
    )
}

struct Scripts {
    acquire: Script,
    renew: Script,
    release: Script,
    downgrade: Script,
}

/// The Redis engine, on one server, a cluster or behind Sentinel. See the
/// [module docs](self).
///
/// Built from config (`kind` in `[engines.<name>]`), or by hand:
///
/// ```no_run
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), dlock::Error> {
/// use std::sync::Arc;
/// use dlock::engines::redis::{RedisConfig, RedisEngine};
///
/// let engine = RedisEngine::connect("main", &RedisConfig::new("redis://127.0.0.1:6379")).await?;
/// dlock::install(dlock::Registry::with_engine("main", Arc::new(engine), Default::default())?)?;
/// # Ok(())
/// # }
/// ```
pub struct RedisEngine {
    kind: &'static str,
    connection: Connection,
    notifier: notify::Notifier,
    scripts: Scripts,
    address: String,
    waiter_ttl: Duration,
    /// Replicas that must acknowledge a grant (`WAIT`), and how long to wait.
    replicas_ack: Option<(u32, Duration)>,
    /// Names this engine's channel for each lock (`<prefix>:n:<id>`), so a
    /// release wakes only the process whose waiter is next.
    id: String,
}

impl RedisEngine {
    /// Connects single-server engine `name` (for error messages).
    pub async fn connect(name: &str, config: &RedisConfig) -> Result<Self, Error> {
        let timings = timings(name, config.fence_retention, config.waiter_ttl)?;
        let client = client(name, config)?;
        let target = Target {
            engine: name,
            kind: "redis",
            address: client.get_connection_info().addr().to_string(),
            timeout: config.connect_timeout,
        };
        let connection = connection::single(client.clone(), &target).await?;
        let notifier = notify::Notifier::new(notify::Source::Single(Box::new(client)));
        let engine = Self::new(target, connection, notifier, "PUBLISH", timings);
        Ok(engine.acknowledged_by(config.replicas_ack, config.replicas_ack_timeout))
    }

    /// Connects Redis Cluster engine `name` through its seed nodes.
    pub async fn connect_cluster(name: &str, config: &RedisClusterConfig) -> Result<Self, Error> {
        let timings = timings(name, config.fence_retention, config.waiter_ttl)?;
        if config.nodes.is_empty() {
            return Err(Error::config(
                format!("engines.{name}.nodes"),
                "name at least one seed node",
            ));
        }
        let target = Target {
            engine: name,
            kind: "redis-cluster",
            address: config.nodes.join(","),
            timeout: config.connect_timeout,
        };
        let connection = connection::cluster(&config.nodes, &target).await?;
        let notifier = notify::Notifier::new(notify::Source::Cluster(config.nodes.clone()));
        Ok(Self::new(target, connection, notifier, "SPUBLISH", timings))
    }

    /// Connects Sentinel engine `name` to the primary its sentinels name.
    pub async fn connect_sentinel(name: &str, config: &RedisSentinelConfig) -> Result<Self, Error> {
        let timings = timings(name, config.fence_retention, config.waiter_ttl)?;
        let field = |f: &str| format!("engines.{name}.{f}");
        if config.sentinels.is_empty() {
            return Err(Error::config(field("sentinels"), "name at least one sentinel"));
        }
        let mut infos = Vec::new();
        let mut sentinel_auth = None;
        for url in &config.sentinels {
            let info = redis::IntoConnectionInfo::into_connection_info(url.as_str())
                .map_err(|e| Error::config(field("sentinels"), format!("`{url}`: {e}")))?;
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
        let addresses: Vec<_> = infos.iter().map(|info| info.addr().clone()).collect();
        let mut builder = redis::sentinel::SentinelClientBuilder::new(
            addresses,
            &config.master_name,
            redis::sentinel::SentinelServerType::Master,
        )
        .map_err(|e| Error::config(field("sentinels"), e.to_string()))?;
        if let Some(auth) = &sentinel_auth {
            if let Some(username) = auth.username() {
                builder = builder.set_client_to_sentinel_username(username);
            }
            if let Some(password) = auth.password() {
                builder = builder.set_client_to_sentinel_password(password);
            }
        }
        if let Some(username) = &config.username {
            builder = builder.set_client_to_redis_username(username);
        }
        if let Some(password) = &config.password {
            builder = builder.set_client_to_redis_password(password);
        }
        let sentinel = builder
            .build()
            .map_err(|e| Error::config(field("sentinels"), e.to_string()))?;
        let target = Target {
            engine: name,
            kind: "redis-sentinel",
            address: format!(
                "{} (sentinels {})",
                config.master_name,
                config.sentinels.join(",")
            ),
            timeout: config.connect_timeout,
        };
        let primary = Arc::new(connection::Primary::new(sentinel, config.connect_timeout));
        let connection = connection::sentinel(primary.clone(), &target).await?;
        primary.follow(infos, &config.master_name);
        let notifier = notify::Notifier::new(notify::Source::Sentinel(primary));
        let engine = Self::new(target, connection, notifier, "PUBLISH", timings);
        Ok(engine.acknowledged_by(config.replicas_ack, config.replicas_ack_timeout))
    }

    /// Grants wait for `replicas` replicas (none: 0), at most `timeout`.
    fn acknowledged_by(mut self, replicas: u32, timeout: Duration) -> Self {
        self.replicas_ack = (replicas > 0).then_some((replicas, timeout));
        self
    }

    /// With `replicas_ack`, waits until that many replicas have the grant
    /// (`WAIT` on the connection that wrote it); true if they do in time.
    async fn replicated(&self) -> Result<bool, EngineError> {
        let Some((replicas, timeout)) = self.replicas_ack else {
            return Ok(true);
        };
        let acked: u32 = redis::cmd("WAIT")
            .arg(replicas)
            .arg(millis(timeout))
            .query_async(&mut self.connection.clone())
            .await
            .map_err(EngineError::failed)?;
        Ok(acked >= replicas)
    }

    fn new(
        target: Target<'_>,
        connection: Connection,
        notifier: notify::Notifier,
        publish: &'static str,
        (fence_retention, waiter_ttl): (Duration, Duration),
    ) -> Self {
        let settings = format!(
            "local publish, retain, waiter_ttl = '{publish}', {}, {}\n",
            millis(fence_retention),
            millis(waiter_ttl)
        );
        RedisEngine {
            kind: target.kind,
            connection,
            notifier,
            scripts: Scripts {
                acquire: script(include_str!("scripts/acquire.lua"), &settings),
                renew: script(include_str!("scripts/renew.lua"), &settings),
                release: script(include_str!("scripts/release.lua"), &settings),
                downgrade: script(include_str!("scripts/downgrade.lua"), &settings),
            },
            address: target.address,
            waiter_ttl,
            replicas_ack: None,
            id: OwnerId::random().to_string(),
        }
    }

    /// One try. A receiver taken before the script runs catches a release
    /// during the round trip; without one (lock not yet subscribed here), the
    /// wait subscribes and then tries again at once.
    async fn attempt(&self, req: &Request, queue: bool) -> Result<Poll, EngineError> {
        let gate = keys::gate(&req.key);
        // Only a request that may wait hears from the lock.
        let channel = queue.then(|| keys::channel(&gate, &self.id));
        let watching = channel.as_deref().and_then(|c| self.notifier.existing(c));
        let mode = match req.mode {
            dlock_core::Mode::Write => "w",
            dlock_core::Mode::Read => "r",
        };
        let join = if queue { "1" } else { "0" };
        let args = (req.owner.to_string(), mode, millis(req.lease), join, &self.id);
        let fence: u64 = self
            .eval(&self.scripts.acquire, &gate, args)
            .await
            .map_err(EngineError::failed)?;
        if fence > 0 {
            if self.replicated().await? {
                return Ok(Poll::Held(fence));
            }
            // Too few replicas have it: a failover now could forget it.
            // Undo, and try again within the wait.
            self.run(&self.scripts.release, req, ("cancel", "")).await?;
            return Ok(Poll::Waiting(Box::pin(std::future::pending())));
        }
        let wake: Wake = match (watching, channel) {
            // A handed-over grant lasts the waiter's lease or its liveness
            // window, the shorter (see release.lua), counted from this call
            // on both sides. With replicas_ack a handed-over grant must
            // still be acknowledged: the waiter then claims it by polling.
            (Some(receiver), _) => {
                let handoff = self
                    .replicas_ack
                    .is_none()
                    .then_some(req.lease.min(self.waiter_ttl));
                notify::wake_for(receiver, req.owner, handoff)
            }
            (None, None) => Box::pin(std::future::pending()),
            // Subscribed after this attempt: try again at once, so a release
            // that happened meanwhile is not missed.
            (None, Some(channel)) => match self.notifier.subscribe(&channel).await {
                Some(_) => Box::pin(std::future::ready(dlock_core::kit::Woken::Retry)),
                None => Box::pin(std::future::pending()),
            },
        };
        Ok(Poll::Waiting(wake))
    }

    async fn run(
        &self,
        script: &Script,
        req: &Request,
        arg: impl redis::ToRedisArgs,
    ) -> Result<bool, EngineError> {
        self.invoke(script, req, arg).await.map_err(EngineError::failed)
    }

    /// A release or a withdrawal, sent once more on a fresh connection if
    /// the first went down with a dead one (a killed connection fails its
    /// next command): otherwise the lock would stay taken for the lease.
    /// The core bounds both tries by the call timeout. If the first had
    /// run after all, the second finds nothing of this owner's: a release
    /// then reports the hold lost, never a hold that is still there.
    async fn let_go(&self, req: &Request, how: &str) -> Result<bool, EngineError> {
        let release = &self.scripts.release;
        // The token lets a lone writer's release go without reading the gate first.
        let fence = match req.fence {
            0 => String::new(),
            fence => format!("{fence:014x}"),
        };
        let args = (how, fence);
        match self.invoke(release, req, &args).await {
            Err(e) if e.is_unrecoverable_error() => self.run(release, req, &args).await,
            done => done.map_err(EngineError::failed),
        }
    }

    async fn invoke(
        &self,
        script: &Script,
        req: &Request,
        arg: impl redis::ToRedisArgs,
    ) -> redis::RedisResult<bool> {
        let gate = keys::gate(&req.key);
        let done: u8 = self.eval(script, &gate, (req.owner.to_string(), arg)).await?;
        Ok(done == 1)
    }

    /// `EVALSHA` of `script` on the lock's gate, its arguments written
    /// straight into one command buffer (redis-rs's script invocation
    /// copies each into a buffer of its own first); loads the script after
    /// `NOSCRIPT` and sends it once more.
    async fn eval<T: redis::FromRedisValue>(
        &self,
        script: &Script,
        gate: &str,
        args: impl redis::ToRedisArgs,
    ) -> redis::RedisResult<T> {
        // Room for every part at once: a lock's name and ids rarely need more.
        let mut cmd = redis::Cmd::with_capacity(12, 256 + gate.len());
        cmd.arg("EVALSHA")
            .arg(script.get_hash())
            .arg(1)
            .arg(gate)
            .arg(args);
        let mut connection = self.connection.clone();
        match cmd.query_async(&mut connection).await {
            Err(e) if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) => {
                script.load_async(&mut connection).await?;
                cmd.query_async(&mut connection).await
            }
            done => done,
        }
    }
}

/// `fence_retention` and `waiter_ttl`, which the scripts use as key
/// expiries: at least a millisecond each.
fn timings(
    name: &str,
    fence_retention: Duration,
    waiter_ttl: Duration,
) -> Result<(Duration, Duration), Error> {
    for (field, value) in [("fence_retention", fence_retention), ("waiter_ttl", waiter_ttl)] {
        if value < Duration::from_millis(1) {
            return Err(Error::config(
                format!("engines.{name}.{field}"),
                "must be at least 1ms",
            ));
        }
    }
    Ok((fence_retention, waiter_ttl))
}

/// A client for `config.url`, with TLS trust from `tls_ca_file` when given.
fn client(name: &str, config: &RedisConfig) -> Result<Client, Error> {
    let field = |f: &str| format!("engines.{name}.{f}");
    let tls = config.url.starts_with("rediss://");
    if !tls && config.tls_ca_file.is_some() {
        return Err(Error::config(
            field("tls_ca_file"),
            "is only used with a rediss:// url",
        ));
    }
    if tls && !cfg!(feature = "redis-tls") {
        return Err(Error::config(
            field("url"),
            "rediss:// needs dlock's cargo feature `redis-tls`",
        ));
    }
    #[cfg(feature = "redis-tls")]
    if let Some(path) = &config.tls_ca_file {
        let root_cert = std::fs::read(path).map_err(|e| {
            Error::config(
                field("tls_ca_file"),
                format!("cannot read {}: {e}", path.display()),
            )
        })?;
        let certificates = redis::TlsCertificates {
            client_tls: None,
            root_cert: Some(root_cert),
        };
        return Client::build_with_tls(config.url.as_str(), certificates)
            .map_err(|e| Error::config(field("url"), e.to_string()));
    }
    Client::open(config.url.as_str()).map_err(|e| {
        Error::config(
            field("url"),
            format!(
                "`{}` is not a Redis url ({e}); write redis://[user:password@]host:port, or rediss:// for TLS",
                without_password(&config.url)
            ),
        )
    })
}

/// `url` with any password replaced by `***`, for error messages: the
/// credentials are what stands after the last `/` before the `@`, so a
/// malformed url keeps its password out of the message too.
fn without_password(url: &str) -> String {
    let Some(at) = url.rfind('@') else {
        return url.to_owned();
    };
    let start = url[..at].rfind('/').map_or(0, |slash| slash + 1);
    match url[start..at].find(':') {
        Some(colon) => format!("{}:***{}", &url[..start + colon], &url[at..]),
        None => url.to_owned(),
    }
}

fn millis(d: Duration) -> u64 {
    d.as_millis().try_into().unwrap_or(u64::MAX)
}

#[async_trait]
impl Engine for RedisEngine {
    fn kind(&self) -> &'static str {
        self.kind
    }

    fn address(&self) -> String {
        self.address.clone()
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            waiter_ttl: Some(self.waiter_ttl),
            ..Capabilities::FULL
        }
    }

    async fn acquire(&self, req: &Request) -> Result<Poll, EngineError> {
        self.attempt(req, !req.try_once).await
    }

    async fn poll(&self, req: &Request) -> Result<Poll, EngineError> {
        self.attempt(req, true).await
    }

    async fn cancel(&self, req: &Request) -> Result<(), EngineError> {
        self.let_go(req, "cancel").await.map(drop)
    }

    async fn renew(&self, req: &Request) -> Result<bool, EngineError> {
        self.run(&self.scripts.renew, req, millis(req.lease)).await
    }

    async fn downgrade(&self, req: &Request) -> Result<bool, EngineError> {
        self.run(&self.scripts.downgrade, req, millis(req.lease)).await
    }

    async fn release(&self, req: &Request) -> Result<bool, EngineError> {
        self.let_go(req, "release").await
    }

    /// No signal of its own: a failed renewal tells the core.
    fn lost(&self, _req: &Request) -> Option<LostSignal> {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::without_password;

    #[test]
    fn passwords_never_reach_error_messages() {
        assert_eq!(without_password("redis://u:secret@h:1"), "redis://u:***@h:1");
        assert_eq!(without_password("redis://:secret@h:1"), "redis://:***@h:1");
        assert_eq!(without_password("redis//h:1"), "redis//h:1");
        assert_eq!(without_password("redis//u:secret@h"), "redis//u:***@h");
        assert_eq!(without_password("redis://u@h:1"), "redis://u@h:1");
    }
}
