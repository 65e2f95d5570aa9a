//! etcd-specific behaviour against real etcd on loopback: the real `etcdctl
//! lock` and dlock exclude each other both ways under an exact counter; a
//! key dlock did not write counts as a writer, and etcd's lock waits for
//! dlock's readers; records show an `etcdctl lock` holder without a label,
//! dlock's with its `client_name`; the two known failures of etcd's recipes
//! (a waiter granted after its lease expired, etcd 11456; after it was
//! revoked, etcd 16221) do not happen; one watch stream per engine and two
//! watchers per waiter (the key ahead and its own); nothing left in etcd
//! after the suite; clear errors. An operator revokes and forces out
//! `etcdctl lock`'s holders as dlock's, and etcd's lock waits behind a
//! revoked dlock holder.

#![cfg(feature = "etcd")]

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use dlock::config::Queue;
use dlock::engines::conformance::run_each;
use dlock::engines::etcd::{EtcdConfig, EtcdEngine};
use dlock::kit::Engine;
use dlock::kit::{ClientSettings, Credentials};
use dlock::{Registry, Settings};
use dlock_testkit::fixtures::etcd::{Etcd, SESSION_TTL, etcdctl, metric};
use dlock_testkit::printed::Printed;
use dlock_testkit::proxy::{CutProxy, cut_holder_then_next};
use dlock_testkit::server::free_port;
use dlock_testkit::{Fixture, assert_unreachable_is_a_clear_error};

fn shared() -> &'static Etcd {
    static SERVER: OnceLock<Etcd> = OnceLock::new();
    SERVER.get_or_init(Etcd::start)
}

fn config(endpoint: String) -> EtcdConfig {
    EtcdConfig {
        session_ttl: SESSION_TTL,
        ..EtcdConfig::new(&[endpoint])
    }
}

async fn engine_at(endpoint: String) -> Arc<EtcdEngine> {
    Arc::new(
        EtcdEngine::connect("etcd", &config(endpoint))
            .await
            .expect("connect"),
    )
}

fn registry(engine: Arc<EtcdEngine>) -> Registry {
    let settings = Settings {
        wait: dlock::Wait::For(Duration::from_secs(30)),
        ..Settings::default()
    };
    Registry::with_engine("etcd", engine, settings).expect("registry")
}

