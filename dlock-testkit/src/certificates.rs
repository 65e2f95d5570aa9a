//! Certificates made at test time for servers that speak TLS: a CA, a
//! server certificate for IP 127.0.0.1 and a client certificate, both
//! signed by it, with `openssl`.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};

fn openssl(dir: &Path, args: &[&str]) {
    let status = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .status()
        .expect("openssl");
    assert!(status.success(), "openssl {args:?} failed");
}

/// A CA (`ca.crt`), and signed by it a server certificate for IP 127.0.0.1
/// (`server.crt`, `server.key`) and a client certificate (`client.crt`,
/// `client.key`), in a new folder.
pub fn certificates() -> PathBuf {
    // A folder per call: tests in one process run side by side.
    static MADE: AtomicUsize = AtomicUsize::new(0);
    let made = MADE.fetch_add(1, Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("dlock-tls-{}-{made}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("cert dir");
    openssl(
        &dir,
        &[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=dlock test CA",
            "-keyout",
            "ca.key",
            "-out",
            "ca.crt",
        ],
    );
    request(&dir, "server", "/CN=127.0.0.1");
    std::fs::write(dir.join("san.ext"), "subjectAltName=IP:127.0.0.1\n").expect("ext");
    sign(&dir, "server", "san.ext");
    request(&dir, "client", "/CN=dlock test client");
    std::fs::write(dir.join("client.ext"), "extendedKeyUsage=clientAuth\n").expect("ext");
    sign(&dir, "client", "client.ext");
    dir
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

/// Signs `<name>.csr` with the CA into `<name>.crt`.
fn sign(dir: &Path, name: &str, extensions: &str) {
    let (csr, crt) = (format!("{name}.csr"), format!("{name}.crt"));
    openssl(
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
