//! `docs/guarantees.md` names, for every guarantee on every engine, the test
//! that shows it. This fails when a cited test no longer exists, so the doc
//! cannot go on citing a test that was renamed or removed.
//!
//! A cited name is a backticked snake_case identifier with at least one
//! underscore in its last segment, optionally behind a module path
//! (`redis::holder_killed_frees_the_lock_in_time`: the test module, then the
//! fn). It must appear as `fn <last segment>` in some `.rs` file of the
//! repository, wherever it lives: the whole tree is searched.

use std::fs;
use std::path::{Path, PathBuf};

/// Backticked snake_case names in the doc that are not tests: settings and
/// server-side names the cells mention. Each must still appear in the doc
/// (checked below), so the list cannot outgrow it.
const NOT_TESTS: &[&str] = &[
    "call_timeout",             // setting
    "connect_timeout",          // engine setting
    "deadlock_check",           // setting
    "dlock_fence",              // a fenced table's column
    "flush_all",                // memcached command
    "idle_session_timeout",     // PostgreSQL setting
    "password_file",            // engine setting
    "require_secure_transport", // MariaDB setting
    "pg_locks",                 // PostgreSQL view
    "pg_terminate_backend",     // PostgreSQL function
    "wait_timeout",             // MySQL setting
    "waiter_ttl",               // engine setting
];

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Every backticked span of `doc` that reads as a test name.
fn cited_names(doc: &str) -> Vec<&str> {
    let mut names: Vec<&str> = doc
        .split('`')
        .skip(1)
        .step_by(2)
        .filter(|s| is_test_name(s))
        .collect();
    names.sort_unstable();
    names.dedup();
    names
}

fn is_test_name(s: &str) -> bool {
    let segments: Vec<&str> = s.split("::").collect();
    let well_formed = segments.iter().all(|seg| {
        seg.starts_with(|c: char| c.is_ascii_lowercase())
            && seg
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
    });
    well_formed && segments.last().is_some_and(|last| last.contains('_'))
}

/// The text of every `.rs` file under `dir`, leaving out build output,
/// git's own files and the benches' peers (crates of their own).
fn sources(dir: &Path, out: &mut String) {
    let entries = fs::read_dir(dir).unwrap_or_else(|e| panic!("read {}: {e}", dir.display()));
    for entry in entries {
        let path = entry.expect("directory entry").path();
        if path.is_dir() {
            let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
            if name != "target" && name != ".git" && !path.ends_with("benches/peers") {
                sources(&path, out);
            }
        } else if path.extension().is_some_and(|e| e == "rs") {
            // Not UTF-8 (a test fixture, say) cannot define a Rust fn.
            if let Ok(text) = fs::read_to_string(&path) {
                out.push_str(&text);
                out.push('\n');
            }
        }
    }
}

fn is_ident_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// Whether `src` has `fn <name>` with `fn` and `name` as whole words.
fn defines_fn(src: &str, name: &str) -> bool {
    let needle = format!("fn {name}");
    src.match_indices(&needle).any(|(at, _)| {
        let before = src[..at].chars().next_back();
        let after = src[at + needle.len()..].chars().next();
        !before.is_some_and(is_ident_char) && !after.is_some_and(is_ident_char)
    })
}

#[test]
fn every_test_the_guarantee_doc_cites_exists() {
    let doc_path = root().join("docs/guarantees.md");
    let doc = fs::read_to_string(&doc_path).unwrap_or_else(|e| panic!("read {}: {e}", doc_path.display()));
    let cited = cited_names(&doc);

    for not_test in NOT_TESTS {
        assert!(
            cited.contains(not_test),
            "NOT_TESTS lists `{not_test}`, which the doc no longer mentions"
        );
    }
    let tests: Vec<&str> = cited.into_iter().filter(|n| !NOT_TESTS.contains(n)).collect();
    // The doc cites over a hundred tests; a handful means the extraction broke.
    assert!(
        tests.len() > 50,
        "only {} test names found in {}",
        tests.len(),
        doc_path.display()
    );

    let mut src = String::new();
    sources(&root(), &mut src);
    let missing: Vec<&str> = tests
        .iter()
        .copied()
        .filter(|name| !defines_fn(&src, name.rsplit("::").next().unwrap_or(name)))
        .collect();
    assert!(
        missing.is_empty(),
        "{} cites tests that no .rs file defines (renamed or removed? update the doc):\n  {}",
        doc_path.display(),
        missing.join("\n  ")
    );
}
