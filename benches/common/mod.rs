//! What the engine benches share: the `distributed-lock` peer process, the
//! figures' arithmetic and the rows of `scripts/bench`'s table. Each bench
//! uses part of it.

#![allow(dead_code)]

use std::fs::OpenOptions;
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Uncontended cycles of the floor, dlock and the peer, `cycles` each,
/// taking turns in blocks of `block`, each going first in turn; prints each
/// one's mean per cycle and dlock's ratios (median block, p10, p90) to the
/// floor and the peer against their targets. `names`: the floor's, the
/// peer's and dlock's labels; `peer` runs a block and answers its mean
/// cycle in ns (the peer may time itself in its own process).
pub async fn uncontended(
    engine: &str,
    names: [&str; 3],
    (cycles, block): (usize, usize),
    mut floor: impl AsyncFnMut(),
    mut dlock: impl AsyncFnMut(),
    mut peer: impl AsyncFnMut(usize) -> f64,
    targets: [f64; 2],
) {
    let mut ns: [Vec<f64>; 3] = Default::default();
    for round in 0..cycles / block {
        for turn in 0..3 {
            let who = (turn + round) % 3;
            let started = Instant::now();
            match who {
                0 => {
                    for _ in 0..block {
                        floor().await;
                    }
                }
                1 => {
                    for _ in 0..block {
                        dlock().await;
                    }
                }
                _ => {
                    ns[2].push(peer(block).await);
                    continue;
                }
            }
            ns[who].push(started.elapsed().as_nanos() as f64 / block as f64);
        }
    }
    let [floor_ns, dlock_ns, peer_ns] = ns;
    println!(
        "uncontended cycle, {cycles} each, interleaved in blocks of {block} (mean per cycle, median block):"
    );
    println!(
        "  {:<35}{:>10}",
        names[0],
        micros(percentile(floor_ns.clone(), 0.5))
    );
    println!(
        "  {:<35}{:>10}",
        names[1],
        micros(percentile(peer_ns.clone(), 0.5))
    );
    println!(
        "  {:<35}{:>10}",
        names[2],
        micros(percentile(dlock_ns.clone(), 0.5))
    );
    for ((name, label, base), target) in [("floor", names[0], floor_ns), (names[1], names[1], peer_ns)]
        .into_iter()
        .zip(targets)
    {
        let ratios: Vec<f64> = dlock_ns.iter().zip(&base).map(|(d, b)| d / b).collect();
        let ratio = percentile(ratios.clone(), 0.5);
        println!(
            "  dlock / {name} {ratio:.3} (p10 {:.3}, p90 {:.3}; target ≤ {target})",
            percentile(ratios.clone(), 0.1),
            percentile(ratios, 0.9)
        );
        row(
            engine,
            "uncontended cycle (median block ratio)",
            &micros(percentile(dlock_ns.clone(), 0.5)),
            label,
            &micros(percentile(base.clone(), 0.5)),
            ratio,
            Target::AtMost(target),
        );
    }
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

/// The peer process.
pub struct Peer {
    child: Child,
    input: ChildStdin,
    output: BufReader<ChildStdout>,
}

impl Peer {
    /// Builds the peer (once; `benches/peers/distributed-lock`) and starts
    /// it on `kind` (`postgres`, `mysql`) at `url`.
    pub fn start(kind: &str, url: &str) -> Self {
        let manifest = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/benches/peers/distributed-lock/Cargo.toml"
        );
        let target = concat!(env!("CARGO_MANIFEST_DIR"), "/target/peers");
        let built = Command::new(env!("CARGO"))
            .args([
                "build",
                "--release",
                "--quiet",
                "--manifest-path",
                manifest,
                "--target-dir",
                target,
            ])
            .status()
            .expect("build the peer");
        assert!(built.success(), "the distributed-lock peer did not build");
        let mut command = Command::new(format!("{target}/release/distributed-lock-peer"));
        Self::spawn(command.args([kind, url]))
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

    /// Runs `block` uncontended cycles; their mean in ns.
    pub fn cycles(&mut self, block: usize) -> f64 {
        self.ask(&format!("cycles {block}"))[0] as f64 / block as f64
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
