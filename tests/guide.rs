//! The README and the crate docs (`src/lib.rs`) say some things twice: the
//! engine table, the guarantees in short, the metric series, the
//! attribute's options, the configuration; and the README's sketches call
//! only what dlock has. Here they are held to each
//! other, and to `docs/guarantees.md`, whose capability row a running
//! engine checks.

use std::path::Path;

use dlock_testkit::{documented_capabilities, table_cells as cells, workspace_file as read};

/// The rows of the table whose header starts with `header`, in `text`
/// (the crate docs' `//! ` taken off).
fn table(text: &str, header: &str) -> Vec<Vec<String>> {
    let lines: Vec<&str> = text
        .lines()
        .map(|line| line.strip_prefix("//! ").unwrap_or(line))
        .collect();
    let start = lines
        .iter()
        .position(|line| line.starts_with(header))
        .unwrap_or_else(|| panic!("no table headed {header}"));
    lines[start + 2..]
        .iter()
        .take_while(|line| line.starts_with('|'))
        .map(|row| cells(row))
        .collect()
}

/// The backticked kinds of a first cell.
fn kinds(cell: &str) -> Vec<String> {
    cell.split('`').skip(1).step_by(2).map(str::to_owned).collect()
}

#[test]
fn the_readme_and_the_crate_docs_list_the_same_engines_alike() {
    let readme = table(&read("README.md"), "| `kind` | cargo feature |");
    let docs = table(
        &read("src/lib.rs"),
        "| kind | cargo feature | server | semaphores |",
    );
    let rows = |table: &[Vec<String>]| -> Vec<(String, String, String)> {
        table
            .iter()
            .map(|r| (r[0].clone(), r[1].clone(), r[3].clone()))
            .collect()
    };
    assert_eq!(
        rows(&readme),
        rows(&docs),
        "kind, cargo feature and semaphores differ between README.md and src/lib.rs"
    );
    let listed: Vec<String> = readme.iter().flat_map(|row| kinds(&row[0])).collect();
    let mut built: Vec<String> = dlock::engines::ENGINES
        .iter()
        .flat_map(|(_, kinds)| kinds.iter().map(|kind| kind.to_string()))
        .collect();
    let mut listed_sorted = listed.clone();
    listed_sorted.sort();
    built.sort();
    assert_eq!(listed_sorted, built, "the engine table and the engines differ");
}

#[test]
fn the_crate_docs_guarantees_in_short_are_the_guarantee_docs() {
    let doc = read("docs/guarantees.md");
    let short = table(&read("src/lib.rs"), "| kind | capabilities |");
    assert!(!short.is_empty());
    for row in short {
        // What is said in parentheses is a note, not a capability's words.
        let words: String = row[1]
            .split('(')
            .map(|part| part.split_once(')').map_or(part, |(_, rest)| rest))
            .collect();
        for kind in kinds(&row[0]) {
            for word in words.split(", ").map(str::trim) {
                assert!(
                    documented_capabilities(&doc, &kind).contains(word),
                    "src/lib.rs says {kind} has `{word}`; docs/guarantees.md says {}",
                    documented_capabilities(&doc, &kind)
                );
            }
        }
    }
}

#[test]
fn the_readme_names_the_metric_series_the_crate_docs_describe() {
    let series = |text: &str| -> Vec<String> {
        let mut names: Vec<String> = text
            .split('`')
            .skip(1)
            .step_by(2)
            .filter(|code| code.starts_with("dlock_"))
            .map(|code| code.split('{').next().unwrap_or_default().to_owned())
            .collect();
        names.sort();
        names.dedup();
        names
    };
    let readme = read("README.md");
    let readme = readme
        .split("## Metrics")
        .nth(1)
        .and_then(|rest| rest.split("\n## ").next())
        .expect("the README's metrics section");
    let docs = read("src/lib.rs");
    let docs = docs
        .split("//! # Metrics")
        .nth(1)
        .and_then(|rest| rest.split("//! # ").next())
        .expect("the crate docs' metrics section");
    assert_eq!(series(readme), series(docs));
    assert_eq!(series(readme).len(), 6, "{:?}", series(readme));
}

#[test]
fn the_attributes_options_are_named_as_the_compiler_names_them() {
    // What the compiler says to a misspelt option: the one list of them.
    let ui = Path::new(env!("CARGO_MANIFEST_DIR")).join("dlock-macros/tests/ui");
    let said = std::fs::read_dir(&ui)
        .expect("dlock-macros/tests/ui")
        .filter_map(|entry| std::fs::read_to_string(entry.ok()?.path()).ok())
        .flat_map(|text| text.lines().map(str::to_owned).collect::<Vec<_>>())
        .find(|line| line.contains("unknown option `grup`"))
        .expect("a ui test of a misspelt option");
    let options: Vec<&str> = said
        .split("options are: ")
        .nth(1)
        .expect("the list")
        .split(", ")
        .collect();
    assert!(options.len() >= 13, "{options:?}");
    let readme = read("README.md");
    assert!(
        readme.lines().any(|line| line.eq_ignore_ascii_case(&said)),
        "README.md quotes another error than dlock-macros/tests/ui holds: {said}"
    );
    let attribute_docs = read("dlock-macros/src/lib.rs");
    let docs = read("src/lib.rs");
    let docs_options = docs
        .split("Options:")
        .nth(1)
        .and_then(|rest| rest.split("defaults.").next())
        .expect("the crate docs' options");
    for option in options {
        let named =
            |text: &str| text.contains(&format!("`{option}`")) || text.contains(&format!("`{option} = "));
        assert!(named(&readme), "README.md never names `{option}`");
        assert!(
            named(&attribute_docs),
            "the attribute's docs never name `{option}`"
        );
        assert!(
            docs_options.contains(&format!("`{option}`")),
            "the crate docs' options leave out `{option}`"
        );
    }
}

