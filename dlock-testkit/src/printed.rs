//! A child process and the lines it prints, each with when it came, read
//! on a thread of their own: how the suites, tests and benches watch the
//! processes they start (workers, `etcdctl`, Curator). Dropped, the
//! process is killed, so a failed test leaves none running.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// A running child process, its input, and its output line by line.
pub struct Printed {
    child: Child,
    input: Option<ChildStdin>,
    lines: mpsc::Receiver<(String, Instant)>,
}

impl Printed {
    /// Starts `command` with its input and output piped.
    pub fn spawn(command: &mut Command) -> Self {
        let mut child = command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("start {:?}: {e}", command.get_program()));
        let out = child.stdout.take().expect("stdout");
        let (send, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                let _ = send.send((line, Instant::now()));
            }
        });
        let input = child.stdin.take();
        Printed { child, input, lines }
    }

    /// Its next line that starts with `prefix`, and when it came; panics
    /// if none comes within `within`.
    pub fn line(&self, prefix: &str, within: Duration) -> (String, Instant) {
        self.try_line(prefix, within).unwrap_or_else(|| {
            panic!(
                "{:?} printed no `{prefix}` line within {within:?}",
                self.child.id()
            )
        })
    }

    /// As [`line`](Self::line), or `None` if none came within `within`.
    pub fn try_line(&self, prefix: &str, within: Duration) -> Option<(String, Instant)> {
        let deadline = Instant::now() + within;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let (line, at) = self.lines.recv_timeout(left).ok()?;
            if line.starts_with(prefix) {
                return Some((line, at));
            }
        }
    }

    /// The lines printed since the last look, without waiting.
    pub fn printed(&self) -> Vec<String> {
        self.lines.try_iter().map(|(line, _)| line).collect()
    }

    /// Every line left, once the process has closed its output.
    pub fn rest(&self) -> Vec<String> {
        self.lines.iter().map(|(line, _)| line).collect()
    }

    /// Writes `line` to its input.
    pub fn say(&mut self, line: &str) {
        let input = self.input.as_mut().expect("its input");
        writeln!(input, "{line}").expect("write to the process");
    }

    /// Its process id, as `kill` takes it.
    pub fn pid(&self) -> String {
        self.child.id().to_string()
    }

    /// Sends `signal` (`"-STOP"`, `"-CONT"`, `"-INT"`, `"-KILL"`).
    pub fn signal(&self, signal: &str) {
        let status = Command::new("kill")
            .args([signal, &self.pid()])
            .status()
            .expect("kill");
        assert!(status.success(), "kill {signal} {}", self.pid());
    }

    /// How it ended, if it has.
    pub fn exited(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().expect("wait")
    }

    /// Waits for it to end.
    pub fn wait(&mut self) -> ExitStatus {
        self.child.wait().expect("wait")
    }

    /// SIGKILLs it and waits for it to end; when the signal went.
    pub fn kill(&mut self) -> Instant {
        let at = Instant::now();
        let _ = self.child.kill();
        let _ = self.child.wait();
        at
    }
}

impl Drop for Printed {
    fn drop(&mut self) {
        self.kill();
    }
}
