//! ZooKeeper-specific behaviour against a real server on loopback: interop
//! with the real Apache Curator, session expiry and blips (through a proxy
//! that cuts the real connection), the LockKeeper, one watch per waiter,
//! digest auth, unreachable servers.

#![cfg(feature = "zookeeper")]

use std::net::SocketAddr;
use std::process::Command;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use dlock::engines::zookeeper::{ZooKeeperConfig, ZooKeeperEngine};
use dlock::kit::ClientSettings;
use dlock::{Error, LockView, Mode, Registry, Settings};
use dlock_testkit::fixtures::zookeeper::{curator_classpath, four_letter, zookeeper};
use dlock_testkit::printed::Printed;
use dlock_testkit::proxy::{CutProxy, cut_holder_then_next};
use dlock_testkit::server::TestServer;
use dlock_testkit::visits::Visits;

const CURATOR_PEER: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/curator/CuratorPeer.java");

fn server() -> &'static TestServer {
    static SERVER: OnceLock<TestServer> = OnceLock::new();
    SERVER.get_or_init(zookeeper)
}

fn config(connect: String) -> ZooKeeperConfig {
    ZooKeeperConfig {
        session_timeout: Duration::from_secs(2),
        keeper_idle: Duration::from_millis(500),
        ..ZooKeeperConfig::new(connect)
    }
}

async fn engine_at(connect: String) -> Arc<ZooKeeperEngine> {
    Arc::new(
        ZooKeeperEngine::connect("zk", &config(connect))
            .await
            .expect("connect"),
    )
}

fn registry(engine: Arc<ZooKeeperEngine>) -> Registry {
    leased(engine, Settings::default().lease)
}

/// A hold's lease in the revocation tests: a holder hears of a revocation
/// at its next renewal, a third of the lease on, plus one call.
const LEASE: Duration = Duration::from_secs(2);

fn leased(engine: Arc<ZooKeeperEngine>, lease: Duration) -> Registry {
    let settings = Settings {
        wait: dlock::Wait::For(Duration::from_secs(20)),
        lease,
        ..Settings::default()
    };
    Registry::with_engine("zk", engine, settings).expect("registry")
}

async fn client() -> (Registry, Arc<ZooKeeperEngine>) {
    let engine = engine_at(server().address()).await;
    (registry(engine.clone()), engine)
}

/// The real Apache Curator, driven line by line (tests/curator/CuratorPeer.java).
struct Curator(Printed);

impl Curator {
    fn start(path: &str) -> Self {
        let mut java = Command::new("java");
        java.args([
            "-cp",
            &curator_classpath(CURATOR_PEER),
            "CuratorPeer",
            &server().address(),
            path,
        ]);
        let curator = Curator(Printed::spawn(&mut java));
        assert_eq!(curator.answer(), "ready");
        curator
    }

    fn say(&mut self, line: &str) -> String {
        self.0.say(line);
        self.answer()
    }

