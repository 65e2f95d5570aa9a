//! Configuration: a TOML document plus `DLOCK_*` environment overrides,
//! checked as a whole so a mistake fails at startup naming the field.
//!
//! ```toml
//! [defaults]
//! engine = "main"
//! lease = "30s"
//! wait = "10s"
//! poll = { strategy = "exponential", initial = "10ms", max = "200ms" }
//!
//! [engines.main]
//! kind = "memory"
//!
//! [groups.payment]
//! engine = "main"
//! lease = "5s"
//! ```
//!
//! An environment variable `DLOCK_A__B__C=value` sets `a.b.c` (segments are
//! lower-cased; `__` separates them): `DLOCK_DEFAULTS__LEASE=5s`,
//! `DLOCK_ENGINES__MAIN__URL=redis://10.0.0.5`. Values that parse as TOML
//! (numbers, booleans, arrays) keep their type; anything else is a string.

use std::collections::BTreeMap;
use std::fmt;
use std::path::Path;
use std::time::Duration;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Deserializer};

use crate::Error;
use crate::typo::with_suggestion;

/// Shortest lease accepted: engines with millisecond expiry need some margin.
/// (`dlock-macros` checks the attribute's `lease` against the same value.)
pub const MIN_LEASE: Duration = Duration::from_millis(30);

/// Name of the engine used when the config defines none.
pub const IMPLICIT_ENGINE: &str = "memory";

/// The whole configuration. `Config::default()` serves every group from the
/// embedded memory engine.
///
/// ```
/// # fn main() -> Result<(), dlock::Error> {
/// use std::time::Duration;
/// use dlock::{Config, Error, Wait};
///
/// let text = r#"
///     [defaults]
///     lease = "30s"
///     wait = "10s"
///
///     [engines.main]
///     kind = "memory"
///
///     [groups.payment]
///     lease = "5s"
///     wait = "forever"
/// "#;
/// // `from_file` takes these from the process's environment.
/// let env = [("DLOCK_DEFAULTS__WAIT".to_owned(), "2s".to_owned())];
/// let config = Config::parse(text, env)?;
///
/// let payment = config.defaults.settings(config.groups.get("payment"));
/// assert_eq!((payment.lease, payment.wait), (Duration::from_secs(5), Wait::Forever));
/// let others = config.defaults.settings(None);
/// assert_eq!(others.wait, Wait::For(Duration::from_secs(2)));
///
/// // A mistake fails at once, naming the field.
/// let err = Config::parse("[defaults]\nlease = \"1ms\"", []).unwrap_err();
/// assert!(matches!(err, Error::Config { field, .. } if field == "defaults.lease"));
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// `[defaults]`: what every group uses unless it says otherwise.
    #[serde(default)]
    pub defaults: Defaults,
    /// `[engines.<name>]`: the engines to build, by the name groups route to.
    /// None: the embedded memory engine, named `memory`, serves.
    #[serde(default)]
    pub engines: BTreeMap<String, EngineConfig>,
    /// `[groups.<name>]`: per-group overrides. A group not listed here uses
    /// the defaults.
    #[serde(default)]
    pub groups: BTreeMap<String, GroupConfig>,
}

/// Settings for every group unless the group overrides them.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Defaults {
    /// The engine for groups not routed elsewhere; may be omitted when there is one engine.
    pub engine: Option<String>,
    /// How long an engine keeps a hold without renewal; the watchdog renews every lease/3.
    #[serde(with = "humantime_serde")]
    pub lease: Duration,
    /// How long `lock()` waits: `"10s"`, or `"forever"` (the default).
    pub wait: Wait,
    /// How often a waiter re-checks when no notification arrives.
    pub poll: Polling,
    /// Where this process's waiters line up; see [`Queue`].
    pub queue: Queue,
    /// The longest one engine call may take before it counts as failed.
    #[serde(with = "humantime_serde")]
    pub call_timeout: Duration,
    /// A request waiting this long for a lock that another task of this
    /// process holds logs a warning: if that task awaits this one, neither
    /// moves again (hand the task a share instead; see `Share`).
    #[serde(with = "humantime_serde")]
    pub deadlock_warning: Duration,
    /// A task that holds locks and has waited this long for another looks
    /// for a cycle of such waits across processes (`Error::Deadlock`), and
    /// again every half of it while it waits (a quarter, to confirm a
    /// cycle seen once); `"0s"` never looks.
    #[serde(with = "humantime_serde")]
    pub deadlock_check: Duration,
    /// The label every engine's holds carry in its records, unless the
    /// engine's own `client_name` says otherwise; default: `<host>:<pid>`.
    /// Each engine's table is given it as `client_name`.
    pub client_name: Option<String>,
}

