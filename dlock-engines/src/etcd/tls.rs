//! TLS for `https://` endpoints, with cargo feature `etcd-tls`; without it,
//! asking for TLS is a config error naming the feature.

use dlock_core::Error;

use super::EtcdConfig;

/// Whether the config asks for TLS.
fn wanted(config: &EtcdConfig) -> bool {
    config.endpoints.iter().any(|e| e.starts_with("https://"))
        || config.tls_ca_file.is_some()
        || config.tls_cert_file.is_some()
        || config.tls_key_file.is_some()
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
pub(crate) fn options(config: &EtcdConfig, field: &dyn Fn(&str) -> String) -> Result<Option<Options>, Error> {
    if wanted(config) {
        return Err(Error::config(
            field("endpoints"),
            "TLS needs dlock's cargo feature `etcd-tls`",
        ));
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
pub(crate) fn options(config: &EtcdConfig, field: &dyn Fn(&str) -> String) -> Result<Option<Options>, Error> {
    use etcd_client::{Certificate, Identity};
    if !wanted(config) {
        return Ok(None);
    }
    if let Some(plain) = config.endpoints.iter().find(|e| e.starts_with("http://")) {
        return Err(Error::config(
            field("endpoints"),
            format!("`{plain}` is plain http while TLS is set: write https://, or drop the tls_ settings"),
        ));
    }
    let read = |name: &str, path: &std::path::Path| {
        std::fs::read(path)
            .map_err(|e| Error::config(field(name), format!("cannot read {}: {e}", path.display())))
    };
    let mut options = Options::new();
    options = match &config.tls_ca_file {
        Some(path) => options.ca_certificate(Certificate::from_pem(read("tls_ca_file", path)?)),
        None => options.with_native_roots(),
    };
    match (&config.tls_cert_file, &config.tls_key_file) {
        (Some(cert), Some(key)) => {
            let identity = Identity::from_pem(read("tls_cert_file", cert)?, read("tls_key_file", key)?);
            options = options.identity(identity);
        }
        (None, None) => {}
        (Some(_), None) => return Err(Error::config(field("tls_key_file"), "set it with tls_cert_file")),
        (None, Some(_)) => return Err(Error::config(field("tls_cert_file"), "set it with tls_key_file")),
    }
    Ok(Some(options))
}
