//! One connection type over a single server (a reconnecting manager) or a
//! Redis Cluster (routing each script by its key's slot).

use std::time::Duration;

use dlock_core::{BoxError, Error};
use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClientBuilder;
use redis::cluster_async::ClusterConnection;
use redis::{Client, Cmd, Pipeline, RedisFuture, Value};

#[derive(Clone)]
pub(crate) enum Connection {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
}

impl ConnectionLike for Connection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Connection::Single(c) => c.req_packed_command(cmd),
            Connection::Cluster(c) => c.req_packed_command(cmd),
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
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Connection::Single(c) => c.get_db(),
            Connection::Cluster(c) => c.get_db(),
        }
    }
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
    let config = ConnectionManagerConfig::new()
        .set_connection_timeout(Some(target.timeout))
        .set_response_timeout(Some(target.timeout))
        .set_number_of_retries(1);
    let manager = target
        .within(ConnectionManager::new_with_config(client, config))
        .await?;
    Ok(Connection::Single(manager))
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