/// How long an acquisition waits for the lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wait {
    /// Until granted.
    Forever,
    /// At most this long; zero tries once.
    For(Duration),
}

impl Wait {
    /// Tries once, never queues.
    pub const TRY_ONCE: Wait = Wait::For(Duration::ZERO);
}

impl<'de> Deserialize<'de> for Wait {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        if text == "forever" {
            return Ok(Wait::Forever);
        }
        humantime_serde::re::humantime::parse_duration(&text)
            .map(Wait::For)
            .map_err(|e| {
                serde::de::Error::custom(format!(
                    "`{text}`: {e}; write it like \"10s\" or \"250ms\", or \"forever\""
                ))
            })
    }
}

/// Where a process's waiters for one lock line up.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Queue {
    /// Every waiter joins the engine's queue: strict FIFO across all
    /// waiters of all processes, at a server cost that grows with the
    /// number of waiters (each keeps its own place alive and polls).
    Engine,
    /// The default. Waiters line up in the process first, and only the
    /// process's head (one writer, or a run of readers) joins the engine's
    /// queue: FIFO within a process and among the processes' heads. The
    /// server then carries a few waiters per lock and process, so waiting
    /// costs O(processes), not O(waiters) (a flash sale's 10,000 buyers).
    #[default]
    Local,
}

impl Default for Defaults {
    fn default() -> Self {
        Defaults {
            engine: None,
            lease: Duration::from_secs(30),
            wait: Wait::Forever,
            poll: Polling::default(),
            queue: Queue::Local,
            call_timeout: Duration::from_secs(5),
            deadlock_warning: Duration::from_secs(10),
            deadlock_check: Duration::from_secs(1),
            client_name: None,
        }
    }
}

/// The safety-net polling schedule of a waiter (ylock's constant or exponential polling).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(tag = "strategy", rename_all = "lowercase", deny_unknown_fields)]
pub enum Polling {
    /// The same pause every time: `{ strategy = "constant", interval = "50ms" }`.
    Constant {
        /// The pause between two polls.
        #[serde(with = "humantime_serde")]
        interval: Duration,
    },
    /// Doubles from `initial` up to `max`:
    /// `{ strategy = "exponential", initial = "10ms", max = "200ms" }` (the default).
    Exponential {
        /// The first pause.
        #[serde(with = "humantime_serde")]
        initial: Duration,
        /// The longest pause.
        #[serde(with = "humantime_serde")]
        max: Duration,
    },
}

impl Default for Polling {
    fn default() -> Self {
        Polling::Exponential {
            initial: Duration::from_millis(10),
            max: Duration::from_millis(200),
        }
    }
}

impl Polling {
    /// The longest pause between two polls.
    pub fn max_interval(self) -> Duration {
        match self {
            Polling::Constant { interval } => interval,
            Polling::Exponential { max, .. } => max,
        }
    }

    /// The pauses of one waiter, in order.
    pub fn intervals(self) -> impl Iterator<Item = Duration> {
        let (mut next, max) = match self {
            Polling::Constant { interval } => (interval, interval),
            Polling::Exponential { initial, max } => (initial, max),
        };
        std::iter::from_fn(move || {
            let now = next;
            next = (next * 2).min(max);
            Some(now)
        })
    }
}

/// One engine: its kind and the kind's own settings (checked by the engine).
/// Its `Debug` shows no secret: `password` and `digest` as `***`, and urls
/// with their passwords masked.
#[derive(Clone, Deserialize)]
pub struct EngineConfig {
    /// The engine kind: `"memory"`, `"redis"`, `"postgres"`, ... (see
    /// `Kinds`).
    pub kind: String,
    /// Every other field of the table, left for the kind to parse.
    #[serde(flatten)]
    pub settings: toml::Table,
}

