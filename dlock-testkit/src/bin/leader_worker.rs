//! The election suite's worker process (`fault_suite/elections.rs` starts
//! several): a candidate that works while it leads, writing a fenced store
//! with its term, or an observer of who leads.
//!
//! ```text
//! leader_worker --config dlock.toml --store /tmp/r [--every-ms 20] [--observe 1]
//! ```
//!
//! A candidate runs `run_while_leader` for good: each term marks its
//! start and end in the store's journal, prints `leading <term>`, and
//! adds one to the store every `--every-ms`, printing `wrote <term>` after
//! each (so a test can pause it between writes, never inside the store's
//! file lock); a write the store refuses prints `refused <term>` and ends
//! the work. A term cancelled prints `stopped
//! <term>`. An observer prints `observed <term> <label>` for each leader
//! it is told of, and `observed none` when nobody leads, asking again
//! while the server is away.

use std::io::Write;
use std::process::ExitCode;
use std::time::Duration;

use dlock_testkit::store::FencedStore;
use dlock_testkit::worker_flags::Flags;

fn say(line: &str) {
    println!("{line}");
    let _ = std::io::stdout().flush();
}

/// Marks the term's end in the journal however its work ends, and says
/// `stopped` if it was cancelled.
struct Term<'a> {
    store: &'a FencedStore,
    term: u64,
    done: bool,
}

impl Drop for Term<'_> {
    fn drop(&mut self) {
        self.store.mark(self.term, "exit");
        if !self.done {
            say(&format!("stopped {}", self.term));
        }
    }
}

async fn lead(store: &FencedStore, term: u64, every: Duration) {
    store.mark(term, "enter");
    let mut inside = Term {
        store,
        term,
        done: false,
    };
    say(&format!("leading {term}"));
    loop {
        let written = store.read(term).and_then(|value| store.write(term, value + 1));
        if written.is_err() {
            say(&format!("refused {term}"));
            inside.done = true;
            return;
        }
        say(&format!("wrote {term}"));
        tokio::time::sleep(every).await;
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    let flags = match Flags::parse("leader_worker", &["observe", "every-ms"]) {
        Ok(flags) => flags,
        Err(code) => return code,
    };
    if let Err(code) = flags.connect().await {
        return code;
    }
    let election = dlock::election("elect", "leader");
    let ended: dlock::Error = if flags.number("observe", 0) == 1 {
        let mut observer = election.observe();
        loop {
            match observer.next().await {
                Ok(Some(leader)) => say(&format!(
                    "observed {} {}",
                    leader.term,
                    leader.label.unwrap_or_default()
                )),
                Ok(None) => say("observed none"),
                // A server away: ask again, as a dashboard would.
                Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        }
    } else {
        let store = FencedStore::open(&flags.store());
        let every = Duration::from_millis(flags.number("every-ms", 20));
        match election.run_while_leader(|term| lead(&store, term, every)).await {
            Ok(()) => return ExitCode::SUCCESS,
            Err(e) => e,
        }
    };
    eprintln!("leader_worker: {ended}");
    ExitCode::FAILURE
}