/// `etcdctl` output, trimmed.
fn ctl(endpoint: &str, args: &[&str]) -> String {
    let out = etcdctl(endpoint).args(args).output().expect("run etcdctl");
    assert!(
        out.status.success(),
        "etcdctl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// Keys under `prefix`, oldest first.
fn keys(endpoint: &str, prefix: &str) -> Vec<String> {
    ctl(
        endpoint,
        &["get", prefix, "--prefix", "--keys-only", "--sort-by=CREATE"],
    )
    .lines()
    .filter(|l| !l.is_empty())
    .map(String::from)
    .collect()
}

/// (create revision, lease) of the oldest key under `prefix`.
fn oldest(endpoint: &str, prefix: &str) -> Option<(u64, i64)> {
    let fields = ctl(
        endpoint,
        &[
            "get",
            prefix,
            "--prefix",
            "--sort-by=CREATE",
            "--limit=1",
            "-w",
            "fields",
        ],
    );
    let field = |name: &str| {
        fields
            .lines()
            .find(|l| l.starts_with(&format!("\"{name}\" :")))
            .map(|l| l.rsplit(' ').next().unwrap_or_default().to_owned())
    };
    Some((
        field("CreateRevision")?.parse().ok()?,
        field("Lease")?.parse().ok()?,
    ))
}

async fn wait_for_keys(endpoint: &str, prefix: &str, count: usize) {
    let started = Instant::now();
    while keys(endpoint, prefix).len() != count {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "{count} keys under {prefix}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A counter in a file and a directory that exists while someone is inside:
/// the same critical section for etcdctl (through `sh`) and for dlock.
struct Section {
    dir: PathBuf,
}

impl Section {
    fn new(name: &str) -> Self {
        let dir = dlock_testkit::server::scratch(&format!("etcd-{name}"));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("section dir");
        std::fs::write(dir.join("counter"), "0").expect("counter");
        Section { dir }
    }

    fn script(&self) -> String {
        let d = self.dir.display();
        format!(
            "mkdir {d}/inside 2>/dev/null || echo x >> {d}/violations; n=$(cat {d}/counter); \
             sleep 0.01; echo $((n+1)) > {d}/counter; rmdir {d}/inside"
        )
    }

    async fn run(&self) {
        let inside = self.dir.join("inside");
        if std::fs::create_dir(&inside).is_err() {
            append(&self.dir.join("violations"));
        }
        let n: u32 = read(&self.dir.join("counter")).parse().expect("counter");
        tokio::time::sleep(Duration::from_millis(10)).await;
        std::fs::write(self.dir.join("counter"), (n + 1).to_string()).expect("write");
        let _ = std::fs::remove_dir(&inside);
    }

    fn counter(&self) -> u32 {
        read(&self.dir.join("counter")).parse().expect("counter")
    }

    fn violations(&self) -> usize {
        read(&self.dir.join("violations")).lines().count()
    }
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .trim()
        .to_owned()
}

fn append(path: &Path) {
    use std::io::Write;
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .expect("open");
    writeln!(file, "x").expect("append");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn etcdctl_lock_and_dlock_writers_exclude_each_other_both_ways() {
    const ROUNDS: u32 = 12;
    let endpoint = shared().server.address();
    let section = Arc::new(Section::new("interop"));
    let dlock = registry(engine_at(endpoint.clone()).await);
    let lock = dlock.locks("interop").get("counter");

    let etcdctl_loops: Vec<_> = (0..2)
        .map(|_| {
            let (endpoint, script) = (endpoint.clone(), section.script());
            std::thread::spawn(move || {
                for _ in 0..ROUNDS {
                    let status = etcdctl(&endpoint)
                        .args(["lock", "/locks/interop/counter", "--", "sh", "-c", &script])
                        .stdout(Stdio::null())
                        .status()
                        .expect("etcdctl lock");
                    assert!(status.success());
                }
            })
        })
        .collect();
    let dlock_loops: Vec<_> = (0..2)
        .map(|_| {
            let (lock, section) = (lock.clone(), section.clone());
            tokio::spawn(async move {
                for _ in 0..ROUNDS {
                    let guard = lock.lock().await.expect("lock");
                    section.run().await;
                    guard.release().await.expect("release");
                }
            })
        })
        .collect();
    for task in dlock_loops {
        task.await.expect("dlock loop");
    }
    for thread in etcdctl_loops {
        thread.join().expect("etcdctl loop");
    }
    assert_eq!(section.violations(), 0, "etcdctl and dlock were inside at once");
    assert_eq!(section.counter(), 4 * ROUNDS, "lost updates");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_foreign_key_is_a_writer_and_etcd_lock_waits_for_dlock_readers() {
    let endpoint = shared().server.address();
    let dlock = registry(engine_at(endpoint.clone()).await);
    let lock = dlock.locks("interop").get("foreign");
    let prefix = "/locks/interop/foreign/";

    // etcdctl holds: dlock can neither read nor write.
    let mut holder = etcdctl(&endpoint)
        .args(["lock", "/locks/interop/foreign", "sleep", "1.5"])
        .stdout(Stdio::null())
        .spawn()
        .expect("etcdctl lock");
    wait_for_keys(&endpoint, prefix, 1).await;
    let foreign = keys(&endpoint, prefix).remove(0);
    assert!(
        lock.try_read().await.expect("try").is_none(),
        "read under etcd's lock"
    );
    assert!(
        lock.try_lock().await.expect("try").is_none(),
        "wrote under etcd's lock"
    );
    let read = lock.read().await.expect("read");
    // etcdctl deletes its key before it exits: the key, not the process, is
    // the hold.
    assert!(
        !keys(&endpoint, prefix).contains(&foreign),
        "dlock's reader got in while etcdctl still held"
    );

    // dlock reads: etcd's lock waits until the reader lets go.
    let mut waiter = etcdctl(&endpoint)
        .args(["lock", "/locks/interop/foreign", "true"])
        .stdout(Stdio::null())
        .spawn()
        .expect("etcdctl lock");
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert!(
        waiter.try_wait().expect("wait").is_none(),
        "etcd's lock passed dlock's reader"
    );
    read.release().await.expect("release");
    let started = Instant::now();
    while waiter.try_wait().expect("wait").is_none() {
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "etcd's lock never got in"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let _ = holder.wait();
}

/// Records: `etcdctl lock`'s key shows as a write holder with no label,
/// owner or time (its value is empty); dlock's waiter behind it, and then
/// its hold, carry the configured `client_name`, spaces and all.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_etcdctl_holder_shows_without_a_label_and_dlock_with_its_client_name() {
    let endpoint = shared().server.address();
    let named = EtcdConfig {
        client: ClientSettings {
            client_name: Some("billing worker 3".into()),
            ..ClientSettings::default()
        },
        ..config(endpoint.clone())
    };
    let engine = EtcdEngine::connect("etcd", &named).await.expect("connect");
    let lock = registry(Arc::new(engine)).locks("records").get("interop");
    let prefix = "/locks/records/interop/";
    let label = Some("billing worker 3".to_owned());

    let mut holder = etcdctl(&endpoint)
        .args(["lock", "/locks/records/interop", "sleep", "1.5"])
        .stdout(Stdio::null())
        .spawn()
        .expect("etcdctl lock");
    wait_for_keys(&endpoint, prefix, 1).await;
    let waiter = tokio::spawn({
        let lock = lock.clone();
        async move { lock.lock().await.expect("lock") }
    });
    wait_for_keys(&endpoint, prefix, 2).await;
    let view = lock.inspect().await.expect("inspect");
    let ([foreign], [waiting]) = (view.holders.as_slice(), view.waiters.as_slice()) else {
        panic!("etcdctl holding, dlock waiting: {view:?}");
    };
    assert_eq!(foreign.mode, dlock::Mode::Write, "{view:?}");
    assert_eq!(
        (&foreign.label, &foreign.owner, foreign.since),
        (&None, &None, None),
        "{view:?}"
    );
    // Its session's lease, as `etcdctl lock` grants it by default.
    assert_eq!(foreign.lease, Some(Duration::from_secs(10)), "{view:?}");
    assert!(foreign.fence.is_some(), "{view:?}");
    assert_eq!(waiting.label, label, "{view:?}");

    let guard = waiter.await.expect("waiter");
    let _ = holder.wait();
    let view = lock.inspect().await.expect("inspect");
    let [mine] = view.holders.as_slice() else {
        panic!("dlock holding: {view:?}");
    };
    assert_eq!(mine.label, label, "{view:?}");
    assert_eq!(mine.owner, Some(guard.owner_digest()));
    assert_eq!(mine.fence, Some(guard.fence()));
    assert!(mine.since.is_some(), "{view:?}");
    assert_eq!(mine.lease, Some(SESSION_TTL), "{view:?}");
    guard.release().await.expect("release");
}

/// A holder's record tells a live holder from a dead one: the lease's
/// renewal keeps moving while its process lives, and stops when it is
/// killed, as the lease runs down. The holder is `etcdctl lock` with a
/// 6 s session, renewed every 2 s; etcd tells what is left of a lease in
/// whole seconds, so a renewal reads within a second of the truth.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holders_record_tells_a_live_holder_from_a_dead_one() {
    let endpoint = shared().server.address();
    let engine = engine_at(endpoint.clone()).await;
    let lock = registry(engine).locks("records").get("alive");
    let mut holder = etcdctl(&endpoint)
        .args(["lock", "--ttl", "6", "/locks/records/alive", "sleep", "60"])
        .stdout(Stdio::null())
        .spawn()
        .expect("etcdctl lock");
    wait_for_keys(&endpoint, "/locks/records/alive/", 1).await;
    let renewal = async || {
        let view = lock.inspect().await.expect("inspect");
        let [holder] = view.holders.as_slice() else {
            panic!("etcdctl holding: {view:?}");
        };
        assert_eq!(holder.lease, Some(Duration::from_secs(6)), "{view:?}");
        holder.renewed.expect("a renewal")
    };
    let second = Duration::from_secs(1);

    let first = renewal().await;
    tokio::time::sleep(Duration::from_millis(4_500)).await;
    let live = renewal().await;
    // Two keep-alives at least in 4.5 s: the last within 2 s of now.
    let moved = live.duration_since(first).unwrap_or_default();
    assert!(moved >= second + second / 4, "alive, renewed {moved:?} later");

    holder.kill().expect("kill etcdctl");
    let _ = holder.wait();
    let killed = renewal().await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let dead = renewal().await;
    let moved = dead.duration_since(killed).unwrap_or_default();
    assert!(
        moved <= second + second / 4,
        "killed, yet renewed {moved:?} later"
    );
    let free = Instant::now() + Duration::from_secs(10);
    while !lock.inspect().await.expect("inspect").is_free() {
        assert!(Instant::now() < free, "the dead holder's lease never ended");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// etcd 16221: the read/write recipe granted a waiter whose lease had been
/// revoked. dlock's waiter notices its key is gone and queues again on a
/// new lease: when it holds, its key is the oldest, on a live lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_waiter_whose_lease_was_revoked_is_never_granted_on_it() {
    let endpoint = shared().server.address();
    let prefix = "/locks/revoked/rw/";
    let first = registry(engine_at(endpoint.clone()).await);
    let holder = registry(engine_at(endpoint.clone()).await);
    let waiter_engine = engine_at(endpoint.clone()).await;
    let waiter = registry(waiter_engine.clone());
    // The holder gets in through a look, so it knows the waiter behind it
    // and will try to hand over to it.
    let before = first.locks("revoked").get("rw").lock().await.expect("lock");
    let holding = tokio::spawn({
        let lock = holder.locks("revoked").get("rw");
        async move { lock.lock().await }
    });
    wait_for_keys(&endpoint, prefix, 2).await;
    let reading = tokio::spawn({
        let lock = waiter.locks("revoked").get("rw");
        async move { lock.read().await }
    });
    wait_for_keys(&endpoint, prefix, 3).await;
    before.release().await.expect("release");
    let held = holding.await.expect("task").expect("lock");
    let revoked = waiter_engine.lease();
    ctl(&endpoint, &["lease", "revoke", &format!("{revoked:x}")]);
    // Its key goes with the lease (the waiter then queues again, on a new one).
    let revoked_key = format!("{prefix}{revoked:x}-");
    let started = Instant::now();
    while keys(&endpoint, prefix)
        .iter()
        .any(|k| k.starts_with(&revoked_key))
    {
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "the revoked lease's key stayed"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    held.release().await.expect("release");

    let read = tokio::time::timeout(Duration::from_secs(10), reading)
        .await
        .expect("the waiter never got in")
        .expect("task")
        .expect("read");
    let (created, lease) = oldest(&endpoint, prefix).expect("the reader's key");
    assert_eq!(read.fence(), created, "granted on a key that is not the oldest");
    assert_ne!(lease, revoked, "granted on the revoked lease");
    assert_eq!(lease, waiter_engine.lease());
    read.release().await.expect("release");
}

/// The value of `key`.
fn value(endpoint: &str, key: &str) -> String {
    ctl(endpoint, &["get", key, "--print-value-only"])
}

/// Keys `etcdctl lock` put are an operator's to revoke and to force out
/// like dlock's: the mark leaves the holder holding and its key as created;
/// the force lets dlock's waiter in, with a greater fence. And etcd's lock
/// waits behind a revoked dlock holder, whose downgrade keeps the mark, and
/// gets in once it lets go.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn etcdctl_lock_holders_are_revoked_and_forced_out_and_wait_for_a_revoked_dlock_holder() {
    let endpoint = shared().server.address();
    let settings = Settings {
        lease: SESSION_TTL,
        ..Settings::default()
    };
    let engine = engine_at(endpoint.clone()).await;
    let dlock = Registry::with_engine("etcd", engine.clone(), settings).expect("registry");
    let lock = dlock.locks("control").get("interop");
    let prefix = "/locks/control/interop/";

    let mut holder = etcdctl(&endpoint)
        .args(["lock", "/locks/control/interop", "sleep", "60"])
        .stdout(Stdio::null())
        .spawn()
        .expect("etcdctl lock");
    wait_for_keys(&endpoint, prefix, 1).await;
    let foreign = keys(&endpoint, prefix).remove(0);
    let (created, _) = revisions(&endpoint, &foreign);
    let waiter = tokio::spawn({
        let lock = lock.clone();
        async move { lock.lock().await.expect("lock") }
    });
    wait_for_keys(&endpoint, prefix, 2).await;
    assert_eq!(lock.revoke().await.expect("revoke"), 1);
    assert_eq!(
        value(&endpoint, &foreign),
        "revoked",
        "etcdctl's empty value, marked"
    );
    assert_eq!(
        revisions(&endpoint, &foreign).0,
        created,
        "the mark made a new key"
    );
    tokio::time::sleep(SESSION_TTL / 2).await;
    assert!(!waiter.is_finished(), "a revoke let the waiter in");
    assert_eq!(lock.force_release().await.expect("force release"), 1);
    let guard = tokio::time::timeout(SESSION_TTL, waiter)
        .await
        .expect("the waiter never got in")
        .expect("task");
    assert!(
        guard.fence() > created as u64,
        "fence {} after {created}",
        guard.fence()
    );
    holder.kill().expect("kill etcdctl");
    let _ = holder.wait();
    guard.release().await.expect("release");

    // In this task, for the nested read below.
    let guard = lock.lock().await.expect("lock");
    assert_eq!(lock.revoke().await.expect("revoke"), 1);
    tokio::time::timeout(SESSION_TTL, guard.revoked())
        .await
        .expect("the holder never heard it was revoked");
    let mut behind = etcdctl(&endpoint)
        .args(["lock", "/locks/control/interop", "true"])
        .stdout(Stdio::null())
        .spawn()
        .expect("etcdctl lock");
    wait_for_keys(&endpoint, prefix, 2).await;
    let read = lock.read().await.expect("nested read");
    guard.release().await.expect("downgrade");
    let mine = format!("{prefix}{:x}-0", engine.lease());
    let downgraded = value(&endpoint, &mine);
    assert!(
        downgraded.starts_with("dlock read ") && downgraded.ends_with("\nrevoked"),
        "the downgrade dropped the mark: {downgraded:?}"
    );
    tokio::time::sleep(SESSION_TTL / 2).await;
    assert!(
        behind.try_wait().expect("wait").is_none(),
        "etcd's lock passed a revoked dlock reader"
    );
    read.release().await.expect("release");
    let started = Instant::now();
    while behind.try_wait().expect("wait").is_none() {
        assert!(started.elapsed() < SESSION_TTL * 2, "etcd's lock never got in");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// CreateRevision and ModRevision of `key`.
fn revisions(endpoint: &str, key: &str) -> (i64, i64) {
    let fields = ctl(endpoint, &["get", key, "-w", "fields"]);
    let field = |name: &str| {
        fields
            .lines()
            .find(|l| l.starts_with(&format!("\"{name}\" :")))
            .and_then(|l| l.rsplit(' ').next()?.parse().ok())
            .unwrap_or_else(|| panic!("no {name} for {key}"))
    };
    (field("CreateRevision"), field("ModRevision"))
}

/// A holder that got in through a look knows who is right behind it and
/// hands the lock over in its release: the next writer's key is rewritten
/// in the same transaction, and that writer passes it on in turn.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_release_hands_the_lock_to_the_writer_behind_which_passes_it_on() {
    let endpoint = shared().server.address();
    let prefix = "/locks/handoff/chain/";
    let first = registry(engine_at(endpoint.clone()).await);
    let held = first.locks("handoff").get("chain").lock().await.expect("lock");
    let served = Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut waiters = Vec::new();
    for i in 0..3 {
        let engine = engine_at(endpoint.clone()).await;
        let key = format!("{prefix}{:x}-0", engine.lease());
        let (lock, served, at) = (
            registry(engine).locks("handoff").get("chain"),
            served.clone(),
            endpoint.clone(),
        );
        waiters.push(tokio::spawn(async move {
            let guard = lock.lock().await.expect("lock");
            let (created, modified) = revisions(&at, &key);
            served.lock().unwrap().push((i, modified != created));
            tokio::time::sleep(Duration::from_millis(100)).await;
            guard.release().await.expect("release");
        }));
        wait_for_keys(&endpoint, prefix, i + 2).await;
    }
    held.release().await.expect("release");
    for waiter in waiters {
        waiter.await.expect("waiter");
    }
    // The first waiter got in through a look (the first holder got in
    // through its put and knew nobody behind); each later one was handed
    // the lock, its key rewritten by the release before it.
    assert_eq!(*served.lock().unwrap(), [(0, false), (1, true), (2, true)]);
}

/// A holder cut off from etcd hears of its loss at half the lease TTL,
/// before the server expires the lease and lets the next one in; a blip
/// shorter than that loses nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_cut_off_holder_is_lost_before_the_next_gets_in_and_a_blip_loses_nothing() {
    let endpoint = shared().server.address();
    let proxy = CutProxy::start(endpoint.parse().expect("address")).await;
    let holder = registry(engine_at(proxy.address.to_string()).await);
    let waiter = registry(engine_at(endpoint.clone()).await);
    let guard = holder.locks("cut").get("k").lock().await.expect("lock");

    proxy.cut();
    tokio::time::sleep(SESSION_TTL / 4).await;
    proxy.heal();
    tokio::time::sleep(SESSION_TTL).await;
    assert!(!guard.is_lost(), "a blip of a quarter TTL lost the hold");

    let (lost_after, admitted_after) = cut_holder_then_next(&proxy, guard, {
        let lock = waiter.locks("cut").get("k");
        async move { lock.lock().await }
    })
    .await;
    println!(
        "lease TTL 2 s: lost fired {lost_after:?} after the cut, the next holder in {admitted_after:?} after it"
    );
    assert!(
        lost_after <= SESSION_TTL / 2 + Duration::from_millis(300),
        "lost only after {lost_after:?}"
    );
}

/// The runtime's live tasks once the count has held still for 200 ms.
async fn settled_task_count() -> usize {
    let tasks = || tokio::runtime::Handle::current().metrics().num_alive_tasks();
    let (mut last, mut still) = (tasks(), 0);
    while still < 4 {
        tokio::time::sleep(Duration::from_millis(50)).await;
        let now = tasks();
        still = if now == last { still + 1 } else { 0 };
        last = now;
    }
    last
}

/// A hold watches its session's end from the timer, not from a task of its
/// own: holds add no task until their first renewal is due, and a revoked
/// lease still makes every one lost at once, long before that renewal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn holds_watch_their_session_without_a_task_each() {
    const HOLDS: usize = 20;
    let endpoint = shared().server.address();
    let engine = engine_at(endpoint.clone()).await;
    let registry = registry(engine.clone());
    let locks = registry.locks("watched");
    let lease = Duration::from_secs(30);
    // The session, its keep-alive and the runtime's timer start with the first hold.
    let first = locks.get("first").with_lease(lease).lock().await.expect("lock");
    first.release().await.expect("release");
    let before = settled_task_count().await;

    let mut guards = Vec::new();
    for i in 0..HOLDS {
        guards.push(
            locks
                .get(i.to_string())
                .with_lease(lease)
                .lock()
                .await
                .expect("lock"),
        );
    }
    // Counted once nothing is in flight: a release finishing in the
    // background from before is not a hold's task. The gRPC client may
    // open a stream or connection task of its own meanwhile (CI saw one);
    // a task per hold would be 20.
    let after = settled_task_count().await;
    assert!(
        after <= before + 2,
        "{after} tasks after {HOLDS} holds, {before} before: a hold spawned a task to watch its session"
    );

    let revoked = Instant::now();
    ctl(&endpoint, &["lease", "revoke", &format!("{:x}", engine.lease())]);
    for (i, guard) in guards.iter().enumerate() {
        while guard.held().lost_reason().is_none() {
            assert!(
                revoked.elapsed() < lease / 3,
                "hold {i} not lost {:?} after its lease was revoked",
                revoked.elapsed()
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(
            guard.held().lost_reason(),
            Some(dlock::LostReason::Engine),
            "hold {i}"
        );
    }
    println!(
        "{HOLDS} holds lost {:?} after their lease was revoked",
        revoked.elapsed()
    );
    drop(guards);
}

/// Past its first renewal a holder watches its lock, so a revocation or a
/// force release reaches it at once (see the helper).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn past_its_first_renewal_a_holder_hears_a_revocation_and_a_force_release_at_once() {
    let registry = registry(engine_at(shared().server.address()).await);
    dlock_testkit::assert_acts_heard_at_once(&registry).await;
}

/// etcd 11456 (Jepsen): a lock returned to a waiter whose lease had expired
/// while it waited. The waiter is cut off past its TTL; meanwhile another
/// client takes the lock; once the waiter is back, it waits for that one.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_waiter_whose_lease_expired_while_cut_off_waits_for_the_next_holder() {
    let endpoint = shared().server.address();
    let proxy = CutProxy::start(endpoint.parse().expect("address")).await;
    let first = registry(engine_at(endpoint.clone()).await);
    let cut_off = registry(engine_at(proxy.address.to_string()).await);
    let next = registry(engine_at(endpoint.clone()).await);
    let prefix = "/locks/expired/x/";

    let held = first.locks("expired").get("x").lock().await.expect("lock");
    let started = Instant::now();
    let late = tokio::spawn({
        let lock = cut_off.locks("expired").get("x");
        async move {
            let guard = lock.lock().await.expect("the cut-off waiter's lock");
            (started.elapsed(), guard)
        }
    });
    wait_for_keys(&endpoint, prefix, 2).await;
    proxy.cut();
    // The server expires the waiter's lease and its key.
    wait_for_keys(&endpoint, prefix, 1).await;
    let queued = tokio::spawn({
        let lock = next.locks("expired").get("x");
        async move { lock.lock().await.expect("the next holder's lock") }
    });
    wait_for_keys(&endpoint, prefix, 2).await;
    held.release().await.expect("release");
    let guard = queued.await.expect("task");
    proxy.heal();
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(
        !late.is_finished(),
        "the cut-off waiter got in under the next holder"
    );
    let next_released = started.elapsed();
    let next_fence = guard.fence();
    guard.release().await.expect("release");
    let (granted_at, late_guard) = tokio::time::timeout(Duration::from_secs(15), late)
        .await
        .expect("the cut-off waiter never got in")
        .expect("task");
    assert!(
        granted_at >= next_released,
        "granted at {granted_at:?}, before {next_released:?}"
    );
    assert!(late_guard.fence() > next_fence, "the fence went back");
    late_guard.release().await.expect("release");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn waiters_share_one_watch_stream_each_watching_the_key_ahead_and_its_own() {
    const WAITERS: usize = 40;
    let own = Etcd::start();
    let endpoint = own.server.address();
    // Every waiter in etcd's line, not only this process's first.
    let settings = Settings {
        queue: Queue::Engine,
        ..Settings::default()
    };
    let dlock = Registry::with_engine("etcd", engine_at(endpoint.clone()).await, settings).expect("registry");
    let lock = dlock.locks("watch").get("one");
    let held = lock.lock().await.expect("lock");
    let order = Arc::new(AtomicU32::new(0));
    let mut waiters = Vec::new();
    for i in 0..WAITERS as u32 {
        let (lock, order) = (lock.clone(), order.clone());
        waiters.push(tokio::spawn(async move {
            let guard = lock.lock().await.expect("lock");
            let turn = order.fetch_add(1, Ordering::SeqCst);
            guard.release().await.expect("release");
            (i, turn)
        }));
        wait_for_keys(&endpoint, "/locks/watch/one/", i as usize + 2).await;
    }
    let started = Instant::now();
    // Two watchers a waiter: the key ahead, and its own (for a handoff).
    while metric(&endpoint, "etcd_debugging_mvcc_watcher_total") < 2.0 * WAITERS as f64 {
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "not every waiter watches"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        metric(&endpoint, "etcd_debugging_mvcc_watcher_total"),
        2.0 * WAITERS as f64
    );
    assert_eq!(metric(&endpoint, "etcd_debugging_mvcc_watch_stream_total"), 1.0);
    held.release().await.expect("release");
    for waiter in waiters {
        let (i, turn) = waiter.await.expect("waiter");
        assert_eq!(i, turn, "served out of order");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn nothing_is_left_in_etcd_after_the_suite() {
    let own = Etcd::start();
    let endpoint = own.server.address();
    run_each(|| {
        let endpoint = endpoint.clone();
        async move { engine_at(endpoint).await as Arc<dyn Engine> }
    })
    .await;
    assert_eq!(keys(&endpoint, "/"), Vec::<String>::new(), "keys left behind");
    let started = Instant::now();
    loop {
        let leases = ctl(&endpoint, &["lease", "list"]);
        if leases.starts_with("found 0 leases") {
            break;
        }
        assert!(
            started.elapsed() < SESSION_TTL * 3,
            "leases left behind: {leases}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn bad_settings_and_an_unreachable_cluster_are_clear_errors() {
    let nobody = format!("127.0.0.1:{}", free_port());
    let unreachable = EtcdConfig {
        client: ClientSettings::with_timeout(Duration::from_millis(800)),
        ..EtcdConfig::new(std::slice::from_ref(&nobody))
    };
    assert_unreachable_is_a_clear_error(
        EtcdEngine::connect("etcd-main", &unreachable),
        "etcd-main",
        &nobody,
        Duration::from_secs(3),
    )
    .await;

    let endpoint = shared().server.address();
    let fractional = EtcdConfig {
        session_ttl: Duration::from_millis(1500),
        ..config(endpoint.clone())
    };
    let message = EtcdEngine::connect("e", &fractional)
        .await
        .err()
        .expect("refused")
        .to_string();
    assert!(message.contains("engines.e.session_ttl"), "{message}");
    let half_auth = EtcdConfig {
        credentials: Credentials {
            username: Some("dlock".into()),
            ..Credentials::default()
        },
        ..config(endpoint)
    };
    let message = EtcdEngine::connect("e", &half_auth)
        .await
        .err()
        .expect("refused")
        .to_string();
    assert!(message.contains("engines.e.password"), "{message}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn user_and_password_authenticate_and_a_wrong_password_is_refused() {
    let own = Etcd::start();
    let endpoint = own.server.address();
    ctl(&endpoint, &["user", "add", "root:rootpw"]);
    ctl(&endpoint, &["user", "add", "dlock:lockpw"]);
    ctl(&endpoint, &["role", "add", "locker"]);
    ctl(
        &endpoint,
        &[
            "role",
            "grant-permission",
            "locker",
            "readwrite",
            "/locks/",
            "--prefix=true",
        ],
    );
    ctl(&endpoint, &["user", "grant-role", "dlock", "locker"]);
    ctl(&endpoint, &["auth", "enable"]);
    let with = |password: &str| EtcdConfig {
        credentials: Credentials {
            username: Some("dlock".into()),
            password: Some(password.into()),
            ..Credentials::default()
        },
        ..config(endpoint.clone())
    };
    let from_file = EtcdConfig {
        credentials: Credentials {
            username: Some("dlock".into()),
            password_file: Some(dlock_testkit::server::secret_file("lockpw")),
            ..Credentials::default()
        },
        ..config(endpoint.clone())
    };
    for (how, config) in [("password", with("lockpw")), ("password_file", from_file)] {
        let engine = Arc::new(EtcdEngine::connect("auth", &config).await.expect(how));
        let dlock = registry(engine);
        let guard = dlock.locks("auth").get("x").lock().await.expect("lock");
        guard.release().await.expect("release");
    }
    let message = EtcdEngine::connect("auth", &with("wrong"))
        .await
        .err()
        .expect("refused")
        .to_string();
    assert!(
        message.contains("auth") && message.contains(&endpoint),
        "{message}"
    );
}

/// An election is `concurrency.Election`'s layout: `etcdctl elect` and a
/// dlock candidate lead one at a time, each waiting for the other, with
/// rising terms; `etcdctl elect -l` prints a dlock leader's label as its
/// value, and dlock's observer shows `etcdctl`'s proposal as the leader's
/// label.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn etcdctl_elect_and_dlock_candidates_lead_one_at_a_time_and_see_each_other() {
    let endpoint = shared().server.address();
    let named = EtcdConfig {
        client: ClientSettings {
            client_name: Some("dlock candidate 1".into()),
            ..ClientSettings::default()
        },
        ..config(endpoint.clone())
    };
    let engine = EtcdEngine::connect("etcd", &named).await.expect("connect");
    let election = registry(Arc::new(engine)).locks("elect").election("leader");
    let name = "/locks/elect/leader";
    let mut observer = election.observe();
    let mut watching = Printed::spawn(etcdctl(&endpoint).args(["elect", "-l", name]));
    let limit = Duration::from_secs(10);

    let first = election.campaign().await.expect("campaign");
    watching.line("dlock candidate 1", limit);
    assert_eq!(
        value(&endpoint, &keys(&endpoint, name).remove(0)),
        "dlock candidate 1"
    );
    let seen = observer.next().await.expect("observe").expect("a leader");
    assert_eq!(
        (seen.label.as_deref(), seen.term),
        (Some("dlock candidate 1"), first.number())
    );

    // etcdctl campaigns behind dlock's leader, and leads once it resigns.
    let mut rival = Printed::spawn(etcdctl(&endpoint).args(["elect", name, "etcd proposal"]));
    wait_for_keys(&endpoint, &format!("{name}/"), 2).await;
    assert!(
        rival
            .try_line("etcd proposal", Duration::from_millis(700))
            .is_none(),
        "etcdctl led beside dlock"
    );
    let first_term = first.number();
    first.resign().await.expect("resign");
    rival.line("etcd proposal", limit);
    watching.line("etcd proposal", limit);
    let seen = observer.next_leader().await.expect("observe");
    assert_eq!(seen.label.as_deref(), Some("etcd proposal"));
    assert!(
        seen.term > first_term,
        "term {} not above {first_term}",
        seen.term
    );

    // dlock campaigns behind etcdctl's leader, and leads once it resigns.
    let next = tokio::spawn({
        let election = election.clone();
        async move { election.campaign().await }
    });
    wait_for_keys(&endpoint, &format!("{name}/"), 2).await;
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert!(!next.is_finished(), "dlock led beside etcdctl");
    // On SIGINT, etcdctl elect resigns.
    rival.signal("-INT");
    rival.wait();
    let second = tokio::time::timeout(limit, next)
        .await
        .expect("dlock leads")
        .expect("task");
    let second = second.expect("campaign");
    assert!(second.number() > seen.term);
    watching.line("dlock candidate 1", limit);
    second.resign().await.expect("resign");
    watching.signal("-INT");
    watching.wait();
    wait_for_keys(&endpoint, &format!("{name}/"), 0).await;
}

/// A leader cut off by the network hears its term is lost at half the
/// TTL, before the server expires its key and the next candidate leads,
/// with a greater term.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_leader_cut_off_hears_it_lost_before_the_next_leads() {
    let endpoint = shared().server.address();
    let proxy = CutProxy::start(endpoint.parse().expect("address")).await;
    let leader = registry(engine_at(proxy.address.to_string()).await);
    let next = registry(engine_at(endpoint).await)
        .locks("cut")
        .election("leader");
    let term = leader
        .locks("cut")
        .election("leader")
        .campaign()
        .await
        .expect("campaign");
    let campaign = async move { next.campaign().await.map(dlock::Term::into_guard) };
    let (lost_after, led_after) = cut_holder_then_next(&proxy, term.into_guard(), campaign).await;
    println!(
        "lease TTL 2 s: the leader lost {lost_after:?} after the cut, the next led {led_after:?} after it"
    );
}

/// etcd 19597: a campaign whose lease expired while it waited returned as
/// leader with no key. dlock's candidate, cut off past its TTL while it
/// waits, never leads on the expired key: back, it campaigns on a new
/// lease, behind the candidate that came meanwhile, and leads after it
/// with a greater term.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_candidate_whose_lease_expired_while_campaigning_never_leads_on_it() {
    let endpoint = shared().server.address();
    let proxy = CutProxy::start(endpoint.parse().expect("address")).await;
    let election = |registry: Registry| registry.locks("expired").election("leader");
    let first = election(registry(engine_at(endpoint.clone()).await));
    let cut_off = election(registry(engine_at(proxy.address.to_string()).await));
    let next = election(registry(engine_at(endpoint.clone()).await));
    let prefix = "/locks/expired/leader/";

    let leading = first.campaign().await.expect("campaign");
    let late = tokio::spawn(async move { cut_off.campaign().await.expect("the cut-off candidate's term") });
    wait_for_keys(&endpoint, prefix, 2).await;
    proxy.cut();
    // The server expires the candidate's lease and its key.
    wait_for_keys(&endpoint, prefix, 1).await;
    let queued = tokio::spawn(async move { next.campaign().await.expect("the next candidate's term") });
    wait_for_keys(&endpoint, prefix, 2).await;
    leading.resign().await.expect("resign");
    let term = queued.await.expect("task");
    proxy.heal();
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(!late.is_finished(), "the cut-off candidate led beside the next");
    let next_term = term.number();
    term.resign().await.expect("resign");
    let late = tokio::time::timeout(Duration::from_secs(15), late)
        .await
        .expect("the cut-off candidate never led")
        .expect("task");
    assert!(late.number() > next_term, "the term went back");
    let (created, _) = oldest(&endpoint, prefix).expect("the leader's key");
    assert_eq!(late.number(), created, "led on a key that is not the oldest");
    late.resign().await.expect("resign");
}
