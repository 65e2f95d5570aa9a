//! Curator's `InterProcessReadWriteLock` layout: where a lock lives, what its
//! contenders' nodes are called, and whose turn it is.
//!
//! Each contender is one `EPHEMERAL_SEQUENTIAL` child of the lock path named
//! `_c_<uuid>-__READ__<seq>` or `_c_<uuid>-__WRIT__<seq>` (Curator's
//! "protection" prefix, which lets a client find its node again after a lost
//! create reply). Contenders are ordered by the sequence suffix alone.

use dlock_core::Mode;
use dlock_core::kit::OwnerId;

const READ: &str = "__READ__";
const WRITE: &str = "__WRIT__";
/// Curator's `LeaderLatch` participant: a writer to dlock.
const LATCH: &str = "latch-";

/// The name prefix of this owner's nodes: `_c_<owner as a UUID>-`.
pub(crate) fn protected_prefix(owner: OwnerId) -> String {
    let h = format!("{owner}");
    format!(
        "_c_{}-{}-{}-{}-{}-",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    )
}

/// The `_c_<uuid>-` a node's name starts with, if it has one.
pub(crate) fn protection(name: &str) -> Option<&str> {
    let prefix = name.get(..3 + 36 + 1)?;
    let uuid = &prefix[3..39];
    let dashes = uuid.char_indices().all(|(at, c)| match at {
        8 | 13 | 18 | 23 => c == '-',
        _ => c.is_ascii_hexdigit(),
    });
    (prefix.starts_with("_c_") && prefix.ends_with('-') && dashes).then_some(prefix)
}

/// The digest of the owner id a node's name carries (see
/// [`OwnerId::digest`]): the id itself goes no further than this.
pub(crate) fn owner_digest(name: &str) -> Option<String> {
    let uuid: String = protection(name)?[3..39].chars().filter(|&c| c != '-').collect();
    u128::from_str_radix(&uuid, 16)
        .ok()
        .map(|bits| OwnerId::from_u128(bits).digest())
}

/// The name passed to a sequential create: ZooKeeper appends the sequence.
pub(crate) fn node_prefix(owner: OwnerId, mode: Mode) -> String {
    let kind = match mode {
        Mode::Read => READ,
        Mode::Write => WRITE,
    };
    protected_prefix(owner) + kind
}

/// The name passed to the sequential create of an election's node, as a
/// Curator `LeaderLatch` names its participants.
pub(crate) fn latch_prefix(owner: OwnerId) -> String {
    protected_prefix(owner) + LATCH
}

/// Whether a node is a `LeaderLatch` participant's (dlock's or Curator's).
pub(crate) fn is_latch(name: &str) -> bool {
    Contender::parse(name).is_some_and(|c| c.latch)
}

/// The read node that replaces a write node on downgrade: same owner, same
/// sequence, so it keeps the write node's place in line (CURATOR-621).
pub(crate) fn downgraded(write_node: &str) -> Option<String> {
    let at = write_node.rfind(WRITE)?;
    Some(format!(
        "{}{READ}{}",
        &write_node[..at],
        &write_node[at + WRITE.len()..]
    ))
}

/// One contender, as listed under the lock path.
#[derive(Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Contender<'a> {
    order: u64,
    name: &'a str,
    writer: bool,
    latch: bool,
}

impl<'a> Contender<'a> {
    /// `None` for a child that is not a read/write lock node or a
    /// `LeaderLatch` participant.
    fn parse(name: &'a str) -> Option<Self> {
        let (seq, writer, latch) = match (name.rfind(READ), name.rfind(WRITE)) {
            (Some(r), Some(w)) => (&name[r.max(w) + READ.len()..], w > r, false),
            (Some(r), None) => (&name[r + READ.len()..], false, false),
            (None, Some(w)) => (&name[w + WRITE.len()..], true, false),
            (None, None) => (&name[name.rfind(LATCH)? + LATCH.len()..], true, true),
        };
        let seq: i64 = seq.parse().ok()?;
        Some(Contender {
            order: sequence_order(seq),
            name,
            writer,
            latch,
        })
    }
}

