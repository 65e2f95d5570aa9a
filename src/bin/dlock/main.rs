//! `dlock`: who holds which lock and who waits, from the command line,
//! through the config file and `DLOCK_*` variables the application reads.

mod show;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use dlock::{Config, Error, LockView, Registry};

const EXIT_CODES: &str = "\
Exit codes:
  0  done; `show`: someone holds or waits
  1  an engine could not answer (unreachable, or it keeps no such records)
  2  bad usage or bad config
  3  nothing held: `show` found the lock free, `locks` found no lock held";

/// Who holds which lock, who waits, since when.
#[derive(Parser)]
#[command(name = "dlock", version, after_help = EXIT_CODES)]
struct Cli {
    /// The application's config file; `DLOCK_*` variables override it, as
    /// in the application. Without this option, `dlock.toml` if it exists.
    #[arg(long, short)]
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
    /// Who holds GROUP/NAME, and who waits for it.
    Show {
        /// GROUP/NAME; the name may hold further slashes.
        lock: String,
        /// Show the semaphore of NAME with this many permits, not its lock.
        #[arg(long)]
        permits: Option<u32>,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build();
    let runtime = match runtime {
        Ok(runtime) => runtime,
        Err(e) => return fail(&Error::config("runtime", e.to_string())),
    };
    match runtime.block_on(run(&cli)) {
        Ok(views) => {
            if cli.json {
                let json = serde_json::to_string_pretty(&views).expect("views serialize");
                println!("{json}");
            } else {
                print!("{}", show::table(&views, std::time::SystemTime::now()));
            }
            if views.iter().all(LockView::is_free) {
                ExitCode::from(3)
            } else {
                ExitCode::SUCCESS
            }
        }
        Err(e) => fail(&e),
    }
}

async fn run(cli: &Cli) -> Result<Vec<LockView>, Error> {
    let config = match &cli.config {
        Some(path) => Config::from_file(path)?,
        None if std::path::Path::new("dlock.toml").exists() => Config::from_file("dlock.toml")?,
        None => Config::parse("", std::env::vars())?,
    };
    let registry = Registry::build(&config, &dlock::engines::kinds()).await?;
    match &cli.command {
        Command::Locks { group: Some(group) } => registry.locks(group).list().await,
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
            Ok(views)
        }
        Command::Show { lock, permits } => {
            let Some((group, name)) = lock.split_once('/') else {
                return Err(Error::config(
                    "GROUP/NAME",
                    format!("`{lock}` has no `/` between group and name"),
                ));
            };
            let locks = registry.locks(group);
            match permits {
                Some(n) => locks.semaphore(name, *n).inspect().await.map(|v| vec![v]),
                None => locks.get(name).inspect().await.map(|v| vec![v]),
            }
        }
    }
}

/// The error on stderr, and its exit code: 2 for config, 1 for the rest.
fn fail(error: &Error) -> ExitCode {
    eprintln!("dlock: {error}");
    match error {
        Error::Config { .. } => ExitCode::from(2),
        _ => ExitCode::from(1),
    }
}
