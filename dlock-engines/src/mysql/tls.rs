//! TLS for the mysql engine: the shared settings as mysql_async's
//! `SslOpts` (rustls with ring).
//!
//! `verify-ca`, and `require` with a CA file (which means `verify-ca`),
//! are refused: mysql_async's rustls build checks the host name whenever
//! it checks the chain (its switch to skip the name looks for an error
//! text rustls 0.23 no longer gives), so a chain-only check cannot be had.

use dlock_core::Error;
use dlock_core::kit::{Connecting, TlsFiles, TlsMode};
use mysql_async::{ClientIdentity, SslOpts};

/// The `SslOpts` for `mode` with `files`; `None` for plain TCP.
pub(super) fn ssl_opts(
    at: &Connecting<'_>,
    mode: TlsMode,
    files: &TlsFiles,
) -> Result<Option<SslOpts>, Error> {
    let pem = files.read(at)?;
    let checked = mode.checks_the_chain(pem.ca.is_some());
    let opts = match mode {
        TlsMode::Disable => return Ok(None),
        TlsMode::VerifyFull => SslOpts::default(),
        _ if checked => {
            return Err(at.bad(
                "tls_mode",
                "the mysql engine checks a certificate's chain only with its name: use verify-full, \
                 or require without tls_ca_file",
            ));
        }
        _ => SslOpts::default().with_danger_accept_invalid_certs(true),
    };
    let opts = match pem.ca {
        Some(ca) => opts
            .with_root_certs(vec![ca.into()])
            .with_disable_built_in_roots(true),
        None => opts,
    };
    let identity = pem
        .identity
        .map(|(cert, key)| ClientIdentity::new(cert.into(), key.into()));
    crate::crypto::ensure_provider();
    Ok(Some(opts.with_client_identity(identity)))
}