/// A place in a lock's line, as [`line`] gives it.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Place {
    /// Where the node is among the children listed.
    pub at: usize,
    pub mode: Mode,
    /// Whether it holds: a writer first in line, a reader with no writer
    /// ahead, as [`turn`] decides.
    pub held: bool,
}

/// The read/write lock nodes among `children`, first in line first.
pub(crate) fn line(children: &[String]) -> Vec<Place> {
    let mut line: Vec<(Contender<'_>, usize)> = children
        .iter()
        .enumerate()
        .filter_map(|(at, c)| Some((Contender::parse(c)?, at)))
        .collect();
    line.sort_unstable();
    let mut writer_ahead = false;
    line.iter()
        .enumerate()
        .map(|(rank, (c, at))| {
            let held = if c.writer { rank == 0 } else { !writer_ahead };
            writer_ahead |= c.writer;
            let mode = if c.writer { Mode::Write } else { Mode::Read };
            Place { at: *at, mode, held }
        })
        .collect()
}

/// ZooKeeper numbers children with the parent's 32-bit child version printed
/// as `%010d`, so after 2^31 - 1 it goes on at -2^31 ("-2147483648").
/// Curator compares the text, which puts those first; read as unsigned they
/// stay in creation order.
fn sequence_order(seq: i64) -> u64 {
    if seq < 0 {
        (seq + (1 << 32)) as u64
    } else {
        seq as u64
    }
}

/// What a semaphore's path adds to its lock's: `%` is escaped in names, so
/// no lock's path ends so.
pub(crate) const SEMAPHORE: &str = "%permits";

/// The children of a semaphore's path, in Curator's
/// `InterProcessSemaphoreV2`: its internal mutex, and the leases.
pub(crate) const SEMAPHORE_LOCKS: &str = "locks";
pub(crate) const SEMAPHORE_LEASES: &str = "leases";

/// The name passed to a sequential create of a node in a semaphore's
/// mutex line (`lock-`), or of a lease in `slot` (`slot<n>-lease-`:
/// Curator counts a semaphore's leases whatever their names).
pub(crate) fn semaphore_node_prefix(owner: OwnerId, slot: Option<u32>) -> String {
    match slot {
        None => protected_prefix(owner) + "lock-",
        Some(slot) => format!("{}slot{slot}-lease-", protected_prefix(owner)),
    }
}

/// The slot a dlock lease's name carries; `None` for Curator's, or one
/// of a dlock before slots.
pub(crate) fn lease_slot(name: &str) -> Option<u32> {
    let rest = name.strip_prefix(protection(name)?)?.strip_prefix("slot")?;
    let (slot, rest) = rest.split_once('-')?;
    rest.starts_with("lease-").then(|| slot.parse().ok())?
}

/// Whose turn it is in a Curator `InterProcessMutex` line (a semaphore's
/// internal mutex): the `lock-` nodes by sequence, each waiting for the
/// one just ahead.
pub(crate) fn mutex_turn<'a>(children: &'a [String], ours: &str) -> Turn<'a> {
    let mut line: Vec<(u64, &'a str)> = children
        .iter()
        .filter_map(|c| Some((semaphore_order(c, false)?, c.as_str())))
        .collect();
    line.sort_unstable();
    match line.iter().position(|&(_, name)| name == ours) {
        None => Turn::Gone,
        Some(0) => Turn::Held,
        Some(at) => Turn::Watch(line[at - 1].1),
    }
}

/// Where a node of a semaphore's mutex line (`lock-`) or of its leases
/// (`lease-`) comes, by its sequence.
pub(crate) fn semaphore_order(name: &str, lease: bool) -> Option<u64> {
    let marker = if lease { "lease-" } else { "lock-" };
    let at = name.rfind(marker)?;
    name[at + marker.len()..].parse().ok().map(sequence_order)
}

/// Whose turn it is, for the node `ours` among `children`.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Turn<'a> {
    /// Ours holds the lock.
    Held,
    /// Wait until this node is gone: a writer watches the node just ahead of
    /// it, a reader the first writer ahead of it (no herd: one node each).
    Watch(&'a str),
    /// Our node is not among the children any more.
    Gone,
}

