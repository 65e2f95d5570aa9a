//! The engine table (`dlock::engines::ENGINES`, one row per engine) is the
//! one list: what must still be written by hand elsewhere (a cargo feature
//! in each manifest, a fixture with its `every_setup!` row, a conformance
//! file, its server's packages in `scripts/install`, a column of the
//! guarantee doc, a row of the README's engine table) is held to it here,
//! so a new engine that misses one fails with the place named.

#![cfg(feature = "all-engines")]

use std::path::Path;

use dlock_testkit::workspace_file as read;

/// The lines of `manifest`'s `[features]` table.
fn features(manifest: &str) -> Vec<String> {
    read(manifest)
        .lines()
        .skip_while(|line| *line != "[features]")
        .skip(1)
        .take_while(|line| !line.starts_with('['))
        .map(str::to_owned)
        .collect()
}

fn declares(features: &[String], feature: &str) -> bool {
    features
        .iter()
        .any(|line| line.starts_with(&format!("{feature} = ")))
}

#[test]
fn every_registered_kind_is_a_row_of_the_table_and_back() {
    let mut registered = dlock::engines::kinds().names();
    let mut listed: Vec<&str> = dlock::engines::ENGINES
        .iter()
        .flat_map(|(_, kinds)| kinds.iter().copied())
        .collect();
    registered.sort_unstable();
    listed.sort_unstable();
    assert_eq!(
        registered, listed,
        "the modules register other kinds than the table lists"
    );
}

#[test]
fn each_engine_has_its_features_fixture_and_doc_column() {
    let engines_crate = features("dlock-engines/Cargo.toml");
    let facade = features("Cargo.toml");
    let testkit = features("dlock-testkit/Cargo.toml");
    let all = facade
        .iter()
        .find(|line| line.starts_with("all-engines = "))
        .expect("the facade's all-engines feature");
    let readme = read("README.md");
    // The first cell of each row of the README's engine table: its kinds.
    let readme_rows: Vec<&str> = readme
        .lines()
        .filter_map(|line| line.strip_prefix("| `")?.split(" | ").next())
        .collect();
    let doc = read("docs/guarantees.md");
    let doc_header = doc
        .lines()
        .find(|l| l.starts_with("| guarantee |"))
        .expect("the guarantee table");
    for (feature, kinds) in dlock::engines::ENGINES {
        assert!(
            declares(&engines_crate, feature),
            "dlock-engines/Cargo.toml has no feature {feature}"
        );
        assert!(
            declares(&facade, feature),
            "Cargo.toml (the facade) has no feature {feature}"
        );
        assert!(
            all.contains(&format!("\"{feature}\"")),
            "all-engines leaves out {feature}"
        );
        assert!(
            declares(&testkit, feature),
            "dlock-testkit/Cargo.toml has no feature {feature}"
        );
        let fixture =
            Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("dlock-testkit/src/fixtures/{feature}.rs"));
        assert!(
            fixture.exists(),
            "no fixture for {feature}: {}",
            fixture.display()
        );
        for kind in *kinds {
            let conformance = format!("tests/conformance_{}.rs", kind.replace('-', "_"));
            assert!(
                Path::new(env!("CARGO_MANIFEST_DIR")).join(&conformance).exists()
                    && read(&conformance).contains("conformance_suite!("),
                "{kind} has no conformance file running the suite: {conformance}"
            );
            assert!(
                doc_header.contains(&format!(" {kind} (")) || doc_header.contains(&format!(" {kind},")),
                "docs/guarantees.md has no column for {kind}"
            );
            assert!(
                readme_rows
                    .iter()
                    .any(|kinds| format!("`{kinds}").contains(&format!("`{kind}`"))),
                "README.md's engine table leaves out {kind}"
            );
        }
    }
}

/// The files outside its folder in which a new engine writes code of its
/// own, as `docs/writing-an-engine.md` lists them: `<engine>` and `<kind>`
/// stand for its names.
const CODE_OUTSIDE_ITS_FOLDER: &[&str] = &[
    "dlock-engines/src/lib.rs",
    "dlock-testkit/src/fixtures/<engine>.rs",
    "dlock-testkit/src/fixtures/mod.rs",
    "tests/conformance_<kind>.rs",
];

/// The places it is named in besides, each held to the `engines!` row or
/// the fixture by a test here: its cargo feature in three manifests, its
/// server's packages, its guarantee column and its README line.
const CHECKED_OUTSIDE_ITS_FOLDER: &[&str] = &[
    "dlock-engines/Cargo.toml",
    "Cargo.toml",
    "dlock-testkit/Cargo.toml",
    "scripts/install",
    "docs/guarantees.md",
    "README.md",
];

