//! Reaching the server: the URL or key/value string, less libpq's TLS
//! words that tokio-postgres does not take (`sslmode`'s `verify-ca` and
//! `verify-full`, `sslrootcert`, `sslcert`, `sslkey`), which join the
//! shared TLS settings instead; and the one TLS connector that every
//! connection and cancel request goes through.

use std::collections::HashSet;

use dlock_core::Error;
use dlock_core::kit::{Connecting, Credentials, EngineError, TlsFiles, TlsMode};
use tokio_postgres::config::{Host, SslMode};
use tokio_postgres::tls::MakeTlsConnect;
use tokio_postgres::{Client, Config, Connection, SimpleQueryMessage, Socket};
use tokio_postgres_rustls::MakeRustlsConnect;

/// A connection's other half, to be polled in a task of its own.
pub(super) type Link = Connection<Socket, <MakeRustlsConnect as MakeTlsConnect<Socket>>::Stream>;

/// The server's settings and the TLS to reach it with.
pub(super) struct Server {
    pub config: Config,
    pub tls: MakeRustlsConnect,
}

impl Server {
    /// Parses the settings (the engine's `url`, `credentials`, `tls_mode`
    /// and `tls`); a bad one is an error naming its field.
    pub fn new(
        at: &Connecting<'_>,
        url: &str,
        credentials: &Credentials,
        tls: (Option<TlsMode>, &TlsFiles),
    ) -> Result<Self, Error> {
        let (url, words) = take_tls_words(url);
        let mut config: Config = url.parse().map_err(|e| {
            at.bad(
                "url",
                format!("not a PostgreSQL URL (postgres://user@host:5432/db) or key/value string (host=... user=...): {e}"),
            )
        })?;
        if let Some(password) = credentials.password(at)? {
            if config.get_password().is_some() {
                return Err(at.bad("password", "the url names a password too: keep one"));
            }
            config.password(password);
        }
        if let Some(user) = &credentials.username {
            config.user(user);
        }
        let (mode, files) = tls_settings(at, tls, &words)?;
        // An `sslmode` the words missed (a `?` in the password, an
        // escaped key) is tokio-postgres's: kept, never overwritten.
        let parsed = match config.get_ssl_mode() {
            SslMode::Disable => Some(TlsMode::Disable),
            SslMode::Require => Some(TlsMode::Require),
            _ => None,
        };
        let mode = match (mode, parsed) {
            (Some(_), Some(_)) => {
                return Err(at.bad("tls_mode", "set here and as `sslmode` in the url: keep one"));
            }
            (mode, parsed) => mode.or(parsed).unwrap_or(TlsMode::Prefer),
        };
        config.ssl_mode(match mode {
            TlsMode::Disable => SslMode::Disable,
            TlsMode::Prefer => SslMode::Prefer,
            _ => SslMode::Require,
        });
        let tls = MakeRustlsConnect::new(crate::tls::client_config(at, &files, mode)?);
        Ok(Server { config, tls })
    }

    /// Opens a connection, TLS as set.
    pub async fn connect(&self) -> Result<(Client, Link), tokio_postgres::Error> {
        self.config.connect(self.tls.clone()).await
    }

    /// Refuses a pooler that serves idle clients from one server session
    /// in turn (PgBouncer's `transaction` and `statement` modes): an
    /// advisory lock belongs to the session, so it would pass from one
    /// client to the next. Two connections, open at once, ask in turn
    /// which backend serves them; a backend seen by both is shared.
    pub async fn check_sessions_are_own(&self, at: &Connecting<'_>) -> Result<(), Error> {
        let mut clients = Vec::new();
        for _ in 0..2 {
            let (client, link) = self.connect().await.map_err(failed_with(at, self))?;
            tokio::spawn(link);
            clients.push(client);
        }
        let mut seen = [HashSet::new(), HashSet::new()];
        for _ in 0..3 {
            for (client, pids) in clients.iter().zip(&mut seen) {
                // The simple protocol: a pooler may run a prepared
                // statement's steps on two sessions.
                let rows = client.simple_query("SELECT pg_backend_pid()").await;
                let rows = rows.map_err(failed_with(at, self))?;
                let pid = rows.iter().find_map(|message| match message {
                    SimpleQueryMessage::Row(row) => row.get(0).map(str::to_owned),
                    _ => None,
                });
                pids.extend(pid);
            }
        }
        if seen[0].is_disjoint(&seen[1]) {
            return Ok(());
        }
        Err(at.bad(
            "url",
            "two connections open at once are served by one server session in turn: a pooler in \
             transaction or statement mode stands in between (PgBouncer's pool_mode), and an advisory \
             lock, which belongs to the session, would pass from one client to the next; connect to \
             PostgreSQL directly, or through session pooling (pool_mode = session)",
        ))
    }
}

