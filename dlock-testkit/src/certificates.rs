//! Certificates made at test time for servers that speak TLS, with
//! `openssl`: a CA, and signed by it a server certificate for 127.0.0.1
//! and localhost, one that expired, one for another name, and a client
//! certificate; and a second CA that signed nothing.

use std::path::{Path, PathBuf};

use dlock_core::kit::TlsFiles;
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};

fn openssl(dir: &Path, args: &[&str]) {
    run(Command::new("openssl"), dir, args);
}

fn run(mut openssl: Command, dir: &Path, args: &[&str]) {
    let out = openssl.args(args).current_dir(dir).output().expect("openssl");
    assert!(
        out.status.success(),
        "openssl {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// In a new folder: a CA (`ca.crt`), and signed by it a server
/// certificate for IP 127.0.0.1 and localhost (`server.crt`, `server.key`),
/// the same that expired yesterday (`expired.crt`, `expired.key`), one
/// for `db.example` alone (`elsewhere.crt`, `elsewhere.key`) and a client
/// certificate (`client.crt`, `client.key`, for user `dlock`); and
/// a second CA (`other-ca.crt`) that signed nothing.
pub fn certificates() -> PathBuf {
    // A folder per call: tests in one process run side by side.
    static MADE: AtomicUsize = AtomicUsize::new(0);
    let made = MADE.fetch_add(1, Ordering::Relaxed);
    let dir = crate::server::scratch(&format!("tls-{made}"));
    std::fs::create_dir_all(&dir).expect("cert dir");
    authority(&dir, "ca", "/CN=dlock test CA");
    authority(&dir, "other-ca", "/CN=dlock test CA that signed nothing");
    std::fs::write(
        dir.join("san.ext"),
        "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n",
    )
    .expect("ext");
    request(&dir, "server", "/CN=127.0.0.1");
    sign(&dir, "server", "san.ext", Command::new("openssl"));
    // Signed two days ago for one day.
    request(&dir, "expired", "/CN=127.0.0.1");
    sign(
        &dir,
        "expired",
        "san.ext",
        crate::server::with_clock("openssl", "-2d"),
    );
    std::fs::write(
        dir.join("elsewhere.ext"),
        "subjectAltName=DNS:db.example\nextendedKeyUsage=serverAuth\n",
    )
    .expect("ext");
    request(&dir, "elsewhere", "/CN=db.example");
    sign(&dir, "elsewhere", "elsewhere.ext", Command::new("openssl"));
    request(&dir, "client", "/CN=dlock");
    std::fs::write(dir.join("client.ext"), "extendedKeyUsage=clientAuth\n").expect("ext");
    sign(&dir, "client", "client.ext", Command::new("openssl"));
    dir
}

/// A CA's certificate and key, `<name>.crt` and `<name>.key`.
fn authority(dir: &Path, name: &str, subject: &str) {
    let (key, crt) = (format!("{name}.key"), format!("{name}.crt"));
    openssl(
        dir,
        &[
            "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", subject, "-keyout", &key,
            "-out", &crt,
        ],
    );
}

/// A key, `<name>.key`, and a request to sign it, `<name>.csr`.
fn request(dir: &Path, name: &str, subject: &str) {
    let (key, csr) = (format!("{name}.key"), format!("{name}.csr"));
    openssl(
        dir,
        &[
            "req", "-newkey", "rsa:2048", "-nodes", "-subj", subject, "-keyout", &key, "-out", &csr,
        ],
    );
}

/// Signs `<name>.csr` with the CA into `<name>.crt`, for a day from the
/// clock `openssl` runs with.
fn sign(dir: &Path, name: &str, extensions: &str, openssl: Command) {
    let (csr, crt) = (format!("{name}.csr"), format!("{name}.crt"));
    run(
        openssl,
        dir,
        &[
            "x509",
            "-req",
            "-in",
            &csr,
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-days",
            "1",
            "-extfile",
            extensions,
            "-out",
            &crt,
        ],
    );
}

/// The TLS files of a client of `certs`: it trusts `ca` (a file there,
/// `ca.crt` or `other-ca.crt`), and presents the client certificate if
/// `client_cert`.
pub fn tls_files(certs: &Path, ca: Option<&str>, client_cert: bool) -> TlsFiles {
    TlsFiles {
        tls_ca_file: ca.map(|ca| certs.join(ca)),
        tls_cert_file: client_cert.then(|| certs.join("client.crt")),
        tls_key_file: client_cert.then(|| certs.join("client.key")),
    }
}