pub(crate) fn turn<'a>(children: &'a [String], ours: &str) -> Turn<'a> {
    let mut line: Vec<Contender<'a>> = children.iter().filter_map(|c| Contender::parse(c)).collect();
    line.sort_unstable();
    let Some(at) = line.iter().position(|c| c.name == ours) else {
        return Turn::Gone;
    };
    let ahead = &line[..at];
    let blocker = if line[at].writer {
        ahead.last()
    } else {
        ahead.iter().find(|c| c.writer)
    };
    match blocker {
        None => Turn::Held,
        Some(c) => Turn::Watch(c.name),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn writers_wait_for_the_node_just_ahead() {
        let kids = names(&[
            "_c_a-__WRIT__0000000003",
            "_c_b-__READ__0000000001",
            "_c_c-__WRIT__0000000002",
        ]);
        assert_eq!(turn(&kids, "_c_b-__READ__0000000001"), Turn::Held);
        assert_eq!(
            turn(&kids, "_c_c-__WRIT__0000000002"),
            Turn::Watch("_c_b-__READ__0000000001")
        );
        assert_eq!(
            turn(&kids, "_c_a-__WRIT__0000000003"),
            Turn::Watch("_c_c-__WRIT__0000000002")
        );
        assert_eq!(turn(&kids, "_c_z-__WRIT__0000000009"), Turn::Gone);
    }

    #[test]
    fn readers_wait_only_for_the_first_writer_ahead() {
        let kids = names(&[
            "_c_a-__READ__0000000001",
            "_c_b-__READ__0000000002",
            "_c_c-__WRIT__0000000003",
            "_c_d-__READ__0000000004",
            "_c_e-__WRIT__0000000005",
            "_c_f-__READ__0000000006",
            "not-a-lock-node",
        ]);
        assert_eq!(turn(&kids, "_c_b-__READ__0000000002"), Turn::Held);
        assert_eq!(
            turn(&kids, "_c_d-__READ__0000000004"),
            Turn::Watch("_c_c-__WRIT__0000000003")
        );
        assert_eq!(
            turn(&kids, "_c_f-__READ__0000000006"),
            Turn::Watch("_c_c-__WRIT__0000000003")
        );
    }

    #[test]
    fn sequence_numbers_past_2_pow_31_stay_in_creation_order() {
        // What the server prints for child versions 2^31 - 2, 2^31 - 1, 2^31, 2^31 + 1.
        let kids = names(&[
            "_c_c-__WRIT__-2147483648",
            "_c_a-__WRIT__2147483646",
            "_c_d-__WRIT__-2147483647",
            "_c_b-__WRIT__2147483647",
        ]);
        assert_eq!(turn(&kids, "_c_a-__WRIT__2147483646"), Turn::Held);
        assert_eq!(
            turn(&kids, "_c_b-__WRIT__2147483647"),
            Turn::Watch("_c_a-__WRIT__2147483646")
        );
        assert_eq!(
            turn(&kids, "_c_c-__WRIT__-2147483648"),
            Turn::Watch("_c_b-__WRIT__2147483647")
        );
        assert_eq!(
            turn(&kids, "_c_d-__WRIT__-2147483647"),
            Turn::Watch("_c_c-__WRIT__-2147483648")
        );
        // Text order, as Curator compares, would have put the negative ones first.
        assert!("-2147483648" < "2147483646");
    }

    #[test]
    fn a_downgraded_read_node_keeps_the_write_nodes_place() {
        let read = downgraded("_c_a-__WRIT__0000000001").unwrap();
        assert_eq!(read, "_c_a-__READ__0000000001");
        let kids = names(&[&read, "_c_b-__WRIT__0000000002", "_c_c-__READ__0000000003"]);
        assert_eq!(turn(&kids, "_c_b-__WRIT__0000000002"), Turn::Watch(&read));
        assert_eq!(
            turn(&kids, "_c_c-__READ__0000000003"),
            Turn::Watch("_c_b-__WRIT__0000000002")
        );
    }

    #[test]
    fn leader_latch_participants_are_writers_in_sequence_order() {
        let owner = OwnerId::random();
        let ours = format!("{}0000000002", latch_prefix(owner));
        assert!(ours.starts_with("_c_") && ours.contains("-latch-"));
        let kids = names(&[
            "_c_b-latch-0000000003",
            &ours,
            "_c_a-latch-0000000001",
            "_c_c-__READ__0000000004",
        ]);
        assert_eq!(turn(&kids, "_c_a-latch-0000000001"), Turn::Held);
        assert_eq!(turn(&kids, &ours), Turn::Watch("_c_a-latch-0000000001"));
        assert_eq!(turn(&kids, "_c_b-latch-0000000003"), Turn::Watch(&ours));
        // A reader watches the first writer ahead, a latch as any.
        assert_eq!(
            turn(&kids, "_c_c-__READ__0000000004"),
            Turn::Watch("_c_a-latch-0000000001")
        );
        assert!(is_latch(&ours) && !is_latch("_c_c-__READ__0000000004") && !is_latch("latch-x"));
    }

    #[test]
    fn curator_names() {
        let owner = OwnerId::random();
        let prefix = node_prefix(owner, Mode::Write);
        assert!(prefix.starts_with("_c_") && prefix.ends_with("-__WRIT__"));
        // `_c_` + 36-character UUID + `-`.
        assert_eq!(protected_prefix(owner).len(), 3 + 36 + 1);
    }

    #[test]
    fn the_line_holds_whom_turn_lets_hold() {
        let kids = names(&[
            "_c_c-__WRIT__0000000003",
            "_c_a-__READ__0000000001",
            "not-a-lock-node",
            "_c_b-__READ__0000000002",
            "_c_d-__READ__0000000004",
        ]);
        let line = line(&kids);
        let order: Vec<_> = line.iter().map(|p| (p.at, p.mode)).collect();
        assert_eq!(
            order,
            [
                (1, Mode::Read),
                (3, Mode::Read),
                (0, Mode::Write),
                (4, Mode::Read)
            ]
        );
        for place in line {
            let held = turn(&kids, &kids[place.at]) == Turn::Held;
            assert_eq!(place.held, held, "{place:?}");
        }
    }

    #[test]
    fn a_nodes_owner_shows_as_its_digest() {
        let owner = OwnerId::random();
        let name = format!("{}0000000001", node_prefix(owner, Mode::Read));
        assert_eq!(owner_digest(&name), Some(owner.digest()));
        assert_eq!(protection(&name), Some(protected_prefix(owner).as_str()));
        assert_eq!(owner_digest("_c_not-a-uuid-__READ__0000000001"), None);
        assert_eq!(owner_digest("lock-0000000001"), None);
    }

    #[test]
    fn a_semaphores_mutex_line_goes_by_sequence() {
        let owner = OwnerId::random();
        let prefix = semaphore_node_prefix(owner, None);
        assert!(prefix.starts_with("_c_") && prefix.ends_with("-lock-"));
        let lease = semaphore_node_prefix(owner, Some(7)) + "0000000004";
        assert!(lease.ends_with("-slot7-lease-0000000004"));
        assert_eq!(
            (lease_slot(&lease), semaphore_order(&lease, true)),
            (Some(7), Some(4))
        );
        let older = protected_prefix(owner) + "lease-0000000004";
        assert_eq!(
            (lease_slot(&older), lease_slot("_c_x-lease-0000000001")),
            (None, None)
        );
        let kids = names(&[
            "_c_b-lock-0000000002",
            "_c_a-lock-0000000003",
            "_c_c-lock-0000000001",
        ]);
        assert_eq!(mutex_turn(&kids, "_c_c-lock-0000000001"), Turn::Held);
        assert_eq!(
            mutex_turn(&kids, "_c_a-lock-0000000003"),
            Turn::Watch("_c_b-lock-0000000002")
        );
        assert_eq!(mutex_turn(&kids, "_c_z-lock-0000000009"), Turn::Gone);
        assert_eq!(semaphore_order("_c_a-lease--2147483648", true), Some(1 << 31));
        assert_eq!(semaphore_order("_c_a-lease-0000000007", false), None);
    }
}
