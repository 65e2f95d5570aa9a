//! `dlock`: who holds which lock and who waits, from the command line,
//! through the config file and `DLOCK_*` variables the application reads.

mod bulk;
mod leader;
mod show;
mod watch;

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use bulk::Bulk;
use clap::{Parser, Subcommand};
use dlock::{Acted, Config, Cycle, Error, LockView, Locks, Only, Reached, Registry};

const EXIT_CODES: &str = "\
Exit codes:
  0  done; `show`: someone holds or waits
  1  an engine could not answer (unreachable, or it cannot do what was asked)
  2  bad usage or bad config
  3  nothing held: `show` found the lock free, `locks` found no lock held,
     `deadlocks` found no cycle,
     `release` and `revoke` found no holder (with --if-fence or --if-owner:
     none with that fence or owner, so whoever holds now was left alone)";

/// Who holds which lock, who waits, since when; and letting a stuck lock go.
#[derive(Parser)]
#[command(name = "dlock", version, after_help = EXIT_CODES)]
struct Cli {
    /// The application's config file; `DLOCK_*` variables override it, as
    /// in the application. Without this option, `dlock.toml` if it exists,
    /// else the `DLOCK_*` variables alone. It must name an engine: the
    /// embedded memory engine lives in one process, and would show every
    /// lock free.
    #[arg(long, short, global = true)]
    config: Option<PathBuf>,
    /// JSON instead of a table, for scripts.
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// The locks and semaphores someone holds or waits for, in GROUP, or
    /// in every group the config names.
    Locks { group: Option<String> },
    /// Who holds GROUP/NAME, and who waits for it; with the lock free, a
    /// held semaphore of that name too.
    Show {
        /// GROUP/NAME; the name may hold further slashes.
        lock: String,
        /// Show the semaphore of NAME with this many permits, not its lock.
        #[arg(long)]
        permits: Option<u32>,
    },
    /// Ends every hold of GROUP/NAME on the server so its next waiter gets
    /// in. Each old holder learns it at its next renewal; the next
    /// holder's fencing token is greater, so storage that checks tokens
    /// refuses the old holder's writes. With --label, --owner or --prefix,
    /// the holds they pick, in GROUP or every group the config names, each
    /// only while it is the hold that was listed.
    Release {
        /// GROUP/NAME; with --label, --owner or --prefix, GROUP or nothing.
        lock: Option<String>,
        /// Required: this takes the lock from a holder that may be alive.
        #[arg(long)]
        force: bool,
        #[command(flatten)]
        only: Aim,
        #[command(flatten)]
        bulk: Bulk,
    },
    /// Each change to GROUP's locks and semaphores, or to GROUP/NAME, as
    /// it happens, until interrupted: taken, released (or forced out),
    /// expired, waiting, gave up; the holds and waits there now first. Found
    /// by reading the records at each change the engine's own watch hears
    /// (etcd, ZooKeeper), and every --every ms.
    Watch {
        /// GROUP, or GROUP/NAME.
        target: String,
        /// With GROUP/NAME: its semaphore of this many permits.
        #[arg(long)]
        permits: Option<u32>,
        /// Milliseconds between reads of the records, changes heard or not.
        #[arg(long, value_name = "MS", default_value_t = 250)]
        every: u64,
    },
    /// Who leads the election GROUP/NAME, as `etcdctl elect -l` answers:
    /// the leader's value or label, its term and since when; exit 3 if
    /// nobody leads. With --watch, each change of leader after, until
    /// interrupted.
    Leader {
        /// GROUP/NAME.
        election: String,
        #[arg(long)]
        watch: bool,
    },
    /// The cycles of waits between tasks holding locks, in every engine
    /// whose records can be listed, or those through a lock of GROUP: each
    /// lock, its holder's label and owner digest, what it waits for. A
    /// wait shows once it has lasted `deadlock_check`; the cycle's youngest
    /// wait gives up with `Error::Deadlock`, and the cycle is gone.
    Deadlocks { group: Option<String> },
    /// Asks every holder of GROUP/NAME to let go; each hears it at once
    /// where its engine tells holders (docs/guarantees.md says which),
    /// else at its next renewal, and lets go as its code decides.
    Revoke {
        /// GROUP/NAME.
        lock: String,
        #[command(flatten)]
        only: Aim,
    },
}

/// The hold an act is for, as `show` printed it. The engine checks it as
/// it acts: if the lock changed hands since, the new holder keeps it and
/// the command finds no holder (exit 3).
#[derive(clap::Args)]
struct Aim {
    /// Act on the semaphore of NAME with this many permits, not its lock
    /// (with --if-owner, on one permit's holder).
    #[arg(long)]
    permits: Option<u32>,
    /// Only the hold with this fencing token.
    #[arg(long, value_name = "FENCE")]
    if_fence: Option<u64>,
    /// Only the hold of this owner digest (8 hex digits).
    #[arg(long, value_name = "DIGEST")]
    if_owner: Option<String>,
}