impl fmt::Debug for EngineConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fn shown(key: &str, value: &toml::Value) -> toml::Value {
            match value {
                _ if matches!(key, "password" | "digest") => toml::Value::String("***".to_owned()),
                toml::Value::String(text) => toml::Value::String(crate::secret::masked(text)),
                toml::Value::Array(items) => {
                    toml::Value::Array(items.iter().map(|v| shown(key, v)).collect())
                }
                other => other.clone(),
            }
        }
        let settings: toml::Table = self
            .settings
            .iter()
            .map(|(k, v)| (k.clone(), shown(k, v)))
            .collect();
        f.debug_struct("EngineConfig")
            .field("kind", &self.kind)
            .field("settings", &settings)
            .finish()
    }
}

impl EngineConfig {
    /// Parses the kind-specific settings of engine `name`; errors name the field
    /// as `engines.<name>.<field>`.
    pub fn settings<T: DeserializeOwned>(&self, name: &str) -> Result<T, Error> {
        from_table(self.settings.clone(), &format!("engines.{name}"))
    }
}

/// Per-group overrides.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GroupConfig {
    /// The engine serving this group, instead of `defaults.engine`.
    pub engine: Option<String>,
    /// The group's lease, instead of `defaults.lease`.
    #[serde(default, with = "humantime_serde")]
    pub lease: Option<Duration>,
    /// The group's wait, instead of `defaults.wait`.
    pub wait: Option<Wait>,
    /// The group's queue, instead of `defaults.queue`.
    pub queue: Option<Queue>,
}

/// The timing of one group's locks: the defaults with the group's overrides.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Settings {
    /// See [`Defaults::lease`].
    pub lease: Duration,
    /// See [`Defaults::wait`].
    pub wait: Wait,
    /// See [`Defaults::poll`].
    pub poll: Polling,
    /// See [`Defaults::queue`].
    pub queue: Queue,
    /// See [`Defaults::call_timeout`].
    pub call_timeout: Duration,
    /// See [`Defaults::deadlock_warning`].
    pub deadlock_warning: Duration,
    /// See [`Defaults::deadlock_check`].
    pub deadlock_check: Duration,
}

impl Default for Settings {
    fn default() -> Self {
        Defaults::default().settings(None)
    }
}

impl Defaults {
    /// These defaults with `group`'s overrides applied.
    pub fn settings(&self, group: Option<&GroupConfig>) -> Settings {
        let group = group.cloned().unwrap_or_default();
        Settings {
            lease: group.lease.unwrap_or(self.lease),
            wait: group.wait.unwrap_or(self.wait),
            poll: self.poll,
            queue: group.queue.unwrap_or(self.queue),
            call_timeout: self.call_timeout,
            deadlock_warning: self.deadlock_warning,
            deadlock_check: self.deadlock_check,
        }
    }
}

impl Config {
    /// Reads a TOML file and applies the process's `DLOCK_*` variables.
    pub fn from_file(path: impl AsRef<Path>) -> Result<Self, Error> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path)
            .map_err(|e| Error::config("config file", format!("cannot read {}: {e}", path.display())))?;
        Self::parse(&text, std::env::vars())
    }

    /// Parses a TOML document, applies `DLOCK_*` overrides from `env`, and checks the result.
    pub fn parse(text: &str, env: impl IntoIterator<Item = (String, String)>) -> Result<Self, Error> {
        let mut table: toml::Table = text.parse().map_err(|e: toml::de::Error| {
            let mut message = e.message().to_owned();
            if let Some(span) = e.span() {
                let line = text[..span.start].lines().count().max(1);
                message = format!("line {line}: {message}");
            }
            Error::config("config", message)
        })?;
        let from_env = apply_env(&mut table, env)?;
        let config: Config = from_table(table, "").map_err(|e| name_the_variable(e, &from_env))?;
        config.check().map_err(|e| name_the_variable(e, &from_env))?;
        Ok(config)
    }

    /// The engine serving groups that are not routed elsewhere.
    pub fn default_engine(&self) -> &str {
        match (&self.defaults.engine, self.engines.len()) {
            (Some(name), _) => name,
            (None, 1) => self.engines.keys().next().expect("one engine"),
            (None, _) => IMPLICIT_ENGINE,
        }
    }

    /// Checks references and ranges that the types alone cannot.
    pub fn check(&self) -> Result<(), Error> {
        let d = &self.defaults;
        let known = |name: &str| {
            self.engines.contains_key(name) || (self.engines.is_empty() && name == IMPLICIT_ENGINE)
        };
        if d.engine.is_none() && self.engines.len() > 1 {
            return Err(Error::config(
                "defaults.engine",
                "several engines are defined; name the one that serves groups not routed elsewhere",
            ));
        }
        if let Some(name) = &d.engine
            && !known(name)
        {
            return Err(undefined_engine("defaults.engine", name));
        }
        check_lease("defaults.lease", d.lease)?;
        check_polling(d.poll)?;
        if d.call_timeout.is_zero() {
            return Err(Error::config("defaults.call_timeout", "must be more than zero"));
        }
        if let Some(label) = &d.client_name {
            check_label(label).map_err(|problem| Error::config("defaults.client_name", problem))?;
        }
        for (name, engine) in &self.engines {
            if name.is_empty() {
                return Err(Error::config("engines", "an engine name is empty"));
            }
            if engine.kind.is_empty() {
                return Err(Error::config(format!("engines.{name}.kind"), "is empty"));
            }
        }
        for (group, g) in &self.groups {
            if group.is_empty() {
                return Err(Error::config("groups", "a group name is empty"));
            }
            if let Some(name) = &g.engine
                && !known(name)
            {
                return Err(undefined_engine(&format!("groups.{group}.engine"), name));
            }
            if let Some(lease) = g.lease {
                check_lease(&format!("groups.{group}.lease"), lease)?;
            }
        }
        Ok(())
    }
}