#[test]
fn a_new_engine_writes_code_in_four_files_outside_its_folder() {
    let guide = read("docs/writing-an-engine.md");
    let section = guide
        .split("## An engine inside this repository: the files it touches")
        .nth(1)
        .expect("the guide's section on the files an engine touches");
    for file in CODE_OUTSIDE_ITS_FOLDER.iter().chain(CHECKED_OUTSIDE_ITS_FOLDER) {
        assert!(
            section.contains(&format!("`{file}`")),
            "the guide leaves out {file}"
        );
    }
    assert!(CODE_OUTSIDE_ITS_FOLDER.len() <= 4, "{CODE_OUTSIDE_ITS_FOLDER:?}");
    // The suites beyond conformance take their engines from `every_setup!`
    // alone: no test file names a fixture of its own.
    for suite in [
        "dlock-testkit/tests/faults.rs",
        "dlock-testkit/tests/random_faults.rs",
        "tests/operator.rs",
    ] {
        let text = read(suite);
        assert!(
            text.contains("every_setup!("),
            "{suite} does not run on every setup"
        );
        for (feature, _) in dlock::engines::ENGINES {
            let suite_of_its_own = format!("_suite!(dlock_testkit::fixtures::{feature}::");
            assert!(
                !text.contains(&suite_of_its_own),
                "{suite} lists {feature} by hand"
            );
        }
    }
}

#[test]
fn scripts_install_provides_what_every_setup_needs() {
    let install = read("scripts/install");
    let mut checked = Vec::new();
    macro_rules! provided {
        ($name:ident, $fixture:ty, $feature:literal) => {
            for need in <$fixture as dlock_testkit::Fixture>::INSTALLED {
                assert!(
                    install.contains(&format!("\"{need}:")),
                    "scripts/install does not provide {need} for {}",
                    stringify!($name)
                );
            }
            checked.push(stringify!($name));
        };
    }
    dlock_testkit::every_setup!(provided);
    assert_eq!(checked.len(), 11, "{checked:?}");
}

/// No engine asks a request what it is: the core picks the lifecycle by
/// the request's kind, once, and a permit's lifecycle knows its count. So
/// a new kind of request touches the engines that serve it, and no
/// method's branches in the others. Only a campaign's layout (etcd's and
/// ZooKeeper's elections) reads the kind, in one place per engine; a held
/// write learns whether its hold is a permit's from the core
/// (`HeldBy::is_permit`).
#[test]
fn engines_never_branch_on_the_kind_of_request() {
    for (feature, _) in dlock::engines::ENGINES {
        let mut campaign_reads = 0;
        for (path, text) in engine_sources(feature) {
            for asked in ["req.kind", "Kind::", ".permits()"] {
                assert!(
                    !mentions(&text, asked),
                    "{path} asks a request what it is: `{asked}`"
                );
            }
            campaign_reads += text.matches("is_campaign()").count();
        }
        assert!(
            campaign_reads <= 1,
            "{feature} reads whether a request is a campaign in {campaign_reads} places"
        );
    }
}

/// Whether `text` has `word` where no name runs into its start
/// (`Kind::`, but not `ErrorKind::`).
fn mentions(text: &str, word: &str) -> bool {
    text.match_indices(word).any(|(at, _)| {
        !text[..at]
            .chars()
            .next_back()
            .is_some_and(|c| c.is_alphanumeric() || c == '_')
    })
}

/// Each engine's Rust files, with their text.
fn engine_sources(feature: &str) -> Vec<(String, String)> {
    let folder = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("dlock-engines/src/{feature}"));
    let mut files: Vec<_> = std::fs::read_dir(folder)
        .expect("the engine's folder")
        .map(|entry| entry.expect("entry").path())
        .filter(|path| path.extension().is_some_and(|e| e == "rs"))
        .collect();
    files.sort();
    files
        .into_iter()
        .map(|path| {
            let text = std::fs::read_to_string(&path).expect("source");
            (path.display().to_string(), text)
        })
        .collect()
}

/// Each engine offers its facets with `..Facets::default()`, so a facet
/// added to the kit later is missing on it, not a compile error to fix in
/// every engine.
#[test]
fn a_new_facet_touches_no_engine() {
    for (feature, _) in dlock::engines::ENGINES {
        let module = read(&format!("dlock-engines/src/{feature}/mod.rs"));
        let Some(facets) = module.split("fn facets(&self) -> Facets<'_> {").nth(1) else {
            continue;
        };
        let literal = facets.split("\n    }\n").next().unwrap_or_default();
        assert!(
            literal.contains("..Facets::default()"),
            "{feature}'s facets name every field: a new facet would have to edit it"
        );
    }
}
