//! Direct handoff. A holder with nothing ahead of it hands the lock to the
//! dlock waiters right behind it in the transaction that deletes its key: it
//! rewrites their keys (same value first line, same lease), and each of them
//! is watching its own key, so it holds on that event, one notification
//! after the release, with no read of its own.
//!
//! Why it is sound: the holder knows who is right behind it from the read
//! that granted it (keys created after its own, at that read's revision).
//! A key created later has a greater create revision than all of those, so
//! nobody can come between; a key among them that went away fails the
//! transaction's compare, and the release falls back to a plain delete (the
//! waiters' watches on the key ahead then take over). The compares also
//! prove each target's own key still existed, with its create revision, at
//! the revision it was granted: a waiter whose lease ended is never handed
//! the lock (etcd 11456, 16221).
//!
//! A writer handed the lock also gets the rest of the line (up to a read's
//! worth) in its key's value, one successor a line, so it can hand over in
//! turn.

use etcd_client::KeyValue;

use super::queue::{READER, WRITER};

/// A contender right behind a holder, as last read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Successor {
    pub key: Vec<u8>,
    pub created: i64,
    /// The first line of its value: `dlock read <owner> ...`, `dlock write
    /// <owner> ...` (`queue.rs`), or anything else for a key dlock did not
    /// write.
    pub line: Vec<u8>,
}

impl Successor {
    fn reader(&self) -> bool {
        self.line.starts_with(READER)
    }

    fn writer(&self) -> bool {
        self.line.starts_with(WRITER)
    }
}

/// The first line of a key's value.
pub(crate) fn first_line(value: &[u8]) -> &[u8] {
    value.split(|&b| b == b'\n').next().unwrap_or_default()
}

/// The contenders behind a holder, oldest first, from a read of them.
pub(crate) fn successors(behind: &[KeyValue]) -> Vec<Successor> {
    behind
        .iter()
        .map(|kv| Successor {
            key: kv.key().to_vec(),
            created: kv.create_revision(),
            line: first_line(kv.value()).to_vec(),
        })
        .collect()
}

/// Whom a holder with nothing ahead hands the lock to: the writer right
/// behind it, or the run of readers right behind it; and what it passes on
/// to a writer (the successors after it).
pub(crate) fn targets(successors: &[Successor]) -> (&[Successor], &[Successor]) {
    match successors.first() {
        Some(next) if next.writer() => (&successors[..1], &successors[1..]),
        Some(next) if next.reader() => {
            let run = successors.iter().take_while(|s| s.reader()).count();
            (&successors[..run], &[])
        }
        _ => (&[], &[]),
    }
}

/// A handed-over key's value: its first line, then the successors passed
/// on, `<created>\t<key>\t<first line>` each. Keys hold no tab or newline
/// (the lock's path escapes control characters), nor do first lines (a
/// label has no control character).
pub(crate) fn value(line: &[u8], rest: &[Successor]) -> Vec<u8> {
    let mut value = line.to_vec();
    for s in rest {
        value.push(b'\n');
        value.extend_from_slice(s.created.to_string().as_bytes());
        value.push(b'\t');
        value.extend_from_slice(&s.key);
        value.push(b'\t');
        value.extend_from_slice(&s.line);
    }
    value
}

/// The successors passed on in a handed-over key's value.
pub(crate) fn passed_on(value: &[u8]) -> Vec<Successor> {
    let parse = |line: &[u8]| {
        let mut parts = line.splitn(3, |&b| b == b'\t');
        let created = std::str::from_utf8(parts.next()?).ok()?.parse().ok()?;
        Some(Successor {
            created,
            key: parts.next()?.to_vec(),
            line: parts.next()?.to_vec(),
        })
    };
    value.split(|&b| b == b'\n').skip(1).map_while(parse).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(key: &str, created: i64, line: &str) -> Successor {
        Successor {
            key: key.into(),
            created,
            line: line.into(),
        }
    }

    #[test]
    fn a_writer_alone_or_a_run_of_readers_and_never_past_a_foreign_key() {
        let line = [
            s("w1", 5, "dlock write a"),
            s("r1", 6, "dlock read b"),
            s("r2", 7, "dlock read c"),
            s("w2", 8, "dlock write d"),
        ];
        assert_eq!(targets(&line), (&line[..1], &line[1..]));
        assert_eq!(targets(&line[1..]), (&line[1..3], &[][..]));
        let foreign = [s("m", 5, ""), s("w", 6, "dlock write e")];
        assert_eq!(targets(&foreign), (&[][..], &[][..]));
        assert_eq!(targets(&[]), (&[][..], &[][..]));
    }

    #[test]
    fn the_line_passed_on_reads_back() {
        let rest = [
            s("/locks/g/n/1f-0", 9, "dlock read x 1764166213000 web 1:42"),
            s("/locks/g/n/2a-3", 12, ""),
        ];
        let handed = value(b"dlock write me", &rest);
        assert_eq!(first_line(&handed), b"dlock write me");
        assert_eq!(passed_on(&handed), rest);
        assert_eq!(passed_on(b"dlock write me"), []);
    }
}