fn undefined_engine(field: &str, name: &str) -> Error {
    Error::config(field, format!("engine `{name}` is not defined under [engines]"))
}

/// Checks a lease against the core's minimum; engines' own minimum is a
/// capability, checked where the engine is known.
pub(crate) fn check_lease(field: &str, lease: Duration) -> Result<(), Error> {
    if lease < MIN_LEASE {
        return Err(Error::config(
            field,
            format!("{lease:?} is too short; use at least {MIN_LEASE:?}"),
        ));
    }
    Ok(())
}

fn check_polling(poll: Polling) -> Result<(), Error> {
    match poll {
        Polling::Constant { interval } if interval.is_zero() => {
            Err(Error::config("defaults.poll.interval", "must be more than zero"))
        }
        Polling::Exponential { initial, .. } if initial.is_zero() => {
            Err(Error::config("defaults.poll.initial", "must be more than zero"))
        }
        Polling::Exponential { initial, max } if max < initial => Err(Error::config(
            "defaults.poll.max",
            format!("{max:?} is less than initial ({initial:?})"),
        )),
        _ => Ok(()),
    }
}

/// Deserializes `table`, reporting the dotted path of a bad field under `prefix`.
fn from_table<T: DeserializeOwned>(table: toml::Table, prefix: &str) -> Result<T, Error> {
    serde_path_to_error::deserialize(toml::Value::Table(table)).map_err(|e| {
        let path = e.path().to_string();
        let field = match (prefix, path.as_str()) {
            ("", ".") => "config".to_owned(),
            ("", p) => p.to_owned(),
            (pre, ".") => pre.to_owned(),
            (pre, p) => format!("{pre}.{p}"),
        };
        // The message alone: the error's display adds the path again, on
        // a line of its own.
        let mut message = with_suggestion(e.into_inner().message().to_owned(), &[]);
        if message.contains("duration") {
            message.push_str("; write a duration like \"30s\", \"250ms\" or \"1m 30s\"");
        }
        Error::config(field, message)
    })
}

/// Adds the environment variable to an error about a field it set.
fn name_the_variable(error: Error, from_env: &[(String, String)]) -> Error {
    let Error::Config { field, message } = error else {
        return error;
    };
    let set_by = from_env
        .iter()
        .find(|(path, _)| field == *path || field.starts_with(&format!("{path}.")));
    match set_by {
        Some((_, var)) => Error::Config {
            message: format!("{message} (set by environment variable {var})"),
            field,
        },
        None => Error::Config { field, message },
    }
}

