//! What the engine benches share: the `distributed-lock` peer process, the
//! figures' arithmetic and the rows of `scripts/bench`'s table. Each bench
//! uses part of it.

#![allow(dead_code)]

use std::fs::OpenOptions;
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// One side of an uncontended run.
pub struct Contender<'a> {
    pub name: &'a str,
    /// What dlock's ratio to it must be (dlock's own entry: `Target::None`).
    pub target: Target,
    /// The process its client runs in, when not this one (a peer).
    pub process: Option<u32>,
    /// Whether the table also gets dlock's client and server CPU against
    /// its own (for the floor that does what dlock's engine sends).
    pub cpu_rows: bool,
}

impl<'a> Contender<'a> {
    /// A floor whose client runs in this process.
    pub fn floor(name: &'a str, target: Target) -> Self {
        Contender {
            name,
            target,
            process: None,
            cpu_rows: false,
        }
    }

    /// The floor that sends what dlock's engine sends: dlock's CPU rows go
    /// against it.
    pub fn stamped(name: &'a str, target: Target) -> Self {
        Contender {
            cpu_rows: true,
            ..Self::floor(name, target)
        }
    }

    /// A peer in process `pid`, timing itself.
    pub fn peer(name: &'a str, target: Target, pid: u32) -> Self {
        Contender {
            process: Some(pid),
            ..Self::floor(name, target)
        }
    }

    /// dlock itself, last in the list.
    pub fn dlock(name: &'a str) -> Self {
        Self::floor(name, Target::None)
    }
}

