//! Real servers for engine tests, on free loopback ports. Each server is
//! watched by a small shell loop that kills it when the test process exits,
//! so a server in a `static` does not outlive its test binary.

use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// A server process on a loopback port, killed when dropped.
pub struct TestServer {
    /// The port it listens on.
    pub port: u16,
    program: String,
    args: Vec<String>,
    /// Where the server logs, whose end a failed start shows.
    log: Option<PathBuf>,
    child: Child,
}

impl TestServer {
    /// Starts `program` with `args(port)` on a free port and waits until it accepts.
    pub fn start(program: &str, args: impl FnOnce(u16) -> Vec<String>) -> Self {
        Self::start_at(free_port(), program, args)
    }

    /// Starts `program` with `args(port)` on `port` and waits until it accepts.
    pub fn start_at(port: u16, program: &str, args: impl FnOnce(u16) -> Vec<String>) -> Self {
        Self::start_logged(port, program, |port| (args(port), None))
    }

    /// Starts `program` on `port` with the arguments `args(port)` gives,
    /// and the log they name, whose end a failed start shows.
    pub fn start_logged(
        port: u16,
        program: &str,
        args: impl FnOnce(u16) -> (Vec<String>, Option<PathBuf>),
    ) -> Self {
        let (args, log) = args(port);
        let child = serve_program(program, &args, port, log.as_deref());
        TestServer {
            port,
            program: program.to_owned(),
            args,
            log,
            child,
        }
    }

    /// `127.0.0.1:<port>`.
    pub fn address(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// The server process's id (a bench reads its CPU time, with its
    /// children's).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Kills the server (SIGKILL), as a crash would.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Starts the same server again on the same port.
    pub fn restart(&mut self) {
        self.kill();
        self.child = serve_program(&self.program, &self.args, self.port, self.log.as_deref());
    }
}

/// Starts `program` and returns once it accepts on `port` itself: another
/// server that took the port first (a test elsewhere restarting its own)
/// must not pass for this one.
fn serve_program(program: &str, args: &[String], port: u16, log: Option<&Path>) -> Child {
    let pid = std::cell::Cell::new(0);
    serve(
        program,
        Duration::from_secs(30),
        log,
        || {
            let child = spawn(program, args);
            pid.set(child.id());
            child
        },
        || TcpStream::connect(("127.0.0.1", port)).is_ok() && listens(pid.get(), port),
    )
}

/// Whether process `pid` holds a socket listening on `port`: the sockets
/// in LISTEN state (`0A`) on that port, by inode, among its descriptors.
fn listens(pid: u32, port: u16) -> bool {
    let tables = ["/proc/net/tcp", "/proc/net/tcp6"].map(|t| std::fs::read_to_string(t).unwrap_or_default());
    let listening: Vec<String> = tables
        .iter()
        .flat_map(|table| table.lines().skip(1))
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let (local, state, inode) = (fields.get(1)?, fields.get(3)?, fields.get(9)?);
            let local_port = u16::from_str_radix(local.rsplit(':').next()?, 16).ok()?;
            (local_port == port && *state == "0A").then(|| format!("socket:[{inode}]"))
        })
        .collect();
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .into_iter()
        .flatten()
        .flatten();
    fds.filter_map(|fd| std::fs::read_link(fd.path()).ok())
        .any(|target| listening.iter().any(|l| target.as_os_str() == l.as_str()))
}

