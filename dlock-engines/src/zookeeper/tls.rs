//! How the zookeeper engine's sessions connect: plain TCP, or TLS to a
//! `secureClientPort` through zookeeper-client's `TlsOptions`.
//!
//! zookeeper-client checks the server's chain against the CA it is given
//! and knows no system roots, so every TLS mode names `tls_ca_file`;
//! `require` with it means `verify-ca`, as in libpq. A secure port speaks
//! TLS alone, so `prefer` is refused.
//!
//! zookeeper-client keeps why a handshake failed to its debug log. When
//! no session opens, a handshake of dlock's own with the first server,
//! under the same checks, says why.

use dlock_core::Error;
use dlock_core::kit::{Connecting, TlsMode};
use zookeeper_client::{Client, Connector};

use super::ZooKeeperConfig;

/// Plain TCP, or TLS.
#[derive(Clone, Default)]
pub(super) struct Transport {
    #[cfg(feature = "zookeeper-tls")]
    tls: Option<secure::Tls>,
}

impl Transport {
    /// The transport `config` asks for; its files are read now, so a bad
    /// one fails startup, naming its field.
    pub fn new(at: &Connecting<'_>, config: &ZooKeeperConfig) -> Result<Self, Error> {
        match config.tls_mode.unwrap_or(TlsMode::Disable) {
            TlsMode::Disable if config.tls.any() => Err(at.bad(
                "tls_mode",
                "set it to require, verify-ca or verify-full to use the tls_ files",
            )),
            TlsMode::Disable => Ok(Transport::default()),
            TlsMode::Prefer => Err(at.bad(
                "tls_mode",
                "a ZooKeeper secureClientPort speaks TLS alone: choose disable, require, verify-ca or verify-full",
            )),
            #[cfg(not(feature = "zookeeper-tls"))]
            _ => Err(at.bad("tls_mode", "TLS needs dlock's cargo feature `zookeeper-tls`")),
            #[cfg(feature = "zookeeper-tls")]
            mode => Ok(Transport {
                tls: Some(secure::Tls::new(at, mode, &config.tls)?),
            }),
        }
    }

    /// Connects `connector` to `cluster` over this transport.
    pub async fn connect(
        &self,
        connector: Connector,
        cluster: &str,
    ) -> Result<Client, zookeeper_client::Error> {
        #[cfg(feature = "zookeeper-tls")]
        if let Some(tls) = &self.tls {
            return connector
                .with_tls(tls.options.clone())
                .secure_connect(cluster)
                .await;
        }
        connector.connect(cluster).await
    }

    /// Why no session opened over TLS to `cluster`, if a handshake with its
    /// first server fails.
    pub async fn why_not(&self, cluster: &str) -> Option<String> {
        #[cfg(feature = "zookeeper-tls")]
        if let Some(tls) = &self.tls {
            return tls.why_not(cluster).await;
        }
        let _ = cluster;
        None
    }
}

#[cfg(feature = "zookeeper-tls")]
mod secure {
    use std::sync::Arc;
    use std::time::Duration;

    use dlock_core::Error;
    use dlock_core::kit::{Connecting, TlsFiles, TlsMode};
    use rustls::ClientConfig;
    use zookeeper_client::TlsOptions;

    /// zookeeper-client's options, and the same checks as rustls's config.
    #[derive(Clone)]
    pub(super) struct Tls {
        pub options: TlsOptions,
        probe: Arc<ClientConfig>,
    }

    /// A handshake with a server that answers takes far less.
    const PROBE_TAKES: Duration = Duration::from_secs(1);

    impl Tls {
        pub fn new(at: &Connecting<'_>, mode: TlsMode, files: &TlsFiles) -> Result<Self, Error> {
            crate::crypto::ensure_provider();
            let pem = files.read(at)?;
            let text = |field: &str, bytes: Vec<u8>| {
                String::from_utf8(bytes).map_err(|_| at.bad(field, "is not a PEM file"))
            };
            let Some(ca) = pem.ca else {
                return Err(at.bad(
                    "tls_ca_file",
                    "the zookeeper engine checks the server's certificate against this CA alone (it knows no system roots): name it",
                ));
            };
            let mut options = TlsOptions::new()
                .with_pem_ca(&text("tls_ca_file", ca)?)
                .map_err(|e| at.bad("tls_ca_file", e.to_string()))?;
            if let Some((cert, key)) = pem.identity {
                options = options
                    .with_pem_identity(&text("tls_cert_file", cert)?, &text("tls_key_file", key)?)
                    .map_err(|e| at.bad("tls_cert_file", e.to_string()))?;
            }
            if mode != TlsMode::VerifyFull {
                // SAFETY: not memory safety; the crate marks skipping the
                // name check as a danger, and `require` and `verify-ca`
                // ask for just that.
                options = unsafe { options.with_no_hostname_verification() };
            }
            let probe = Arc::new(crate::tls::client_config(at, files, mode)?);
            Ok(Tls { options, probe })
        }

        pub async fn why_not(&self, cluster: &str) -> Option<String> {
            let first = cluster.split(',').next()?.trim();
            let first = first.strip_prefix("tcp+tls://").unwrap_or(first);
            let address = first.split('/').next()?;
            let name = crate::tls::server_name(address)?;
            let connector = tokio_rustls::TlsConnector::from(self.probe.clone());
            let handshake = async {
                let stream = tokio::net::TcpStream::connect(address).await?;
                connector.connect(name, stream).await
            };
            match tokio::time::timeout(PROBE_TAKES, handshake).await {
                Ok(Err(e)) => Some(format!("TLS with {address}: {e}")),
                _ => None,
            }
        }
    }
}