/// Uncontended cycles (`case`, e.g. "uncontended cycle") of each
/// contender, `cycles` each, taking turns in blocks of `block`, each going
/// first in turn. `run(who, block)` runs a
/// block of contender `who`; it answers the block's mean cycle in ns when
/// the contender times itself (a peer), else `None` and it is timed here.
/// The last contender is dlock. Prints each one's time per cycle (median
/// block), its client's CPU and the server's (process `server` and its
/// children) per cycle, and dlock's ratios; adds the rows.
///
/// CPU is read from `/proc` in clock ticks (10 ms), summed over all blocks,
/// so a few thousand cycles give it to about 2 %. Where the wall time goes
/// beyond the two is waiting: the network, the scheduler.
pub async fn uncontended(
    (engine, case): (&str, &str),
    contenders: &[Contender<'_>],
    (cycles, block): (usize, usize),
    server: u32,
    mut run: impl AsyncFnMut(usize, usize) -> Option<f64>,
) {
    let n = contenders.len();
    let mut ns: Vec<Vec<f64>> = vec![Vec::new(); n];
    let (mut client, mut served) = (vec![0.0; n], vec![0.0; n]);
    for round in 0..cycles / block {
        for turn in 0..n {
            let who = (turn + round) % n;
            let process = contenders[who].process.unwrap_or_else(std::process::id);
            let (server_before, client_before) = (tree_cpu(server), process_cpu(process));
            let started = Instant::now();
            let timed = run(who, block).await;
            let elapsed = started.elapsed().as_nanos() as f64 / block as f64;
            client[who] += process_cpu(process) - client_before;
            served[who] += tree_cpu(server) - server_before;
            ns[who].push(timed.unwrap_or(elapsed));
        }
    }
    let per_cycle = |total: f64| total / (cycles / block * block) as f64;
    println!(
        "{case}, {cycles} each, interleaved in blocks of {block} (mean per cycle, median block; CPU per cycle):"
    );
    println!(
        "  {:<40}{:>12}{:>14}{:>14}",
        "", "cycle", "client CPU", "server CPU"
    );
    for (i, contender) in contenders.iter().enumerate() {
        println!(
            "  {:<40}{:>12}{:>14}{:>14}",
            contender.name,
            micros(median(ns[i].clone())),
            micros(per_cycle(client[i])),
            micros(per_cycle(served[i]))
        );
    }
    let dlock = n - 1;
    for (i, contender) in contenders[..dlock].iter().enumerate() {
        let ratios: Vec<f64> = ns[dlock].iter().zip(&ns[i]).map(|(d, b)| d / b).collect();
        let ratio = median(ratios.clone());
        println!(
            "  dlock / {} {ratio:.3} (p10 {:.3}, p90 {:.3}); client CPU {:.2}, server CPU {:.2}",
            contender.name,
            percentile(ratios.clone(), 0.1),
            percentile(ratios, 0.9),
            client[dlock] / client[i],
            served[dlock] / served[i],
        );
        row(
            engine,
            &format!("{case} (median block ratio)"),
            &micros(median(ns[dlock].clone())),
            contender.name,
            &micros(median(ns[i].clone())),
            ratio,
            contender.target,
        );
        if contender.cpu_rows {
            for (what, figures) in [("client", &client), ("server", &served)] {
                row(
                    engine,
                    &format!("{what} CPU per {case} (`/proc`)"),
                    &micros(per_cycle(figures[dlock])),
                    contender.name,
                    &micros(per_cycle(figures[i])),
                    figures[dlock] / figures[i],
                    Target::None,
                );
            }
        }
    }
}

/// CPU time of process `pid` so far (all its threads, user + system), in ns.
pub fn process_cpu(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    stat_fields(&stat).map_or(0.0, |f| ticks(&f[11..13]))
}

/// CPU time of process `root` and every live process under it so far,
/// with their children already reaped, in ns. (A server's processes may
/// each lead a session of their own, as PostgreSQL's backends do, so its
/// process group would miss them.)
pub fn tree_cpu(root: u32) -> f64 {
    let entries = std::fs::read_dir("/proc").into_iter().flatten().flatten();
    let processes: Vec<(u32, u32, f64)> = entries
        .filter_map(|entry| {
            let pid = entry.file_name().to_str()?.parse().ok()?;
            let stat = std::fs::read_to_string(entry.path().join("stat")).ok()?;
            let fields = stat_fields(&stat)?;
            Some((pid, fields[1].parse().ok()?, ticks(&fields[11..15])))
        })
        .collect();
    let mut tree = vec![root];
    let mut total = 0.0;
    while let Some(parent) = tree.pop() {
        for &(pid, ppid, cpu) in &processes {
            if pid == parent {
                total += cpu;
            }
            if ppid == parent {
                tree.push(pid);
            }
        }
    }
    total
}

/// The fields of `/proc/<pid>/stat` after `(comm)`: state first.
fn stat_fields(stat: &str) -> Option<Vec<&str>> {
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    (fields.len() > 15).then_some(fields)
}

/// Clock ticks (Linux reports 100 a second) summed, in ns.
fn ticks(fields: &[&str]) -> f64 {
    fields
        .iter()
        .map(|f| f.parse::<f64>().unwrap_or(0.0))
        .sum::<f64>()
        * 1e7
}

/// Times from a release to the next acquisition, in ns.
#[derive(Default)]
pub struct Handoffs {
    released: Mutex<Option<Instant>>,
    pub times: Mutex<Vec<f64>>,
}

impl Handoffs {
    /// Handoffs timed elsewhere (by a peer process), in ns.
    pub fn of(times: Vec<f64>) -> Self {
        Handoffs {
            times: Mutex::new(times),
            ..Handoffs::default()
        }
    }

    /// Call right after acquiring.
    pub fn entered(&self) {
        if let Some(at) = self.released.lock().unwrap().take() {
            self.times.lock().unwrap().push(at.elapsed().as_nanos() as f64);
        }
    }

    /// Call right before releasing.
    pub fn leaving(&self) {
        *self.released.lock().unwrap() = Some(Instant::now());
    }

    pub fn p50(&self) -> f64 {
        percentile(self.times.lock().unwrap().clone(), 0.5)
    }

    pub fn p50_micros(&self) -> String {
        micros(self.p50())
    }

    pub fn summary(&self) -> String {
        let times = self.times.lock().unwrap().clone();
        format!(
            "p50 {:>9}  p90 {:>9}  ({} handoffs)",
            micros(percentile(times.clone(), 0.5)),
            micros(percentile(times.clone(), 0.9)),
            times.len()
        )
    }
}

/// Each of `locks` (one per client) taken `rounds` times, all at once:
/// the handoffs between them.
pub async fn handoffs(locks: Vec<dlock::Lock>, rounds: usize) -> std::sync::Arc<Handoffs> {
    let handoffs = std::sync::Arc::new(Handoffs::default());
    let tasks: Vec<_> = locks
        .into_iter()
        .map(|lock| {
            let handoffs = handoffs.clone();
            tokio::spawn(async move {
                for _ in 0..rounds {
                    let guard = lock.lock().await.expect("lock");
                    handoffs.entered();
                    handoffs.leaving();
                    guard.release().await.expect("release");
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.expect("client");
    }
    handoffs
}

/// The peer process.
pub struct Peer {
    child: Child,
    input: ChildStdin,
    output: BufReader<ChildStdout>,
}

impl Peer {
    /// Builds the peer (once; `benches/peers/distributed-lock`) and starts
    /// it on `kind` (`postgres`, `mysql`, `redis`) at `url`.
    pub fn start(kind: &str, url: &str) -> Self {
        Self::built("distributed-lock", "distributed-lock-peer", &[kind, url])
    }

    /// Builds the peer crate `benches/peers/<folder>` (once) and starts its
    /// binary `binary` with `args`.
    pub fn built(folder: &str, binary: &str, args: &[&str]) -> Self {
        let root = env!("CARGO_MANIFEST_DIR");
        let manifest = format!("{root}/benches/peers/{folder}/Cargo.toml");
        let target = format!("{root}/target/peers");
        let built = Command::new(env!("CARGO"))
            .args([
                "build",
                "--release",
                "--quiet",
                "--manifest-path",
                &manifest,
                "--target-dir",
                &target,
            ])
            .status()
            .expect("build the peer");
        assert!(built.success(), "the {folder} peer did not build");
        Self::spawn(Command::new(format!("{target}/release/{binary}")).args(args))
    }

    /// Starts `command`, a process that answers as the peer does.
    pub fn spawn(command: &mut Command) -> Self {
        let mut child = command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("start the peer");
        let input = child.stdin.take().expect("stdin");
        let output = BufReader::new(child.stdout.take().expect("stdout"));
        Peer { child, input, output }
    }

    /// The peer's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Runs `block` uncontended cycles; their mean in ns.
    pub fn cycles(&mut self, block: usize) -> f64 {
        self.cycles_of(&format!("cycles {block}"), block)
    }

    /// Runs `command`, `block` cycles of some kind; their mean in ns.
    pub fn cycles_of(&mut self, command: &str, block: usize) -> f64 {
        self.ask(command)[0] as f64 / block as f64
    }

    /// Sends one command; the numbers of its answer.
    pub fn ask(&mut self, command: &str) -> Vec<u128> {
        writeln!(self.input, "{command}").expect("to the peer");
        let mut line = String::new();
        self.output.read_line(&mut line).expect("from the peer");
        line.split_whitespace()
            .skip(1)
            .map(|n| n.parse().expect("number"))
            .collect()
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn percentile(mut values: Vec<f64>, q: f64) -> f64 {
    values.sort_by(f64::total_cmp);
    values[((values.len() - 1) as f64 * q) as usize]
}

/// The lower middle value, as `percentile(values, 0.5)`.
pub fn median(values: Vec<f64>) -> f64 {
    percentile(values, 0.5)
}

pub fn mean(samples: &[Duration]) -> Duration {
    samples.iter().sum::<Duration>() / samples.len() as u32
}

/// The lower middle sample, as `median`.
pub fn p50(samples: &[Duration]) -> Duration {
    let mut sorted = samples.to_vec();
    sorted.sort();
    sorted[(sorted.len() - 1) / 2]
}

/// `cycles` cycles each of `floor` and `ours`, in blocks of `block` taking
/// turns, each going first in turn: every cycle's time, floor's first.
pub async fn take_turns(
    (cycles, block): (usize, usize),
    mut floor: impl AsyncFnMut(),
    mut ours: impl AsyncFnMut(),
) -> [Vec<Duration>; 2] {
    let mut times: [Vec<Duration>; 2] = Default::default();
    for round in 0..cycles / block {
        for turn in 0..2 {
            let who = (turn + round) % 2;
            for _ in 0..block {
                let started = Instant::now();
                if who == 0 {
                    floor().await;
                } else {
                    ours().await;
                }
                times[who].push(started.elapsed());
            }
        }
    }
    times
}

/// Per block of `block` cycles taken in turns: the block's mean over the
/// base's mean for the same turn.
pub fn block_ratios(times: &[Duration], base: &[Duration], block: usize) -> Vec<f64> {
    times
        .chunks(block)
        .zip(base.chunks(block))
        .map(|(t, b)| mean(t).as_secs_f64() / mean(b).as_secs_f64())
        .collect()
}

pub fn micros(nanos: f64) -> String {
    format!("{:.1} µs", nanos / 1000.0)
}

/// What a ratio should be.
#[derive(Clone, Copy)]
pub enum Target {
    AtMost(f64),
    AtLeast(f64),
    /// Shown for context; nothing is asked of it.
    None,
}

/// One row of the table `scripts/bench` writes: appended to the file that
/// `BENCH_TABLE` names (without it, nothing is written). `ours` is
/// dlock's figure, `theirs` what it is compared with (the floor's or a
/// peer's, named in `against`), `ratio` ours ÷ theirs from the same run.
pub fn row(engine: &str, case: &str, ours: &str, against: &str, theirs: &str, ratio: f64, target: Target) {
    let Some(path) = std::env::var_os("BENCH_TABLE") else {
        return;
    };
    let (target, verdict) = match target {
        Target::AtMost(t) => (format!("≤ {t}"), if ratio <= t { "met" } else { "**missed**" }),
        Target::AtLeast(t) => (format!("≥ {t}"), if ratio >= t { "met" } else { "**missed**" }),
        Target::None => (String::new(), ""),
    };
    let line =
        format!("| {engine} | {case} | {ours} | {against}: {theirs} | {ratio:.2} | {target} | {verdict} |\n");
    let mut file = OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .expect("open the bench table");
    file.write_all(line.as_bytes()).expect("write the bench table");
}

/// One uncontended permit: acquire and release.
pub async fn permit_cycle(semaphore: &dlock::Semaphore) {
    let permit = semaphore
        .acquire()
        .await
        .unwrap_or_else(|e| panic!("permit: {e}"));
    permit.release().await.expect("release");
}

/// What `permit_rate` measured.
pub struct Rate {
    pub per_second: f64,
    /// The fewest and the most acquisitions one task made: how evenly the
    /// permits went round.
    pub fewest: u64,
    pub most: u64,
}

/// Acquisitions per second of one task per semaphore handle, each holding
/// its permit `hold`, for `run`.
pub async fn permit_rate(semaphores: Vec<dlock::Semaphore>, hold: Duration, run: Duration) -> Rate {
    let started = Instant::now();
    let until = started + run;
    let tasks: Vec<_> = semaphores
        .into_iter()
        .map(|semaphore| {
            tokio::spawn(async move {
                let mut done = 0u64;
                while Instant::now() < until {
                    let permit = semaphore
                        .acquire()
                        .await
                        .unwrap_or_else(|e| panic!("permit: {e}"));
                    tokio::time::sleep(hold).await;
                    permit.release().await.expect("release");
                    done += 1;
                }
                done
            })
        })
        .collect();
    let mut each = Vec::new();
    for task in tasks {
        each.push(task.await.expect("task"));
    }
    Rate {
        per_second: each.iter().sum::<u64>() as f64 / started.elapsed().as_secs_f64(),
        fewest: each.iter().copied().min().unwrap_or(0),
        most: each.iter().copied().max().unwrap_or(0),
    }
}
