//! The admin page in a real headless Chromium, against a real Redis whose
//! lock another process holds and a third waits for: what the page
//! renders, that a lock's name stays text, and the release button; and a
//! semaphore's holders, each with its slot. Against Redis too: the page at
//! `/dlock/`, the names `.` and `..` released, a 65,000-byte name, Redis
//! down and back, counts, pages and the filter, and 10,000 locks measured;
//! on a memory engine, the lease and last renewal it shows.
//! `ADMIN_PAGE_SCREENSHOT=1 cargo test --features admin,redis --test admin`
//! rewrites the README's picture, docs/admin-page.png.

#![cfg(all(feature = "admin", feature = "redis"))]

mod browser;
mod service;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use browser::{Browser, Chromedriver};
use dlock::admin::Admin;
use dlock::{Config, Registry};
use dlock_testkit::fixtures::redis::redis_args;
use dlock_testkit::server::{TestServer, spawn_watched};
use serde_json::{Value, json};
use service::Http;

/// Markup if a page ever parsed it: an `<img>` whose error handler alerts.
const NAME: &str = "<img src=x onerror=alert(1)>";
const TOKEN: &str = "s3cret-operator-token";
/// The holder's lease: the lock passes on within it once released (or,
/// were the holder to crash, once it runs out).
const LEASE: Duration = Duration::from_secs(5);
/// Set in the holder and waiter processes: which one this run of the test
/// binary is, and its config.
const ROLE: &str = "ADMIN_TEST_ROLE";
const CONFIG: &str = "ADMIN_TEST_CONFIG";

/// Groups `ops` and `pool`, and `bulk`, whose locks the tests take by the
/// hundred and keep for their length: its lease needs no renewing.
fn config(redis: &str, label: &str) -> String {
    format!(
        "[defaults]\nclient_name = \"{label}\"\nlease = \"{}s\"\n\
         [engines.main]\nkind = \"redis\"\nurl = \"redis://{redis}\"\nconnect_timeout = \"5s\"\n\
         [groups.ops]\n[groups.pool]\n[groups.bulk]\nlease = \"10m\"\n",
        LEASE.as_secs()
    )
}

/// Not a test on its own: the holder's and the waiter's process, this
/// binary run again by the page test with `ROLE` set. Takes the lock,
/// says so, and keeps it until killed.
#[tokio::test]
async fn holding_process() {
    let (Ok(role), Ok(text)) = (std::env::var(ROLE), std::env::var(CONFIG)) else {
        return;
    };
    let config = Config::parse(&text, []).expect("config");
    let registry = Registry::build(&config, &dlock::engines::kinds())
        .await
        .expect("registry");
    let guard = registry.locks("ops").get(NAME).lock().await.expect("lock");
    println!("{role} holds {}", guard.fence());
    let reason = guard.lost().await;
    println!("{role} lost: {reason}");
    std::future::pending::<()>().await;
}

/// A holding process, killed with its process group when dropped.
struct Holder(Child, mpsc::Receiver<String>);

impl Holder {
    fn start(role: &str, config: String) -> Holder {
        let mut command = Command::new(std::env::current_exe().expect("test binary"));
        command
            .args(["--exact", "holding_process", "--nocapture", "--test-threads=1"])
            .env(ROLE, role)
            .env(CONFIG, config)
            .stdout(Stdio::piped())
            .stderr(Stdio::null());
        let mut child = spawn_watched(command, role);
        let (tx, rx) = mpsc::channel();
        let stdout = BufReader::new(child.stdout.take().expect("piped stdout"));
        std::thread::spawn(move || stdout.lines().map_while(Result::ok).try_for_each(|l| tx.send(l)));
        Holder(child, rx)
    }

    /// Waits until the process says it holds the lock.
    fn holds(&self, role: &str, within: Duration) {
        let deadline = Instant::now() + within;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.1.recv_timeout(left) {
                // The harness's `test holding_process ... ` comes first on the line.
                Ok(line) if line.contains(&format!("{role} holds")) => return,
                Ok(_) => {}
                Err(e) => panic!("{role} did not take the lock within {within:?}: {e}"),
            }
        }
    }
}