    fn answer(&self) -> String {
        self.0.line("", Duration::from_secs(60)).0.trim().to_owned()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn curator_writer_and_dlock_exclude_each_other_both_ways() {
    let (dlock, _engine) = client().await;
    let lock = dlock.locks("interop").get("write");
    let mut curator = Curator::start("/locks/interop/write");

    // Curator holds the write lock: dlock can neither write nor read.
    assert_eq!(curator.say("write 5000"), "held");
    assert!(
        lock.try_lock().await.expect("try").is_none(),
        "dlock wrote under Curator's writer"
    );
    assert!(
        lock.try_read().await.expect("try").is_none(),
        "dlock read under Curator's writer"
    );
    let waiting = tokio::spawn({
        let lock = lock.clone();
        async move { lock.lock().await }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !waiting.is_finished(),
        "dlock's queued writer got in under Curator's writer"
    );
    assert_eq!(curator.say("release"), "released");
    let guard = tokio::time::timeout(Duration::from_secs(5), waiting)
        .await
        .expect("dlock's writer was not admitted after Curator released")
        .expect("task")
        .expect("lock");

    // dlock holds the write lock: Curator can neither write nor read.
    assert_eq!(curator.say("write 500"), "timeout");
    assert_eq!(curator.say("read 500"), "timeout");
    guard.release().await.expect("release");
    assert_eq!(curator.say("write 5000"), "held");
    assert_eq!(curator.say("release"), "released");

    // dlock holds read: Curator may read too, but not write.
    let read = lock.read().await.expect("read");
    assert_eq!(curator.say("read 5000"), "held");
    assert_eq!(curator.say("release"), "released");
    assert_eq!(curator.say("write 500"), "timeout");
    read.release().await.expect("release");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn curator_and_dlock_readers_share_and_a_dlock_writer_waits_its_turn() {
    let (dlock, _engine) = client().await;
    let lock = dlock.locks("interop").get("read");
    let mut curator = Curator::start("/locks/interop/read");
    assert_eq!(curator.say("read 5000"), "held");
    let shared = lock
        .try_read()
        .await
        .expect("try")
        .expect("readers share with Curator's reader");
    shared.release().await.expect("release");

    // A dlock writer queues behind Curator's reader and gets in when it leaves.
    let writer = tokio::spawn({
        let lock = lock.clone();
        async move { lock.lock().await }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !writer.is_finished(),
        "dlock's writer got in beside Curator's reader"
    );
    let released = Instant::now();
    assert_eq!(curator.say("release"), "released");
    let guard = tokio::time::timeout(Duration::from_secs(5), writer)
        .await
        .expect("writer not admitted after Curator's reader left")
        .expect("task")
        .expect("lock");
    println!(
        "dlock writer admitted {:?} after Curator's reader released",
        released.elapsed()
    );
    guard.release().await.expect("release");
}

/// Curator's `InterProcessSemaphoreV2` and dlock's semaphore on one path
/// count each other's permits, both ways, and a waiter on either side gets
/// in when the other lets go.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn curator_and_dlock_permits_exclude_each_other_both_ways() {
    let (dlock, _engine) = client().await;
    let semaphore = dlock.locks("interop").semaphore("permits", 2);
    let mut curator = Curator::start("/locks/interop/permits%permits");

    // Curator holds both permits: dlock gets none, and its waiter waits.
    assert_eq!(curator.say("permit 2 5000"), "held");
    assert_eq!(curator.say("permit 2 5000"), "held");
    assert!(
        semaphore.try_acquire().await.expect("try").is_none(),
        "dlock took a third permit of two"
    );
    let waiting = tokio::spawn({
        let semaphore = semaphore.clone();
        async move { semaphore.acquire().await }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !waiting.is_finished(),
        "dlock's waiter got in beside two Curator leases"
    );
    assert_eq!(curator.say("release"), "released");
    let first = tokio::time::timeout(Duration::from_secs(5), waiting)
        .await
        .expect("dlock's waiter was not admitted after Curator released")
        .expect("task")
        .expect("acquire");

    // dlock holds both: Curator gets none until dlock lets one go.
    let second = semaphore
        .try_acquire()
        .await
        .expect("try")
        .expect("the second permit");
    assert_eq!(curator.say("permit 2 500"), "timeout");
    first.release().await.expect("release");
    assert_eq!(curator.say("permit 2 5000"), "held");
    // From another task: this one holds a permit, and would take it again.
    let another = tokio::spawn({
        let semaphore = semaphore.clone();
        async move { semaphore.try_acquire().await.expect("try").is_none() }
    });
    assert!(
        another.await.expect("task"),
        "dlock took a permit that Curator holds"
    );
    second.release().await.expect("release");
    assert_eq!(curator.say("release"), "released");
}

/// An engine whose nodes say `label`.
async fn labelled(label: &str) -> Registry {
    registry(labelled_engine(label).await)
}

async fn labelled_engine(label: &str) -> Arc<ZooKeeperEngine> {
    let config = ZooKeeperConfig {
        client: ClientSettings {
            client_name: Some(label.to_owned()),
            ..ClientSettings::default()
        },
        ..config(server().address())
    };
    Arc::new(ZooKeeperEngine::connect("zk", &config).await.expect("connect"))
}

/// Inspects `lock` until `done` says the view is as expected, for 5 s.
async fn inspect_until(lock: &dlock::Lock, done: impl Fn(&LockView) -> bool) -> LockView {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let view = lock.inspect().await.expect("inspect");
        if done(&view) || Instant::now() > deadline {
            return view;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Curator's write lock (an `InterProcessMutex`) shows as a writer with no
/// label or owner (its node's data is Curator's address), a dlock waiter
/// and then holder behind it with its `client_name`, spaces and all; a
/// downgraded hold shows as a reader with its fence.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn records_show_curators_writer_unlabelled_and_dlocks_by_client_name() {
    let dlock = labelled("billing 7").await;
    let lock = dlock.locks("interop").get("records");
    let mut curator = Curator::start("/locks/interop/records");

    assert_eq!(curator.say("write 5000"), "held");
    let waiting = tokio::spawn({
        let lock = lock.clone();
        async move { lock.lock().await }
    });
    let view = inspect_until(&lock, |v| v.waiters.len() == 1).await;
    let ([holder], [waiter]) = (view.holders.as_slice(), view.waiters.as_slice()) else {
        panic!("Curator's writer and dlock's waiter expected: {view:?}");
    };
    assert_eq!(
        (holder.mode, holder.label.as_deref(), holder.owner.as_deref()),
        (Mode::Write, None, None),
        "{view:?}"
    );
    assert!(holder.fence.is_some() && holder.since.is_some(), "{view:?}");
    let curators = holder.fence;
    assert_eq!(
        (waiter.mode, waiter.label.as_deref()),
        (Mode::Write, Some("billing 7"))
    );

    assert_eq!(curator.say("release"), "released");
    let write = tokio::time::timeout(Duration::from_secs(5), waiting)
        .await
        .expect("dlock's writer was not admitted after Curator released")
        .expect("task")
        .expect("lock");
    let view = lock.inspect().await.expect("inspect");
    let [holder] = view.holders.as_slice() else {
        panic!("dlock's writer expected: {view:?}");
    };
    assert_eq!(holder.label.as_deref(), Some("billing 7"));
    assert_eq!(holder.owner, Some(write.owner_digest()));
    assert_eq!(holder.fence, Some(write.fence()));
    assert!(holder.fence > curators, "{view:?}");
    write.release().await.expect("release");

    // Released with a read held inside (in one task): the write node becomes
    // a read node, whose own czxid is the swap's; the record keeps the
    // hold's fence.
    let write = lock.lock().await.expect("lock");
    let read = lock.read().await.expect("read");
    write.release().await.expect("downgrade");
    let view = lock.inspect().await.expect("inspect");
    let [holder] = view.holders.as_slice() else {
        panic!("dlock's reader expected: {view:?}");
    };
    assert_eq!((holder.mode, holder.fence), (Mode::Read, Some(read.fence())));
    assert_eq!(holder.label.as_deref(), Some("billing 7"));
    read.release().await.expect("release");
    assert!(lock.inspect().await.expect("inspect").is_free());
}

/// A Curator lease and a dlock permit of one semaphore: both show as
/// holders, Curator's unlabelled, and the count is dlock's.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn records_show_curators_lease_beside_a_dlock_permit() {
    let dlock = labelled("reports").await;
    let semaphore = dlock.locks("interop").semaphore("records", 3);
    let mut curator = Curator::start("/locks/interop/records%permits");
    assert_eq!(curator.say("permit 3 5000"), "held");
    let permit = semaphore.acquire().await.expect("acquire");
    let view = semaphore.inspect().await.expect("inspect");
    assert_eq!(view.permits, Some(3), "{view:?}");
    let labels: Vec<_> = view.holders.iter().map(|h| h.label.as_deref()).collect();
    assert_eq!(labels, [None, Some("reports")], "{view:?}");
    assert_eq!(view.holders[1].owner, Some(permit.owner_digest()));
    assert_eq!(view.holders[1].fence, Some(permit.fence()));
    assert!(view.waiters.is_empty(), "{view:?}");
    let listed = dlock.locks("interop").list().await.expect("list");
    assert!(
        listed.iter().any(|v| v.name == "records" && v.permits == Some(3)),
        "{listed:?}"
    );
    permit.release().await.expect("release");
    assert_eq!(curator.say("release"), "released");
}

/// Two Curator processes and two dlock clients, three holders each, take
/// permits of one semaphore of 3 over and over, each stamping while inside:
/// every visit happens, and never more than 3 at once (3 are reached).
/// Every dlock holder has a slot of the 3, and no two dlock stays in one
/// slot overlap (a Curator holder has none, and counts all the same).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn curator_and_dlock_share_a_semaphore_and_never_exceed_its_permits() {
    const PERMITS: usize = 3;
    const HOLDERS: usize = 3;
    const EACH: usize = 5;
    // Long beside an admission through Curator's internal mutex (several
    // round trips, each slow on a busy machine), so that 3 do overlap.
    const STAY: Duration = Duration::from_millis(100);
    let log = dlock_testkit::server::scratch("zk-visits");
    let _ = std::fs::remove_file(&log);
    let path = "/locks/interop/shared%permits";
    let curators: Vec<_> = (0..2)
        .map(|_| {
            let mut curator = Curator::start(path);
            let command = format!(
                "visits {PERMITS} {HOLDERS} {EACH} {} {}",
                STAY.as_millis(),
                log.display()
            );
            tokio::task::spawn_blocking(move || curator.say(&command))
        })
        .collect();
    let visits = Arc::new(Visits::open(&log));
    let slots = Arc::new(std::sync::Mutex::new(std::collections::HashMap::new()));
    let mut holders = Vec::new();
    for _ in 0..2 {
        let (dlock, _engine) = client().await;
        for _ in 0..HOLDERS {
            let semaphore = dlock.locks("interop").semaphore("shared", PERMITS as u32);
            let (visits, slots) = (visits.clone(), slots.clone());
            holders.push(tokio::spawn(async move {
                for _ in 0..EACH {
                    let guard = semaphore.acquire().await.expect("acquire");
                    let slot = guard.slot().filter(|&slot| slot < PERMITS as u32);
                    slots
                        .lock()
                        .unwrap()
                        .insert(guard.fence(), slot.expect("a slot of the 3"));
                    assert!(visits.stay(guard, STAY).await.expect("stay"), "a permit was lost");
                }
            }));
        }
    }
    for holder in holders {
        holder.await.expect("dlock holder");
    }
    for curator in curators {
        let said = curator.await.expect("Curator");
        assert_eq!(said, format!("visits {}", HOLDERS * EACH));
    }
    let stays = Visits::stays(&log);
    assert_eq!(stays.len(), 4 * HOLDERS * EACH, "every visit, each its own stay");
    let most = Visits::most_at_once(&stays);
    println!(
        "Curator and dlock on a semaphore of {PERMITS}: {} visits, at most {most} inside at once",
        stays.len()
    );
    assert!(most <= PERMITS, "{most} inside a semaphore of {PERMITS}");
    assert_eq!(most, PERMITS, "the permits were never all in use at once");
    let slots = slots.lock().unwrap();
    let slotted: Vec<_> = stays
        .iter()
        .filter_map(|s| Some((slots.get(&s.fence)?, s)))
        .collect();
    let shared = slotted
        .iter()
        .flat_map(|a| slotted.iter().map(move |b| (a, b)))
        .filter(|((sa, a), (sb, b))| sa == sb && a.fence < b.fence && a.from < b.to && b.from < a.to)
        .count();
    assert_eq!(slotted.len(), 2 * HOLDERS * EACH, "every dlock stay has a slot");
    assert_eq!(shared, 0, "dlock holders inside one slot at once");
    let _ = std::fs::remove_file(&log);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn session_expiry_fires_lost_and_the_next_waiter_proceeds() {
    let target: SocketAddr = server().address().parse().expect("address");
    let proxy = CutProxy::start(target).await;
    let (holder, _) = {
        let engine = engine_at(proxy.address.to_string()).await;
        (registry(engine.clone()), engine)
    };
    let (waiter, _) = client().await;
    let guard = holder.locks("expiry").get("k").lock().await.expect("lock");
    let (lost_after, admitted_after) = cut_holder_then_next(&proxy, guard, {
        let lock = waiter.locks("expiry").get("k");
        async move { lock.lock().await }
    })
    .await;
    println!(
        "session timeout 2 s: lost fired {lost_after:?} after the cut, waiter admitted {admitted_after:?} after it"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_blip_shorter_than_the_session_timeout_loses_nothing() {
    let target: SocketAddr = server().address().parse().expect("address");
    let proxy = CutProxy::start(target).await;
    let engine = engine_at(proxy.address.to_string()).await;
    let holder = registry(engine);
    let guard = holder.locks("blip").get("k").lock().await.expect("lock");
    proxy.cut();
    tokio::time::sleep(Duration::from_millis(700)).await;
    proxy.heal();
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(!guard.is_lost(), "a 0.7 s blip lost a hold on a 2 s session");
    let (peer, _) = client().await;
    assert!(
        peer.locks("blip")
            .get("k")
            .try_lock()
            .await
            .expect("try")
            .is_none()
    );
    guard.release().await.expect("release after a blip");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_lock_keeper_forgets_100k_locks_once_idle() {
    let (dlock, engine) = client().await;
    let locks = dlock.locks("keeper");
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for worker in 0..50 {
        let locks = locks.clone();
        tasks.spawn(async move {
            for i in 0..2_000 {
                let guard = locks
                    .get(format!("user-{worker}-{i}"))
                    .lock()
                    .await
                    .expect("lock");
                guard.release().await.expect("release");
            }
        });
    }
    while let Some(done) = tasks.join_next().await {
        done.expect("worker");
    }
    let peak = engine.kept_locks();
    println!(
        "100,000 distinct locks in {:?}; {peak} kept at the end",
        started.elapsed()
    );
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(engine.kept_locks(), 0, "the keeper still holds idle locks");
    // The server removes the empty container parents by itself.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let stat = four_letter(&server().address(), "stat");
        let nodes: usize = stat
            .lines()
            .find_map(|l| l.strip_prefix("Node count: "))
            .and_then(|n| n.trim().parse().ok())
            .expect("node count");
        if nodes < 1_000 {
            break;
        }
        assert!(Instant::now() < deadline, "{nodes} nodes left on the server");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn each_waiter_watches_one_node_never_the_children_list() {
    let (dlock, _engine) = client().await;
    let holder = dlock.locks("herd").get("k").lock().await.expect("lock");
    let mut waiters = Vec::new();
    for _ in 0..10 {
        let (peer, _) = client().await;
        waiters.push(tokio::spawn(async move {
            let guard = peer.locks("herd").get("k").lock().await.expect("lock");
            guard.release().await.expect("release");
        }));
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    // `wchp`: each watched path, then the sessions watching it, one per line.
    let watches = four_letter(&server().address(), "wchp");
    let mut watched = std::collections::HashMap::<&str, usize>::new();
    let mut path = "";
    for line in watches.lines() {
        if line.starts_with('/') {
            path = line;
        } else if path.starts_with("/locks/herd/") && line.trim().starts_with("0x") {
            *watched.entry(path).or_default() += 1;
        }
    }
    assert!(
        !watched.contains_key("/locks/herd/k"),
        "someone watches the children list:\n{watches}"
    );
    assert_eq!(watched.len(), 10, "10 waiters, 10 watched nodes:\n{watches}");
    assert!(
        watched.values().all(|&n| n == 1),
        "one watcher per node:\n{watches}"
    );
    holder.release().await.expect("release");
    for waiter in waiters {
        waiter.await.expect("waiter");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_unreachable_server_is_an_error_naming_engine_and_address() {
    let nobody = dlock_testkit::server::free_port();
    let config = ZooKeeperConfig {
        client: ClientSettings::with_timeout(Duration::from_millis(800)),
        ..ZooKeeperConfig::new(format!("127.0.0.1:{nobody}"))
    };
    let started = Instant::now();
    let err = match ZooKeeperEngine::connect("zk-main", &config).await {
        Ok(_) => panic!("connected to nothing"),
        Err(e) => e,
    };
    let message = err.to_string();
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "took {:?}",
        started.elapsed()
    );
    assert!(
        message.contains("zk-main") && message.contains(&format!("127.0.0.1:{nobody}")),
        "{message}"
    );
    assert!(matches!(err, Error::Unavailable { .. }), "{message}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn digest_auth_keeps_other_clients_out_of_the_lock() {
    let secured = |digest: Option<&str>| ZooKeeperConfig {
        digest: digest.map(str::to_owned),
        root: "/secured".to_owned(),
        ..config(server().address())
    };
    let connect = |config: ZooKeeperConfig| async move {
        registry(Arc::new(
            ZooKeeperEngine::connect("zk", &config).await.expect("connect"),
        ))
    };
    let app = connect(secured(Some("app:secret"))).await;
    let guard = app.locks("g").get("k").lock().await.expect("lock");
    // Another instance with the credentials contends as usual...
    let twin = connect(secured(Some("app:secret"))).await;
    assert!(twin.locks("g").get("k").try_lock().await.expect("try").is_none());
    // ...while a client without them cannot even queue under the lock path.
    let stranger = connect(secured(None)).await;
    let err = stranger
        .locks("g")
        .get("k")
        .try_lock()
        .await
        .expect_err("a stranger queued under a secured lock");
    assert!(err.to_string().contains("not authorized"), "{err}");
    guard.release().await.expect("release");
    let twin = twin
        .locks("g")
        .get("k")
        .try_lock()
        .await
        .expect("try")
        .expect("free");
    twin.release().await.expect("release");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_waiter_whose_connection_drops_keeps_its_turn() {
    let target: SocketAddr = server().address().parse().expect("address");
    let proxy = CutProxy::start(target).await;
    let (holder, _) = client().await;
    let waiter = registry(engine_at(proxy.address.to_string()).await);
    let guard = holder.locks("drop").get("k").lock().await.expect("lock");
    let waiting = tokio::spawn(async move { waiter.locks("drop").get("k").lock().await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    proxy.cut();
    tokio::time::sleep(Duration::from_millis(500)).await;
    proxy.heal();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!waiting.is_finished(), "the waiter got in beside the holder");
    guard.release().await.expect("release");
    let next = tokio::time::timeout(Duration::from_secs(5), waiting)
        .await
        .expect("the waiter never got the lock after its connection came back")
        .expect("task")
        .expect("lock");
    next.release().await.expect("release");
}

/// Requests the server at `address` has received so far (`srvr`).
fn received(address: &str) -> u64 {
    let stats = four_letter(address, "srvr");
    stats
        .lines()
        .find_map(|l| l.strip_prefix("Received: "))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or_else(|| panic!("no request count in:\n{stats}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_uncontended_cycle_sends_two_requests_like_a_bare_create_and_delete() {
    // A server of its own: the count is the server's, for every client.
    let own = zookeeper();
    let lock = registry(engine_at(own.address()).await).locks("count").get("k");
    lock.lock().await.expect("lock").release().await.expect("release");
    let before = received(&own.address());
    let mut fences = Vec::new();
    for _ in 0..200 {
        let guard = lock.lock().await.expect("lock");
        fences.push(guard.fence());
        guard.release().await.expect("release");
    }
    let sent = received(&own.address()) - before;
    // 400, plus a few pings; a listing per cycle would make it 600.
    assert!((400..420).contains(&sent), "{sent} requests for 200 cycles");
    assert!(fences.windows(2).all(|w| w[0] < w[1]), "{fences:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_lock_path_we_may_create_under_but_not_write_still_locks() {
    use zookeeper_client::{Acl, Acls, AuthId, Client, CreateMode, Permission};
    // Set up by hand, as an operator might: children may be created and
    // deleted under the lock's path, its own data may not be written.
    let raw = Client::connect(&server().address()).await.expect("connect");
    let open = CreateMode::Persistent.with_acls(Acls::anyone_all());
    for parent in ["/locks", "/locks/no-write"] {
        let _ = raw.create(parent, &[], &open).await;
    }
    let no_write = [Acl::new(
        Permission::READ | Permission::CREATE | Permission::DELETE,
        AuthId::new("world", "anyone"),
    )];
    raw.create(
        "/locks/no-write/k",
        &[],
        &CreateMode::Persistent.with_acls(Acls::new(&no_write)),
    )
    .await
    .expect("create the lock's path");
    let (dlock, _) = client().await;
    let (peer, _) = client().await;
    let guard = dlock.locks("no-write").get("k").lock().await.expect("lock");
    assert!(
        peer.locks("no-write")
            .get("k")
            .try_lock()
            .await
            .expect("try")
            .is_none()
    );
    let first = guard.fence();
    guard.release().await.expect("release");
    let next = peer.locks("no-write").get("k").lock().await.expect("lock");
    assert!(next.fence() > first, "{} after {first}", next.fence());
    next.release().await.expect("release");
}

/// Curator's `Revoker.attemptRevoke` on a dlock holder's node (here a
/// downgrade's read node, which carries its fence in its data): the holder
/// hears it at its next renewal and keeps its hold, and writes its record
/// back over the revoke message, fence and all.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_curator_revoker_reaches_a_dlock_holder_whose_record_comes_back() {
    let dlock = leased(labelled_engine("billing 7").await, LEASE);
    let lock = dlock.locks("interop").get("revoked");
    let mut curator = Curator::start("/locks/interop/revoked");
    let write = lock.lock().await.expect("lock");
    let read = lock.read().await.expect("read");
    write.release().await.expect("downgrade");
    assert_eq!(curator.say("revoke"), "sent");
    tokio::time::timeout(LEASE, read.revoked())
        .await
        .expect("the dlock holder did not hear Curator's revocation within its lease");
    assert!(read.is_revoked() && !read.is_lost());
    let view = inspect_until(&lock, |v| v.holders.iter().any(|h| h.label.is_some())).await;
    let [holder] = view.holders.as_slice() else {
        panic!("dlock's reader expected: {view:?}");
    };
    assert_eq!(
        (holder.mode, holder.fence, holder.label.as_deref()),
        (Mode::Read, Some(read.fence()), Some("billing 7")),
        "{view:?}"
    );
    assert_eq!(holder.owner, Some(read.owner_digest()));
    // Curator's writer still waits: being asked takes nothing away.
    assert_eq!(curator.say("write 300"), "timeout");
    read.release().await.expect("release");
    assert_eq!(curator.say("write 5000"), "held");
    assert_eq!(curator.say("release"), "released");
}

/// Past its first renewal a dlock holder watches its node, so a
/// revocation or a force release reaches it at once (see the helper).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn past_its_first_renewal_a_holder_hears_a_revocation_and_a_force_release_at_once() {
    let dlock = registry(engine_at(server().address()).await);
    dlock_testkit::assert_acts_heard_at_once(&dlock).await;
}

/// A permit past its renewals keeps its hold: a renewal asks the watch of
/// a lock's node only of a lock (a permit's node state is another's).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_permit_renewed_many_times_keeps_its_hold() {
    let dlock = leased(engine_at(server().address()).await, LEASE);
    let permit = dlock
        .locks("renewed")
        .semaphore("permits", 2)
        .acquire()
        .await
        .expect("permit");
    tokio::time::sleep(LEASE * 2).await;
    assert!(!permit.is_lost(), "{:?}", permit.held().lost_reason());
    permit.release().await.expect("release");
}

/// dlock's revocation reaches a Curator holder that made itself revocable:
/// its listener runs, it lets go, and the dlock waiter gets in, not asked
/// to let go itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn dlock_revoke_asks_a_revocable_curator_holder_to_let_go() {
    let dlock = leased(engine_at(server().address()).await, LEASE);
    let lock = dlock.locks("interop").get("revocable");
    let mut curator = Curator::start("/locks/interop/revocable");
    assert_eq!(curator.say("revocable-write 5000"), "held");
    let waiting = tokio::spawn({
        let lock = lock.clone();
        async move { lock.lock().await }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!waiting.is_finished(), "dlock's writer got in under Curator's");
    assert_eq!(lock.revoke().await.expect("revoke"), 1);
    assert_eq!(curator.say("revoked 5000"), "revoked");
    assert_eq!(curator.say("release"), "released");
    let guard = tokio::time::timeout(Duration::from_secs(5), waiting)
        .await
        .expect("dlock's writer was not admitted after Curator let go")
        .expect("task")
        .expect("lock");
    tokio::time::sleep(LEASE * 2 / 3).await;
    assert!(!guard.is_revoked(), "the next holder inherited the request");
    guard.release().await.expect("release");
}

/// An operator unsticks a Curator holder: its node is deleted, the dlock
/// waiter gets in with a greater fence, and Curator's own release later
/// passes quietly, its node already gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn force_release_of_a_curator_holder_lets_a_dlock_waiter_in() {
    let (dlock, _engine) = client().await;
    let lock = dlock.locks("interop").get("forced");
    let mut curator = Curator::start("/locks/interop/forced");
    assert_eq!(curator.say("write 5000"), "held");
    let waiting = tokio::spawn({
        let lock = lock.clone();
        async move { lock.lock().await }
    });
    let view = inspect_until(&lock, |v| v.waiters.len() == 1).await;
    let curators = view
        .holders
        .first()
        .and_then(|h| h.fence)
        .expect("Curator's fence");
    assert!(!waiting.is_finished(), "dlock's writer got in under Curator's");
    assert_eq!(lock.force_release().await.expect("force release"), 1);
    let guard = tokio::time::timeout(Duration::from_secs(5), waiting)
        .await
        .expect("dlock's writer was not admitted after the force release")
        .expect("task")
        .expect("lock");
    assert!(guard.fence() > curators, "{} after {curators}", guard.fence());
    assert_eq!(curator.say("release"), "released");
    assert_eq!(curator.say("write 300"), "timeout");
    guard.release().await.expect("release");
    assert_eq!(lock.force_release().await.expect("force release"), 0);
}

/// An election is Curator's `LeaderLatch` layout: a Curator latch and a
/// dlock candidate on one path lead one at a time, each waiting for the
/// other, with rising terms; Curator reads a dlock leader's label as its
/// id, and dlock's observer reads Curator's id as the leader's label.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn curator_leader_latch_and_dlock_candidates_lead_one_at_a_time_and_see_each_other() {
    let election = labelled("dlock-7").await.locks("interop").election("latch");
    let mut observer = election.observe();
    let mut curator = Curator::start("/locks/interop/latch");
    let limit = Duration::from_secs(10);

    let first = election.campaign().await.expect("campaign");
    assert_eq!(curator.say("leader"), "leader dlock-7");
    let seen = observer.next().await.expect("observe").expect("a leader");
    assert_eq!(
        (seen.label.as_deref(), seen.term),
        (Some("dlock-7"), first.number())
    );

    // Curator's latch joins behind dlock's leader, and leads once it resigns.
    assert_eq!(curator.say("latch curator 1"), "started");
    assert_eq!(curator.say("lead 700"), "timeout", "Curator led beside dlock");
    let first_term = first.number();
    first.resign().await.expect("resign");
    assert_eq!(curator.say("lead 5000"), "leader");
    let seen = tokio::time::timeout(limit, observer.next_leader()).await;
    let seen = seen.expect("a leader in time").expect("observe");
    assert_eq!(seen.label.as_deref(), Some("curator 1"));
    assert!(
        seen.term > first_term,
        "term {} not above {first_term}",
        seen.term
    );

    // dlock campaigns behind Curator's leader, and leads once it closes.
    let next = tokio::spawn({
        let election = election.clone();
        async move { election.campaign().await }
    });
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert!(!next.is_finished(), "dlock led beside Curator");
    assert_eq!(curator.say("leader"), "leader curator 1");
    assert_eq!(curator.say("unlatch"), "closed");
    let second = tokio::time::timeout(limit, next)
        .await
        .expect("dlock leads")
        .expect("task");
    let second = second.expect("campaign");
    assert!(second.number() > seen.term);
    assert_eq!(curator.say("leader"), "leader dlock-7");
    second.resign().await.expect("resign");
    assert_eq!(curator.say("leader"), "leader none");
}

/// A leader cut off by the network hears its term is lost at half the
/// session timeout, before the server expires its session and the next
/// candidate leads, with a greater term.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_leader_cut_off_hears_it_lost_before_the_next_leads() {
    let target: SocketAddr = server().address().parse().expect("address");
    let proxy = CutProxy::start(target).await;
    let leader = registry(engine_at(proxy.address.to_string()).await);
    let (peer, _) = client().await;
    let next = peer.locks("cut").election("leader");
    let term = leader
        .locks("cut")
        .election("leader")
        .campaign()
        .await
        .expect("campaign");
    let campaign = async move { next.campaign().await.map(dlock::Term::into_guard) };
    let (lost_after, led_after) = cut_holder_then_next(&proxy, term.into_guard(), campaign).await;
    println!(
        "session timeout 2 s: the leader lost {lost_after:?} after the cut, the next led {led_after:?} after it"
    );
}

/// Digest authentication from `username` and `password_file`: the lock's
/// nodes get creator-only ACLs under that identity, which another user may
/// not read.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_digest_login_from_a_password_file_owns_the_lock_nodes() {
    use zookeeper_client::Client;
    let config = ZooKeeperConfig {
        credentials: dlock::kit::Credentials {
            username: Some("locker".into()),
            password_file: Some(dlock_testkit::server::secret_file("s3cret")),
            ..Default::default()
        },
        ..config(server().address())
    };
    let engine = Arc::new(ZooKeeperEngine::connect("zk", &config).await.expect("connect"));
    let guard = registry(engine)
        .locks("digest")
        .get("k")
        .lock()
        .await
        .expect("lock");
    let login = async |auth: &[u8]| {
        let connector = Client::connector().with_auth("digest", auth);
        connector.connect(&server().address()).await.expect("connect")
    };
    // The same identity, given as `digest`, may read the nodes.
    let owner = login(b"locker:s3cret").await;
    let (children, _) = owner.get_children("/locks/digest/k").await.expect("children");
    let node = format!("/locks/digest/k/{}", children.first().expect("the hold's node"));
    let (acls, _) = owner.get_acl(&node).await.expect("acl");
    assert!(
        acls.iter()
            .all(|acl| acl.auth_id().scheme() == "digest" && acl.auth_id().id().starts_with("locker:")),
        "{acls:?}"
    );
    let stranger = login(b"stranger:other").await;
    assert!(
        stranger.get_data(&node).await.is_err(),
        "another user read the hold's node"
    );
    assert!(
        stranger.get_children("/locks/digest/k").await.is_err(),
        "another user listed the lock"
    );
    guard.release().await.expect("release");
}
