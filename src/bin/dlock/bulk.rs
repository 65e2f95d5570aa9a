//! `release --force` of many locks at once, picked by who holds them: what
//! is left after a process crashed holding thousands, which one call per
//! lock by hand would take minutes to clear.

use std::io::Write;
use std::process::ExitCode;

use dlock::{Acted, Error, LockView, Only, Reached, Registry};
use futures_util::StreamExt;

use crate::show;

/// Acts in flight at once: enough to hide round trips, few enough not to
/// crowd the server.
const IN_FLIGHT: usize = 32;

/// Which holds a bulk release picks, in GROUP or every group the config
/// names; with several, a hold must match all.
#[derive(clap::Args)]
pub struct Bulk {
    /// Every hold whose holder's label is LABEL (its `client_name`, by
    /// default `<host>:<pid>`): a crashed process's.
    #[arg(long)]
    pub label: Option<String>,
    /// Every hold of this owner digest.
    #[arg(long, value_name = "DIGEST")]
    pub owner: Option<String>,
    /// Every hold of a lock or semaphore whose name starts with PREFIX.
    #[arg(long)]
    pub prefix: Option<String>,
    /// Show the holds it would force out, and force out none.
    #[arg(long)]
    pub dry_run: bool,
}

impl Bulk {
    /// Whether a bulk release was asked for.
    pub fn is_asked(&self) -> bool {
        self.label.is_some() || self.owner.is_some() || self.prefix.is_some()
    }

    /// The views of locks and semaphores in `views` with the holds picked,
    /// and no others. Only dlock's holds: another client's hold has no
    /// owner to check the act against.
    pub fn picked(&self, views: Vec<LockView>) -> Vec<LockView> {
        let named = |view: &LockView| {
            self.prefix
                .as_ref()
                .is_none_or(|p| view.name.starts_with(p.as_str()))
        };
        let views = views.into_iter().filter(named);
        let picked = views.map(|mut view| {
            view.waiters.clear();
            view.holders.retain(|h| {
                h.owner.is_some()
                    && self.label.as_ref().is_none_or(|l| h.label.as_ref() == Some(l))
                    && self.owner.as_ref().is_none_or(|o| h.owner.as_ref() == Some(o))
            });
            view
        });
        picked.filter(|view| !view.holders.is_empty()).collect()
    }
}

/// Forces out each hold of `picked` (a lock's, or a semaphore's permit),
/// only while it is the hold that was listed (its fence and owner),
/// [`IN_FLIGHT`] at a time: what each act reached, or why it failed, in
/// the order of `picked`.
pub async fn release(registry: &Registry, picked: Vec<LockView>, by: &str) -> Vec<Result<Acted, Error>> {
    let acts = picked.into_iter().flat_map(|view| {
        let lock = registry.locks(&view.group).get(view.name.clone()).by(by);
        let semaphore = view
            .permits
            .map(|n| registry.locks(&view.group).semaphore(view.name.clone(), n).by(by));
        view.holders.into_iter().map(move |holder| {
            let (lock, semaphore) = (lock.clone(), semaphore.clone());
            let whole = format!("{}/{}", view.group, view.name);
            async move {
                let only = Only {
                    fence: holder.fence,
                    owner: holder.owner,
                };
                let forced = match semaphore {
                    Some(semaphore) => semaphore.force_release_only(&only).await?,
                    None => lock.force_release_only(&only).await?,
                };
                Ok(Acted {
                    lock: whole,
                    reached: Reached::ForcedOut(forced),
                })
            }
        })
    });
    futures_util::stream::iter(acts)
        .buffered(IN_FLIGHT)
        .collect()
        .await
}

/// Prints what a bulk release did: a line per act (or, with `json`, one
/// array of them), each failure on stderr, and a total; exits 1 if any
/// failed, 3 if none forced a holder out, else 0.
pub fn report(acts: Vec<Result<Acted, Error>>, json: bool) -> ExitCode {
    let (done, failed): (Vec<_>, Vec<_>) = acts.into_iter().partition(Result::is_ok);
    let done: Vec<Acted> = done.into_iter().flatten().collect();
    for error in failed.iter().filter_map(|act| act.as_ref().err()) {
        eprintln!("dlock: {error}");
    }
    let forced: u32 = done.iter().map(Acted::holders).sum();
    let mut out = std::io::stdout().lock();
    // A reader that stopped early (`| head`) is no failure of the command.
    let _ = if json {
        writeln!(out, "{}", serde_json::to_string(&done).expect("acts serialize"))
    } else {
        let lines = done.iter().map(|acted| {
            let lock = show::escaped(&acted.lock);
            Acted {
                lock,
                ..acted.clone()
            }
            .to_string()
        });
        let reached = done.iter().filter(|acted| acted.holders() > 0);
        let locks = reached
            .map(|acted| &acted.lock)
            .collect::<std::collections::HashSet<_>>()
            .len();
        let total = format!("forced out {forced} holder(s) of {locks} lock(s)");
        writeln!(out, "{}", lines.chain([total]).collect::<Vec<_>>().join("\n"))
    };
    match (failed.is_empty(), forced) {
        (false, _) => ExitCode::from(1),
        (true, 0) => ExitCode::from(3),
        (true, _) => ExitCode::SUCCESS,
    }
}
