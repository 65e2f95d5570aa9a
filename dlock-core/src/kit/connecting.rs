//! Connecting an engine at startup, written once: the settings every
//! server engine shares, the names of its fields in errors, the error for a
//! server that cannot be reached, and a call with a time limit.

use std::fmt;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use crate::config::{LABEL_MAX, check_label};
use crate::{BoxError, Error};

/// An engine being built: its name in the config and its kind.
#[derive(Clone, Copy, Debug)]
pub struct Connecting<'a> {
    /// The engine's name, `<name>` in `[engines.<name>]`.
    pub name: &'a str,
    /// Its kind, as written in config.
    pub kind: &'static str,
}

impl Connecting<'_> {
    /// The config path of one of the engine's fields: `engines.<name>.<field>`.
    pub fn field(&self, field: &str) -> String {
        format!("engines.{}.{field}", self.name)
    }

    /// A bad setting, naming its field.
    pub fn bad(&self, field: &str, message: impl Into<String>) -> Error {
        Error::config(self.field(field), message)
    }

    /// The server at `address` (never with a password) could not be
    /// reached, or refused the engine.
    pub fn unreachable(&self, address: impl Into<String>, source: impl Into<BoxError>) -> Error {
        Error::Unavailable {
            engine: self.name.to_owned(),
            kind: self.kind,
            address: address.into(),
            source: source.into(),
        }
    }

    /// The secret a file holds for `field`: its first line, trimmed. A file
    /// that cannot be read or holds none is an error naming the field; the
    /// message never holds the secret.
    pub fn secret_file(&self, field: &str, path: &Path) -> Result<String, Error> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| self.bad(field, format!("cannot read {}: {e}", path.display())))?;
        let line = text.lines().next().unwrap_or_default().trim();
        if line.is_empty() {
            return Err(self.bad(field, format!("{} holds no secret", path.display())));
        }
        Ok(line.to_owned())
    }

    /// `call` to the server at `address`, given `limit` to answer: an error
    /// or no answer in time is [`unreachable`](Self::unreachable).
    pub async fn within<T, E: Into<BoxError>>(
        &self,
        address: &str,
        limit: Duration,
        call: impl Future<Output = Result<T, E>>,
    ) -> Result<T, Error> {
        let call = async { call.await.map_err(|e| self.unreachable(address, e)) };
        self.in_time(address, limit, call).await
    }

    /// `steps` of startup that make their own errors (a missing privilege,
    /// say), given `limit` in all: a server that accepts and then says
    /// nothing is [`unreachable`](Self::unreachable) once it is up.
    pub async fn in_time<T>(
        &self,
        address: &str,
        limit: Duration,
        steps: impl Future<Output = Result<T, Error>>,
    ) -> Result<T, Error> {
        tokio::time::timeout(limit, steps)
            .await
            .unwrap_or_else(|_| Err(self.unreachable(address, format!("no answer within {limit:?}"))))
    }
}

/// Settings every engine with a server has, flattened into its own table.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
pub struct ClientSettings {
    /// How long connecting to a server may take before startup fails.
    #[serde(default = "default_connect_timeout", with = "humantime_serde")]
    pub connect_timeout: Duration,
    /// How this process names itself in holder records, and to servers
    /// that show client names to their operators (PostgreSQL's
    /// `application_name`, Redis's `CLIENT SETNAME`); default: [`process_label`].
    #[serde(default)]
    pub client_name: Option<String>,
}

impl ClientSettings {
    /// The label this engine's holds and waiters carry: `client_name`, or
    /// else [`process_label`]. One that a record could not carry intact is
    /// refused, naming the field.
    pub fn label(&self, at: &Connecting<'_>) -> Result<String, Error> {
        match &self.client_name {
            Some(name) => check_label(name)
                .map(|()| name.clone())
                .map_err(|problem| at.bad("client_name", problem)),
            None => Ok(process_label()),
        }
    }

    /// The defaults, with `connect_timeout` as given.
    pub fn with_timeout(connect_timeout: Duration) -> Self {
        ClientSettings {
            connect_timeout,
            client_name: None,
        }
    }
}

impl Default for ClientSettings {
    fn default() -> Self {
        Self::with_timeout(default_connect_timeout())
    }
}

fn default_connect_timeout() -> Duration {
    Duration::from_secs(5)
}

/// A user name and password, for engines that log in apart from their
/// address. The password never shows in `Debug`.
#[derive(Clone, Default, Deserialize, PartialEq, Eq)]
pub struct Credentials {
    /// The user to log in as (`user` is accepted too).
    #[serde(default, alias = "user")]
    pub username: Option<String>,
    /// Its password.
    #[serde(default, deserialize_with = "secret")]
    pub password: Option<String>,
    /// A file holding the password (its first line), read at startup: a
    /// mounted secret, kept out of the config and the environment.
    #[serde(default)]
    pub password_file: Option<PathBuf>,
}

