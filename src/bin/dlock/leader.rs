//! `dlock leader`: who leads an election, and with `--watch`, each change.

use std::io::Write;
use std::process::ExitCode;
use std::time::SystemTime;

use dlock::{Election, Error, Leader};
use serde_json::json;

use crate::show;

/// Prints who leads `election` (exit 3 if nobody does); with `watch`, each
/// change after, until stdout closes.
pub async fn run(election: &Election, watch: bool, json: bool) -> Result<ExitCode, Error> {
    let whole = format!("{}/{}", election.group(), election.name());
    let mut observer = election.observe();
    loop {
        let leader = observer.next().await?;
        let shown = if json {
            as_json(&whole, leader.as_ref())
        } else {
            line(&whole, leader.as_ref())
        };
        if writeln!(std::io::stdout(), "{shown}").is_err() {
            return Ok(ExitCode::SUCCESS);
        }
        if !watch {
            return Ok(if leader.is_some() {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(3)
            });
        }
    }
}

/// `scheduler/leader: billing 7, term 42`, or `... : nobody leads`.
fn line(whole: &str, leader: Option<&Leader>) -> String {
    let whole = show::escaped(whole);
    match leader {
        Some(leader) => {
            let label = leader
                .label
                .as_deref()
                .map_or_else(|| "(no label)".to_owned(), show::escaped);
            format!("{whole}: {label}, term {}", leader.term)
        }
        None => format!("{whole}: nobody leads"),
    }
}

/// `{"election": ..., "leader": label, "term": n, "since": ms}`, the
/// last three `null` while nobody leads.
fn as_json(whole: &str, leader: Option<&Leader>) -> String {
    let since = leader
        .and_then(|l| l.since)
        .and_then(|t| t.duration_since(SystemTime::UNIX_EPOCH).ok())
        .map(|d| d.as_millis() as u64);
    json!({
        "election": whole,
        "leader": leader.and_then(|l| l.label.clone()),
        "term": leader.map(|l| l.term),
        "since": since,
    })
    .to_string()
}
