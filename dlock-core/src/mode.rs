//! Read (shared) and write (exclusive) modes.

use std::fmt;
use std::str::FromStr;

/// How a lock is held: `Write` excludes everyone else, `Read` shares with readers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Mode {
    Read,
    Write,
}

impl Mode {
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