impl Aim {
    fn only(&self) -> Only {
        Only {
            fence: self.if_fence,
            owner: self.if_owner.clone(),
        }
    }

    /// Forces out (`force`) or asks to let go the holds of `name` in
    /// `locks` this aims at; how many it reached.
    async fn act(&self, locks: &Locks, name: &str, force: bool) -> Result<u32, Error> {
        let only = self.only();
        match self.permits {
            Some(n) => {
                let semaphore = locks.semaphore(name, n).by(operator());
                match force {
                    true => semaphore.force_release_only(&only).await,
                    false => semaphore.revoke_only(&only).await,
                }
            }
            None => {
                let lock = locks.get(name).by(operator());
                match force {
                    true => lock.force_release_only(&only).await,
                    false => lock.revoke_only(&only).await,
                }
            }
        }
    }
}

/// What a command found or did.
enum Outcome {
    Views(Vec<LockView>),
    /// How many holders a force release or revocation reached.
    Acted(Acted),
    /// What each act of a bulk release reached, or why it failed.
    Acts(Vec<Result<Acted, Error>>),
    /// A command that printed as it went, and how it ended.
    Printed(ExitCode),
    /// The cycles of waits found.
    Cycles(Vec<Cycle>),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build();
    let runtime = match runtime {
        Ok(runtime) => runtime,
        Err(e) => return fail(&Error::config("runtime", e.to_string())),
    };
    let (shown, nothing_held) = match runtime.block_on(run(&cli)) {
        Ok(Outcome::Views(views)) if cli.json => (
            serde_json::to_string_pretty(&views).expect("views serialize"),
            views.iter().all(LockView::is_free),
        ),
        Ok(Outcome::Views(views)) => (
            show::table(&views, std::time::SystemTime::now()),
            views.iter().all(LockView::is_free),
        ),
        Ok(Outcome::Acted(acted)) if cli.json => (
            serde_json::to_string(&acted).expect("an act serializes"),
            acted.holders() == 0,
        ),
        Ok(Outcome::Acted(acted)) => {
            let nothing = acted.holders() == 0;
            let lock = show::escaped(&acted.lock);
            (Acted { lock, ..acted }.to_string(), nothing)
        }
        Ok(Outcome::Acts(acts)) => return bulk::report(acts, cli.json),
        Ok(Outcome::Cycles(cycles)) if cli.json => (
            serde_json::to_string_pretty(&cycles).expect("cycles serialize"),
            cycles.is_empty(),
        ),
        Ok(Outcome::Cycles(cycles)) => (
            show::cycles(&cycles, std::time::SystemTime::now()),
            cycles.is_empty(),
        ),
        Ok(Outcome::Printed(code)) => return code,
        Err(e) => return fail(&e),
    };
    // A reader that stopped early (`| head`) is no failure of the command.
    let _ = writeln!(std::io::stdout().lock(), "{}", shown.trim_end());
    if nothing_held {
        ExitCode::from(3)
    } else {
        ExitCode::SUCCESS
    }
}

