//! Where one lock's state lives: every key shares one hash tag, so a lock's
//! keys sit in one Redis Cluster slot and one Lua script can change them all.

use dlock_core::LockKey;
use dlock_core::kit::{percent_escape, percent_unescape};

/// `{dlock:<group>:<name>}` with `%`, `:`, `{` and `}` percent-escaped: a
/// brace in a user's name cannot end the tag early, and ("g:a", "b") cannot
/// meet ("g", "a:b").
pub(crate) fn prefix(key: &LockKey) -> String {
    let mut out = String::with_capacity(key.group().len() + key.name().len() + 10);
    out.push_str("{dlock:");
    escape_into(key.group(), &mut out);
    out.push(':');
    escape_into(key.name(), &mut out);
    out.push('}');
    out
}

/// The key every script is given: a lock's gate, `<prefix>:w`, its record;
/// or, for a semaphore (`semaphore`), the semaphore's record, `<prefix>:s`.
pub(crate) fn record(key: &LockKey, semaphore: bool) -> String {
    let mut out = prefix(key);
    out.push_str(if semaphore { ":s" } else { ":w" });
    out
}

/// The channel on which engine `engine` hears from the lock or semaphore
/// of `record`: `<prefix>:n:<engine>`, or `<prefix>:s:n:<engine>`.
pub(crate) fn channel(record: &str, engine: &str) -> String {
    let base = record.strip_suffix(":w").unwrap_or(record);
    format!("{base}:n:{engine}")
}

/// The channel on which an operator's act on lock `key` is published
/// (`scripts/control.lua`): `<prefix>:c`.
pub(crate) fn control_channel(key: &LockKey) -> String {
    let mut out = prefix(key);
    out.push_str(":c");
    out
}

/// The `SCAN` pattern of keys `{dlock:<group>:<any name>}<tail>`, the
/// escaped group's glob characters escaped once more (`tail` is a pattern).
pub(crate) fn pattern(group: &str, tail: &str) -> String {
    let mut escaped = String::new();
    escape_into(group, &mut escaped);
    let mut out = String::with_capacity(escaped.len() + tail.len() + 12);
    out.push_str("{dlock:");
    for c in escaped.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out.push_str(":*}");
    out.push_str(tail);
    out
}

/// The name of a key of `group` that [`pattern`] found, and what follows
/// its tag.
pub(crate) fn name_in<'k>(key: &'k str, group: &str) -> Option<(String, &'k str)> {
    let mut head = String::from("{dlock:");
    escape_into(group, &mut head);
    head.push(':');
    let (name, tail) = key.strip_prefix(&head)?.split_once('}')?;
    Some((percent_unescape(name)?, tail))
}

pub(crate) fn escape_into(text: &str, out: &mut String) {
    percent_escape(text, |c| matches!(c, ':' | '{' | '}'), out);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(group: &str, name: &str) -> String {
        prefix(&LockKey::new(group, name).unwrap())
    }

    #[test]
    fn the_tag_holds_the_whole_key_and_parts_stay_apart() {
        assert_eq!(key("order", "{x}:1"), "{dlock:order:%7Bx%7D%3A1}");
        assert_ne!(key("g:a", "b"), key("g", "a:b"));
        assert_ne!(key("g", "%3A"), key("g", ":"));
        // Exactly one `}`: the tag ends at the end.
        let k = key("}{", "}}");
        assert_eq!(k.matches('}').count(), 1);
        assert!(k.ends_with('}'));
    }

    #[test]
    fn a_groups_keys_are_found_and_named() {
        assert_eq!(pattern("a*b:c", ":[ws]"), "{dlock:a\\*b%3Ac:*}:[ws]");
        let gate = record(&LockKey::new("a*b:c", "x}:1").unwrap(), false);
        assert_eq!(name_in(&gate, "a*b:c"), Some(("x}:1".to_owned(), ":w")));
        let semaphore = record(&LockKey::new("g", "s").unwrap(), true);
        assert_eq!(name_in(&semaphore, "g"), Some(("s".to_owned(), ":s")));
        assert_eq!(name_in(&semaphore, "h"), None);
    }
}
