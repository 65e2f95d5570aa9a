//! rustls's process-wide crypto provider, for the clients that take theirs
//! from there (mysql_async, redis, zookeeper-client and async-nats build
//! their configs with `ClientConfig::builder()`).
//!
//! rustls picks a process default on its own only when one provider is
//! compiled in. zookeeper-client's TLS turns on aws-lc-rs beside ring, and so
//! may the application's own crates; with both, each such client would
//! panic at its first TLS handshake.

use rustls::crypto::CryptoProvider;

/// Installs ring as the process default, unless one is already installed
/// (the application's choice stands).
pub(crate) fn ensure_provider() {
    if CryptoProvider::get_default().is_none() {
        // Another thread may have installed one since: either stands.
        let _ = rustls::crypto::ring::default_provider().install_default();
    }
}