async fn run(cli: &Cli) -> Result<Outcome, Error> {
    let config = match &cli.config {
        Some(path) => Config::from_file(path)?,
        None if std::path::Path::new("dlock.toml").exists() => Config::from_file("dlock.toml")?,
        None => Config::parse("", std::env::vars())?,
    };
    if config.engines.is_empty() {
        let looked = match &cli.config {
            Some(path) => format!("{} names no engine", path.display()),
            None => {
                let here = std::env::current_dir().map_or_else(|_| ".".into(), |d| d.display().to_string());
                format!("no --config, no dlock.toml in {here}, and no engine in the DLOCK_* variables")
            }
        };
        return Err(Error::config(
            "engines",
            format!(
                "{looked}: the command would read an empty memory engine of its own and call every lock free; \
                 give the application's config (`--config FILE`), or an engine with `kind = \"memory\"` to mean it"
            ),
        ));
    }
    if let Command::Release { force: false, .. } = cli.command {
        return Err(Error::config(
            "--force",
            "`release` takes the lock from a holder that may be alive: say `release --force`",
        ));
    }
    if let Command::Release { bulk, only, .. } = &cli.command {
        if bulk.dry_run && !bulk.is_asked() {
            return Err(Error::config(
                "--dry-run",
                "shows what --label, --owner or --prefix would pick: give one",
            ));
        }
        if bulk.is_asked() && (only.if_fence.is_some() || only.if_owner.is_some() || only.permits.is_some()) {
            return Err(Error::config(
                "--if-fence",
                "--if-fence, --if-owner and --permits aim at one lock or semaphore; --label, --owner and --prefix pick locks' holds",
            ));
        }
    }
    let registry = Registry::build(&config, &dlock::engines::kinds()).await?;
    let views = match &cli.command {
        Command::Locks { group: Some(group) } => registry.locks(group).list().await?,
        Command::Locks { group: None } => {
            if config.groups.is_empty() {
                return Err(Error::config(
                    "groups",
                    "the config names no group: say which, as `dlock locks GROUP`",
                ));
            }
            let mut views = Vec::new();
            for group in config.groups.keys() {
                views.extend(registry.locks(group).list().await?);
            }
            views
        }
        Command::Show { lock, permits } => {
            let (group, name) = group_and_name(lock)?;
            let locks = registry.locks(group);
            match permits {
                Some(n) => vec![locks.semaphore(name, *n).inspect().await?],
                None => {
                    let view = locks.get(name).inspect().await?;
                    // A free lock may share its name with a held semaphore:
                    // show that too, found in the group's listing.
                    let mut views = vec![view];
                    if views[0].is_free() {
                        match locks.list().await {
                            Ok(listed) => views.extend(
                                listed
                                    .into_iter()
                                    .filter(|v| v.name == name && v.permits.is_some()),
                            ),
                            Err(_) => eprintln!(
                                "dlock: the lock is free; for a semaphore of this name, say `--permits N`"
                            ),
                        }
                    }
                    views
                }
            }
        }
        Command::Release { lock, bulk, .. } if bulk.is_asked() => {
            let groups: Vec<&str> = match lock {
                Some(group) if group.contains('/') => {
                    return Err(Error::config(
                        "GROUP",
                        format!(
                            "`{group}`: with --label, --owner or --prefix, give a group alone, or none for all"
                        ),
                    ));
                }
                Some(group) => vec![group],
                None => config.groups.keys().map(String::as_str).collect(),
            };
            let mut listed = Vec::new();
            for group in groups {
                listed.extend(registry.locks(group).list().await?);
            }
            let picked = bulk.picked(listed);
            if bulk.dry_run {
                return Ok(Outcome::Views(picked));
            }
            return Ok(Outcome::Acts(bulk::release(&registry, picked, &operator()).await));
        }
        Command::Release { lock, only, .. } => {
            let lock = lock
                .as_ref()
                .ok_or_else(|| Error::config("GROUP/NAME", "say which lock to release"))?;
            let (group, name) = group_and_name(lock)?;
            let reached = Reached::ForcedOut(only.act(&registry.locks(group), name, true).await?);
            return Ok(Outcome::Acted(Acted {
                lock: lock.clone(),
                reached,
            }));
        }
        Command::Watch {
            target,
            permits,
            every,
        } => {
            let every = std::time::Duration::from_millis(*every);
            return watch::run(&registry, target, *permits, every, cli.json)
                .await
                .map(Outcome::Printed);
        }
        Command::Leader { election, watch } => {
            let (group, name) = group_and_name(election)?;
            let election = registry.locks(group).election(name);
            return leader::run(&election, *watch, cli.json)
                .await
                .map(Outcome::Printed);
        }
        Command::Deadlocks { group } => {
            let cycles = match group {
                Some(group) => registry.locks(group).deadlocks().await?,
                None => registry.deadlocks().await?,
            };
            return Ok(Outcome::Cycles(cycles));
        }
        Command::Revoke { lock, only } => {
            let (group, name) = group_and_name(lock)?;
            let reached = Reached::Asked(only.act(&registry.locks(group), name, false).await?);
            return Ok(Outcome::Acted(Acted {
                lock: lock.clone(),
                reached,
            }));
        }
    };
    Ok(Outcome::Views(views))
}

/// Who acts, for the audit trail: the user, and this command's host and pid.
fn operator() -> String {
    let user = std::env::var("USER").or_else(|_| std::env::var("LOGNAME"));
    let user = user.unwrap_or_else(|_| "someone".to_owned());
    format!("{user} with the dlock command at {}", dlock::kit::process_label())
}

fn group_and_name(lock: &str) -> Result<(&str, &str), Error> {
    lock.split_once('/').ok_or_else(|| {
        Error::config(
            "GROUP/NAME",
            format!("`{lock}` has no `/` between group and name"),
        )
    })
}

/// The error on stderr, and its exit code: 2 for bad usage (a key that
/// cannot be one) or config, 1 for the rest.
fn fail(error: &Error) -> ExitCode {
    eprintln!("dlock: {error}");
    match error {
        Error::Config { .. } | Error::InvalidKey { .. } => ExitCode::from(2),
        _ => ExitCode::from(1),
    }
}