/// The error for a failure of the server, naming where it is.
fn failed_with<'a>(
    at: &'a Connecting<'_>,
    server: &'a Server,
) -> impl Fn(tokio_postgres::Error) -> Error + 'a {
    move |e| at.unreachable(address_of(&server.config), failed(e))
}

/// The TLS words of libpq that stand in place of a setting: `sslmode`
/// for `tls_mode`, and the files.
const WORDS: [(&str, &str); 4] = [
    ("sslmode", "tls_mode"),
    ("sslrootcert", "tls_ca_file"),
    ("sslcert", "tls_cert_file"),
    ("sslkey", "tls_key_file"),
];

/// The mode and files: each from its setting or the URL's word (both is
/// an error); no mode if neither gives one.
fn tls_settings(
    at: &Connecting<'_>,
    (mode, files): (Option<TlsMode>, &TlsFiles),
    words: &[(String, String)],
) -> Result<(Option<TlsMode>, TlsFiles), Error> {
    let word = |name: &str| {
        words
            .iter()
            .rev()
            .find(|(w, _)| w == name)
            .map(|(_, v)| v.clone())
    };
    let mut files = files.clone();
    let mut mode = mode;
    for (name, field) in WORDS {
        let Some(value) = word(name) else { continue };
        let twice = || at.bad(field, format!("set here and as `{name}` in the url: keep one"));
        match field {
            "tls_mode" => {
                let given = TlsMode::parse(&value).ok_or_else(|| {
                    at.bad(
                        "url",
                        format!("sslmode `{value}` is not one of {}", TlsMode::WORDS),
                    )
                })?;
                if mode.replace(given).is_some() {
                    return Err(twice());
                }
            }
            _ => {
                let slot = match field {
                    "tls_ca_file" => &mut files.tls_ca_file,
                    "tls_cert_file" => &mut files.tls_cert_file,
                    _ => &mut files.tls_key_file,
                };
                if slot.replace(value.into()).is_some() {
                    return Err(twice());
                }
            }
        }
    }
    Ok((mode, files))
}

/// `url` without its TLS words (a URL's query parameters, or a key/value
/// string's pairs), and those words with their values.
fn take_tls_words(url: &str) -> (String, Vec<(String, String)>) {
    let is_tls = |key: &str| WORDS.iter().any(|(word, _)| *word == key);
    let mut taken = Vec::new();
    if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        let Some((base, query)) = url.split_once('?') else {
            return (url.to_owned(), taken);
        };
        let mut kept = Vec::new();
        for pair in query.split('&') {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            if is_tls(key) {
                taken.push((key.to_owned(), percent_decoded(value)));
            } else {
                kept.push(pair);
            }
        }
        return match kept.is_empty() {
            true => (base.to_owned(), taken),
            false => (format!("{base}?{}", kept.join("&")), taken),
        };
    }
    let mut kept = Vec::new();
    for (key, value, text) in pairs(url) {
        if is_tls(&key) {
            taken.push((key, value));
        } else {
            kept.push(text);
        }
    }
    (kept.join(" "), taken)
}

/// A key/value string's pairs: each key, its value unquoted, and its text.
fn pairs(text: &str) -> Vec<(String, String, &str)> {
    let mut out = Vec::new();
    let mut rest = text.trim_start();
    while !rest.is_empty() {
        let start = rest;
        let key_end = rest
            .find(|c: char| c == '=' || c.is_whitespace())
            .unwrap_or(rest.len());
        let key = rest[..key_end].to_owned();
        rest = rest[key_end..].trim_start();
        let mut value = String::new();
        if let Some(after) = rest.strip_prefix('=') {
            rest = after.trim_start();
            let mut chars = rest.char_indices().peekable();
            let quoted = rest.starts_with('\'');
            if quoted {
                chars.next();
            }
            let mut end = rest.len();
            while let Some((i, c)) = chars.next() {
                match c {
                    '\\' => value.extend(chars.next().map(|(_, c)| c)),
                    '\'' if quoted => {
                        end = i + 1;
                        break;
                    }
                    c if c.is_whitespace() && !quoted => {
                        end = i;
                        break;
                    }
                    c => value.push(c),
                }
            }
            rest = &rest[end..];
        }
        out.push((key, value, start[..start.len() - rest.len()].trim_end()));
        rest = rest.trim_start();
    }
    out
}