/// A secret as text, whatever TOML type it was read as: an all-digit
/// password set through the environment reads as a number. An error
/// never holds it.
fn secret<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Scalar {
        Text(String),
        Whole(i64),
        Real(f64),
        Truth(bool),
    }
    let scalar = Option::<Scalar>::deserialize(d)
        .map_err(|_| serde::de::Error::custom("the password must be text (its value is not shown)"))?;
    Ok(scalar.map(|scalar| match scalar {
        Scalar::Text(text) => text,
        Scalar::Whole(n) => n.to_string(),
        Scalar::Real(n) => n.to_string(),
        Scalar::Truth(b) => b.to_string(),
    }))
}

impl Credentials {
    /// The password: `password`, or the first line of `password_file`.
    /// Both set, or a file that cannot be read, is an error naming the
    /// field; the message never holds the password.
    pub fn password(&self, at: &Connecting<'_>) -> Result<Option<String>, Error> {
        match (&self.password, &self.password_file) {
            (Some(_), Some(_)) => Err(at.bad("password_file", "set password or password_file, not both")),
            (Some(password), None) => Ok(Some(password.clone())),
            (None, Some(path)) => {
                let text = std::fs::read_to_string(path)
                    .map_err(|e| at.bad("password_file", format!("cannot read {}: {e}", path.display())))?;
                let line = text.lines().next().unwrap_or_default();
                if line.is_empty() {
                    return Err(at.bad("password_file", format!("{} holds no password", path.display())));
                }
                Ok(Some(line.to_owned()))
            }
            (None, None) => Ok(None),
        }
    }

    /// Whether a user or a password is set here.
    pub fn any(&self) -> bool {
        self.username.is_some() || self.password.is_some() || self.password_file.is_some()
    }
}

impl fmt::Debug for Credentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Credentials")
            .field("username", &self.username)
            .field("password", &self.password.as_ref().map(|_| "***"))
            .field("password_file", &self.password_file)
            .finish()
    }
}

/// PEM files for TLS: the certificate authority to trust, and the
/// client's own certificate and key for servers that ask for one.
#[derive(Debug, Clone, Default, Deserialize, PartialEq, Eq)]
pub struct TlsFiles {
    /// The CA that signed the server's certificate; default: the system's.
    #[serde(default)]
    pub tls_ca_file: Option<PathBuf>,
    /// The client certificate, with `tls_key_file`.
    #[serde(default)]
    pub tls_cert_file: Option<PathBuf>,
    /// The client certificate's key, with `tls_cert_file`.
    #[serde(default)]
    pub tls_key_file: Option<PathBuf>,
}

/// How much TLS an engine asks of its server, in libpq's `sslmode` words,
/// which every engine with modes takes (`tls_mode = "verify-full"`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum TlsMode {
    /// Plain TCP.
    Disable,
    /// TLS if the server offers it, else plain TCP; the certificate is
    /// not checked.
    Prefer,
    /// TLS or no connection; the certificate is checked against
    /// `tls_ca_file` if one is set (as `verify-ca`), else not at all.
    Require,
    /// TLS, with a certificate that a trusted CA signed, for any name.
    VerifyCa,
    /// TLS, with a certificate that a trusted CA signed for the host
    /// connected to.
    VerifyFull,
}

impl TlsMode {
    /// Every mode's word, for messages.
    pub const WORDS: &str = "disable, prefer, require, verify-ca or verify-full";

    /// The mode a word names (libpq's `sslmode` values).
    pub fn parse(word: &str) -> Option<Self> {
        Some(match word {
            "disable" => TlsMode::Disable,
            "prefer" => TlsMode::Prefer,
            "require" => TlsMode::Require,
            "verify-ca" => TlsMode::VerifyCa,
            "verify-full" => TlsMode::VerifyFull,
            _ => return None,
        })
    }

    /// Whether the server's certificate must chain to a trusted CA, given
    /// whether a CA file is set.
    pub fn checks_the_chain(self, ca_file: bool) -> bool {
        match self {
            TlsMode::Disable | TlsMode::Prefer => false,
            TlsMode::Require => ca_file,
            TlsMode::VerifyCa | TlsMode::VerifyFull => true,
        }
    }
}

/// What [`TlsFiles`] name, read.
#[derive(Default)]
pub struct TlsPem {
    /// The CA to trust, if not the system's.
    pub ca: Option<Vec<u8>>,
    /// The client certificate and its key.
    pub identity: Option<(Vec<u8>, Vec<u8>)>,
}

impl TlsFiles {
    /// Whether any file is set.
    pub fn any(&self) -> bool {
        self.tls_ca_file.is_some() || self.tls_cert_file.is_some() || self.tls_key_file.is_some()
    }

    /// Reads the files; an unreadable file, or a certificate without its
    /// key, is a config error naming the field.
    pub fn read(&self, at: &Connecting<'_>) -> Result<TlsPem, Error> {
        let read = |field: &str, path: &Path| {
            std::fs::read(path).map_err(|e| at.bad(field, format!("cannot read {}: {e}", path.display())))
        };
        let ca = match &self.tls_ca_file {
            Some(path) => Some(read("tls_ca_file", path)?),
            None => None,
        };
        let identity = match (&self.tls_cert_file, &self.tls_key_file) {
            (Some(cert), Some(key)) => Some((read("tls_cert_file", cert)?, read("tls_key_file", key)?)),
            (None, None) => None,
            (Some(_), None) => return Err(at.bad("tls_key_file", "set it with tls_cert_file")),
            (None, Some(_)) => return Err(at.bad("tls_cert_file", "set it with tls_key_file")),
        };
        Ok(TlsPem { ca, identity })
    }
}

