//! Lock identity: a group (the business purpose) and a name within it.

use std::fmt;
use std::hash::{BuildHasher, BuildHasherDefault, Hash, Hasher, RandomState};
use std::sync::{Arc, LazyLock};

use crate::Error;

/// Longest group accepted, in bytes.
pub const MAX_GROUP_LEN: usize = 255;
/// Longest name accepted, in bytes. Keys are opaque to dlock; engines escape them.
pub const MAX_NAME_LEN: usize = 64 * 1024;

/// One lock's identity. Any non-empty text is a valid name: braces, colons,
/// spaces and unicode are escaped by each engine, never interpreted.
///
/// ```
/// let key = dlock_core::LockKey::new("order", "{tenant}:42").unwrap();
/// assert_eq!(key.to_string(), "order/{tenant}:42");
/// ```
#[derive(Clone, PartialEq, Eq)]
pub struct LockKey {
    /// Hashed once, here: every table a request passes through (the holds,
    /// the local queue, an engine's own) uses this rather than hashing the
    /// text again. SipHash with a key random per process, so names chosen
    /// by users cannot be made to collide.
    hash: u64,
    group: Arc<str>,
    name: Arc<str>,
}

impl Hash for LockKey {
    fn hash<H: Hasher>(&self, state: &mut H) {
        state.write_u64(self.hash);
    }
}

/// The hasher for tables keyed by [`LockKey`]s (alone, or with ids beside
/// them): it mixes the hash each key carries with the ids' numbers, one
/// multiplication each, instead of hashing the key's text again.
#[derive(Clone, Copy, Default)]
pub struct KeyHasher(u64);

/// Builds [`KeyHasher`]s: `HashMap<LockKey, V, KeyHashing>`.
pub type KeyHashing = BuildHasherDefault<KeyHasher>;

impl Hasher for KeyHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &byte in bytes {
            self.write_u64(u64::from(byte));
        }
    }

    fn write_u64(&mut self, n: u64) {
        // FxHash's step: the product's high bits depend on every input bit.
        self.0 = (self.0.rotate_left(5) ^ n).wrapping_mul(0x517c_c1b7_2722_0a95);
    }

    fn write_usize(&mut self, n: usize) {
        self.write_u64(n as u64);
    }
}

static HASHING: LazyLock<RandomState> = LazyLock::new(RandomState::new);

/// Which of `SHARDS` tables `item` (a key, or a key with ids) goes in.
pub(crate) fn shard_of<const SHARDS: usize>(item: &impl Hash) -> usize {
    let mut hasher = KeyHasher::default();
    item.hash(&mut hasher);
    (hasher.finish() >> 32) as usize % SHARDS
}

impl LockKey {
    /// Checks the parts and builds the key.
    pub fn new(group: impl Into<Arc<str>>, name: impl Into<Arc<str>>) -> Result<Self, Error> {
        let (group, name) = (group.into(), name.into());
        let problem = if group.is_empty() {
            Some("the group is empty")
        } else if group.len() > MAX_GROUP_LEN {
            Some("the group is longer than 255 bytes")
        } else if name.is_empty() {
            Some("the name is empty")
        } else if name.len() > MAX_NAME_LEN {
            Some("the name is longer than 64 KiB")
        } else {
            None
        };
        match problem {
            Some(reason) => Err(Error::InvalidKey {
                key: shorten(&group) + "/" + &shorten(&name),
                reason,
            }),
            None => Ok(Self {
                hash: HASHING.hash_one((&*group, &*name)),
                group,
                name,
            }),
        }
    }

    /// The group: what the lock protects (`"order"`).
    pub fn group(&self) -> &str {
        &self.group
    }

    /// The name within the group (`"42"`).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// `<root>/<group>/<name>` for servers that keep locks in a tree of
    /// paths (ZooKeeper, etcd), so that a peer finds the same lock on both:
    /// `/`, `%` and the characters ZooKeeper refuses in a path become `%XX`,
    /// and the components `.` and `..` become `%2E`, `%2E%2E`.
    pub fn path(&self, root: &str) -> String {
        // ZooKeeper's PathUtils refuses these code points. Beyond U+FFFF
        // Java sees a surrogate pair, which it refuses too.
        let refused = |c| {
            matches!(c, '/' | '\u{0}'..='\u{1f}' | '\u{7f}'..='\u{9f}' | '\u{e000}'..='\u{f8ff}')
                || c >= '\u{fff0}'
        };
        let mut path = String::with_capacity(root.len() + self.group.len() + self.name.len() + 2);
        path.push_str(root);
        for part in [self.group(), self.name()] {
            path.push('/');
            if part == "." || part == ".." {
                path.push_str(&"%2E".repeat(part.len()));
            } else {
                percent_escape(part, refused, &mut path);
            }
        }
        path
    }

