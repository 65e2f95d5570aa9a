//! One connection type over a single server (a reconnecting manager), a
//! Redis Cluster (routing each script by its key's slot), or the primary
//! that Sentinel names (followed across failovers).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use dlock_core::{BoxError, Error};
use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClientBuilder;
use redis::cluster_async::ClusterConnection;
use redis::sentinel::SentinelClient;
use redis::{Client, Cmd, ErrorKind, Pipeline, RedisFuture, RedisResult, ServerErrorKind, Value};

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

/// The primary Sentinel names, connected on first use and asked for again
/// after any failure (a failover kills or demotes the old primary: its
/// connection fails, or answers `READONLY`).
pub(crate) struct Primary {
    sentinel: tokio::sync::Mutex<SentinelClient>,
    current: Mutex<Option<ConnectionManager>>,
    timeout: Duration,
}

impl Primary {
    pub fn new(sentinel: SentinelClient, timeout: Duration) -> Self {
        Primary {
            sentinel: tokio::sync::Mutex::new(sentinel),
            current: Mutex::new(None),
            timeout,
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
        if let Some(current) = self.current.lock().unwrap_or_else(|e| e.into_inner()).clone() {
            return Ok(current);
        }
        let manager =
            ConnectionManager::new_with_config(self.client().await?, manager_config(self.timeout)).await?;
        *self.current.lock().unwrap_or_else(|e| e.into_inner()) = Some(manager.clone());
        Ok(manager)
    }

    /// Runs `call` on the primary's connection; after a failure other than
    /// a missing script, the next call asks the sentinels again.
    async fn call<T>(&self, call: impl AsyncFnOnce(ConnectionManager) -> RedisResult<T>) -> RedisResult<T> {
        let result = call(self.connection().await?).await;
        if let Err(e) = &result
            && e.kind() != ErrorKind::Server(ServerErrorKind::NoScript)
        {
            self.current.lock().unwrap_or_else(|e| e.into_inner()).take();
        }
        result
    }
}

fn manager_config(timeout: Duration) -> ConnectionManagerConfig {
    ConnectionManagerConfig::new()
        .set_connection_timeout(Some(timeout))
        .set_response_timeout(Some(timeout))
        .set_number_of_retries(1)
}

/// What a connect attempt failed on, named the way config errors are.
pub(crate) struct Target<'a> {
    pub engine: &'a str,
    pub kind: &'static str,
    pub address: String,
    pub timeout: Duration,
}

impl Target<'_> {
    fn unavailable(&self, source: BoxError) -> Error {
        Error::Unavailable {
            engine: self.engine.to_owned(),
            kind: self.kind,
            address: self.address.clone(),
            source,
        }
    }

    /// Runs `connect` within the timeout, naming engine and address on failure.
    pub async fn within<T>(&self, connect: impl Future<Output = redis::RedisResult<T>>) -> Result<T, Error> {
        tokio::time::timeout(self.timeout, connect)
            .await
            .map_err(|_| self.unavailable(format!("no answer within {:?}", self.timeout).into()))?
            .map_err(|e| self.unavailable(e.into()))
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

pub(crate) async fn cluster(nodes: &[String], target: &Target<'_>) -> Result<Connection, Error> {
    let client = ClusterClientBuilder::new(nodes.to_vec())
        .connection_timeout(target.timeout)
        .response_timeout(target.timeout)
        .build()
        .map_err(|e| Error::config(format!("engines.{}.nodes", target.engine), e.to_string()))?;
    let connection = target.within(client.get_async_connection()).await?;
    Ok(Connection::Cluster(connection))
}