/// Applies `DLOCK_*` variables to `table`; returns the dotted paths they
/// set, with each variable's name.
fn apply_env(
    table: &mut toml::Table,
    env: impl IntoIterator<Item = (String, String)>,
) -> Result<Vec<(String, String)>, Error> {
    let mut set = Vec::new();
    for (var, value) in env {
        let Some(path) = var.strip_prefix("DLOCK_") else {
            continue;
        };
        let segments: Vec<String> = path.split("__").map(str::to_lowercase).collect();
        if segments.iter().any(String::is_empty) {
            return Err(Error::config(var, "empty path segment; use DLOCK_SECTION__KEY"));
        }
        let (last, parents) = segments.split_last().expect("split yields one segment");
        let mut at = &mut *table;
        for seg in parents {
            let entry = at
                .entry(seg.clone())
                .or_insert_with(|| toml::Value::Table(Default::default()));
            at = entry
                .as_table_mut()
                .ok_or_else(|| Error::config(var.clone(), format!("`{seg}` is not a table")))?;
        }
        at.insert(last.clone(), env_value(&value));
        set.push((segments.join("."), var));
    }
    Ok(set)
}

fn env_value(text: &str) -> toml::Value {
    format!("v = {text}")
        .parse::<toml::Table>()
        .ok()
        .and_then(|mut t| t.remove("v"))
        .unwrap_or_else(|| toml::Value::String(text.to_owned()))
}

/// The longest label, in bytes: what PostgreSQL keeps of an
/// `application_name`.
pub const LABEL_MAX: usize = 63;

/// Why `label` cannot be a label, if it cannot: records store it among
/// fields split at spaces, tabs, new lines or NULs, so a label is one line
/// of printable characters, not empty, at most [`LABEL_MAX`] bytes.
pub fn check_label(label: &str) -> Result<(), String> {
    if label.trim().is_empty() {
        return Err("is empty".to_owned());
    }
    if label.len() > LABEL_MAX {
        return Err(format!(
            "is {} bytes long; at most {LABEL_MAX} are kept",
            label.len()
        ));
    }
    // etcd reads a key's value so to tell dlock's readers, writers and
    // permits apart; an election's key holds a label alone.
    if ["dlock read ", "dlock write ", "dlock permit "]
        .iter()
        .any(|mark| label.starts_with(mark))
    {
        return Err(
            "starts as dlock's own records do (`dlock read `, `dlock write `, `dlock permit `)".to_owned(),
        );
    }
    if label.chars().any(char::is_control) {
        return Err(
            "has a control character (a tab, a new line, ...); a label is one printable line".to_owned(),
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_engines_debug_shows_no_secret() {
        let text = "[defaults]\nengine = \"pg\"\n[engines.pg]\nkind = \"postgres\"\nurl = \"postgres://u:s3cret@h/db\"\n\
                    [engines.kv]\nkind = \"postgres\"\nurl = \"host=h password='s3 \\\\'cret' dbname=x\"\n\
                    [engines.r]\nkind = \"redlock\"\nmasters = [\"redis://:s3cret@a\", \"redis://b\"]\n\
                    password = \"s3cret\"\n[engines.zk]\nkind = \"zookeeper\"\ndigest = \"u:s3cret\"";
        let config = Config::parse(text, std::iter::empty()).expect("config");
        let shown = format!("{config:?}");
        assert!(!shown.contains("s3") && !shown.contains("cret"), "{shown}");
        assert!(
            shown.contains("postgres://u:***@h/db") && shown.contains("dbname=x"),
            "{shown}"
        );
        assert_eq!(
            crate::secret::masked("host=h password=p dbname=x"),
            "host=h password=*** dbname=x"
        );
        assert_eq!(crate::secret::masked("password='a b' x=1"), "password=*** x=1");
    }

    #[test]
    fn polling_intervals_double_up_to_max() {
        let poll = Polling::Exponential {
            initial: Duration::from_millis(10),
            max: Duration::from_millis(35),
        };
        let got: Vec<_> = poll.intervals().take(4).map(|d| d.as_millis()).collect();
        assert_eq!(got, [10, 20, 35, 35]);
    }

    #[test]
    fn env_values_keep_toml_types() {
        assert_eq!(env_value("5"), toml::Value::Integer(5));
        assert_eq!(env_value("true"), toml::Value::Boolean(true));
        assert_eq!(env_value("10s"), toml::Value::String("10s".into()));
        assert_eq!(
            env_value("redis://h:1"),
            toml::Value::String("redis://h:1".into())
        );
    }
}