/// This process's label where no `client_name` is set: `<host name>:<pid>`,
/// the host name cut to fit [`LABEL_MAX`].
pub fn process_label() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty() && check_label(h).is_ok())
        .unwrap_or_else(|| "localhost".to_owned());
    let pid = format!(":{}", std::process::id());
    let mut cut = LABEL_MAX - pid.len();
    while !host.is_char_boundary(cut.min(host.len())) {
        cut -= 1;
    }
    format!("{}{pid}", &host[..cut.min(host.len())])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_name_the_engine_and_field() {
        let at = Connecting {
            name: "pg",
            kind: "postgres",
        };
        assert_eq!(at.field("url"), "engines.pg.url");
        let bad = at.bad("url", "not a url").to_string();
        assert!(
            bad.contains("engines.pg.url") && bad.contains("not a url"),
            "{bad}"
        );
        let gone = at.unreachable("127.0.0.1:1", "refused").to_string();
        assert!(
            gone.contains("pg") && gone.contains("postgres") && gone.contains("127.0.0.1:1"),
            "{gone}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_call_that_does_not_answer_is_unreachable_after_its_limit() {
        let at = Connecting {
            name: "e",
            kind: "etcd",
        };
        let silent = std::future::pending::<Result<(), std::io::Error>>();
        let err = at
            .within("127.0.0.1:2379", Duration::from_secs(2), silent)
            .await
            .unwrap_err();
        assert!(err.to_string().contains("no answer within 2s"), "{err}");
    }

    #[test]
    fn a_certificate_without_its_key_names_the_missing_field() {
        let at = Connecting {
            name: "e",
            kind: "etcd",
        };
        let files = TlsFiles {
            tls_cert_file: Some("c.pem".into()),
            ..TlsFiles::default()
        };
        let err = files.read(&at).err().expect("refused").to_string();
        assert!(err.contains("engines.e.tls_key_file"), "{err}");
        assert!(
            !format!(
                "{:?}",
                Credentials {
                    username: Some("u".into()),
                    password: Some("secret".into()),
                    password_file: None,
                }
            )
            .contains("secret")
        );
    }

    #[test]
    fn a_password_comes_from_its_file_and_never_from_both() {
        let at = Connecting {
            name: "e",
            kind: "etcd",
        };
        let file = std::env::temp_dir().join(format!("dlock-password-{}", std::process::id()));
        std::fs::write(&file, "s3cret\n").expect("write");
        let from_file = Credentials {
            password_file: Some(file.clone()),
            ..Credentials::default()
        };
        assert_eq!(from_file.password(&at).expect("read"), Some("s3cret".to_owned()));
        let both = Credentials {
            password: Some("other".into()),
            ..from_file.clone()
        };
        let err = both.password(&at).expect_err("both").to_string();
        assert!(
            err.contains("engines.e.password_file") && !err.contains("s3cret"),
            "{err}"
        );
        std::fs::remove_file(&file).expect("remove");
        let err = from_file.password(&at).expect_err("gone").to_string();
        assert!(err.contains("engines.e.password_file"), "{err}");
    }

    #[test]
    fn a_password_read_as_a_number_is_text_and_a_bad_one_is_never_shown() {
        // From a parsed table, as config reads engines (a text's parse
        // error would quote its line).
        let read = |text: &str| Credentials::deserialize(toml::from_str::<toml::Value>(text).expect("toml"));
        assert_eq!(
            read("password = 123456").expect("a number").password.as_deref(),
            Some("123456")
        );
        assert_eq!(
            read("password = \"s3cret\"").expect("text").password.as_deref(),
            Some("s3cret")
        );
        let err = read("password = [\"s3cret\"]").expect_err("a list").to_string();
        assert!(!err.contains("s3cret"), "{err}");
    }

    #[test]
    fn the_process_label_names_the_pid() {
        let label = process_label();
        assert!(label.ends_with(&format!(":{}", std::process::id())));
        assert_eq!(check_label(&label), Ok(()));
    }

    #[test]
    fn a_label_is_one_short_printable_line() {
        let at = Connecting {
            name: "r",
            kind: "redis",
        };
        let named = |name: &str| ClientSettings {
            client_name: Some(name.to_owned()),
            ..ClientSettings::default()
        };
        assert_eq!(named("billing-7").label(&at).expect("label"), "billing-7");
        for bad in ["", "  ", "a\tb", "a\nb", "a\0b", &"x".repeat(LABEL_MAX + 1)] {
            let Err(Error::Config { field, .. }) = named(bad).label(&at) else {
                panic!("{bad:?} taken as a label");
            };
            assert_eq!(field, "engines.r.client_name");
        }
    }
}