/// `%XX` escapes decoded; anything malformed is kept as written.
fn percent_decoded(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let digits = bytes
            .get(i + 1..i + 3)
            .filter(|d| d.iter().all(u8::is_ascii_hexdigit));
        let hex = digits.filter(|_| bytes[i] == b'%').map(|d| {
            d.iter()
                .fold(0, |n, d| n * 16 + (*d as char).to_digit(16).unwrap_or(0) as u8)
        });
        match hex {
            Some(byte) => {
                out.push(byte);
                i += 3;
            }
            None => {
                out.push(bytes[i]);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// `host:port` of each host, for messages; never the password.
pub(super) fn address_of(config: &tokio_postgres::Config) -> String {
    let ports = config.get_ports();
    let hosts = config.get_hosts().iter().enumerate().map(|(i, host)| {
        let port = ports.get(i).or(ports.first()).copied().unwrap_or(5432);
        match host {
            Host::Tcp(host) => format!("{host}:{port}"),
            Host::Unix(dir) => format!("{}/.s.PGSQL.{port}", dir.display()),
        }
    });
    let address = hosts.collect::<Vec<_>>().join(",");
    if address.is_empty() {
        "(no host)".to_owned()
    } else {
        address
    }
}

/// A driver error as the engine reports it: tokio-postgres shows a server
/// error as just "db error" and a refused connection as "error connecting
/// to server", so the server's text and the causes are spelt out.
pub(super) fn failed(e: tokio_postgres::Error) -> EngineError {
    if let Some(db) = e.as_db_error() {
        return EngineError::failed(format!(
            "{}: {} (SQLSTATE {})",
            db.severity(),
            db.message(),
            db.code().code()
        ));
    }
    let mut text = e.to_string();
    let mut cause = std::error::Error::source(&e);
    while let Some(inner) = cause {
        text = format!("{text}: {inner}");
        cause = inner.source();
    }
    EngineError::failed(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_never_show_the_password() {
        let config: tokio_postgres::Config = "postgres://u:secret@db1:5433,db2/app".parse().unwrap();
        assert_eq!(address_of(&config), "db1:5433,db2:5432");
        let config: tokio_postgres::Config = "host=/run/pg port=6000 password=secret".parse().unwrap();
        assert_eq!(address_of(&config), "/run/pg/.s.PGSQL.6000");
    }

    #[test]
    fn tls_words_leave_a_url_and_keep_the_rest() {
        let (url, words) = take_tls_words(
            "postgres://u:p@db:5432/app?sslmode=verify-full&application_name=x&sslrootcert=%2Fetc%2Fca.pem",
        );
        assert_eq!(url, "postgres://u:p@db:5432/app?application_name=x");
        assert_eq!(
            words,
            [
                ("sslmode".to_owned(), "verify-full".to_owned()),
                ("sslrootcert".to_owned(), "/etc/ca.pem".to_owned())
            ]
        );
        let (url, words) = take_tls_words("postgres://db/app?sslmode=require");
        assert_eq!((url.as_str(), words.len()), ("postgres://db/app", 1));
    }

    #[test]
    fn tls_words_leave_a_key_value_string_and_keep_the_rest() {
        let (text, words) = take_tls_words(
            "host=db  sslmode = verify-ca password='a b\\'c' sslcert='/my certs/c.pem' dbname=app",
        );
        assert_eq!(text, "host=db password='a b\\'c' dbname=app");
        assert_eq!(
            words,
            [
                ("sslmode".to_owned(), "verify-ca".to_owned()),
                ("sslcert".to_owned(), "/my certs/c.pem".to_owned())
            ]
        );
    }

    #[test]
    fn percent_escapes_decode_and_malformed_ones_stay() {
        assert_eq!(percent_decoded("%2Fa%20b"), "/a b");
        assert_eq!(percent_decoded("50%"), "50%");
        assert_eq!(percent_decoded("%zz"), "%zz");
    }
}
