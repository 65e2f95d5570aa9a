//! A fenced register: the storage stand-in of the fault suite. One file
//! holds a number; any process may read or write it, each time showing the
//! fencing token of the lock it holds. The register refuses an operation
//! whose token is below the greatest it has seen, reads included, so a
//! holder that lost its lock cannot write once a newer holder has touched
//! the register, even if it read before the newer holder did.
//!
//! Every operation, and every critical section's entry and exit, is
//! appended to a journal under the same file lock, from which [`Report`]
//! counts overlapping critical sections and stale operations refused.

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, Write};
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

pub struct FencedRegister {
    state: PathBuf,
    journal: PathBuf,
}

/// The register refused a token below the greatest it has seen.
#[derive(Debug, PartialEq, Eq)]
pub struct Stale {
    pub fence: u64,
    pub newest: u64,
}

impl FencedRegister {
    /// A register at `path` holding 0 (and `path.journal` beside it).
    pub fn create(path: &Path) -> Self {
        let register = Self::open(path);
        std::fs::write(&register.state, "0 0\n").expect("create register");
        std::fs::write(&register.journal, "").expect("create journal");
        register
    }

    pub fn open(path: &Path) -> Self {
        FencedRegister {
            state: path.to_owned(),
            journal: path.with_extension("journal"),
        }
    }

    pub fn read(&self, fence: u64) -> Result<u64, Stale> {
        self.apply(fence, "read", |value| value)
    }

    pub fn write(&self, fence: u64, value: u64) -> Result<(), Stale> {
        self.apply(fence, "write", |_| value).map(drop)
    }

    /// Notes that the holder of `fence` entered (`"enter"`) or left (`"exit"`)
    /// its critical section.
    pub fn mark(&self, fence: u64, what: &str) {
        let _lock = self.lock();
        self.journal(fence, what);
    }

    /// The value, without a token (for the suite, after the workers).
    pub fn value(&self) -> u64 {
        Self::load(&mut self.lock()).1
    }

    fn apply(&self, fence: u64, op: &str, f: impl FnOnce(u64) -> u64) -> Result<u64, Stale> {
        let mut file = self.lock();
        let (newest, value) = Self::load(&mut file);
        if fence < newest {
            self.journal(fence, &format!("{op}-refused"));
            return Err(Stale { fence, newest });
        }
        let next = f(value);
        file.set_len(0).expect("truncate");
        file.rewind().expect("rewind");
        writeln!(file, "{fence} {next}").expect("write register");
        self.journal(fence, op);
        Ok(value)
    }

    fn lock(&self) -> File {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(&self.state)
            .expect("open register");
        file.lock().expect("lock register");
        file
    }

    /// Reads the register through the handle that holds its lock.
    fn load(file: &mut File) -> (u64, u64) {
        let mut text = String::new();
        file.rewind()
            .and_then(|()| file.read_to_string(&mut text))
            .expect("read register");
        let mut parts = text
            .split_whitespace()
            .map(|n| n.parse::<u64>().expect("register number"));
        (parts.next().unwrap_or(0), parts.next().unwrap_or(0))
    }

    fn journal(&self, fence: u64, what: &str) {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .expect("clock")
            .as_nanos();
        let mut journal = OpenOptions::new()
            .append(true)
            .open(&self.journal)
            .expect("open journal");
        writeln!(journal, "{nanos} {} {fence} {what}", std::process::id()).expect("journal");
    }

    /// What the journal shows.
    pub fn report(&self) -> Report {
        let _lock = self.lock();
        let text = std::fs::read_to_string(&self.journal).expect("read journal");
        let mut report = Report::default();
        // (fence, entered, last seen, left) per critical section; a holder
        // killed inside never left, and counts as inside until its last line.
        let mut sections: Vec<(u64, u128, u128, bool)> = Vec::new();
        for line in text.lines() {
            let fields: Vec<&str> = line.split(' ').collect();
            let (at, fence, what) = (
                fields[0].parse().unwrap_or(0),
                fields[2].parse().unwrap_or(0),
                fields[3],
            );
            match what {
                "enter" => sections.push((fence, at, at, false)),
                "write" => report.writes += 1,
                "read-refused" | "write-refused" => report.stale_refused += 1,
                _ => {}
            }
            if let Some(open) = sections.iter_mut().rev().find(|s| s.0 == fence && !s.3) {
                open.2 = at;
                open.3 = what == "exit";
            }
        }
        for (i, a) in sections.iter().enumerate() {
            for b in &sections[i + 1..] {
                if a.0 != b.0 && a.1 < b.2 && b.1 < a.2 {
                    report.overlaps += 1;
                }
            }
        }
        report
    }
}

/// What the fault suite measures at the register.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Report {
    /// Pairs of critical sections (different tokens) that were open at once.
    pub overlaps: u64,
    /// Reads and writes refused for a stale token.
    pub stale_refused: u64,
    /// Writes accepted.
    pub writes: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stale_token_is_refused_even_after_it_read_first() {
        let path = std::env::temp_dir().join(format!("dlock-register-{}", std::process::id()));
        let register = FencedRegister::create(&path);
        register.mark(5, "enter");
        assert_eq!(register.read(5), Ok(0)); // the old holder reads...
        register.mark(6, "enter");
        assert_eq!(register.read(6), Ok(0)); // ...a newer one reads too...
        assert_eq!(register.write(5, 1), Err(Stale { fence: 5, newest: 6 })); // ...the old write is refused
        register.mark(5, "exit");
        assert_eq!(register.write(6, 1), Ok(()));
        register.mark(6, "exit");
        assert_eq!(register.value(), 1);
        assert_eq!(
            register.report(),
            Report {
                overlaps: 1,
                stale_refused: 1,
                writes: 1
            }
        );
    }
}
