//! dlock's lock engines, one module per engine, each behind its cargo feature,
//! and `conformance`, the behaviour suite every engine passes unchanged.

use std::sync::Arc;

use dlock_core::config::EngineConfig;
use dlock_core::{Engine, Error, async_trait};

#[cfg(feature = "conformance")]
pub mod conformance;
#[cfg(feature = "memory")]
pub mod memory;
#[cfg(feature = "redis")]
pub mod redis;
#[cfg(feature = "zookeeper")]
pub mod zookeeper;

/// Builds any engine compiled into this build, by its config `kind`.
pub struct Factory;

#[async_trait]
impl dlock_core::Factory for Factory {
    fn kinds(&self) -> Vec<&'static str> {
        vec![
            #[cfg(feature = "memory")]
            "memory",
            #[cfg(feature = "redis")]
            "redis",
            #[cfg(feature = "redis")]
            "redis-cluster",
            #[cfg(feature = "zookeeper")]
            "zookeeper",
        ]
    }

    async fn build(&self, name: &str, config: &EngineConfig) -> Result<Arc<dyn Engine>, Error> {
        match config.kind.as_str() {
            #[cfg(feature = "memory")]
            "memory" => {
                #[derive(serde::Deserialize)]
                #[serde(deny_unknown_fields)]
                struct NoSettings {}
                config.settings::<NoSettings>(name)?;
                Ok(Arc::new(memory::MemoryEngine::new()))
            }
            #[cfg(feature = "redis")]
            "redis" => Ok(Arc::new(
                redis::RedisEngine::connect(name, &config.settings(name)?).await?,
            )),
            #[cfg(feature = "redis")]
            "redis-cluster" => Ok(Arc::new(
                redis::RedisEngine::connect_cluster(name, &config.settings(name)?).await?,
            )),
            #[cfg(feature = "zookeeper")]
            "zookeeper" => Ok(Arc::new(
                zookeeper::ZooKeeperEngine::connect(name, &config.settings(name)?).await?,
            )),
            other => Err(Error::config(
                format!("engines.{name}.kind"),
                format!("engine kind `{other}` is not compiled into this build"),
            )),
        }
    }
}