impl Drop for Holder {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The first row of group `ops` as the page renders it: each cell's text,
/// as shown.
async fn row(browser: &Browser) -> Option<Value> {
    row_of(browser, "ops").await
}

/// The first row of `group` as the page renders it.
async fn row_of(browser: &Browser, group: &str) -> Option<Value> {
    let script = r#"
        const row = document.querySelector(`section[data-group="${arguments[0]}"] tr.lock`);
        if (!row) return null;
        const text = (name) => row.querySelector("td." + name).innerText;
        return Object.fromEntries(["name", "mode", "holder", "owner", "fence", "held", "lease", "waiters"]
            .map((name) => [name, text(name)]));
    "#;
    let row = browser.run(script, json!([group])).await;
    (!row.is_null()).then_some(row)
}

/// Polls the rendered row of `ops` until `wanted` holds of it; fails
/// after `within`.
async fn row_until(browser: &Browser, within: Duration, wanted: impl Fn(&Value) -> bool) -> Value {
    row_of_until(browser, "ops", within, wanted).await
}

/// Polls the rendered row of `group` until `wanted` holds of it.
async fn row_of_until(
    browser: &Browser,
    group: &str,
    within: Duration,
    wanted: impl Fn(&Value) -> bool,
) -> Value {
    let deadline = Instant::now() + within;
    loop {
        assert_eq!(browser.alert().await, None, "the page ran a script from the data");
        let row = row_of(browser, group).await;
        match row {
            Some(row) if wanted(&row) => return row,
            _ if Instant::now() > deadline => panic!("the page did not show it within {within:?}: {row:?}"),
            _ => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
}

/// A real Redis, a registry on it ([`config`]'s groups), and the
/// admin routes `mount` makes of it, served on loopback.
struct Site {
    redis: TestServer,
    registry: Registry,
    /// `http://127.0.0.1:<port>`.
    url: String,
}

impl Site {
    async fn start(mount: impl FnOnce(&Registry) -> axum::Router) -> Site {
        let redis = TestServer::start("redis-server", |port| redis_args(port, &[]));
        let text = config(&redis.address(), "admin page");
        let registry = Registry::build(
            &Config::parse(&text, []).expect("config"),
            &dlock::engines::kinds(),
        )
        .await
        .expect("registry");
        let app = mount(&registry);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let url = format!("http://{}", listener.local_addr().expect("address"));
        tokio::spawn(async move { axum::serve(listener, app).await });
        Site { redis, registry, url }
    }

    /// A site with one admin page at `/dlock`, mounted as the docs say,
    /// which `admin` sets up.
    async fn dlock(admin: impl for<'r> FnOnce(Admin<'r>) -> Admin<'r>) -> Site {
        Site::start(|registry| {
            axum::Router::new().nest_service("/dlock", admin(Admin::new(registry)).router())
        })
        .await
    }
}

/// Mounted as the docs say, with `nest_service` (axum's `nest` routes
/// `/dlock` alone), the page answers at `/dlock` and `/dlock/` and reads
/// its API from either.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_answers_with_and_without_a_trailing_slash() {
    let site = Site::dlock(|admin| admin.groups(["ops"])).await;
    let held = site
        .registry
        .locks("ops")
        .get("order-42")
        .lock()
        .await
        .expect("lock");
    let driver = Chromedriver::start();
    let browser = Browser::open(&driver).await;
    for path in ["/dlock/", "/dlock"] {
        browser.goto(&format!("{}{path}", site.url)).await;
        row_until(&browser, Duration::from_secs(10), |row| row["name"] == "order-42").await;
    }
    browser.close().await;
    held.release().await.expect("release");
}

/// Where the engine shows renewals (memory here), a holder's lease cell
/// says of how long a lease, and when it was last renewed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_shows_the_lease_and_the_last_renewal_where_the_engine_keeps_them() {
    let engine = std::sync::Arc::new(dlock::engines::memory::MemoryEngine::new());
    let settings = dlock::Settings {
        lease: Duration::from_secs(30),
        ..dlock::Settings::default()
    };
    let registry = Registry::with_engine("main", engine, settings).expect("registry");
    let app = axum::Router::new().nest_service("/dlock", Admin::new(&registry).groups(["ops"]).router());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let url = format!("http://{}/dlock", listener.local_addr().expect("address"));
    tokio::spawn(async move { axum::serve(listener, app).await });
    let held = registry.locks("ops").get("renewed").lock().await.expect("lock");
    let driver = Chromedriver::start();
    let browser = Browser::open(&driver).await;
    browser.goto(&url).await;
    let row = row_until(&browser, Duration::from_secs(10), |row| row["name"] == "renewed").await;
    let lease = row["lease"].as_str().expect("the lease cell");
    let (left, renewed) = lease
        .split_once(" of 30.0s, renewed ")
        .unwrap_or_else(|| panic!("{lease}"));
    assert!(left.ends_with('s') && renewed.ends_with(" ago"), "{lease}");
    browser.close().await;
    held.release().await.expect("release");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_shows_a_lock_as_text_and_releases_it_with_the_token() {
    let Site {
        redis,
        registry,
        url: site,
    } = Site::start(|registry| {
        axum::Router::new()
            .nest_service(
                "/dlock",
                Admin::new(registry)
                    .groups(["ops", "pool"])
                    .actions(TOKEN)
                    .router(),
            )
            .nest_service("/readonly", Admin::new(registry).groups(["ops"]).router())
    })
    .await;

    let holder = Holder::start("holder", config(&redis.address(), "holder 1"));
    holder.holds("holder", Duration::from_secs(30));
    let waiter = Holder::start("waiter", config(&redis.address(), "waiter 2"));

    let driver = Chromedriver::start();
    let browser = Browser::open(&driver).await;
    browser.goto(&format!("{site}/dlock")).await;
    let shown = row_until(&browser, Duration::from_secs(30), |row| row["waiters"] != "").await;
    assert_eq!(shown["name"], NAME, "the name as text: {shown}");
    assert_eq!(
        (&shown["mode"], &shown["holder"]),
        (&json!("write"), &json!("holder 1")),
        "{shown}"
    );
    assert!(
        shown["waiters"]
            .as_str()
            .is_some_and(|w| w.starts_with("1. waiter 2 (write) for ") && w.ends_with('s')),
        "{shown}"
    );
    assert!(
        shown["fence"].as_str().is_some_and(|f| f.parse::<u64>().is_ok()),
        "{shown}"
    );
    assert!(
        shown["held"].as_str().is_some_and(|t| t.ends_with('s')),
        "{shown}"
    );
    // Were the name parsed as markup, its <img> would be in the page and its
    // error handler would have opened an alert.
    assert_eq!(browser.find_all("img").await.len(), 0, "an <img> was injected");
    assert_eq!(browser.alert().await, None, "the page ran the name's script");

    // The owner's digest, and on hover the times the engine told, as the API
    // answers them. A renewal moves the lease's end: read both until they agree.
    let http = Http::default();
    let view = format!("{site}/dlock/api/locks/ops/lock?name={}", encode(NAME));
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (status, answer) = http.get(&view).await;
        assert_eq!(status, 200, "{answer}");
        let answer: Value = serde_json::from_str(&answer).expect("json");
        let (holder, waiter) = (&answer["holders"][0], &answer["waiters"][0]);
        let told = json!([
            holder["owner"],
            holder["since"],
            holder["lease_ends"],
            waiter["since"]
        ]);
        assert!(
            told.as_array().expect("list").iter().all(|v| !v.is_null()),
            "{answer}"
        );
        let shown = browser.run(TIMES, json!([])).await;
        if shown == told {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the page shows {shown}, the API {told}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // Without the token, or with another, nothing is released.
    let release = format!("{site}/dlock/api/locks/ops/release?name={}", encode(NAME));
    let post = |headers: &'static [(&'static str, &'static str)]| {
        http.send(http::Method::POST, &release, headers, String::new())
    };
    assert_eq!(post(&[]).await.0, 401);
    assert_eq!(
        post(&[("authorization", "Bearer s3cret-operator-tokeN")]).await.0,
        401
    );
    let off = release.replace("/dlock/", "/readonly/");
    let off = http.send(http::Method::POST, &off, &[], String::new()).await;
    assert_eq!(off.0, 404, "actions off: {off:?}");
    let unshown = format!("{site}/dlock/api/locks/other");
    let unshown = http.send(http::Method::GET, &unshown, &[], String::new()).await;
    assert_eq!(unshown.0, 404, "a group not given: {unshown:?}");

    browser.type_into("#token", TOKEN).await;
    // Not `DLOCK_*`: the config reads those as overrides, and any other
    // test reading the environment would fail on it.
    if std::env::var("ADMIN_PAGE_SCREENSHOT").is_ok_and(|v| v == "1") {
        let png = browser.screenshot().await;
        std::fs::write(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/admin-page.png"), png).expect("screenshot");
    }
    let still = row(&browser).await.expect("the row");
    assert_eq!(still["holder"], "holder 1", "released without the token: {still}");

    // Cancelled at the confirmation, nothing is released.
    let button = r#"section[data-group="ops"] tr.lock button.release"#;
    browser.click(button).await;
    let asked = confirmed(&browser, false).await;
    assert!(
        asked.starts_with("release ops/") && asked.contains("held by holder 1 (owner "),
        "{asked}"
    );
    tokio::time::sleep(Duration::from_secs(1)).await;
    let still = row(&browser).await.expect("the row");
    assert_eq!(still["holder"], "holder 1", "released when cancelled: {still}");
    browser.click(button).await;
    confirmed(&browser, true).await;
    // Handed to the waiter at its next poll, shown at the page's next
    // refresh: well within a lease, which is how long a crashed holder
    // would have kept it.
    let moved = row_until(&browser, LEASE, |row| row["holder"] == "waiter 2").await;
    assert_eq!(moved["waiters"], "", "{moved}");
    assert_eq!(message(&browser).await, format!("release ops/{NAME}: 1 hold(s)"));
    assert_eq!(browser.find_all("img").await.len(), 0);

    // Two permits of a semaphore of 3, each holder on a line of its own,
    // its fence after its slot.
    let replicas = registry.locks("pool").semaphore("replicas", 3);
    let permits = dlock_testkit::permits_held(&replicas, 2).await;
    let fences: Vec<String> = permits
        .iter()
        .map(|p| format!("slot {}: {}", p.slot().expect("a slot"), p.fence()))
        .collect();
    let pool = row_of_until(&browser, "pool", Duration::from_secs(10), |row| {
        row["holder"] != ""
    })
    .await;
    let mut shown: Vec<&str> = pool["fence"].as_str().expect("text").lines().collect();
    shown.sort();
    let mut expected: Vec<&str> = fences.iter().map(String::as_str).collect();
    expected.sort();
    assert_eq!(shown, expected, "{pool}");
    // Released from the page: each permit's holder, by its owner.
    browser
        .click(r#"section[data-group="pool"] tr.lock button.release"#)
        .await;
    let asked = confirmed(&browser, true).await;
    for permit in &permits {
        assert!(asked.contains(&permit.owner_digest()), "{asked}");
    }
    message_until(
        &browser,
        Duration::from_secs(10),
        "release pool/replicas: 2 hold(s)",
    )
    .await;
    for permit in permits {
        let reason = tokio::time::timeout(LEASE * 2, permit.lost())
            .await
            .expect("the permit's holder hears it");
        assert_eq!(reason, dlock::LostReason::ForceReleased);
    }
    browser.close().await;
    drop((holder, waiter));
}

/// The owner's digest in the first row of `ops`, and the times its holder's
/// and waiter's lines show on hover, as milliseconds since the epoch.
const TIMES: &str = r#"
    const row = document.querySelector('section[data-group="ops"] tr.lock');
    const when = (name) => Date.parse(row.querySelector(`td.${name} div`).title);
    return [row.querySelector("td.owner").innerText, when("held"), when("lease"), when("waiters")];
"#;

/// A 65,000-byte name keeps its row as tall as a short name's: one line
/// of its first 120 characters and its length, the whole name in the
/// cell's title. (Whole, it made a cell 22,000 px tall.) Released from the
/// page, it is cut in the message too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_name_keeps_its_row_one_line_tall() {
    let site = Site::dlock(|admin| admin.groups(["ops"]).actions(TOKEN)).await;
    let long = "n".repeat(65_000);
    let locks = site.registry.locks("ops");
    let mut held = Vec::new();
    for name in [long.as_str(), "short"] {
        held.push(locks.get(name).lock().await.expect("lock"));
    }
    let driver = Chromedriver::start();
    let browser = Browser::open(&driver).await;
    browser.goto(&format!("{}/dlock", site.url)).await;
    let script = r#"
        return [...document.querySelectorAll("tr.lock")].map((tr) => {
            const cell = tr.querySelector("td.name");
            return { height: tr.getBoundingClientRect().height, text: cell.innerText, title: cell.title };
        });
    "#;
    let deadline = Instant::now() + Duration::from_secs(10);
    let rows = loop {
        let rows = browser.run(script, json!([])).await;
        if rows.as_array().is_some_and(|rows| rows.len() == 2) {
            break rows;
        }
        assert!(Instant::now() < deadline, "not both rows shown: {rows}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    // Sorted by name: the long one first.
    let (cut, short) = (&rows[0], &rows[1]);
    assert_eq!(
        cut["height"], short["height"],
        "the long name's row, then the short one's"
    );
    let text = cut["text"].as_str().expect("text");
    let expected = format!("{}… (65000 characters)", &long[..120]);
    assert!(text == expected, "shown: {text:.300}");
    assert!(cut["title"] == long.as_str(), "the whole name on hover");
    assert_eq!(short["text"], "short");

    browser.type_into("#token", TOKEN).await;
    let first = r#"section[data-group="ops"] tr.lock:first-child button.release"#;
    browser.click(first).await;
    confirmed(&browser, true).await;
    let said = format!("release ops/{}…: 1 hold(s)", &long[..120]);
    message_until(&browser, Duration::from_secs(10), &said).await;
    browser.close().await;
    drop(held);
}

/// Runs `script` in the page until `wanted` holds of what it returns;
/// fails after `within`.
async fn until(browser: &Browser, script: &str, within: Duration, wanted: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + within;
    loop {
        let seen = browser.run(script, json!([])).await;
        if wanted(&seen) {
            return seen;
        }
        assert!(
            Instant::now() < deadline,
            "not shown within {within:?}: {:.2000}",
            seen.to_string()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// What the page shows of group `ops`'s state: whether its rows are stale,
/// what its error line says and its title (the first failure's time), its
/// rows, and the colour of its first row's text.
const STATE: &str = r#"
        const section = document.querySelector('section[data-group="ops"]');
        const error = section.querySelector(".error");
        const row = section.querySelector("tr.lock");
        return {
            stale: section.classList.contains("stale"),
            error: error.innerText,
            since: error.title,
            rows: section.querySelectorAll("tr.lock").length,
            color: row && getComputedStyle(row.querySelector("td.held")).color,
            updated: document.getElementById("updated").innerText,
        };
    "#;

/// Polls [`STATE`] until `wanted` holds of it; fails after `within`.
async fn state_until(browser: &Browser, within: Duration, wanted: impl Fn(&Value) -> bool) -> Value {
    until(browser, STATE, within, wanted).await
}

/// With Redis down, the group says its engine is unreachable and since
/// when, and keeps its last rows greyed; with Redis back on its port, the
/// page is live again. (It had kept the rows frozen, looking live.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_engine_greys_the_rows_and_says_since_when() {
    let mut site = Site::dlock(|admin| admin.groups(["ops"])).await;
    let held = (site.registry.locks("ops").get("order-42").lock())
        .await
        .expect("lock");
    let driver = Chromedriver::start();
    let browser = Browser::open(&driver).await;
    browser.goto(&format!("{}/dlock", site.url)).await;
    let live = state_until(&browser, Duration::from_secs(10), |s| s["rows"] == 1).await;
    assert_eq!(
        (&live["stale"], &live["error"]),
        (&json!(false), &json!("")),
        "{live}"
    );

    site.redis.kill();
    let down = state_until(&browser, Duration::from_secs(30), |s| s["stale"] == true).await;
    let error = down["error"].as_str().expect("text");
    assert!(error.starts_with("engine unreachable since "), "{down}");
    assert!(error.contains("(rows as last seen at "), "{down}");
    assert_eq!(down["rows"], 1, "the last rows stay: {down}");
    assert_ne!(down["color"], live["color"], "greyed: {down}");
    // Two refreshes later, still the time of the first failure.
    let mut later = down.clone();
    for _ in 0..2 {
        let updated = later["updated"].clone();
        later = state_until(&browser, Duration::from_secs(30), |s| s["updated"] != updated).await;
    }
    assert_eq!(
        (&later["stale"], &later["since"]),
        (&json!(true), &down["since"]),
        "{later}"
    );

    site.redis.restart();
    // The restarted Redis kept nothing: the lock is gone with it.
    let back = state_until(&browser, Duration::from_secs(30), |s| s["stale"] == false).await;
    assert_eq!((&back["error"], &back["rows"]), (&json!(""), &json!(0)), "{back}");
    browser.close().await;
    drop(held);
}

/// Takes the locks of group `bulk` named `names`, 50 at a time, each in
/// one of 50 tasks: thousands one after another would take a while.
async fn hold_all(registry: &Registry, names: &[String]) -> Vec<dlock::Guard> {
    let names: std::sync::Arc<[String]> = names.into();
    let tasks: Vec<_> = (0..50)
        .map(|first| {
            let (locks, names) = (registry.locks("bulk"), names.clone());
            tokio::spawn(async move {
                let mut held = Vec::new();
                for name in names.iter().skip(first).step_by(50) {
                    held.push(locks.get(name.as_str()).lock().await.expect("lock"));
                }
                held
            })
        })
        .collect();
    let mut held = Vec::new();
    for task in tasks {
        held.extend(task.await.expect("task"));
    }
    held
}

/// What the page shows of group `bulk`: its counts, range and buttons, and
/// its rows' names.
const BULK: &str = r#"
    const section = document.querySelector('section[data-group="bulk"]');
    const names = [...section.querySelectorAll("tr.lock td.name")].map((td) => td.innerText);
    const text = (selector) => section.querySelector(selector).innerText;
    return {
        counts: text(".counts"),
        range: text(".range"),
        previous: !section.querySelector("button.previous").disabled,
        next: !section.querySelector("button.next").disabled,
        rows: names.length,
        first: names[0],
        last: names[names.length - 1],
        filtered: performance.getEntriesByType("resource").some((e) => e.name.includes("contains=-24")),
    };
"#;

/// A group of 250 locks, a semaphore sharing the 100th's name, and a
/// waiter: the page counts them, shows them 100 at a time, with the
/// semaphore on the page of the lock of its name, and filters them on the
/// server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_counts_pages_and_filters_a_group() {
    let site = Site::dlock(|admin| admin.groups(["bulk"])).await;
    let names: Vec<String> = (0..250).map(|i| format!("job-{i:03}")).collect();
    let held = hold_all(&site.registry, &names).await;
    let semaphore = site.registry.locks("bulk").semaphore("job-099", 2);
    let permit = semaphore.acquire().await.expect("permit");
    // Another registry's waiter, as another process's would be.
    let text = config(&site.redis.address(), "waiter");
    let other = Registry::build(
        &Config::parse(&text, []).expect("config"),
        &dlock::engines::kinds(),
    )
    .await
    .expect("registry");
    let waiter = tokio::spawn(async move { other.locks("bulk").get("job-000").lock().await });

    let driver = Chromedriver::start();
    let browser = Browser::open(&driver).await;
    browser.goto(&format!("{}/dlock", site.url)).await;
    let within = Duration::from_secs(10);
    let first = until(&browser, BULK, within, |s| s["counts"] == "251 held, 1 waiting").await;
    assert_eq!(
        first,
        json!({ "counts": "251 held, 1 waiting", "range": "1–101 of 251", "previous": false, "next": true,
                "rows": 101, "first": "job-000", "last": "job-099 (2 permits)", "filtered": false })
    );
    let next = r#"section[data-group="bulk"] button.next"#;
    browser.click(next).await;
    let second = until(&browser, BULK, within, |s| s["range"] == "102–201 of 251").await;
    assert_eq!(
        (&second["first"], &second["last"], &second["previous"]),
        (&json!("job-100"), &json!("job-199"), &json!(true))
    );
    browser.click(next).await;
    let last = until(&browser, BULK, within, |s| s["range"] == "202–251 of 251").await;
    assert_eq!(
        (&last["first"], &last["rows"], &last["next"]),
        (&json!("job-200"), &json!(50), &json!(false))
    );
    browser
        .click(r#"section[data-group="bulk"] button.previous"#)
        .await;
    let back = until(&browser, BULK, within, |s| s["range"] == "102–201 of 251").await;
    assert_eq!(back["first"], "job-100");

    // The filter starts again from the first page, and its counts are its own.
    browser
        .type_into(r#"section[data-group="bulk"] input.filter"#, "-24")
        .await;
    let filtered = until(&browser, BULK, within, |s| s["range"] == "1–10 of 10").await;
    assert_eq!(
        (
            &filtered["counts"],
            &filtered["first"],
            &filtered["last"],
            &filtered["previous"],
            &filtered["filtered"]
        ),
        (
            &json!("10 held, 0 waiting"),
            &json!("job-240"),
            &json!("job-249"),
            &json!(false),
            &json!(true)
        )
    );

    // Through the API: a page of one ends with every view of its name.
    let page = format!("{}/dlock/api/locks/bulk?after=job-098&limit=1", site.url);
    let (status, page) = Http::default().get(&page).await;
    assert_eq!(status, 200, "{page}");
    let page: Value = serde_json::from_str(&page).expect("json");
    let views: Vec<_> = (page["locks"].as_array().expect("locks").iter())
        .map(|view| (view["name"].as_str(), view["permits"].as_u64()))
        .collect();
    assert_eq!(
        views,
        [(Some("job-099"), None), (Some("job-099"), Some(2))],
        "{page}"
    );
    assert_eq!(
        (
            &page["before"],
            &page["total"],
            &page["held"],
            &page["waiting"],
            &page["more"]
        ),
        (&json!(99), &json!(251), &json!(251), &json!(1), &json!(true))
    );
    browser.close().await;
    waiter.abort();
    drop((held, permit));
}

/// What the page measures of its refreshes from now on, in `window.measured`:
/// each refresh's main-thread work (parsing the listing and rendering it),
/// each listing's bytes over the wire and its body's, and every task that
/// held the main thread over 50 ms, whatever it was.
const MEASURE: &str = r#"
    const measured = (window.measured = { renders: [], transfers: [], bodies: [], tasks: [] });
    new PerformanceObserver((list) => {
        for (const e of list.getEntries()) if (e.name === "dlock render") measured.renders.push(e.duration);
    }).observe({ type: "measure" });
    new PerformanceObserver((list) => {
        for (const e of list.getEntries()) {
            if (!e.name.includes("/api/locks/")) continue;
            measured.transfers.push(e.transferSize);
            measured.bodies.push(e.encodedBodySize);
        }
    }).observe({ type: "resource" });
    new PerformanceObserver((list) => {
        for (const e of list.getEntries()) measured.tasks.push(e.duration);
    }).observe({ type: "longtask" });
"#;

/// A group of 10,000 held locks, measured in Chromium over five refreshes:
/// each moves at most 100 KB, and the fastest blocks the main thread at
/// most 50 ms, the issue's bounds; a busy machine only slows a refresh, so
/// the others are held to the freeze this replaced (listing the whole
/// group, a refresh had held it 360 to 590 ms here and moved 2.2 MB): no
/// refresh, and no task, over 300 ms. `--nocapture` prints the figures.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refresh_of_ten_thousand_locks_is_light() {
    let site = Site::dlock(|admin| admin.groups(["bulk"])).await;
    let names: Vec<String> = (0..10_000).map(|i| format!("job-{i:05}")).collect();
    let held = hold_all(&site.registry, &names).await;
    let driver = Chromedriver::start();
    let browser = Browser::open(&driver).await;
    browser.goto(&format!("{}/dlock", site.url)).await;
    let rows = "return document.querySelectorAll('tr.lock').length";
    until(&browser, rows, Duration::from_secs(30), |rows| rows != 0).await;
    browser.run(MEASURE, json!([])).await;
    let refreshes = |m: &Value| m["renders"].as_array().is_some_and(|r| r.len() >= 5);
    let measured = until(
        &browser,
        "return window.measured",
        Duration::from_secs(60),
        refreshes,
    )
    .await;
    let figures = |key: &str| -> Vec<f64> {
        (measured[key].as_array().expect("figures").iter())
            .map(|figure| figure.as_f64().expect("a number"))
            .collect()
    };
    let (renders, transfers, tasks) = (figures("renders"), figures("transfers"), figures("tasks"));
    println!(
        "10,000 locks, per refresh: main thread {renders:.1?} ms; {transfers:?} bytes moved ({:?} the body's); \
         tasks over 50 ms: {tasks:?}",
        figures("bodies")
    );
    let fastest = renders.iter().copied().fold(f64::INFINITY, f64::min);
    assert!(fastest <= 50.0, "main thread, ms: {renders:?}");
    assert!(
        renders.iter().chain(&tasks).all(|&ms| ms <= 300.0),
        "main thread, ms: {renders:?}; tasks over 50 ms: {tasks:?}"
    );
    assert!(
        !transfers.is_empty() && transfers.iter().all(|&bytes| bytes <= 100_000.0),
        "bytes: {transfers:?}"
    );
    browser.close().await;
    drop(held);
}

/// What the page last said about an action.
async fn message(browser: &Browser) -> String {
    let said = browser.run("return document.getElementById('message').innerText", json!([]));
    said.await.as_str().expect("text").to_owned()
}

/// Polls the page's message until it says `wanted`; fails after `within`.
async fn message_until(browser: &Browser, within: Duration, wanted: &str) {
    let said = "return document.getElementById('message').innerText";
    until(browser, said, within, |said| said == wanted).await;
}

/// The text of the confirmation the page asks, once it shows, answered
/// OK (`accept`) or Cancel.
async fn confirmed(browser: &Browser, accept: bool) -> String {
    let text = confirmation(browser).await;
    browser.answer(accept).await;
    text
}

/// The release button acts on the hold the page showed: the lock changes
/// hands while the confirmation is open, and the new holder keeps it; the
/// page says so. Clicked again, it forces out the new holder.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_releases_only_the_hold_it_showed() {
    let site = Site::dlock(|admin| admin.groups(["ops"]).actions(TOKEN)).await;
    let lock = site.registry.locks("ops").get("swapped").with_lease(LEASE);
    let first = lock.lock().await.expect("lock");
    let driver = Chromedriver::start();
    let browser = Browser::open(&driver).await;
    browser.goto(&format!("{}/dlock", site.url)).await;
    browser.type_into("#token", TOKEN).await;
    let seen = row_until(&browser, Duration::from_secs(10), |row| row["name"] == "swapped").await;
    assert_eq!(seen["fence"], first.fence().to_string(), "{seen}");

    let button = r#"section[data-group="ops"] tr.lock button.release"#;
    browser.click(button).await;
    let asked = Instant::now();
    let text = confirmation(&browser).await;
    let named = format!("owner {}, fence {}", first.owner_digest(), first.fence());
    assert!(text.contains(&named), "{text}");
    // Between the look and the act: the lock changes hands.
    first.release().await.expect("release");
    let next = lock.lock().await.expect("the next holder's lock");
    browser.answer(true).await;
    let said = "release ops/swapped: 0 hold(s) (it changed hands since: look again)";
    message_until(&browser, Duration::from_secs(10), said).await;
    assert!(!next.is_lost(), "the new holder was forced out");
    let view = lock.inspect().await.expect("inspect");
    assert_eq!(view.holders[0].owner, Some(next.owner_digest()));
    assert!(
        asked.elapsed() < LEASE,
        "slower than a lease: the hold could have lapsed"
    );

    let fence = next.fence().to_string();
    row_until(&browser, Duration::from_secs(10), |row| {
        row["fence"] == fence.as_str()
    })
    .await;
    browser.click(button).await;
    confirmed(&browser, true).await;
    message_until(
        &browser,
        Duration::from_secs(10),
        "release ops/swapped: 1 hold(s)",
    )
    .await;
    let reason = tokio::time::timeout(LEASE, next.lost())
        .await
        .expect("the holder hears it");
    assert_eq!(reason, dlock::LostReason::ForceReleased);
    browser.close().await;
}

/// The text of the confirmation the page asks, once it shows, left open.
async fn confirmation(browser: &Browser) -> String {
    let asked = Instant::now();
    loop {
        if let Some(text) = browser.alert().await {
            return text;
        }
        assert!(asked.elapsed() < Duration::from_secs(10), "no confirmation asked");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The names `.` and `..` are released from the page: in a path segment,
/// the browser would have rewritten them (`/ops/./release` to `/ops/release`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_releases_the_names_dot_and_dot_dot() {
    let site = Site::dlock(|admin| admin.groups(["ops"]).actions(TOKEN)).await;
    let locks = site.registry.locks("ops");
    let mut held = Vec::new();
    for name in [".", ".."] {
        held.push(locks.get(name).lock().await.expect("lock"));
    }
    let driver = Chromedriver::start();
    let browser = Browser::open(&driver).await;
    browser.goto(&format!("{}/dlock", site.url)).await;
    browser.type_into("#token", TOKEN).await;
    for name in [".", ".."] {
        // Sorted by name: the one to release is first.
        row_until(&browser, Duration::from_secs(10), |row| row["name"] == name).await;
        let first = r#"section[data-group="ops"] tr.lock:first-child button.release"#;
        browser.click(first).await;
        confirmed(&browser, true).await;
        message_until(
            &browser,
            Duration::from_secs(10),
            &format!("release ops/{name}: 1 hold(s)"),
        )
        .await;
        let view = locks.get(name).inspect().await.expect("inspect");
        assert!(view.holders.is_empty(), "{view:?}");
    }
    browser.close().await;
    drop(held);
}

/// An answer's status and its body as JSON, whatever the order of its keys.
fn parsed((status, body): (u16, String)) -> (u16, serde_json::Value) {
    (status, serde_json::from_str(&body).expect("a JSON answer"))
}

/// The actions through the API, on the memory engine (which can force a
/// release and revoke): with the token, a hold ends or is asked to end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn actions_release_and_revoke_with_the_token() {
    let engine = std::sync::Arc::new(dlock::engines::memory::MemoryEngine::new());
    // A holder learns of a revocation at its next renewal, a third of a
    // lease on. Every waiter goes to the engine's queue: in one process,
    // the local queue would keep the waiter behind the forced-out holder's
    // guard, as it rightly does for its own process's holds.
    let settings = dlock::Settings {
        lease: LEASE,
        queue: dlock::config::Queue::Engine,
        ..dlock::Settings::default()
    };
    // The holder and the waiter as two processes would be: a registry each.
    let registry = Registry::with_engine("main", engine.clone(), settings).expect("registry");
    let other = Registry::with_engine("main", engine, settings).expect("registry");
    let app = Admin::new(&registry).groups(["ops"]).actions(TOKEN).router();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let site = format!("http://{}", listener.local_addr().expect("address"));
    tokio::spawn(async move { axum::serve(listener, app).await });
    let (http, bearer) = (
        Http::default(),
        [("authorization", "Bearer s3cret-operator-token")],
    );
    let act = |action: &str| format!("{site}/api/locks/ops/{action}?name={}", encode(NAME));

    let lock = registry.locks("ops").get(NAME);
    let held = lock.lock().await.expect("lock");
    // The scheme's name in any case (RFC 7235), and only that scheme.
    let basic = [("authorization", "Basic s3cret-operator-token")];
    let refused = http
        .send(http::Method::POST, &act("revoke"), &basic, String::new())
        .await;
    assert_eq!(refused.0, 401, "{refused:?}");
    let lower = [("authorization", "bearer s3cret-operator-token")];
    let revoke = http
        .send(http::Method::POST, &act("revoke"), &lower, String::new())
        .await;
    let answer = json!({ "lock": format!("ops/{NAME}"), "asked": 1 });
    assert_eq!(parsed(revoke), (200, answer), "as `dlock revoke --json` prints");
    tokio::time::timeout(LEASE, held.revoked())
        .await
        .expect("asked to let go");

    let waiter = tokio::spawn({
        let lock = other.locks("ops").get(NAME);
        async move { lock.lock().await }
    });
    let release = http
        .send(http::Method::POST, &act("release"), &bearer, String::new())
        .await;
    let answer = json!({ "lock": format!("ops/{NAME}"), "forced_out": 1 });
    assert_eq!(
        parsed(release),
        (200, answer),
        "as `dlock release --force --json` prints"
    );
    let next = tokio::time::timeout(LEASE, waiter)
        .await
        .expect("handed on")
        .expect("task");
    let next = next.expect("lock");
    assert!(next.fence() > held.fence(), "a greater fence for the next holder");

    let shown = format!("{site}/api/locks/ops/lock?name={}", encode(NAME));
    let (status, view) = http.send(http::Method::GET, &shown, &[], String::new()).await;
    assert_eq!(status, 200, "{view}");
    let view: Value = serde_json::from_str(&view).expect("json");
    assert_eq!(
        (view["name"].as_str(), &view["holders"][0]["fence"]),
        (Some(NAME), &json!(next.fence()))
    );
}

/// A query's value, percent-encoded as the page's `URLSearchParams` does.
fn encode(value: &str) -> String {
    form_urlencoded::byte_serialize(value.as_bytes()).collect()
}

/// What the page shows of cycles of waits in group `ops`: the lines above
/// its table, and which rows are marked.
const CYCLES: &str = r#"
        const section = document.querySelector('section[data-group="ops"]');
        return {
            said: section.querySelector("p.deadlocks").innerText,
            marked: [...section.querySelectorAll("tr.lock.in-cycle td.name")].map((td) => td.title),
        };
    "#;

/// Two processes (a registry each) hold one lock of `ops` each and wait
/// for the other's: while the cycle stands, the page names it and marks
/// both rows; once its youngest member gave up, the marks go.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_marks_a_cycle_of_waits_while_it_stands() {
    let site = Site::dlock(|admin| admin.groups(["ops"])).await;
    // Looked for after 12 s, given up on at a second look 3 s later: a
    // page refreshed every second sees it.
    let text = config(&site.redis.address(), "member")
        .replace("[engines.main]", "deadlock_check = \"12s\"\n[engines.main]");
    let config = Config::parse(&text, []).expect("config");
    let members = dlock_testkit::deadlocks::CycleOfTwo::start(&config, "ops").await;
    let driver = Chromedriver::start();
    let browser = Browser::open(&driver).await;
    browser.goto(&format!("{}/dlock", site.url)).await;
    let marked = until(&browser, CYCLES, Duration::from_secs(30), |s| {
        s["marked"].as_array().is_some_and(|m| m.len() == 2)
    })
    .await;
    let said = marked["said"].as_str().expect("text");
    assert!(said.starts_with("Deadlock: ops/"), "{marked}");
    assert!(
        said.contains("held by member") && said.contains("the first gives up"),
        "{marked}"
    );
    members.one_gave_up().await;
    let cleared = until(&browser, CYCLES, Duration::from_secs(10), |s| {
        s["marked"].as_array().is_some_and(Vec::is_empty)
    })
    .await;
    assert_eq!(cleared["said"], "", "{cleared}");
    browser.close().await;
}
