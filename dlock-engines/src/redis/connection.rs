//! One connection type over a single server (a reconnecting manager), a
//! Redis Cluster (routing each script by its key's slot), or the primary
//! that Sentinel names (followed across failovers).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use futures_util::StreamExt;
use tokio::task::AbortHandle;

use dlock_core::Error;
use dlock_core::kit::Connecting;
use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClientBuilder;
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
use redis::sentinel::SentinelClient;
use redis::{
    Client, Cmd, ConnectionAddr, ConnectionInfo, ErrorKind, Pipeline, RedisFuture, RedisResult,
    ServerErrorKind, Value,
};

#[derive(Clone)]
pub(crate) enum Connection {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
    Sentinel(Arc<Primary>),
}

impl ConnectionLike for Connection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Connection::Single(c) => c.req_packed_command(cmd),
            Connection::Cluster(c) => c.req_packed_command(cmd),
            Connection::Sentinel(p) => Box::pin(p.call(async move |mut c| c.req_packed_command(cmd).await)),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Connection::Single(c) => c.req_packed_commands(pipeline, offset, count),
            Connection::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
            Connection::Sentinel(p) => {
                Box::pin(p.call(async move |mut c| c.req_packed_commands(pipeline, offset, count).await))
            }
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Connection::Single(c) => c.get_db(),
            Connection::Cluster(c) => c.get_db(),
            Connection::Sentinel(_) => 0,
        }
    }
}

impl Connection {
    /// Every key matching `pattern`, by `SCAN`: on a cluster, on every
    /// primary in turn, since each holds only its own slots' keys.
    pub async fn scan(&self, pattern: &str) -> RedisResult<Vec<String>> {
        let Connection::Cluster(cluster) = self else {
            let connection = self.clone();
            return scan_with(pattern, |cmd| {
                let mut connection = connection.clone();
                async move { cmd.query_async(&mut connection).await }
            })
            .await;
        };
        let any = RoutingInfo::SingleNode(SingleNodeRoutingInfo::Random);
        let slots = cluster
            .clone()
            .route_command(redis::cmd("CLUSTER").arg("SLOTS").clone(), any)
            .await?;
        // Each range: [start, end, [host, port, id, ...] of its primary, replicas...].
        let mut primaries: Vec<(String, u16)> = Vec::new();
        for range in redis::from_redis_value::<Vec<Vec<Value>>>(slots)? {
            if let Some(node) = range.into_iter().nth(2) {
                let (host, port): (String, u16) =
                    match redis::from_redis_value::<Vec<Value>>(node)?.as_slice() {
                        [host, port, ..] => (
                            redis::from_redis_value_ref(host)?,
                            redis::from_redis_value_ref(port)?,
                        ),
                        _ => continue,
                    };
                if !primaries.contains(&(host.clone(), port)) {
                    primaries.push((host, port));
                }
            }
        }
        let mut keys = Vec::new();
        for (host, port) in primaries {
            let node = RoutingInfo::SingleNode(SingleNodeRoutingInfo::ByAddress { host, port });
            keys.extend(
                scan_with(pattern, |cmd| {
                    let (mut cluster, node) = (cluster.clone(), node.clone());
                    async move { cluster.route_command(cmd, node).await }
                })
                .await?,
            );
        }
        Ok(keys)
    }
}

/// `SCAN` from start to end, each step sent by `send`.
pub(crate) async fn scan_with<F: Future<Output = RedisResult<Value>>>(
    pattern: &str,
    mut send: impl FnMut(Cmd) -> F,
) -> RedisResult<Vec<String>> {
    let (mut keys, mut cursor) = (Vec::new(), 0_u64);
    loop {
        let mut cmd = redis::cmd("SCAN");
        cmd.arg(cursor).arg("MATCH").arg(pattern).arg("COUNT").arg(1000);
        let (next, found): (u64, Vec<String>) = redis::from_redis_value(send(cmd).await?)?;
        keys.extend(found);
        if next == 0 {
            return Ok(keys);
        }
        cursor = next;
    }
}

/// The primary Sentinel names, connected on first use and asked for again
/// after any failure (a failover that kills or demotes the old primary: its
/// connection fails, or answers `READONLY`) and whenever a sentinel
/// announces a new one (`+switch-master`): an old primary that comes back
/// still writable, before the sentinels demote it, answers no error at all.
pub(crate) struct Primary {
    sentinel: tokio::sync::Mutex<SentinelClient>,
    current: Mutex<Option<Current>>,
    timeout: Duration,
    /// Primaries announced so far: the subscriber reconnects when it moves.
    switches: AtomicU64,
    /// The tasks that listen to each sentinel, ended with the engine.
    listeners: Mutex<Vec<AbortHandle>>,
}

#[derive(Clone)]
struct Current {
    manager: ConnectionManager,
    /// `host:port`, as the sentinels announce it.
    address: String,
}

impl Primary {
    pub fn new(sentinel: SentinelClient, timeout: Duration) -> Self {
        Primary {
            sentinel: tokio::sync::Mutex::new(sentinel),
            current: Mutex::new(None),
            timeout,
            switches: AtomicU64::new(0),
            listeners: Mutex::default(),
        }
    }

    /// Listens to every sentinel for the primary named `master` moving.
    pub fn follow(self: &Arc<Self>, sentinels: Vec<ConnectionInfo>, master: &str) {
        let handles = sentinels.into_iter().map(|sentinel| {
            tokio::spawn(listen(Arc::downgrade(self), sentinel, master.to_owned())).abort_handle()
        });
        *lock(&self.listeners) = handles.collect();
    }

    pub fn switches(&self) -> u64 {
        self.switches.load(Ordering::SeqCst)
    }

