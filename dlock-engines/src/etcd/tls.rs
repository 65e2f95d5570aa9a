//! TLS for `https://` endpoints, with cargo feature `etcd-tls`; without it,
//! asking for TLS is a config error naming the feature.

use dlock_core::Error;
use dlock_core::kit::Connecting;

use super::EtcdConfig;

/// Whether the config asks for TLS.
fn wanted(config: &EtcdConfig) -> bool {
    config.endpoints.iter().any(|e| e.starts_with("https://")) || config.tls.any()
}

#[cfg(not(feature = "etcd-tls"))]
pub(crate) enum Options {}

#[cfg(not(feature = "etcd-tls"))]
pub(crate) fn apply(
    options: etcd_client::ConnectOptions,
    tls: Option<Options>,
) -> etcd_client::ConnectOptions {
    match tls {
        None => options,
    }
}

#[cfg(not(feature = "etcd-tls"))]
pub(crate) fn options(config: &EtcdConfig, at: &Connecting<'_>) -> Result<Option<Options>, Error> {
    if wanted(config) {
        return Err(at.bad("endpoints", "TLS needs dlock's cargo feature `etcd-tls`"));
    }
    Ok(None)
}

#[cfg(feature = "etcd-tls")]
pub(crate) use etcd_client::TlsOptions as Options;

#[cfg(feature = "etcd-tls")]
pub(crate) fn apply(
    options: etcd_client::ConnectOptions,
    tls: Option<Options>,
) -> etcd_client::ConnectOptions {
    match tls {
        Some(tls) => options.with_tls(tls),
        None => options,
    }
}

/// The TLS settings of `config`, `None` for plain `http://` endpoints.
#[cfg(feature = "etcd-tls")]
pub(crate) fn options(config: &EtcdConfig, at: &Connecting<'_>) -> Result<Option<Options>, Error> {
    use etcd_client::{Certificate, Identity};
    if !wanted(config) {
        return Ok(None);
    }
    if let Some(plain) = config.endpoints.iter().find(|e| e.starts_with("http://")) {
        return Err(at.bad(
            "endpoints",
            format!("`{plain}` is plain http while TLS is set: write https://, or drop the tls_ settings"),
        ));
    }
    let pem = config.tls.read(at)?;
    let mut options = match pem.ca {
        Some(ca) => Options::new().ca_certificate(Certificate::from_pem(ca)),
        None => Options::new().with_native_roots(),
    };
    if let Some((cert, key)) = pem.identity {
        options = options.identity(Identity::from_pem(cert, key));
    }
    Ok(Some(options))
}
