//! The README and the crate docs (`src/lib.rs`) say some things twice: the
//! engine table, the guarantees in short, the metric series, the
//! attribute's options. Here they are held to each
//! other, and to `docs/guarantees.md`, whose capability row a running
//! engine checks.

use std::path::Path;

fn read(path: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(path);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
}

/// The cells of a table row.
fn cells(row: &str) -> Vec<String> {
    row.trim()
        .trim_matches('|')
        .split(" | ")
        .map(|cell| cell.trim().to_owned())
        .collect()
}

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
    let header = cells(
        doc.lines()
            .find(|l| l.starts_with("| guarantee |"))
            .expect("header"),
    );
    let declared = cells(
        doc.lines()
            .find(|l| l.starts_with("| capabilities "))
            .expect("the capability row"),
    );
    let cell_of = |kind: &str| -> &str {
        let column = header
            .iter()
            .position(|head| {
                head.split(" (")
                    .next()
                    .unwrap_or_default()
                    .split(", ")
                    .any(|k| k == kind)
            })
            .unwrap_or_else(|| panic!("no column of the guarantee table names {kind}"));
        &declared[column]
    };
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
                    cell_of(&kind).contains(word),
                    "src/lib.rs says {kind} has `{word}`; docs/guarantees.md says {}",
                    cell_of(&kind)
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
    let ui = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/ui");
    let said = std::fs::read_dir(&ui)
        .expect("tests/ui")
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
        "README.md quotes another error than tests/ui holds: {said}"
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
