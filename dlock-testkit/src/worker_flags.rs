//! What the worker binaries share: their flags (`--name value` pairs, two of
//! them, `--config` and `--store`, always given by the suites) and getting
//! connected before they print `ready`.

use std::collections::HashMap;
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

/// A worker's flags, each `--name value`.
pub struct Flags {
    values: HashMap<String, String>,
    program: &'static str,
}

impl Flags {
    /// The process's flags, each one of `known` (besides `--config` and
    /// `--store`); an unknown one is an error, exit code 2.
    pub fn parse(program: &'static str, known: &[&str]) -> Result<Self, ExitCode> {
        let mut values = HashMap::new();
        let mut args = std::env::args().skip(1);
        while let Some(flag) = args.next() {
            let name = flag.trim_start_matches("--");
            if !["config", "store"].contains(&name) && !known.contains(&name) {
                eprintln!("{program}: unknown flag {flag}");
                return Err(ExitCode::from(2));
            }
            values.insert(name.to_owned(), args.next().unwrap_or_default());
        }
        Ok(Flags { values, program })
    }

    /// `--<name>`'s number, or `default`.
    pub fn number(&self, name: &str, default: u64) -> u64 {
        self.values.get(name).map_or(default, |value| {
            value
                .parse()
                .unwrap_or_else(|_| panic!("{}: --{name} takes a number", self.program))
        })
    }

    /// `--<name>`'s text, or `default`.
    pub fn text<'a>(&'a self, name: &str, default: &'a str) -> &'a str {
        self.values.get(name).map_or(default, String::as_str)
    }

    /// `--store`, which the suites always give.
    pub fn store(&self) -> PathBuf {
        PathBuf::from(self.values.get("store").expect("--store is required"))
    }

    /// Connects the engines of `--config` (if given) and prints `ready`; an
    /// engine that cannot start is an error, exit code 2.
    pub async fn connect(&self) -> Result<(), ExitCode> {
        if let Some(config) = self.values.get("config")
            && let Err(e) = dlock::init_from_file(config).await
        {
            eprintln!("{}: {e}", self.program);
            return Err(ExitCode::from(2));
        }
        println!("ready");
        let _ = std::io::stdout().flush();
        Ok(())
    }
}
