//! Read (shared) and write (exclusive) modes.

use std::fmt;
use std::str::FromStr;

/// How a lock is held: `Write` excludes everyone else, `Read` shares with readers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Mode {
    /// Shared: any number of readers hold together, no writer meanwhile.
    Read,
    /// Exclusive: one holder, no readers.
    Write,
}

impl Mode {
    /// `"read"` or `"write"`, as config, metrics and the attribute write it.
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Read => "read",
            Mode::Write => "write",
        }
    }
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Mode {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "read" => Ok(Mode::Read),
            "write" => Ok(Mode::Write),
            other => Err(format!("unknown mode `{other}`: expected \"read\" or \"write\"")),
        }
    }
}
