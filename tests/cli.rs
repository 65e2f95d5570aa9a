//! The `dlock` command as a process against a real Redis: what it shows of
//! holds made elsewhere (a permit's slot too), and the exit codes scripts
//! test.

#![cfg(all(feature = "cli", feature = "redis"))]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use dlock::{Config, Registry};
use dlock_testkit::Fixture;
use dlock_testkit::fixtures::redis::redis_args;
use dlock_testkit::server::{TestServer, free_port};

/// A config file for the Redis at `url`, labelled `billing 7`.
fn config_file(tag: &str, body: &str) -> PathBuf {
    let path = dlock_testkit::server::scratch(&format!("cli-{tag}.toml"));
    std::fs::write(&path, body).expect("write config");
    path
}

fn redis_config(url: &str) -> String {
    format!(
        "[defaults]\nclient_name = \"billing 7\"\n[engines.main]\nkind = \"redis\"\nurl = \"{url}\"\nconnect_timeout = \"2s\"\n[groups.order]\n"
    )
}

fn dlock(config: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_dlock"))
        .arg("--config")
        .arg(config)
        .args(args)
        .output()
        .expect("run dlock")
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn show_and_locks_tell_who_holds_and_who_waits() {
    let server = TestServer::start("redis-server", |port| redis_args(port, &[]));
    let text = redis_config(&format!("redis://{}", server.address()));
    let path = config_file("show", &text);
    // The holder and the waiter as two processes would be: a registry each.
    let config = Config::parse(&text, []).expect("config");
    let (holding, waiting) = (
        Registry::build(&config, &dlock::engines::kinds())
            .await
            .expect("registry"),
        Registry::build(&config, &dlock::engines::kinds())
            .await
            .expect("registry"),
    );
    // A name a page would take for markup comes back as it was written.
    let name = "<img src=x onerror=alert(1)>";
    let lock = holding
        .locks("order")
        .get(name)
        .with_lease(Duration::from_secs(30));
    let guard = lock.lock().await.expect("lock");
    let waiter = tokio::spawn({
        let lock = waiting.locks("order").get(name);
        async move { lock.lock().await.expect("waiter").release().await }
    });
    // Queued within seconds, or the test fails rather than hangs.
    for _ in 0..500 {
        if !lock.inspect().await.expect("inspect").waiters.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    let shown = dlock(&path, &["show", &format!("order/{name}"), "--json"]);
    assert_eq!(shown.status.code(), Some(0), "{shown:?}");
    let json: serde_json::Value = serde_json::from_slice(&shown.stdout).expect("json");
    let view = &json[0];
    assert_eq!(
        (view["group"].as_str(), view["name"].as_str()),
        (Some("order"), Some(name))
    );
    let holder = &view["holders"][0];
    assert_eq!(holder["label"], "billing 7");
    assert_eq!(holder["mode"], "write");
    assert_eq!(holder["fence"], guard.fence());
    assert_eq!(holder["owner"], guard.owner_digest());
    assert!(
        holder["since"].as_u64().is_some() && holder["lease_ends"].as_u64().is_some(),
        "{holder}"
    );
    assert_eq!(view["waiters"][0]["label"], "billing 7");
    assert!(
        !stdout(&shown).contains(&guard.owner_digest().repeat(4)),
        "never the id"
    );

    let listed = dlock(&path, &["locks", "order"]);
    assert_eq!(listed.status.code(), Some(0), "{listed:?}");
    let table = stdout(&listed);
    assert!(
        table.contains(name) && table.contains("billing 7") && table.contains("waiter 1"),
        "{table}"
    );
    let (everywhere, order) = (
        dlock(&path, &["locks", "--json"]),
        dlock(&path, &["locks", "order", "--json"]),
    );
    assert_eq!(stdout(&everywhere), stdout(&order), "the config's one group");

    // A semaphore's holders, each with its slot.
    let pool = holding.locks("order").semaphore("pool", 2);
    let permits = dlock_testkit::permits_held(&pool, 2).await;
    let shown = dlock(&path, &["show", "order/pool", "--permits", "2"]);
    assert_eq!(shown.status.code(), Some(0), "{shown:?}");
    // Without `--permits`, the lock of that name is free, and the held
    // semaphore of the same name is shown beside it.
    let unasked = dlock(&path, &["show", "order/pool"]);
    assert_eq!(unasked.status.code(), Some(0), "{unasked:?}");
    let beside = stdout(&unasked);
    assert!(
        beside.contains("order/pool (2 permits)") && beside.contains("free"),
        "{beside}"
    );
    let table = stdout(&shown);
    for permit in &permits {
        let slot = format!("holder, slot {}", permit.slot().expect("a slot"));
        assert!(table.contains(&slot), "{slot} in {table}");
    }
    let json = dlock(&path, &["show", "order/pool", "--permits", "2", "--json"]);
    let json: serde_json::Value = serde_json::from_slice(&json.stdout).expect("json");
    let mut slots: Vec<u64> = (0..2)
        .filter_map(|i| json[0]["holders"][i]["slot"].as_u64())
        .collect();
    slots.sort();
    assert_eq!(slots, [0, 1], "{json}");
    for permit in permits {
        permit.release().await.expect("release");
    }

    guard.release().await.expect("release");
    waiter.await.expect("task").expect("release");
    let free = dlock(&path, &["show", &format!("order/{name}")]);
    assert_eq!(free.status.code(), Some(3), "a free lock: {free:?}");
    let none = dlock(&path, &["locks", "order", "--json"]);
    assert_eq!((none.status.code(), stdout(&none).trim()), (Some(3), "[]"));
}

#[test]
fn errors_name_what_is_wrong_and_exit_as_documented() {
    let address = format!("127.0.0.1:{}", free_port());
    let unreachable = config_file("unreachable", &redis_config(&format!("redis://{address}")));
    let out = dlock(&unreachable, &["locks", "order"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("redis") && stderr.contains(&address), "{stderr}");

    let bad = config_file("bad", "[defaults]\nlease = \"1ms\"\n");
    let out = dlock(&bad, &["locks", "order"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("defaults.lease"));

    let out = dlock(&bad, &["show", "no-slash"]);
    assert_eq!(out.status.code(), Some(2));
    // A key that cannot be one is bad usage too, not an engine's failure.
    let memory = config_file("keys", "[engines.mem]\nkind = \"memory\"\n");
    let long = format!("ops/{}", "n".repeat(70_000));
    for key in ["/x", "ops/", long.as_str()] {
        let out = dlock(&memory, &["show", key]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(
            out.status.code(),
            Some(2),
            "{}: {stderr}",
            &key[..key.len().min(20)]
        );
        assert!(stderr.contains("invalid lock key"), "{stderr}");
    }
    let out = dlock(&bad, &["frobnicate"]);
    assert_eq!(out.status.code(), Some(2), "usage");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn revoke_asks_and_release_force_hands_the_lock_on() {
    let server = TestServer::start("redis-server", |port| redis_args(port, &[]));
    let text = redis_config(&format!("redis://{}", server.address()));
    let path = config_file("act", &text);
    let config = Config::parse(&text, []).expect("config");
    let kinds = dlock::engines::kinds();
    let (holding, waiting) = (
        Registry::build(&config, &kinds).await.expect("registry"),
        Registry::build(&config, &kinds).await.expect("registry"),
    );
    // Holders hear at their next renewal: a third of this lease.
    let lease = Duration::from_secs(2);
    let guard = holding
        .locks("order")
        .get("stuck")
        .with_lease(lease)
        .lock()
        .await
        .expect("lock");
    let waiter = tokio::spawn({
        let lock = waiting.locks("order").get("stuck");
        async move { lock.lock().await.expect("waiter") }
    });

    let revoked = dlock(&path, &["revoke", "order/stuck", "--json"]);
    assert_eq!(revoked.status.code(), Some(0), "{revoked:?}");
    let json: serde_json::Value = serde_json::from_slice(&revoked.stdout).expect("json");
    assert_eq!(json, serde_json::json!({ "lock": "order/stuck", "asked": 1 }));
    tokio::time::timeout(lease, guard.revoked())
        .await
        .expect("the holder hears it was asked");
    assert!(!guard.is_lost(), "asking takes nothing");

    let unforced = dlock(&path, &["release", "order/stuck"]);
    assert_eq!(unforced.status.code(), Some(2), "{unforced:?}");
    assert!(String::from_utf8_lossy(&unforced.stderr).contains("--force"));

    let forced = dlock(&path, &["release", "--force", "order/stuck"]);
    assert_eq!(forced.status.code(), Some(0), "{forced:?}");
    assert_eq!(stdout(&forced).trim(), "order/stuck: forced out 1 holder(s)");
    let next = tokio::time::timeout(Duration::from_secs(10), waiter)
        .await
        .expect("the waiter's turn")
        .expect("task");
    assert!(next.fence() > guard.fence(), "the next token is greater");
    let reason = tokio::time::timeout(lease * 2, guard.lost())
        .await
        .expect("the old holder hears it");
    assert_eq!(reason, dlock::LostReason::ForceReleased);
    next.release().await.expect("release");

    let nothing = dlock(&path, &["release", "--force", "order/stuck"]);
    assert_eq!(nothing.status.code(), Some(3), "nothing held: {nothing:?}");
}

/// Pointed at a server that accepts and never answers, the command fails
/// within `connect_timeout` for every kind, naming the engine and the
/// address: the operator's shell never hangs.
#[cfg(all(
    feature = "postgres",
    feature = "memcached",
    feature = "mysql",
    feature = "zookeeper",
    feature = "etcd"
))]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_server_fails_the_command_within_connect_timeout() {
    let silent = dlock_testkit::proxy::SilentListener::start().await;
    let at = silent.address;
    for (kind, server) in [
        ("redis", format!("url = \"redis://{at}\"")),
        ("postgres", format!("url = \"postgres://dlock@{at}/postgres\"")),
        ("mysql", format!("url = \"mysql://dlock@{at}/dlock\"")),
        ("memcached", format!("address = \"{at}\"")),
        ("zookeeper", format!("connect = \"{at}\"")),
        ("etcd", format!("endpoints = [\"{at}\"]")),
    ] {
        let path = config_file(
            &format!("silent-{kind}"),
            &format!("[engines.main]\nkind = \"{kind}\"\n{server}\nconnect_timeout = \"1s\"\n"),
        );
        let started = std::time::Instant::now();
        let out = tokio::task::spawn_blocking(move || dlock(&path, &["locks", "ops"]))
            .await
            .expect("run");
        let took = started.elapsed();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{kind}: {stderr}");
        assert!(
            stderr.contains(kind) && stderr.contains(&at.to_string()),
            "{kind}: {stderr}"
        );
        assert!(
            took < Duration::from_millis(2500),
            "{kind}: the command took {took:?}"
        );
    }
}

/// Without a config that names an engine, the command would read an empty
/// memory engine of its own and call a held lock free: it refuses, saying
/// where it looked. An engine of `kind = "memory"` is asked for, and runs.
#[test]
fn without_an_engine_the_command_refuses_rather_than_call_a_lock_free() {
    let here = dlock_testkit::server::scratch("cli-nowhere");
    std::fs::create_dir_all(&here).expect("a folder with no config");
    let run = |args: &[&str]| {
        let mut command = Command::new(env!("CARGO_BIN_EXE_dlock"));
        for (name, _) in std::env::vars().filter(|(name, _)| name.starts_with("DLOCK_")) {
            command.env_remove(name);
        }
        command.current_dir(&here).args(args).output().expect("run dlock")
    };
    let out = run(&["show", "scheduler/leader"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("no dlock.toml in") && stderr.contains(&*here.to_string_lossy()),
        "{stderr}"
    );
    assert!(out.stdout.is_empty(), "nothing said free");
    let empty = config_file("no-engine", "[groups.order]\n");
    let out = dlock(&empty, &["locks", "order"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("names no engine"));
    let memory = config_file("memory", "[engines.mem]\nkind = \"memory\"\n");
    assert_eq!(
        dlock(&memory, &["locks", "order"]).status.code(),
        Some(3),
        "asked for"
    );
    // `-c` after the verb, as `--json` may be.
    let after = Command::new(env!("CARGO_BIN_EXE_dlock"))
        .args(["locks", "order", "-c"])
        .arg(&memory)
        .output()
        .expect("run dlock");
    assert_eq!(
        after.status.code(),
        Some(3),
        "{}",
        String::from_utf8_lossy(&after.stderr)
    );
    let _ = std::fs::remove_dir_all(&here);
}

/// A reader that stops early (`dlock locks | head -2`) is no failure: the
/// command keeps its exit code rather than panic (101). Its output goes to
/// a pipe whose reading end is already closed.
#[test]
fn a_closed_pipe_on_stdout_is_no_panic() {
    let (reader, writer) = std::io::pipe().expect("pipe");
    drop(reader);
    let memory = config_file("pipe", "[engines.mem]\nkind = \"memory\"\n");
    let out = Command::new(env!("CARGO_BIN_EXE_dlock"))
        .arg("--config")
        .arg(&memory)
        .args(["--json", "locks", "order"])
        .stdout(writer)
        .output()
        .expect("run dlock");
    assert_eq!(
        out.status.code(),
        Some(3),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Names come from applications, often from user input: in a table they
/// cannot recolour, overwrite or split rows, or set the terminal's title,
/// and one name of 65,000 bytes cannot flood it. JSON keeps every name
/// exact.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn names_cannot_act_on_the_terminal_and_long_ones_are_cut() {
    let server = TestServer::start("redis-server", |port| redis_args(port, &[]));
    let text = redis_config(&format!("redis://{}", server.address()));
    let path = config_file("escapes", &text);
    let registry = Registry::build(
        &Config::parse(&text, []).expect("config"),
        &dlock::engines::kinds(),
    )
    .await
    .expect("registry");
    let long = "n".repeat(65_000);
    let names = [
        "ansi\u{1b}[31mRED",
        "hide\r order/db-migrate  free",
        "new\nline",
        "title\u{1b}]0;pwned\u{1b}\\",
        long.as_str(),
    ];
    let mut held = Vec::new();
    for name in names {
        held.push(registry.locks("order").get(name).lock().await.expect("lock"));
    }
    let table = dlock(&path, &["locks", "order"]);
    assert_eq!(table.status.code(), Some(0));
    let shown = stdout(&table);
    assert!(!shown.contains(['\u{1b}', '\r']), "{shown:?}");
    assert_eq!(shown.lines().count(), 1 + names.len(), "a row each: {shown:?}");
    assert!(shown.len() < 4_000, "{} bytes", shown.len());
    assert!(
        shown.contains("order/ansi\\u{1b}[31mRED") && shown.contains("order/new\\nline"),
        "{shown}"
    );
    let json = dlock(&path, &["locks", "order", "--json"]);
    let json: serde_json::Value = serde_json::from_slice(&json.stdout).expect("json");
    let mut exact: Vec<&str> = json
        .as_array()
        .expect("views")
        .iter()
        .filter_map(|v| v["name"].as_str())
        .collect();
    exact.sort();
    let mut names = names.to_vec();
    names.sort();
    assert_eq!(exact, names);
    for guard in held {
        guard.release().await.expect("release");
    }
}

/// `F`'s servers, started, and a config of them labelled `billing 7`: its
/// file, tagged `tag`, and as parsed.
fn served<F: Fixture>(tag: &str) -> (F, PathBuf, Config) {
    let fixture = F::start();
    let text = format!(
        "[defaults]\nclient_name = \"billing 7\"\n[engines.main]\n{}\nconnect_timeout = \"5s\"\n[groups.order]\n",
        fixture.engine_config()
    );
    let path = config_file(&format!("{tag}-{}", F::NAME), &text);
    (fixture, path, Config::parse(&text, []).expect("config"))
}

/// `release --force --if-fence/--if-owner` and `revoke --if-owner`, as an
/// operator uses them: the hold `show` printed changed hands before the
/// act, so the act finds no holder (exit 3) and the new holder keeps its
/// lock, unasked; aimed at the new holder, it forces that one out. Against
/// each kind of server the command is most used with.
async fn an_aimed_act_spares_a_holder_that_came_in_since<F: Fixture>() {
    let (_fixture, path, config) = served::<F>("aimed");
    let registry = Registry::build(&config, &dlock::engines::kinds())
        .await
        .expect("registry");
    let lock = registry
        .locks("order")
        .get("swapped")
        .with_lease(Duration::from_secs(3));
    let looked = |output: &Output| -> (u64, String) {
        let views: serde_json::Value = serde_json::from_slice(&output.stdout).expect("json");
        let holder = &views[0]["holders"][0];
        let fence = holder["fence"].as_u64().expect("a fence");
        (fence, holder["owner"].as_str().expect("an owner").to_owned())
    };

    let first = lock.lock().await.expect("lock");
    let (fence, owner) = looked(&dlock(&path, &["show", "order/swapped", "--json"]));
    assert_eq!((fence, &owner), (first.fence(), &first.owner_digest()));
    first.release().await.expect("release");
    let next = lock.lock().await.expect("the next holder's lock");

    let fence = fence.to_string();
    for args in [
        &["release", "--force", "order/swapped", "--if-fence", &fence][..],
        &["release", "--force", "order/swapped", "--if-owner", &owner],
        &["revoke", "order/swapped", "--if-owner", &owner],
    ] {
        let missed = dlock(&path, &[args, &["--json"]].concat());
        assert_eq!(missed.status.code(), Some(3), "{args:?}: {missed:?}");
        let json: serde_json::Value = serde_json::from_slice(&missed.stdout).expect("json");
        assert_eq!(
            json["forced_out"].as_u64().or(json["asked"].as_u64()),
            Some(0),
            "{args:?}"
        );
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        !next.is_lost() && !next.is_revoked(),
        "{}: the new holder was touched",
        F::NAME
    );

    let (fence, owner) = looked(&dlock(&path, &["show", "order/swapped", "--json"]));
    assert_eq!(fence, next.fence());
    let fence = fence.to_string();
    let forced = dlock(
        &path,
        &[
            "release",
            "--force",
            "order/swapped",
            "--if-fence",
            &fence,
            "--if-owner",
            &owner,
        ],
    );
    assert_eq!(forced.status.code(), Some(0), "{forced:?}");
    assert_eq!(stdout(&forced).trim(), "order/swapped: forced out 1 holder(s)");
    let reason = tokio::time::timeout(Duration::from_secs(6), next.lost())
        .await
        .expect("the holder hears it");
    assert_eq!(reason, dlock::LostReason::ForceReleased);
}

/// A test each of `$case` against the kinds of server the command is most
/// used with.
macro_rules! on_servers {
    ($case:ident: $($feature:literal $test:ident $fixture:ty,)*) => {$(
        #[cfg(feature = $feature)]
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $test() {
            $case::<$fixture>().await;
        }
    )*};
}

on_servers! { an_aimed_act_spares_a_holder_that_came_in_since:
    "redis" an_aimed_act_on_redis dlock_testkit::fixtures::redis::Redis,
    "postgres" an_aimed_act_on_postgres dlock_testkit::fixtures::postgres::Postgres,
    "etcd" an_aimed_act_on_etcd dlock_testkit::fixtures::etcd::Etcd,
    "zookeeper" an_aimed_act_on_zookeeper dlock_testkit::fixtures::zookeeper::ZooKeeper,
}

/// After a process crashed holding many locks and a permit: `release
/// --force` with `--label` and `--prefix` forces out exactly the holds they
/// pick, each only while it is the hold that was listed; `--dry-run` shows
/// them and forces none; the same process's other locks and another
/// process's locks and permit stay held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bulk_release_forces_out_exactly_the_holds_it_picks() {
    let server = TestServer::start("redis-server", |port| redis_args(port, &[]));
    let url = format!("redis://{}", server.address());
    let config_of = |label: &str| redis_config(&url).replace("billing 7", label);
    let path = config_file("bulk", &config_of("operator"));
    let kinds = dlock::engines::kinds();
    let crashed = Config::parse(&config_of("worker 3"), []).expect("config");
    let crashed = Registry::build(&crashed, &kinds).await.expect("registry");
    let other = Config::parse(&config_of("worker 4"), []).expect("config");
    let other = Registry::build(&other, &kinds).await.expect("registry");
    let lease = Duration::from_secs(30);
    let take = |registry: &Registry, names: Vec<String>| {
        let locks = registry.locks("order");
        let takes = names.into_iter().map(move |name| {
            let lock = locks.get(name).with_lease(lease);
            async move { lock.lock().await.expect("lock") }
        });
        futures_util::future::join_all(takes)
    };
    let jobs = take(&crashed, (0..300).map(|i| format!("job/{i}")).collect()).await;
    let reports = take(&crashed, (0..10).map(|i| format!("report/{i}")).collect()).await;
    let others = take(&other, (300..305).map(|i| format!("job/{i}")).collect()).await;
    let pool = |registry: &Registry| registry.locks("order").semaphore("job/pool", 2).with_lease(lease);
    let crashed_permit = pool(&crashed).acquire().await.expect("a permit");
    let other_permit = pool(&other).acquire().await.expect("a permit");
    let picked = [
        "release", "--force", "order", "--label", "worker 3", "--prefix", "job/",
    ];

    let dry = dlock(&path, &[&picked[..], &["--dry-run", "--json"]].concat());
    assert_eq!(dry.status.code(), Some(0), "{dry:?}");
    let views: Vec<serde_json::Value> = serde_json::from_slice(&dry.stdout).expect("json");
    assert_eq!(views.len(), 301);
    assert!(
        views
            .iter()
            .all(|v| v["holders"].as_array().map(Vec::len) == Some(1))
    );
    assert!(views.iter().all(|v| v["holders"][0]["label"] == "worker 3"));
    assert!(jobs.iter().all(|g| !g.is_lost()), "a dry run forced a holder out");

    let forced = dlock(&path, &picked);
    assert_eq!(forced.status.code(), Some(0), "{forced:?}");
    let printed = stdout(&forced);
    assert_eq!(printed.lines().count(), 302, "{printed}");
    assert_eq!(
        printed.lines().last(),
        Some("forced out 301 holder(s) of 301 lock(s)")
    );
    let listed = crashed.locks("order").list().await.expect("list");
    let mut held: Vec<&str> = listed.iter().map(|v| v.name.as_str()).collect();
    held.sort_unstable();
    let mut kept: Vec<String> = (0..10).map(|i| format!("report/{i}")).collect();
    kept.extend((300..305).map(|i| format!("job/{i}")));
    kept.push("job/pool".into());
    kept.sort_unstable();
    assert_eq!(held, kept);
    let pool_view = listed.iter().find(|v| v.name == "job/pool").expect("the pool");
    let owners: Vec<_> = pool_view.holders.iter().map(|h| h.owner.clone()).collect();
    assert_eq!(owners, [Some(other_permit.owner_digest())], "{pool_view:?}");

    let again = dlock(&path, &picked);
    assert_eq!(again.status.code(), Some(3), "nothing left to pick: {again:?}");
    let mixed = dlock(
        &path,
        &["release", "--force", "order", "--label", "x", "--if-fence", "1"],
    );
    assert_eq!(mixed.status.code(), Some(2), "{mixed:?}");
    drop((jobs, reports, others, crashed_permit, other_permit));
}

/// Lines of JSON a command prints as it goes, read on a thread of their own.
struct Following {
    child: std::process::Child,
    lines: std::sync::mpsc::Receiver<serde_json::Value>,
}

impl Following {
    fn start(config: &Path, args: &[&str]) -> Following {
        let mut child = Command::new(env!("CARGO_BIN_EXE_dlock"))
            .arg("--config")
            .arg(config)
            .args(args)
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("run dlock");
        let out = std::io::BufReader::new(child.stdout.take().expect("stdout"));
        let (sender, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in std::io::BufRead::lines(out).map_while(Result::ok) {
                let _ = sender.send(serde_json::from_str(&line).expect("a line of JSON"));
            }
        });
        Following { child, lines }
    }

    /// The next line, within seconds, or the test fails rather than hangs.
    fn next(&mut self) -> serde_json::Value {
        match self.lines.recv_timeout(Duration::from_secs(15)) {
            Ok(line) => line,
            Err(e) => {
                let _ = self.child.kill();
                panic!("no line in time ({e}); the command: {:?}", self.child.try_wait());
            }
        }
    }
}

impl Drop for Following {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `dlock watch GROUP` prints a line per hold and wait as it begins and
/// ends; `dlock leader` says who leads, and with `--watch` each change.
async fn watch_and_leader_follow_the_changes<F: Fixture>() {
    let (_fixture, path, config) = served::<F>("watch");
    let registry = Registry::build(&config, &dlock::engines::kinds())
        .await
        .expect("registry");
    // The waiter as another process would be: one of this process's would
    // wait behind the holder here, not on the server.
    let waiting = Registry::build(&config, &dlock::engines::kinds())
        .await
        .expect("registry");
    let lock = registry
        .locks("order")
        .get("watched")
        .with_lease(Duration::from_secs(3));

    let mut watching = Following::start(&path, &["watch", "order", "--json", "--every", "100"]);
    let first = lock.lock().await.expect("lock");
    let taken = watching.next();
    assert_eq!(
        (&taken["event"], &taken["lock"]),
        (&"taken".into(), &"order/watched".into()),
        "{taken}"
    );
    assert_eq!(taken["owner"], first.owner_digest());
    assert_eq!(taken["fence"], first.fence());
    let waiter = tokio::spawn({
        let lock = waiting
            .locks("order")
            .get("watched")
            .with_lease(Duration::from_secs(3));
        async move { lock.lock().await.expect("the waiter's lock") }
    });
    let queued = watching.next();
    assert_eq!(queued["event"], "waiting", "{queued}");
    let first_owner = first.owner_digest();
    first.release().await.expect("release");
    let (released, handed) = (watching.next(), watching.next());
    assert_eq!(
        (&released["event"], &released["owner"]),
        (&"released".into(), &first_owner.into())
    );
    let next = waiter.await.expect("the waiter");
    assert_eq!(
        (&handed["event"], &handed["owner"]),
        (&"taken".into(), &next.owner_digest().into())
    );
    next.release().await.expect("release");
    assert_eq!(watching.next()["event"], "released");
    drop(watching);

    let nobody = dlock(&path, &["leader", "order/lead"]);
    assert_eq!(nobody.status.code(), Some(3), "{nobody:?}");
    assert_eq!(stdout(&nobody).trim(), "order/lead: nobody leads");
    let election = registry.locks("order").election("lead");
    let term = election.campaign().await.expect("campaign");
    let leads = dlock(&path, &["leader", "order/lead", "--json"]);
    assert_eq!(leads.status.code(), Some(0), "{leads:?}");
    let json: serde_json::Value = serde_json::from_slice(&leads.stdout).expect("json");
    assert_eq!(
        (&json["leader"], &json["term"]),
        (&"billing 7".into(), &term.number().into())
    );
    let mut following = Following::start(&path, &["leader", "order/lead", "--watch", "--json"]);
    assert_eq!(following.next()["term"], term.number());
    let old = term.number();
    term.resign().await.expect("resign");
    assert_eq!(following.next()["leader"], serde_json::Value::Null);
    let term = election.campaign().await.expect("campaign again");
    let led = following.next();
    assert!(led["term"].as_u64().expect("a term") > old, "{led}");
    assert_eq!(led["term"], term.number());
}

on_servers! { watch_and_leader_follow_the_changes:
    "redis" watch_and_leader_on_redis dlock_testkit::fixtures::redis::Redis,
    "postgres" watch_and_leader_on_postgres dlock_testkit::fixtures::postgres::Postgres,
    "etcd" watch_and_leader_on_etcd dlock_testkit::fixtures::etcd::Etcd,
    "zookeeper" watch_and_leader_on_zookeeper dlock_testkit::fixtures::zookeeper::ZooKeeper,
}

/// Where the engine has a watch of its own, `dlock watch` hears a change
/// when it happens: with reads of the records ten minutes apart, every
/// change still comes, heard by the watch alone.
async fn watch_hears_the_engines_own_watch<F: Fixture>() {
    let (_fixture, path, config) = served::<F>("heard");
    let registry = Registry::build(&config, &dlock::engines::kinds())
        .await
        .expect("registry");
    let lock = registry.locks("order").get("heard");
    let mut watching = Following::start(&path, &["watch", "order", "--json", "--every", "600000"]);
    // Taken: read at the start, or heard; either way, read by now.
    let first = lock.lock().await.expect("lock");
    assert_eq!(watching.next()["event"], "taken");
    let owner = first.owner_digest();
    first.release().await.expect("release");
    let released = watching.next();
    assert_eq!(
        (&released["event"], &released["owner"]),
        (&"released".into(), &owner.into()),
        "{released}"
    );
    let again = lock.lock().await.expect("lock again");
    let taken = watching.next();
    assert_eq!(
        (&taken["event"], &taken["fence"]),
        (&"taken".into(), &again.fence().into()),
        "{taken}"
    );
    again.release().await.expect("release");
    assert_eq!(watching.next()["event"], "released");
}

on_servers! { watch_hears_the_engines_own_watch:
    "etcd" watch_hears_etcds_watch dlock_testkit::fixtures::etcd::Etcd,
    "zookeeper" watch_hears_zookeepers_watch dlock_testkit::fixtures::zookeeper::ZooKeeper,
}

/// `--permits N` aims an act at a semaphore's holders: with `--if-owner`,
/// at one permit's holder, which is asked, then forced out, while the
/// other permit's holder is left alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_command_asks_and_forces_out_one_permits_holder() {
    let server = TestServer::start("redis-server", |port| redis_args(port, &[]));
    let text = redis_config(&format!("redis://{}", server.address()));
    let path = config_file("permits", &text);
    let config = Config::parse(&text, []).expect("config");
    let registry = Registry::build(&config, &dlock::engines::kinds())
        .await
        .expect("registry");
    let pool = registry
        .locks("order")
        .semaphore("pool", 2)
        .with_lease(Duration::from_secs(3));
    let named = pool.acquire().await.expect("permit");
    let other = tokio::spawn({
        let pool = pool.clone();
        async move { pool.acquire().await.expect("permit") }
    })
    .await
    .expect("task");
    let owner = named.owner_digest();
    let aimed = ["order/pool", "--permits", "2", "--if-owner", &owner];

    let asked = dlock(&path, &[&["revoke"][..], &aimed].concat());
    assert_eq!(
        stdout(&asked).trim(),
        "order/pool: asked 1 holder(s)",
        "{asked:?}"
    );
    tokio::time::timeout(Duration::from_secs(3), named.revoked())
        .await
        .expect("the holder hears it was asked");
    let forced = dlock(&path, &[&["release", "--force"][..], &aimed].concat());
    assert_eq!(
        stdout(&forced).trim(),
        "order/pool: forced out 1 holder(s)",
        "{forced:?}"
    );
    let reason = tokio::time::timeout(Duration::from_secs(6), named.lost())
        .await
        .expect("the holder hears it");
    assert_eq!(reason, dlock::LostReason::ForceReleased);
    assert!(
        !other.is_lost() && !other.is_revoked(),
        "the other permit was touched"
    );
    let again = dlock(&path, &[&["release", "--force"][..], &aimed].concat());
    assert_eq!(again.status.code(), Some(3), "{again:?}");
    other.release().await.expect("release");
}

/// A cycle of waits between two processes (a registry each), caught by
/// `dlock deadlocks` while it stands: its two locks, their holders' labels
/// and what each waits for. Then its youngest member gives up, the other
/// goes on, and the command finds none (exit 3).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deadlocks_shows_a_cycle_while_it_stands() {
    let server = TestServer::start("redis-server", |port| redis_args(port, &[]));
    // Looked for after 12 s, and given up on at a second look 3 s later:
    // time for the command to see it.
    let text = redis_config(&format!("redis://{}", server.address()))
        .replace("[engines.main]", "deadlock_check = \"12s\"\n[engines.main]");
    let path = config_file("deadlocks", &text);
    let config = Config::parse(&text, []).expect("config");
    assert_eq!(config.defaults.deadlock_check, Duration::from_secs(12));
    let none = dlock(&path, &["deadlocks"]);
    assert_eq!(none.status.code(), Some(3), "{none:?}");
    let members = dlock_testkit::deadlocks::CycleOfTwo::start(&config, "order").await;
    let mut seen = None;
    for _ in 0..250 {
        let shown = dlock(&path, &["deadlocks", "order", "--json"]);
        if shown.status.code() == Some(0) {
            seen = Some(shown);
            break;
        }
        assert_eq!(shown.status.code(), Some(3), "{shown:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let shown = seen.expect("the cycle shown while it stood");
    let json: serde_json::Value = serde_json::from_slice(&shown.stdout).expect("json");
    let links = json[0]["links"].as_array().expect("links");
    assert_eq!(links.len(), 2, "{json}");
    for link in links {
        assert_eq!(link["group"], "order");
        assert_eq!(link["holder"], "billing 7");
        assert_eq!(link["owner"].as_str().map(str::len), Some(8), "a digest");
    }
    let table = stdout(&dlock(&path, &["deadlocks"]));
    eprintln!("dlock deadlocks:\n{table}");
    assert!(
        table.contains("WAITS FOR") && table.contains("order/a") && table.contains("order/b"),
        "{table}"
    );
    members.one_gave_up().await;
    let after = dlock(&path, &["deadlocks"]);
    assert_eq!(after.status.code(), Some(3), "{after:?}");
}
