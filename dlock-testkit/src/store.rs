//! A fenced store: the storage stand-in of the fault suite. One file
//! holds a number; any process may read or write it, each time showing the
//! fencing token of the lock it holds. The store refuses an operation
//! whose token is below the greatest it has seen, reads included, so a
//! holder that lost its lock cannot write once a newer holder has touched
//! the store, even if it read before the newer holder did.
//!
//! Every operation, and every critical section's entry and exit, is
//! appended to a journal under the same file lock, from which [`Report`]
//! counts overlapping critical sections and stale operations refused.
//! Accepted writes are counted in the state itself, in the same write as
//! the value: a writer killed between the state and the journal must not
//! look like a lost update.
//!
//! [`SlotStores`] is a pool of such stores, one per slot of a semaphore,
//! fenced by the permits' tokens as a lock's store is by the lock's.
//!
//! Each process opens the two files once and keeps them; the state is
//! rewritten in place at a fixed width, never truncated (on ext4 a file
//! truncated and rewritten is flushed to disk when closed, a block write
//! per operation that made the fault suite's flash sale disk-bound).

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, Write};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};
use std::time::{SystemTime, UNIX_EPOCH};

/// The store's state file and its journal; see the module docs.
pub struct FencedStore {
    state: PathBuf,
    journal: PathBuf,
    /// Opened on first use. The mutex orders this process's tasks, the
    /// file lock on `state` the processes.
    files: Mutex<Option<Files>>,
}

struct Files {
    state: File,
    journal: File,
}

/// The store's files, locked against every other task and process.
struct Locked<'a>(MutexGuard<'a, Option<Files>>);

impl Locked<'_> {
    fn files(&mut self) -> &mut Files {
        self.0.as_mut().expect("opened when locked")
    }
}

impl Drop for Locked<'_> {
    fn drop(&mut self) {
        if let Some(files) = self.0.as_ref() {
            let _ = files.state.unlock();
        }
    }
}

/// The store refused a token below the greatest it has seen.
#[derive(Debug, PartialEq, Eq)]
pub struct Stale {
    /// The token shown.
    pub fence: u64,
    /// The greatest token the store had seen.
    pub newest: u64,
}

impl FencedStore {
    /// A store at `path` holding 0 (and `path.journal` beside it).
    pub fn create(path: &Path) -> Self {
        let store = Self::open(path);
        std::fs::write(&store.state, record(0, 0, 0)).expect("create store");
        std::fs::write(&store.journal, "").expect("create journal");
        store
    }

    /// The store at `path`, as another process created it.
    pub fn open(path: &Path) -> Self {
        FencedStore {
            state: path.to_owned(),
            journal: path.with_extension("journal"),
            files: Mutex::new(None),
        }
    }

    /// The value, if `fence` is not below the greatest token seen; a read
    /// raises that greatest token too.
    pub fn read(&self, fence: u64) -> Result<u64, Stale> {
        self.apply(fence, "read", |value| value)
    }

    /// Stores `value`, if `fence` is not below the greatest token seen.
    pub fn write(&self, fence: u64, value: u64) -> Result<(), Stale> {
        self.apply(fence, "write", |_| value).map(drop)
    }

    /// Notes that the holder of `fence` entered (`"enter"`) or left (`"exit"`)
    /// its critical section.
    pub fn mark(&self, fence: u64, what: &str) {
        Self::journal(self.lock().files(), fence, what);
    }

    /// The value, without a token (for the suite, after the workers).
    pub fn value(&self) -> u64 {
        Self::load(self.lock().files()).1
    }

    fn apply(&self, fence: u64, op: &str, f: impl FnOnce(u64) -> u64) -> Result<u64, Stale> {
        let mut locked = self.lock();
        let files = locked.files();
        let (newest, value, writes) = Self::load(files);
        if fence < newest {
            Self::journal(files, fence, &format!("{op}-refused"));
            return Err(Stale { fence, newest });
        }
        let next = f(value);
        let writes = writes + u64::from(op == "write");
        files
            .state
            .rewind()
            .and_then(|()| files.state.write_all(record(fence, next, writes).as_bytes()))
            .expect("write store");
        Self::journal(files, fence, op);
        Ok(value)
    }