    /// FNV-1a (128 bits) of group and name, the same in every build and
    /// process, unlike std's hasher: for engines whose keys have a fixed
    /// width. The group's length goes first, so the boundary between group
    /// and name cannot shift.
    pub fn stable_hash(&self) -> u128 {
        const OFFSET: u128 = 0x6c62272e07bb014262b821756295c58d;
        const PRIME: u128 = 0x0000000001000000000000000000013b;
        let length = (self.group.len() as u16).to_le_bytes();
        let bytes = length
            .iter()
            .chain(self.group.as_bytes())
            .chain(self.name.as_bytes());
        bytes.fold(OFFSET, |hash, &byte| (hash ^ byte as u128).wrapping_mul(PRIME))
    }
}

/// Appends `text` to `out` with `%` and every character `escape` picks
/// written as `%XX`, one per UTF-8 byte: how engines fit any group or name
/// into their key syntax, distinct names staying distinct.
pub fn percent_escape(text: &str, escape: impl Fn(char) -> bool, out: &mut String) {
    use fmt::Write;
    for c in text.chars() {
        if c == '%' || escape(c) {
            let mut buf = [0; 4];
            for byte in c.encode_utf8(&mut buf).bytes() {
                let _ = write!(out, "%{byte:02X}");
            }
        } else {
            out.push(c);
        }
    }
}

/// The text [`percent_escape`] wrote, back; `None` if `escaped` is not
/// such text (a `%` without two hex digits, or bytes that are not UTF-8).
pub fn percent_unescape(escaped: &str) -> Option<String> {
    let mut bytes = Vec::with_capacity(escaped.len());
    let mut rest = escaped.as_bytes();
    while let Some((&byte, tail)) = rest.split_first() {
        if byte == b'%' {
            let digits = std::str::from_utf8(tail.get(..2)?).ok()?;
            bytes.push(u8::from_str_radix(digits, 16).ok()?);
            rest = &tail[2..];
        } else {
            bytes.push(byte);
            rest = tail;
        }
    }
    String::from_utf8(bytes).ok()
}

/// Long names are cut in messages so a 10 KB key does not flood a log line.
fn shorten(text: &str) -> String {
    const SHOWN: usize = 64;
    if text.len() <= SHOWN {
        return text.to_owned();
    }
    let cut = (0..=SHOWN).rev().find(|&i| text.is_char_boundary(i)).unwrap_or(0);
    format!("{}…({} bytes)", &text[..cut], text.len())
}

impl fmt::Display for LockKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", shorten(&self.group), shorten(&self.name))
    }
}

impl fmt::Debug for LockKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "LockKey({self})")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unescaping_gives_back_what_escaping_wrote() {
        for text in ["plain", "a:b%c", "{ü}", "%%", ""] {
            let mut out = String::new();
            percent_escape(text, |c| matches!(c, ':' | '{' | '}' | 'ü'), &mut out);
            assert_eq!(percent_unescape(&out).as_deref(), Some(text), "{out}");
        }
        for bad in ["%", "%4", "%zz", "%FF"] {
            assert_eq!(percent_unescape(bad), None, "{bad}");
        }
    }

    #[test]
    fn rejects_empty_and_oversized_parts() {
        for (group, name) in [
            ("", "a"),
            ("g", ""),
            (&*"g".repeat(256), "a"),
            ("g", &*"n".repeat(MAX_NAME_LEN + 1)),
        ] {
            let err = LockKey::new(group, name).unwrap_err();
            assert!(matches!(err, Error::InvalidKey { .. }), "{err}");
        }
    }

    #[test]
    fn paths_escape_what_trees_refuse() {
        let key = |g: &str, n: &str| LockKey::new(g, n).unwrap().path("/locks");
        assert_eq!(key("order", "42"), "/locks/order/42");
        assert_eq!(key("a/b", "c"), "/locks/a%2Fb/c");
        assert_ne!(key("a/b", "c"), key("a", "b/c"));
        assert_eq!(key("g", ".."), "/locks/g/%2E%2E");
        assert_eq!(key("g", "%2F"), "/locks/g/%252F");
        assert_eq!(key("g", "\n\t"), "/locks/g/%0A%09");
        assert_eq!(key("g", "ünï 锁"), "/locks/g/ünï 锁");
        assert_eq!(key("g", "🔒"), "/locks/g/%F0%9F%94%92");
    }

    #[test]
    fn stable_hash_keeps_group_and_name_apart() {
        let hash = |g: &str, n: &str| LockKey::new(g, n).unwrap().stable_hash();
        assert_eq!(hash("order", "42"), hash("order", "42"));
        assert_ne!(hash("g:a", "b"), hash("g", "a:b"));
        assert_ne!(hash("ga", "b"), hash("g", "ab"));
        // Pinned: keys already on servers must keep their hash across releases.
        assert_eq!(hash("order", "42"), 0xa743f352820393bd1f859b1d70d8f492);
    }

    #[test]
    fn long_names_are_shortened_on_char_boundaries() {
        let name = "é".repeat(5000);
        let key = LockKey::new("g", name.as_str()).unwrap();
        let shown = key.to_string();
        assert!(shown.ends_with("…(10000 bytes)"), "{shown}");
        assert!(shown.len() < 120);
        assert_eq!(key.name(), name);
    }
}