    /// The sentinels named the primary at `address`: the next call asks
    /// them again, unless it is the one connected.
    fn moved_to(&self, address: Option<&str>) {
        let mut current = lock(&self.current);
        if address.is_none() || current.as_ref().map(|c| c.address.as_str()) != address {
            current.take();
            self.switches.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// A client for the primary the sentinels name now.
    pub async fn client(&self) -> RedisResult<Client> {
        let mut sentinel = self.sentinel.lock().await;
        tokio::time::timeout(self.timeout, sentinel.async_get_client())
            .await
            .unwrap_or_else(|_| Err((ErrorKind::Io, "no sentinel answered in time").into()))
    }

    async fn connection(&self) -> RedisResult<ConnectionManager> {
        if let Some(current) = lock(&self.current).clone() {
            return Ok(current.manager);
        }
        let client = self.client().await?;
        let address = match &client.get_connection_info().addr() {
            ConnectionAddr::Tcp(host, port) => format!("{host}:{port}"),
            other => other.to_string(),
        };
        let manager = ConnectionManager::new_with_config(client, manager_config(self.timeout)).await?;
        *lock(&self.current) = Some(Current {
            manager: manager.clone(),
            address,
        });
        Ok(manager)
    }

    /// Runs `call` on the primary's connection; after a failure other than
    /// a missing script, the next call asks the sentinels again.
    async fn call<T>(&self, call: impl AsyncFnOnce(ConnectionManager) -> RedisResult<T>) -> RedisResult<T> {
        let result = call(self.connection().await?).await;
        if let Err(e) = &result
            && e.kind() != ErrorKind::Server(ServerErrorKind::NoScript)
        {
            lock(&self.current).take();
        }
        result
    }
}

impl Drop for Primary {
    fn drop(&mut self) {
        lock(&self.listeners).iter().for_each(AbortHandle::abort);
    }
}

/// Follows one sentinel's `+switch-master` announcements for `master`
/// while the engine lives, reconnecting after a second when it drops. A
/// reconnect may have missed one, so it counts as a move to an unknown
/// address.
async fn listen(primary: Weak<Primary>, sentinel: ConnectionInfo, master: String) {
    let mut connected_before = false;
    loop {
        if let Ok(Ok(mut pubsub)) = tokio::time::timeout(Duration::from_secs(5), async {
            Client::open(sentinel.clone())?.get_async_pubsub().await
        })
        .await
            && pubsub.subscribe("+switch-master").await.is_ok()
        {
            if connected_before {
                let Some(primary) = primary.upgrade() else { return };
                primary.moved_to(None);
            }
            connected_before = true;
            let mut messages = pubsub.on_message();
            while let Some(message) = messages.next().await {
                // `<master> <old ip> <old port> <new ip> <new port>`
                let text: String = message.get_payload().unwrap_or_default();
                let words: Vec<&str> = text.split(' ').collect();
                if let [name, _, _, ip, port] = words[..]
                    && name == master
                {
                    let Some(primary) = primary.upgrade() else { return };
                    primary.moved_to(Some(&format!("{ip}:{port}")));
                }
            }
        }
        if primary.strong_count() == 0 {
            return;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

fn manager_config(timeout: Duration) -> ConnectionManagerConfig {
    ConnectionManagerConfig::new()
        .set_connection_timeout(Some(timeout))
        .set_response_timeout(Some(timeout))
        .set_number_of_retries(1)
}

/// An engine connecting to `address`, each step given `timeout`.
pub(crate) struct Target<'a> {
    pub at: Connecting<'a>,
    /// The label the engine's holder records carry.
    pub label: String,
    pub address: String,
    pub timeout: Duration,
}

impl Target<'_> {
    /// Runs `connect` within the timeout, naming engine and address on failure.
    pub async fn within<T>(&self, connect: impl Future<Output = redis::RedisResult<T>>) -> Result<T, Error> {
        self.at.within(&self.address, self.timeout, connect).await
    }
}

pub(crate) async fn single(client: Client, target: &Target<'_>) -> Result<Connection, Error> {
    let manager = target
        .within(ConnectionManager::new_with_config(
            client,
            manager_config(target.timeout),
        ))
        .await?;
    Ok(Connection::Single(manager))
}

/// Connects to the primary the sentinels name now, to fail at startup if none.
pub(crate) async fn sentinel(primary: Arc<Primary>, target: &Target<'_>) -> Result<Connection, Error> {
    target.within(primary.connection()).await?;
    Ok(Connection::Sentinel(primary))
}

/// A cluster's seed nodes, and the certificates to reach every node with.
#[derive(Clone)]
pub(crate) struct Seeds {
    pub nodes: Vec<ConnectionInfo>,
    #[cfg(feature = "redis-tls")]
    pub certificates: Option<redis::TlsCertificates>,
}

impl Seeds {
    /// A builder of clients of the cluster, over TLS if its urls say so.
    pub fn builder(&self) -> ClusterClientBuilder {
        let builder = ClusterClientBuilder::new(self.nodes.clone());
        #[cfg(feature = "redis-tls")]
        if let Some(certificates) = &self.certificates {
            return builder.certs(certificates.clone());
        }
        builder
    }
}

pub(crate) async fn cluster(seeds: &Seeds, target: &Target<'_>) -> Result<Connection, Error> {
    let client = seeds
        .builder()
        .connection_timeout(target.timeout)
        .response_timeout(target.timeout)
        .build()
        .map_err(|e| target.at.bad("nodes", e.to_string()))?;
    let connection = target.within(client.get_async_connection()).await?;
    Ok(Connection::Cluster(connection))
}