    fn lock(&self) -> Locked<'_> {
        let mut files = self.files.lock().unwrap_or_else(|e| e.into_inner());
        if files.is_none() {
            let open = |path: &Path, options: &mut OpenOptions| options.open(path).expect("open store");
            *files = Some(Files {
                state: open(&self.state, OpenOptions::new().read(true).write(true)),
                journal: open(&self.journal, OpenOptions::new().append(true)),
            });
        }
        let locked = Locked(files);
        locked
            .0
            .as_ref()
            .expect("opened")
            .state
            .lock()
            .expect("lock store");
        locked
    }

    /// Reads the store through the handle that holds its lock.
    fn load(files: &mut Files) -> (u64, u64, u64) {
        let mut text = String::new();
        files
            .state
            .rewind()
            .and_then(|()| files.state.read_to_string(&mut text))
            .expect("read store");
        let mut parts = text
            .split_whitespace()
            .map(|n| n.parse::<u64>().expect("store number"));
        let mut next = || parts.next().unwrap_or(0);
        (next(), next(), next())
    }

    fn journal(files: &mut Files, fence: u64, what: &str) {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .expect("clock")
            .as_nanos();
        // One write per line: appends from several processes stay whole.
        let line = format!("{nanos} {} {fence} {what}\n", std::process::id());
        files.journal.write_all(line.as_bytes()).expect("journal");
    }

    /// The journal's lines so far, each `<unix ns> <pid> <fence> <what>`.
    pub fn journal_lines(&self) -> Vec<String> {
        let _lock = self.lock();
        let text = std::fs::read_to_string(&self.journal).expect("read journal");
        text.lines().map(str::to_owned).collect()
    }

    /// What the journal shows.
    pub fn report(&self) -> Report {
        let mut locked = self.lock();
        let text = std::fs::read_to_string(&self.journal).expect("read journal");
        let mut report = Report {
            writes: Self::load(locked.files()).2,
            ..Report::default()
        };
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
                "read-refused" | "write-refused" => report.stale_refused += 1,
                _ => {}
            }
            if let Some(open) = sections.iter_mut().rev().find(|s| s.0 == fence && !s.3) {
                open.2 = at;
                open.3 = what == "exit";
            }
        }
        // By entry: a section can only overlap those entered before it ends.
        sections.sort_by_key(|s| s.1);
        for (i, a) in sections.iter().enumerate() {
            for b in sections[i + 1..].iter().take_while(|b| b.1 < a.2) {
                if a.0 != b.0 && a.1 < b.2 {
                    report.overlaps += 1;
                }
            }
        }
        report
    }

    /// Each token's accepted reads and writes, as (fence, first, last) in
    /// the journal's unix ns.
    pub fn accepted_spans(&self) -> Vec<(u64, u128, u128)> {
        let _lock = self.lock();
        let text = std::fs::read_to_string(&self.journal).expect("read journal");
        let mut spans: Vec<(u64, u128, u128)> = Vec::new();
        for line in text.lines() {
            let [at, _, fence, "read" | "write"] = line.split(' ').collect::<Vec<_>>()[..] else {
                continue;
            };
            let (at, fence): (u128, u64) = (at.parse().unwrap_or(0), fence.parse().unwrap_or(0));
            match spans.iter_mut().find(|s| s.0 == fence) {
                Some(span) => span.2 = at,
                None => spans.push((fence, at, at)),
            }
        }
        spans
    }

    /// Fences that more than one critical section entered with: a token
    /// handed out twice.
    pub fn repeated_fences(&self) -> Vec<u64> {
        let _lock = self.lock();
        let text = std::fs::read_to_string(&self.journal).expect("read journal");
        let mut seen = std::collections::HashSet::new();
        let mut repeated: Vec<u64> = text
            .lines()
            .filter_map(|line| match line.split(' ').collect::<Vec<_>>()[..] {
                [_, _, fence, "enter"] => fence.parse().ok(),
                _ => None,
            })
            .filter(|fence| !seen.insert(*fence))
            .collect();
        repeated.dedup();
        repeated
    }
}

