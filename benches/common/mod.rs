//! What the engine benches share: the `distributed-lock` peer process and
//! the figures' arithmetic.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::Instant;

/// Uncontended cycles of the floor, dlock and the peer, `cycles` each,
/// taking turns in blocks of `block`, each going first in turn; prints each
/// one's mean per cycle and dlock's ratios (median block, p10, p90) to the
/// floor and the peer against their targets. `names`: the floor's and
/// dlock's labels.
pub async fn uncontended(
    names: [&str; 2],
    (cycles, block): (usize, usize),
    mut floor: impl AsyncFnMut(),
    mut dlock: impl AsyncFnMut(),
    peer: &mut Peer,
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
                    let total = peer.ask(&format!("cycles {block}"))[0];
                    ns[2].push(total as f64 / block as f64);
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
        "distributed-lock 0.2",
        micros(percentile(peer_ns.clone(), 0.5))
    );
    println!(
        "  {:<35}{:>10}",
        names[1],
        micros(percentile(dlock_ns.clone(), 0.5))
    );
    for ((name, base), target) in [("floor", floor_ns), ("distributed-lock", peer_ns)]
        .into_iter()
        .zip(targets)
    {
        let ratios: Vec<f64> = dlock_ns.iter().zip(&base).map(|(d, b)| d / b).collect();
        println!(
            "  dlock / {name} {:.3} (p10 {:.3}, p90 {:.3}; target ≤ {target})",
            percentile(ratios.clone(), 0.5),
            percentile(ratios.clone(), 0.1),
            percentile(ratios, 0.9)
        );
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
        let mut child = Command::new(format!("{target}/release/distributed-lock-peer"))
            .args([kind, url])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("start the peer");
        let input = child.stdin.take().expect("stdin");
        let output = BufReader::new(child.stdout.take().expect("stdout"));
        Peer { child, input, output }
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

pub fn micros(nanos: f64) -> String {
    format!("{:.1} µs", nanos / 1000.0)
}
