//! The fault suite's harness: the paths a test gets from Cargo, a setup of
//! servers, store and workers, and the workers' reports.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use crate::Fixture;
use crate::printed::Printed;
use crate::store::{FencedStore, SlotStores};

/// Where a fault test keeps its files, and the worker binary it runs, both
/// as Cargo gives them to a test of this crate: made by [`paths!`](crate::paths).
#[derive(Clone)]
pub struct Paths {
    /// The test's target tmp dir.
    pub tmp: PathBuf,
    /// The `fault_worker` binary.
    pub worker: PathBuf,
    /// The `transfer_worker` binary.
    pub transfer_worker: PathBuf,
    /// The `permit_worker` binary.
    pub permit_worker: PathBuf,
    /// The `job_worker` binary.
    pub job_worker: PathBuf,
    /// The `leader_worker` binary.
    pub leader_worker: PathBuf,
}

impl Paths {
    /// Prints a measured figure and keeps it in `fault-figures.txt`, which
    /// `scripts/test` prints at the end.
    pub fn figure(&self, line: &str) {
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.tmp.join("fault-figures.txt"))
            .expect("figures");
        writeln!(file, "{line}").expect("write figure");
        println!("{line}");
    }
}

/// The [`Paths`] of the test that expands it (a test of this crate, where
/// Cargo builds the `fault_worker` binary first and names it).
#[macro_export]
macro_rules! paths {
    () => {
        $crate::fault_suite::Paths {
            tmp: env!("CARGO_TARGET_TMPDIR").into(),
            worker: env!("CARGO_BIN_EXE_fault_worker").into(),
            transfer_worker: env!("CARGO_BIN_EXE_transfer_worker").into(),
            permit_worker: env!("CARGO_BIN_EXE_permit_worker").into(),
            job_worker: env!("CARGO_BIN_EXE_job_worker").into(),
            leader_worker: env!("CARGO_BIN_EXE_leader_worker").into(),
        }
    };
}

/// A fresh fixture of `F`, a directory for its files, and config files
/// pointing workers at it.
pub struct Setup<F> {
    /// The engine's servers, for the scenario to kill, pause or restart.
    pub fixture: F,
    dir: PathBuf,
    pub(super) paths: Paths,
}

impl<F: Fixture> Setup<F> {
    /// Starts `F` for scenario `test`; files go under `paths.tmp`.
    pub fn start(paths: &Paths, test: &str) -> Self {
        let dir = paths
            .tmp
            .join(format!("faults-{}-{test}-{}", F::NAME, std::process::id()));
        std::fs::create_dir_all(&dir).expect("test dir");
        Setup {
            fixture: F::start(),
            dir,
            paths: paths.clone(),
        }
    }

    /// Config with a 1 s lease and this wait, written once (workers start
    /// at once and read it).
    pub fn config(&self, wait: &str) -> PathBuf {
        self.config_leased("1s", wait, "engine")
    }

    /// Config with this lease, wait and `queue` (`"engine"` or `"local"`),
    /// written once.
    pub fn config_leased(&self, lease: &str, wait: &str, queue: &str) -> PathBuf {
        let path = self.dir.join(format!("dlock-{lease}-{wait}-{queue}.toml"));
        if path.exists() {
            return path;
        }
        let text = format!(
            "[defaults]\nlease = \"{lease}\"\nwait = \"{wait}\"\nqueue = \"{queue}\"\n\n[engines.main]\n{}\n",
            self.fixture.engine_config()
        );
        std::fs::write(&path, text).expect("config");
        path
    }

    /// A fresh [`FencedStore`] named `name` in the scenario's directory,
    /// and its path for workers.
    pub fn store(&self, name: &str) -> (PathBuf, FencedStore) {
        let path = self.dir.join(name);
        let store = FencedStore::create(&path);
        (path, store)
    }

    /// A fresh, empty log named `name` in the scenario's directory: permit
    /// workers stamp their visits there, job workers their runs.
    pub fn log(&self, name: &str) -> PathBuf {
        let path = self.dir.join(name);
        let _ = std::fs::remove_file(&path);
        path
    }

    /// Fresh stores for the `permits` slots of the scenario's semaphore,
    /// and their path.
    pub fn slot_stores(&self, permits: u32) -> (PathBuf, SlotStores) {
        let path = self.dir.join("slots");
        (path.clone(), SlotStores::create(&path, permits))
    }

    /// Starts a permit worker with `config`, stamping `visits`, writing the
    /// slot stores at `slots`, and more arguments (`--permits 3`,
    /// `--stay-ms 20`, ...).
    pub fn permit_worker(&self, config: &Path, (visits, slots): (&Path, &Path), args: &[&str]) -> Worker {
        let slots = ["--slots", slots.to_str().expect("a path in UTF-8")];
        Worker::start(
            &self.paths.permit_worker,
            config,
            visits,
            &[&slots[..], args].concat(),
        )
    }

    /// Starts a worker with the 30 s wait config.
    pub fn worker(&self, store: &Path, args: &[&str]) -> Worker {
        self.worker_on(&self.config("30s"), store, args)
    }

    /// Starts a worker with `config` and `store`, and more arguments
    /// (`--tasks 4`, `--hold-ms 100`, ...).
    pub fn worker_on(&self, config: &Path, store: &Path, args: &[&str]) -> Worker {
        Worker::start(&self.paths.worker, config, store, args)
    }

    /// A worker whose clock is off by `offset` (`"+2h"`, `"-2h"`), through
    /// libfaketime preloaded (Debian `libfaketime`): its wall and monotonic
    /// clocks both.
    pub fn worker_with_clock(&self, offset: &str, config: &Path, store: &Path, args: &[&str]) -> Worker {
        Worker::launch(
            crate::server::with_clock(&self.paths.worker, offset),
            config,
            store,
            args,
        )
    }