/// A fenced store per slot of a semaphore of `n` permits, slot `i`'s at
/// `<path>-slot<i>`: each permit holder reads and writes its slot's store
/// with its token.
pub struct SlotStores(Vec<FencedStore>);

impl SlotStores {
    /// `n` stores holding 0.
    pub fn create(path: &Path, n: u32) -> Self {
        SlotStores(
            (0..n)
                .map(|slot| FencedStore::create(&Self::path(path, slot)))
                .collect(),
        )
    }

    /// The `n` stores at `path`, as another process created them.
    pub fn open(path: &Path, n: u32) -> Self {
        SlotStores(
            (0..n)
                .map(|slot| FencedStore::open(&Self::path(path, slot)))
                .collect(),
        )
    }

    fn path(path: &Path, slot: u32) -> PathBuf {
        let mut name = path.as_os_str().to_owned();
        name.push(format!("-slot{slot}"));
        PathBuf::from(name)
    }

    /// Slot `slot`'s store; `None` past the count.
    pub fn slot(&self, slot: u32) -> Option<&FencedStore> {
        self.0.get(slot as usize)
    }

    /// Fences that more than one critical section entered with, in any
    /// slot.
    pub fn repeated_fences(&self) -> Vec<u64> {
        self.0.iter().flat_map(FencedStore::repeated_fences).collect()
    }

    /// What the stores' journals show, summed over the slots.
    pub fn report(&self) -> SlotReport {
        let mut report = SlotReport::default();
        let mut spans = Vec::new();
        for store in &self.0 {
            let (writes, value) = (store.report(), store.value());
            report.writes += writes.writes;
            report.stale_refused += writes.stale_refused;
            report.lost_updates += writes.writes.saturating_sub(value);
            let mut slot = store.accepted_spans();
            slot.sort_by_key(|s| s.1);
            report.slot_overlaps += slot.windows(2).filter(|pair| pair[1].1 < pair[0].2).count() as u64;
            spans.extend(slot);
        }
        // The most at once is reached at some span's start.
        let at_start = |a: &(u64, u128, u128)| spans.iter().filter(|b| b.1 <= a.1 && a.1 <= b.2).count();
        report.most_writers = spans.iter().map(at_start).max().unwrap_or(0) as u64;
        report
    }
}

/// What the slot stores show.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct SlotReport {
    /// Writes accepted, over all slots.
    pub writes: u64,
    /// Accepted writes that a slot's value does not bear out.
    pub lost_updates: u64,
    /// Reads and writes refused for a stale token.
    pub stale_refused: u64,
    /// Pairs of tokens whose accepted operations interleaved in one slot.
    pub slot_overlaps: u64,
    /// The most tokens whose accepted operations spanned one instant.
    pub most_writers: u64,
}

/// The state file's content: always the same length, so that a rewrite in
/// place leaves nothing of the last one behind.
fn record(fence: u64, value: u64, writes: u64) -> String {
    format!("{fence:020} {value:020} {writes:020}\n")
}

/// What the fault suite measures at the store.
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
        let path = crate::server::scratch("store");
        let store = FencedStore::create(&path);
        store.mark(5, "enter");
        assert_eq!(store.read(5), Ok(0)); // the old holder reads...
        store.mark(6, "enter");
        assert_eq!(store.read(6), Ok(0)); // ...a newer one reads too...
        assert_eq!(store.write(5, 1), Err(Stale { fence: 5, newest: 6 })); // ...the old write is refused
        store.mark(5, "exit");
        assert_eq!(store.write(6, 1), Ok(()));
        store.mark(6, "exit");
        assert_eq!(store.value(), 1);
        assert_eq!(
            store.report(),
            Report {
                overlaps: 1,
                stale_refused: 1,
                writes: 1
            }
        );
    }
}
