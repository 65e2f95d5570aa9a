//! A rustls client config made from the shared TLS settings, for the
//! engines whose client takes one: ring as the crypto provider, the CA
//! file or else the system's roots, the client's own certificate, and as
//! much checking of the server's certificate as the [`TlsMode`] asks.

use std::sync::Arc;

use dlock_core::Error;
use dlock_core::kit::{Connecting, TlsFiles, TlsMode};
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::{WebPkiServerVerifier, verify_server_cert_signed_by_trust_anchor};
use rustls::crypto::{CryptoProvider, verify_tls12_signature, verify_tls13_signature};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::server::ParsedCertificate;
use rustls::{ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme};

/// The client config for `mode` with `files`; a file that cannot be read
/// or parsed is a config error naming its field.
pub(crate) fn client_config(
    at: &Connecting<'_>,
    files: &TlsFiles,
    mode: TlsMode,
) -> Result<ClientConfig, Error> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let pem = files.read(at)?;
    if mode == TlsMode::VerifyCa && pem.ca.is_none() {
        // Checked against the system's roots with no name, any public
        // certificate for any host would pass.
        return Err(at.bad(
            "tls_ca_file",
            "verify-ca checks the chain against the server's own CA: name it here, or use verify-full",
        ));
    }
    let roots = match &pem.ca {
        Some(ca) => roots_from(at, ca)?,
        None if mode.checks_the_chain(false) => system_roots(at)?,
        None => RootCertStore::empty(),
    };
    let builder = ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| at.bad("tls_mode", e.to_string()))?;
    let builder = if mode == TlsMode::VerifyFull {
        let verifier = WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider)
            .build()
            .map_err(|e| at.bad("tls_ca_file", e.to_string()))?;
        builder.with_webpki_verifier(verifier)
    } else {
        let check = Check {
            roots: mode.checks_the_chain(pem.ca.is_some()).then_some(roots),
            provider,
        };
        builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(check))
    };
    match pem.identity {
        None => Ok(builder.with_no_client_auth()),
        Some((cert, key)) => {
            let chain = CertificateDer::pem_slice_iter(&cert)
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| at.bad("tls_cert_file", format!("not a PEM certificate: {e}")))?;
            let key = PrivateKeyDer::from_pem_slice(&key)
                .map_err(|e| at.bad("tls_key_file", format!("not a PEM private key: {e}")))?;
            builder
                .with_client_auth_cert(chain, key)
                .map_err(|e| at.bad("tls_cert_file", e.to_string()))
        }
    }
}

/// The name to check the certificate of the server at `host:port` for:
/// its host, an IPv6 address without its brackets.
#[cfg(any(feature = "memcached", feature = "zookeeper-tls"))]
pub(crate) fn server_name(address: &str) -> Option<ServerName<'static>> {
    let host = address.rsplit_once(':').map_or(address, |(host, _)| host);
    ServerName::try_from(host.trim_matches(['[', ']']).to_owned()).ok()
}

fn roots_from(at: &Connecting<'_>, ca: &[u8]) -> Result<RootCertStore, Error> {
    let mut roots = RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(ca) {
        let cert = cert.map_err(|e| at.bad("tls_ca_file", format!("not a PEM certificate: {e}")))?;
        roots
            .add(cert)
            .map_err(|e| at.bad("tls_ca_file", format!("not a CA certificate: {e}")))?;
    }
    if roots.is_empty() {
        return Err(at.bad("tls_ca_file", "holds no certificate"));
    }
    Ok(roots)
}

fn system_roots(at: &Connecting<'_>) -> Result<RootCertStore, Error> {
    let mut roots = RootCertStore::empty();
    let found = rustls_native_certs::load_native_certs();
    roots.add_parsable_certificates(found.certs);
    if roots.is_empty() {
        return Err(at.bad(
            "tls_ca_file",
            "the system has no trusted CA certificates: name the server's CA here",
        ));
    }
    Ok(roots)
}

/// The checks short of `verify-full`: the chain to `roots` (`verify-ca`,
/// or `require` with a CA file), or nothing; the handshake's signatures
/// are checked either way.
#[derive(Debug)]
struct Check {
    roots: Option<RootCertStore>,
    provider: Arc<CryptoProvider>,
}

impl ServerCertVerifier for Check {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        _name: &ServerName<'_>,
        _ocsp: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        if let Some(roots) = &self.roots {
            let cert = ParsedCertificate::try_from(end_entity)?;
            let algorithms = self.provider.signature_verification_algorithms.all;
            verify_server_cert_signed_by_trust_anchor(&cert, roots, intermediates, now, algorithms)?;
        }
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        signed: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls12_signature(
            message,
            cert,
            signed,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        signed: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls13_signature(
            message,
            cert,
            signed,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}