    /// A `job_worker` whose clock is off by `offset` (`"+1.5"`: seconds),
    /// appending its runs to `runs`.
    pub fn job_worker(&self, offset: &str, config: &Path, runs: &Path, args: &[&str]) -> Worker {
        Worker::launch(
            crate::server::with_clock(&self.paths.job_worker, offset),
            config,
            runs,
            args,
        )
    }

    /// A `leader_worker` with `config` and `store`, and more arguments
    /// (`--observe 1`).
    pub fn leader_worker(&self, config: &Path, store: &Path, args: &[&str]) -> Worker {
        Worker::start(&self.paths.leader_worker, config, store, args)
    }

    /// Prints a measured figure and keeps it for `scripts/test` to print.
    pub fn figure(&self, line: String) {
        self.paths.figure(&format!("{}: {line}", F::NAME));
    }
}

/// A worker process and its output: a [`Printed`] that also reads the
/// workers' lines.
pub struct Worker(Printed);

impl std::ops::Deref for Worker {
    type Target = Printed;
    fn deref(&self) -> &Printed {
        &self.0
    }
}

impl std::ops::DerefMut for Worker {
    fn deref_mut(&mut self) -> &mut Printed {
        &mut self.0
    }
}

impl Worker {
    /// Starts the worker `binary` with `config` and `store`, and more
    /// arguments.
    pub fn start(binary: &Path, config: &Path, store: &Path, args: &[&str]) -> Self {
        Self::launch(Command::new(binary), config, store, args)
    }

    fn launch(mut command: Command, config: &Path, store: &Path, args: &[&str]) -> Self {
        command
            .arg("--config")
            .arg(config)
            .arg("--store")
            .arg(store)
            .args(args);
        Worker(Printed::spawn(&mut command))
    }

    /// The fences of the critical sections it entered since the last look,
    /// without waiting.
    pub fn entries(&self) -> Vec<u64> {
        self.news().0
    }

    /// What it printed since the last look, without waiting: the fences
    /// of the critical sections it entered, and how many writes of a
    /// permit holder whose permit was never lost the store refused
    /// (`sound-refused <fence>`).
    pub fn news(&self) -> (Vec<u64>, u64) {
        let printed = self.printed();
        let entered = printed
            .iter()
            .filter_map(|line| line.strip_prefix("entered ")?.parse().ok())
            .collect();
        let refused = printed
            .iter()
            .filter(|line| line.starts_with("sound-refused "))
            .count();
        (entered, refused as u64)
    }

    /// Waits until the worker's engine is connected (its `ready` line): a
    /// scenario that breaks the server breaks it for a worker that waits,
    /// not for one still starting up.
    pub fn ready(&self, within: Duration) {
        self.line("ready", within);
    }

    /// Waits for the next `entered <fence>` line; returns the fence.
    pub fn entered(&self, within: Duration) -> u64 {
        let (line, _) = self.line("entered ", within);
        line["entered ".len()..].parse().expect("fence")
    }

    /// Waits for the worker to exit and returns its summary counts.
    pub fn finish(self, within: Duration) -> Summary {
        let printed = finish_all(vec![self], within, false);
        Summary::from_lines(&printed[0])
    }
}

/// Waits for every worker to exit, within `within`, or, if
/// `progress_resets`, for as long as one of them prints a line within it;
/// returns the lines each printed.
pub(crate) fn finish_all(
    mut workers: Vec<Worker>,
    within: Duration,
    progress_resets: bool,
) -> Vec<Vec<String>> {
    let mut printed = vec![Vec::new(); workers.len()];
    let mut last = Instant::now();
    loop {
        let mut running = false;
        for (worker, lines) in workers.iter_mut().zip(&mut printed) {
            let new = worker.printed();
            if progress_resets && !new.is_empty() {
                last = Instant::now();
            }
            lines.extend(new);
            running |= worker.exited().is_none();
        }
        if !running {
            break;
        }
        if last.elapsed() > within {
            for worker in &mut workers {
                worker.kill();
            }
            let counts: Vec<usize> = printed.iter().map(Vec::len).collect();
            panic!("a worker hung: no line for {within:?}; lines printed by each: {counts:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    for (worker, lines) in workers.iter_mut().zip(&mut printed) {
        lines.extend(worker.rest());
        let status = worker.exited().expect("exited");
        let last = &lines[lines.len().saturating_sub(5)..];
        assert!(
            status.success(),
            "a worker ended with {status}; its last lines: {last:?}"
        );
    }
    printed
}

/// A worker's closing counts, one per critical section it tried.
#[derive(Clone, Debug, Default)]
pub struct Summary {
    /// Wrote the store one higher.
    pub bought: u64,
    /// Found the store at the limit and wrote nothing.
    pub sold_out: u64,
    /// The store refused its token as stale.
    pub refused: u64,
    /// Ended with `Error::Lost`.
    pub lost: u64,
    /// Ended with any other error.
    pub failed: u64,
    /// A permit holder's write refused while its permit was never lost.
    pub sound_refused: u64,
}

impl Summary {
    pub(super) fn from_lines(lines: &[String]) -> Self {
        let line = lines
            .iter()
            .find(|l| l.starts_with("bought="))
            .expect("worker summary");
        let mut s = Summary::default();
        for pair in line.split_whitespace() {
            let (name, n) = pair.split_once('=').expect("name=value");
            let n = n.parse().expect("count");
            match name {
                "bought" => s.bought = n,
                "sold_out" => s.sold_out = n,
                "refused" => s.refused = n,
                "lost" => s.lost = n,
                "failed" => s.failed = n,
                "sound_refused" => s.sound_refused = n,
                _ => {}
            }
        }
        s
    }
}