/// The body of the first ```` ```lang ```` block after `heading` in `text`
/// (the crate docs' `//! ` taken off).
fn block_after(text: &str, heading: &str, lang: &str) -> String {
    let text: String = text
        .lines()
        .map(|line| {
            line.strip_prefix("//! ")
                .or(line.strip_prefix("//!"))
                .unwrap_or(line)
        })
        .map(|line| format!("{line}\n"))
        .collect();
    let after = text
        .split(heading)
        .nth(1)
        .unwrap_or_else(|| panic!("no {heading}"));
    let body = after.split(&format!("```{lang}\n")).nth(1).expect("a block");
    body.split("```").next().unwrap_or_default().to_owned()
}

#[test]
fn the_readme_and_the_crate_docs_configure_alike_and_validly() {
    let readme = block_after(&read("README.md"), "## Configuration", "toml");
    let docs = block_after(&read("src/lib.rs"), "# Configuration", "toml");
    assert_eq!(readme, docs, "README.md and src/lib.rs show other configs");
    let config = dlock::Config::parse(&readme, std::iter::empty()).expect("the shown config is valid");
    assert_eq!(config.groups.len(), 1);
}

/// What the README's sketches call that is not dlock's: the user's own
/// code, axum's, etcd-client's and the standard library's.
const NOT_DLOCKS: &[&str] = &["and_then", "nest_service", "send_due", "to_string", "unwrap"];

#[test]
fn the_readmes_sketches_call_only_what_dlock_has() {
    let readme = read("README.md");
    let mut sources = String::new();
    for dir in ["src", "dlock-core/src", "dlock-engines/src", "dlock-macros/src"] {
        let mut stack = vec![Path::new(env!("CARGO_MANIFEST_DIR")).join(dir)];
        while let Some(path) = stack.pop() {
            if path.is_dir() {
                stack.extend(
                    std::fs::read_dir(&path)
                        .expect("dir")
                        .map(|e| e.expect("entry").path()),
                );
            } else if path.extension().is_some_and(|ext| ext == "rs") {
                sources.push_str(&std::fs::read_to_string(&path).expect("source"));
            }
        }
    }
    let sketches: Vec<&str> = readme
        .split("```rust\n")
        .skip(1)
        .filter_map(|b| b.split("```").next())
        .collect();
    assert!(sketches.len() >= 6, "{}", sketches.len());
    let mut called = Vec::new();
    for sketch in sketches {
        for piece in sketch.split('(').filter(|piece| !piece.is_empty()) {
            let name: String = piece
                .chars()
                .rev()
                .take_while(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '_')
                .collect::<String>()
                .chars()
                .rev()
                .collect();
            let before = piece[..piece.len() - name.len()].chars().last();
            // A method (`.name(`) or a function of dlock's (`dlock::name(`).
            let is_call =
                matches!(before, Some('.')) || piece[..piece.len() - name.len()].ends_with("dlock::");
            if is_call && !name.is_empty() {
                called.push(name);
            }
        }
    }
    called.sort();
    called.dedup();
    assert!(called.len() >= 15, "{called:?}");
    for name in called {
        let defined = sources.contains(&format!("fn {name}(")) || sources.contains(&format!("fn {name}<"));
        assert!(
            defined || NOT_DLOCKS.contains(&name.as_str()),
            "README.md calls `{name}`, which dlock does not define"
        );
    }
}

#[test]
fn the_readmes_example_commands_name_real_features() {
    let readme = read("README.md");
    let examples = read("examples/Cargo.toml");
    let facade = read("Cargo.toml");
    let mut checked = 0;
    // Each `cargo run` of the README, inline or in a block, up to its end,
    // a closing backtick or a comment.
    let commands = readme.lines().filter_map(|line| {
        let command = &line[line.find("cargo run")?..];
        Some(command.split(['`', '#']).next().unwrap_or_default().trim())
    });
    for command in commands.filter(|command| command.contains("--example ")) {
        assert!(
            command.contains("-p dlock-examples"),
            "the examples' package is not named: {command}"
        );
        let example = command
            .split("--example ")
            .nth(1)
            .and_then(|rest| rest.split(' ').next())
            .expect("an example");
        assert!(
            examples.contains(&format!("name = \"{example}\"")),
            "no example {example}: {command}"
        );
        if let Some(features) = command.split("--features ").nth(1) {
            let feature = features.split(' ').next().unwrap_or_default();
            let (dependency, feature) = feature.split_once('/').expect("a dependency's feature");
            assert!(
                examples.contains(&format!("\n{dependency} = ")),
                "examples/Cargo.toml has no dependency {dependency}"
            );
            assert!(
                facade.contains(&format!("\n{feature} = ")),
                "the facade has no feature {feature}"
            );
        }
        checked += 1;
    }
    assert_eq!(checked, 4, "the README's example commands");
}
