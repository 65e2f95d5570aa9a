//! What the engine benches share: the `distributed-lock` peer process and
//! the figures' arithmetic.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};

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