/// Probes every 20 ms until `ready`; panics with `failure` after `limit`.
pub fn wait_until(limit: Duration, mut ready: impl FnMut() -> bool, failure: impl Fn() -> String) {
    let started = Instant::now();
    while !ready() {
        assert!(started.elapsed() < limit, "{} within {limit:?}", failure());
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Starts a server with `spawn` and returns it once `ready`. One that
/// exits while starting is started again: its port, freed by a crash, can
/// be held for a while as the local end of some client's connection, which
/// the OS may number from the same range. Panics after `limit`, naming
/// `what`, with the end of the server's `log` if it has one.
pub fn serve(
    what: &str,
    limit: Duration,
    log: Option<&Path>,
    mut spawn: impl FnMut() -> Child,
    mut ready: impl FnMut() -> bool,
) -> Child {
    let started = Instant::now();
    let mut child = spawn();
    let mut exits = Vec::new();
    while !ready() {
        if let Ok(Some(status)) = child.try_wait() {
            exits.push(status.to_string());
            std::thread::sleep(Duration::from_millis(200));
            child = spawn();
        }
        if started.elapsed() > limit {
            let tail = log.map(|log| format!("; the end of {}:\n{}", log.display(), log_tail(log, 20)));
            panic!(
                "{what} did not serve within {limit:?} (exits while starting: {exits:?}){}",
                tail.unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child
}

/// The last `lines` lines of the file at `path`, or why there are none.
fn log_tail(path: &Path, lines: usize) -> String {
    match std::fs::read_to_string(path) {
        Ok(text) => {
            let all: Vec<&str> = text.lines().collect();
            all[all.len().saturating_sub(lines)..].join("\n")
        }
        Err(e) => format!("(unreadable: {e})"),
    }
}

/// Kills the process group that `child` leads and every process under it
/// (SIGKILL), as a crash would, and returns once none of them is left.
/// PostgreSQL's backends each lead a session of their own, so the group
/// alone would leave them running, still serving their clients, after the
/// "crash". A server started again sooner could find the dying ones still
/// holding its shared memory (which PostgreSQL refuses to start beside) or
/// its files.
pub fn kill_group(child: &mut Child) {
    let group = child.id();
    // Stopped first, so it forks no process after the list is taken.
    let _ = Command::new("kill").args(["-STOP", &group.to_string()]).status();
    let mut doomed: Vec<u32> = descendants(group);
    let _ = Command::new("kill")
        .args(["-KILL", "--", &format!("-{group}")])
        .args(doomed.iter().map(u32::to_string))
        .status();
    let _ = child.wait();
    doomed.push(group);
    wait_until(
        Duration::from_secs(30),
        || {
            processes()
                .iter()
                .all(|p| !p.alive || (p.group != group && !doomed.contains(&p.pid)))
        },
        || format!("process group {group} or a process under it still runs after SIGKILL"),
    );
}

/// One line of `/proc/<pid>/stat`, the fields used here.
struct Process {
    pid: u32,
    parent: u32,
    group: u32,
    /// Zombies (reaped or not, their memory is gone) do not count.
    alive: bool,
}

fn processes() -> Vec<Process> {
    let entries = std::fs::read_dir("/proc").into_iter().flatten().flatten();
    entries
        .filter_map(|entry| {
            let pid = entry.file_name().to_str()?.parse().ok()?;
            let stat = std::fs::read_to_string(entry.path().join("stat")).ok()?;
            // `pid (comm) state ppid pgrp ...`; comm may hold spaces and parens.
            let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
            match fields.as_slice() {
                [state, parent, group, ..] => Some(Process {
                    pid,
                    parent: parent.parse().ok()?,
                    group: group.parse().ok()?,
                    alive: *state != "Z" && *state != "X",
                }),
                _ => None,
            }
        })
        .collect()
}

/// Every process under `root`, children first found first.
fn descendants(root: u32) -> Vec<u32> {
    let all = processes();
    let mut found = Vec::new();
    let mut parents = vec![root];
    while let Some(parent) = parents.pop() {
        for process in all.iter().filter(|p| p.parent == parent) {
            found.push(process.pid);
            parents.push(process.pid);
        }
    }
    found
}

impl Drop for TestServer {
    fn drop(&mut self) {
        self.kill();
    }
}

fn spawn(program: &str, args: &[String]) -> Child {
    let mut command = Command::new(program);
    command.args(args).stdout(Stdio::null()).stderr(Stdio::null());
    spawn_watched(command, program)
}

/// Spawns `command` in a process group of its own, watched by a small shell
/// loop that kills the whole group (a server and any processes it forked)
/// once the test process exits.
pub fn spawn_watched(mut command: Command, program: &str) -> Child {
    use std::os::unix::process::CommandExt;
    let child = command
        .stdin(Stdio::null())
        .process_group(0)
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {program} (scripts/test installs it): {e}"));
    after_exit(
        Some(child.id()),
        &format!("env kill -KILL -- -{} 2>/dev/null", child.id()),
        "",
    );
    child
}

/// Runs the shell command `then` (`$0` being `arg`) in a small loop of its
/// own once this test process has exited, or process `or_gone` has.
fn after_exit(or_gone: Option<u32>, then: &str, arg: impl AsRef<std::ffi::OsStr>) {
    let also = or_gone
        .map(|pid| format!(" && kill -0 {pid} 2>/dev/null"))
        .unwrap_or_default();
    let script = format!(
        "while kill -0 {} 2>/dev/null{also}; do sleep 0.5; done; {then}",
        std::process::id()
    );
    let mut looped = Command::new("sh")
        .args(["-c", &script])
        .arg(arg)
        // Not holding this process's output open: a parent reading it to
        // the end would wait for the loop, which waits for this process.
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start a loop watching the test process");
    // Reaped in the background so it leaves no zombie.
    std::thread::spawn(move || looped.wait());
}

/// Whether the tests run as root: some servers refuse to, or must be told
/// whom to run as.
pub fn is_root() -> bool {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let uids = status.lines().find_map(|l| l.strip_prefix("Uid:"));
    uids.and_then(|ids| ids.split_whitespace().nth(1)) == Some("0")
}

/// Under root, the ids of the first of `users` that exists, for a server
/// that refuses to run as root; `None` when the tests are not root.
pub fn server_user(users: &[&str]) -> Option<(u32, u32)> {
    if !is_root() {
        return None;
    }
    let passwd = std::fs::read_to_string("/etc/passwd").expect("/etc/passwd");
    let ids = |name: &str| {
        let line = passwd.lines().find(|l| l.starts_with(&format!("{name}:")))?;
        let fields: Vec<&str> = line.split(':').collect();
        Some((fields.get(2)?.parse().ok()?, fields.get(3)?.parse().ok()?))
    };
    let found = users.iter().find_map(|u| ids(u));
    Some(found.unwrap_or_else(|| panic!("none of the users {users:?} exists")))
}

/// Gives `paths` to `user` (from [`server_user`]), if there is one.
pub fn hand_over(user: Option<(u32, u32)>, paths: &[&Path]) {
    if let Some((uid, gid)) = user {
        for path in paths {
            std::os::unix::fs::chown(path, Some(uid), Some(gid)).expect("chown a server's file");
        }
    }
}

/// A fresh, empty folder for a server's files, in this process's
/// [`scratch`] folder.
pub fn server_dir(prefix: &str, port: u16) -> PathBuf {
    server_dir_in(&std::env::temp_dir(), prefix, port)
}

/// [`server_dir`] under `base` instead of the temporary directory.
pub fn server_dir_in(base: &Path, prefix: &str, port: u16) -> PathBuf {
    // Numbered: a server that ended in this process may have had the same
    // port, and its owner removes its folder only after the kill that freed
    // the port, maybe while this one is being made.
    static MADE: AtomicUsize = AtomicUsize::new(0);
    let made = MADE.fetch_add(1, Ordering::Relaxed);
    let dir = scratch_in(base, &format!("{prefix}-{port}-{made}"));
    std::fs::create_dir_all(&dir).expect("server directory");
    dir
}

/// `<tmp>/dlock-test-<pid>/<name>`: where a test puts its files.
pub fn scratch(name: &str) -> PathBuf {
    scratch_in(&std::env::temp_dir(), name)
}

/// [`scratch`] under `base` instead of the temporary directory.
///
/// The process's folder is removed with all in it once the process has
/// exited, by a shell loop like a server's watcher: servers kept in a
/// `static` are never dropped, and their files (an etcd's is 120 MB) filled
/// the disk over a few runs. Those of processes whose loop was killed too
/// are removed when the next is made.
pub fn scratch_in(base: &Path, name: &str) -> PathBuf {
    use std::os::unix::fs::DirBuilderExt;
    static MADE: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());
    let root = base.join(format!("dlock-test-{}", std::process::id()));
    let mut made = MADE.lock().expect("scratch folders");
    if !made.contains(&root) {
        remove_those_of_gone_processes(base);
        // Servers running as another user reach their own folders inside.
        std::fs::DirBuilder::new()
            .mode(0o755)
            .recursive(true)
            .create(&root)
            .expect("a test process's folder");
        // After the servers' watchers have killed them; again for a file a
        // dying server wrote meanwhile.
        after_exit(
            None,
            "sleep 1; rm -rf -- \"$0\"; sleep 1; rm -rf -- \"$0\"",
            &root,
        );
        made.push(root.clone());
    }
    root.join(name)
}

fn remove_those_of_gone_processes(base: &Path) {
    for entry in std::fs::read_dir(base).into_iter().flatten().flatten() {
        let name = entry.file_name();
        let owner = name.to_str().and_then(|n| n.strip_prefix("dlock-test-"));
        if owner.is_some_and(|pid| !Path::new("/proc").join(pid).exists()) {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

/// A port nothing listens on now, picked at random below the range the OS
/// takes the local ends of outgoing connections from
/// (`ip_local_port_range`). A port the OS picked for a listener comes from
/// that range, so some client's connection could take it as its local end
/// before the server binds it, and hold it for as long as it lasts: a
/// server then exits at every start. Below the range, only another
/// listener can take it, and two tests at once rarely pick the same port.
pub fn free_port() -> u16 {
    let range = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range").unwrap_or_default();
    let first_outgoing: u16 = range
        .split_whitespace()
        .next()
        .and_then(|low| low.parse().ok())
        .unwrap_or(32768);
    if first_outgoing <= 2048 {
        return TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .expect("free port");
    }
    loop {
        let port = rand::random_range(first_outgoing / 2..first_outgoing);
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
}

/// An example program of this workspace (the `dlock-examples` package),
/// built by the workspace's `cargo test` next to the test binaries
/// (`target/<profile>/examples/<name>`).
pub fn example(name: &str) -> PathBuf {
    let test = std::env::current_exe().expect("test path");
    let dir = test.parent().and_then(|d| d.parent()).expect("target dir");
    let path = dir.join("examples").join(name);
    assert!(
        path.exists(),
        "{} is not built: the workspace's `cargo test` builds examples (or run `cargo build -p dlock-examples --examples`)",
        path.display()
    );
    path
}

/// Sends `signal` (`STOP`, `CONT`) to each of `roots` and every process
/// under it: a server whose backends are processes of their own
/// (PostgreSQL's) goes silent whole. The tree is read again until no new
/// process shows: one forked meanwhile gets the signal too.
pub fn signal_trees(roots: &[u32], signal: &str) {
    let mut signalled: Vec<u32> = Vec::new();
    loop {
        let new: Vec<u32> = processes_under(roots)
            .into_iter()
            .filter(|pid| !signalled.contains(pid))
            .collect();
        if new.is_empty() {
            return;
        }
        // A process that ended meanwhile is no matter: `kill` goes on to
        // the rest.
        let _ = Command::new("kill")
            .args(["-s", signal])
            .args(new.iter().map(u32::to_string))
            .stderr(Stdio::null())
            .status();
        signalled.extend(new);
    }
}

/// `roots` and every live process under them.
fn processes_under(roots: &[u32]) -> Vec<u32> {
    let parents: Vec<(u32, u32)> = std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| {
            let pid = entry.file_name().to_str()?.parse().ok()?;
            let stat = std::fs::read_to_string(entry.path().join("stat")).ok()?;
            let ppid = stat.rsplit_once(')')?.1.split_whitespace().nth(1)?.parse().ok()?;
            Some((pid, ppid))
        })
        .collect();
    let mut tree = roots.to_vec();
    let mut at = 0;
    while at < tree.len() {
        let parent = tree[at];
        tree.extend(
            parents
                .iter()
                .filter(|(_, ppid)| *ppid == parent)
                .map(|(pid, _)| *pid),
        );
        at += 1;
    }
    tree
}

/// A new file, readable by its owner alone, holding `secret` and a line
/// end: a password file as a secret store would mount it.
pub fn secret_file(secret: &str) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    static MADE: AtomicUsize = AtomicUsize::new(0);
    let made = MADE.fetch_add(1, Ordering::Relaxed);
    let path = scratch(&format!("secret-{made}"));
    std::fs::write(&path, format!("{secret}\n")).expect("write a secret file");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).expect("secret file mode");
    path
}

/// `binary`, to run with its wall and monotonic clocks off by `offset`
/// (libfaketime's `FAKETIME`), through libfaketime preloaded.
pub fn with_clock(binary: impl AsRef<std::ffi::OsStr>, offset: &str) -> Command {
    let library = std::fs::read_dir("/usr/lib")
        .into_iter()
        .flatten()
        .flatten()
        .map(|arch| arch.path().join("faketime/libfaketimeMT.so.1"))
        .find(|lib| lib.exists())
        .expect("libfaketimeMT.so.1 under /usr/lib/<arch>/faketime (scripts/test installs libfaketime)");
    let mut command = Command::new(binary);
    command.env("LD_PRELOAD", library).env("FAKETIME", offset);
    command
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_port_listens_for_the_process_that_holds_it_only() {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = listener.local_addr().expect("address").port();
        assert!(listens(std::process::id(), port));
        assert!(!listens(1, port), "pid 1 does not hold this test's port");
        drop(listener);
        assert!(!listens(std::process::id(), port));
    }

    /// Run by the test below in a process of its own.
    #[test]
    #[ignore = "a step of a_process_leaves_no_scratch_folder_behind"]
    fn make_a_scratch_folder_and_exit() {
        let base = PathBuf::from(std::env::var("DLOCK_SCRATCH_BASE").expect("run by the test below"));
        let dir = server_dir_in(&base, "etcd", 1);
        std::fs::write(dir.join("data"), "x").expect("write");
        println!("made {}", dir.display());
    }

    #[test]
    fn a_process_leaves_no_scratch_folder_behind() {
        let base = scratch("bases");
        std::fs::create_dir_all(&base).expect("base");
        // One of a process long gone (above the largest pid), whose sweeper
        // was killed with it.
        let gone = base.join("dlock-test-4194305");
        std::fs::create_dir_all(gone.join("etcd-1-0")).expect("a gone process's folder");
        let out = Command::new(std::env::current_exe().expect("this test binary"))
            .args([
                "--exact",
                "server::tests::make_a_scratch_folder_and_exit",
                "--ignored",
                "--nocapture",
            ])
            .env("DLOCK_SCRATCH_BASE", &base)
            .output()
            .expect("run the step");
        let printed = String::from_utf8_lossy(&out.stdout);
        let made = printed
            .lines()
            .find_map(|l| l.strip_prefix("made "))
            .unwrap_or_else(|| panic!("the step printed no folder: {printed}"));
        assert!(
            !gone.exists(),
            "a gone process's folder is removed when the next is made"
        );
        let root = Path::new(made).parent().expect("the process's folder").to_owned();
        assert_eq!(
            root.parent(),
            Some(base.as_path()),
            "{made} is in the step's own folder"
        );
        wait_until(
            Duration::from_secs(10),
            || !root.exists(),
            || format!("{} is still there after its process exited", root.display()),
        );
    }
}
