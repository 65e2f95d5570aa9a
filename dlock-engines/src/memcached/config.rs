//! The memcached engine's settings, and connecting.

use dlock_core::Error;
use dlock_core::kit::{ClientSettings, Connecting, Kinds};
use serde::Deserialize;

use super::MemcachedEngine;
use super::wire::Pool;

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
