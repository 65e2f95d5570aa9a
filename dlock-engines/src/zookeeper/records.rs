//! Holder records: what a lock's or a semaphore's nodes say about who
//! holds and who waits.
//!
//! A dlock lock node's data is `dlock <label>`, written at create and never
//! again: Curator's revocation writes `__REVOKE__` into a contender's data,
//! which a rewrite could erase. A downgrade's read node adds the fence of
//! the write node it replaces, `dlock <label>\tfence=<n>`: its own czxid is
//! the swap's, not the guard's fence. A label has no control characters,
//! so the first tab ends it, spaces and all; more `\t<field>=<value>` may
//! follow. Semaphore nodes carry their count first (`permits.rs`).

/// How a dlock lock node's data starts; the label follows.
const DATA: &str = "dlock ";

/// A lock node's data: this process's label, and for a downgrade's read
/// node the guard's fence.
pub(super) fn data(label: &str, fence: Option<u64>) -> Vec<u8> {
    match fence {
        Some(fence) => format!("{DATA}{label}\tfence={fence}"),
        None => format!("{DATA}{label}"),
    }
    .into_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_label_with_spaces_ends_at_the_tab_before_a_carried_fence() {
        assert_eq!(data("web 7:12", None), b"dlock web 7:12");
        assert_eq!(data("web 7:12", Some(42)), b"dlock web 7:12\tfence=42");
    }
}
