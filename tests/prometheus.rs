//! A real Prometheus (Debian's `prometheus`, installed by `scripts/test`)
//! scrapes the `axum_service` example under contended load, and every PromQL
//! expression of `dashboards/dlock.json` must return data: one that returns
//! nothing is a panel that shows nothing.

mod service;

use std::fs::File;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use dlock_testkit::server::{free_port, server_dir, spawn_watched};
use serde_json::Value;
use service::{Http, Service};

/// Prometheus scrapes this often.
const SCRAPE_SECONDS: u64 = 1;
/// Grafana's `$__rate_interval`: max($__interval + scrape interval, 4 × scrape interval).
const RATE_INTERVAL: &str = "4s";
/// Concurrent payers on `ACCOUNTS`: far more than the accounts, so requests
/// wait for each other's locks.
const PAYERS: usize = 24;
const ACCOUNTS: u64 = 2;
const READERS: usize = 4;
/// Every wait below is bounded by this; none is an assertion about timing.
const PATIENCE: Duration = Duration::from_secs(30);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_dashboard_expression_returns_data_from_a_real_prometheus() {
    let dashboard: Value = service::json(
        &std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/dashboards/dlock.json"))
            .expect("read the dashboard"),
    );
    let exprs = exprs(&dashboard);
    assert!(!exprs.is_empty(), "no expr in the dashboard");

    let service = Service::start();
    let prometheus = Prometheus::start(service.url.trim_start_matches("http://"));
    let http = Http::default();
    let load = Load::start(&http, &service.url);

    // Enough scrapes under load, and the gauges caught above zero in some.
    let held = expr_of(&dashboard, "dlock_held{");
    let waiting = expr_of(&dashboard, "dlock_waiting{");
    let all = [("group", ".+"), ("engine", ".+")];
    for ready in [
        "count_over_time(dlock_held{mode=\"write\"}[1m]) >= 5".to_owned(),
        format!("max_over_time(({})[1m:1s]) > 0", substitute(&held, &all)),
        format!("max_over_time(({})[1m:1s]) > 0", substitute(&waiting, &all)),
    ] {
        prometheus.eventually(&http, &ready, |_| true).await;
    }

    // The template variables, as Grafana fills them with "All" chosen.
    let variables = variables(&dashboard, &prometheus, &http).await;
    let values: Vec<(&str, &str)> = variables.iter().map(|(n, v)| (n.as_str(), v.as_str())).collect();
    for expr in &exprs {
        let query = substitute(expr, &values);
        let result = prometheus
            .eventually(&http, &query, |result| {
                result.iter().any(|sample| value(sample).is_finite())
            })
            .await;
        println!("{} series: {expr}", result.len());
    }

    let failed = load.stop().await;
    assert_eq!(failed, Vec::<String>::new(), "requests that failed under load");
    let (status, stderr) = tokio::task::spawn_blocking(move || service.terminate())
        .await
        .expect("terminate");
    assert!(status.success(), "exit {status}; stderr: {stderr}");
    drop(prometheus);
}

/// Every `expr` in the dashboard, wherever it sits.
fn exprs(node: &Value) -> Vec<String> {
    match node {
        Value::Object(map) => map
            .iter()
            .flat_map(|(key, value)| match (key.as_str(), value) {
                ("expr", Value::String(expr)) => vec![expr.clone()],
                _ => exprs(value),
            })
            .collect(),
        Value::Array(items) => items.iter().flat_map(exprs).collect(),
        _ => Vec::new(),
    }
}

/// The dashboard's one expression containing `part`.
fn expr_of(dashboard: &Value, part: &str) -> String {
    let found: Vec<String> = exprs(dashboard)
        .into_iter()
        .filter(|e| e.contains(part))
        .collect();
    assert_eq!(found.len(), 1, "expressions with {part}: {found:?}");
    found.into_iter().next().expect("one")
}

/// `$__rate_interval` and the `(name, value)` variables filled in; nothing else may be left.
fn substitute(expr: &str, variables: &[(&str, &str)]) -> String {
    let mut query = expr.replace("$__rate_interval", RATE_INTERVAL);
    for (name, value) in variables {
        query = query
            .replace(&format!("${{{name}}}"), value)
            .replace(&format!("${name}"), value);
    }
    assert!(!query.contains('$'), "a variable the test does not fill: {query}");
    query
}

/// The dashboard's query variables, each as the regex Grafana gives `=~`
/// when "All" of a multi-value variable is chosen: `(a|b)`, from
/// `label_values(metric, label)` asked of Prometheus.
async fn variables(dashboard: &Value, prometheus: &Prometheus, http: &Http) -> Vec<(String, String)> {
    let mut filled = Vec::new();
    for variable in dashboard["templating"]["list"]
        .as_array()
        .expect("templating.list")
    {
        let name = variable["name"].as_str().expect("variable name");
        let query = variable["query"].as_str().unwrap_or_default();
        match variable["type"].as_str() {
            Some("datasource") => continue, // picks the data source, used in no expression
            Some("query") => {}
            other => panic!("variable {name}: type {other:?}, which this test does not fill"),
        }
        let (metric, label) = query
            .strip_prefix("label_values(")
            .and_then(|q| q.strip_suffix(')'))
            .and_then(|q| q.split_once(','))
            .unwrap_or_else(|| panic!("variable {name}: {query} is not label_values(metric, label)"));
        let url = format!(
            "{}/api/v1/label/{}/values?{}",
            prometheus.url,
            label.trim(),
            form(&[("match[]", metric.trim())])
        );
        let (status, body) = http.get(&url).await;
        assert_eq!(status, 200, "{url}: {body}");
        let values: Vec<String> = service::json(&body)["data"]
            .as_array()
            .expect("label values")
            .iter()
            .map(|v| regex_escape(v.as_str().expect("a label value")))
            .collect();
        assert!(!values.is_empty(), "variable {name}: {query} has no values");
        filled.push((name.to_owned(), format!("({})", values.join("|"))));
    }
    filled
}

fn regex_escape(text: &str) -> String {
    text.chars()
        .flat_map(|c| {
            let special = r"\.+*?()|[]{}^$".contains(c);
            special.then_some('\\').into_iter().chain([c])
        })
        .collect()
}

fn form(pairs: &[(&str, &str)]) -> String {
    form_urlencoded::Serializer::new(String::new())
        .extend_pairs(pairs)
        .finish()
}

fn value(sample: &Value) -> f64 {
    sample["value"][1]
        .as_str()
        .and_then(|v| v.parse().ok())
        .unwrap_or(f64::NAN)
}

/// Payers on a few accounts and readers of them, until stopped.
struct Load {
    running: Arc<AtomicBool>,
    tasks: Vec<tokio::task::JoinHandle<Vec<String>>>,
}

impl Load {
    fn start(http: &Http, url: &str) -> Load {
        let running = Arc::new(AtomicBool::new(true));
        let tasks = (0..PAYERS + READERS)
            .map(|i| {
                let (http, url, running) = (http.clone(), url.to_owned(), running.clone());
                tokio::spawn(async move {
                    let mut failed = Vec::new();
                    let account = 1 + i as u64 % ACCOUNTS;
                    while running.load(Ordering::SeqCst) {
                        if i < PAYERS {
                            // 200 paid, 409 once the account runs dry: both under the write lock.
                            let (status, answer) = http.pay(&url, account, 1).await;
                            if status != 200 && status != 409 {
                                failed.push(format!("pay: {status} {answer}"));
                            }
                        } else {
                            http.balance(&url, account).await;
                        }
                    }
                    failed
                })
            })
            .collect();
        Load { running, tasks }
    }

    /// Stops the load; the requests that failed.
    async fn stop(self) -> Vec<String> {
        self.running.store(false, Ordering::SeqCst);
        let mut failed = Vec::new();
        for task in self.tasks {
            failed.extend(task.await.expect("load task"));
        }
        failed
    }
}

/// Prometheus on a free loopback port, scraping one target.
struct Prometheus {
    child: std::process::Child,
    url: String,
    dir: std::path::PathBuf,
    log: std::path::PathBuf,
}

/// Whether the Prometheus on `port` answers 200 on `/-/ready`.
fn ready(port: u16) -> bool {
    use std::io::{Read, Write};
    let Ok(mut stream) = std::net::TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let mut answer = String::new();
    stream
        .write_all(b"GET /-/ready HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
        .and_then(|()| stream.read_to_string(&mut answer))
        .is_ok()
        && answer.starts_with("HTTP/1.0 200")
}

impl Prometheus {
    fn start(target: &str) -> Prometheus {
        let port = free_port();
        let dir = server_dir("prometheus", port);
        let config = dir.join("prometheus.yml");
        std::fs::write(
            &config,
            format!(
                "global:\n  scrape_interval: {SCRAPE_SECONDS}s\n  scrape_timeout: {SCRAPE_SECONDS}s\n\
                 scrape_configs:\n  - job_name: axum_service\n    static_configs:\n      - targets: ['{target}']\n"
            ),
        )
        .expect("write prometheus.yml");
        let log = dir.join("prometheus.log");
        let output = File::create(&log).expect("prometheus.log");
        let mut command = Command::new("prometheus");
        command
            .arg(format!("--config.file={}", config.display()))
            .arg(format!("--storage.tsdb.path={}", dir.join("data").display()))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdout(output.try_clone().expect("prometheus.log"))
            .stderr(output);
        let mut prometheus = Prometheus {
            child: spawn_watched(command, "prometheus"),
            url: format!("http://127.0.0.1:{port}"),
            dir,
            log,
        };
        // Listening is not serving: until ready, queries answer 503.
        let started = Instant::now();
        while !ready(port) {
            if let Ok(Some(status)) = prometheus.child.try_wait() {
                panic!("prometheus exited ({status}): {}", prometheus.log_text());
            }
            assert!(
                started.elapsed() < PATIENCE,
                "prometheus not ready: {}",
                prometheus.log_text()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        prometheus
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// `/api/v1/query` at this moment: the result's samples. A query
    /// Prometheus refuses (bad PromQL) fails the test at once.
    async fn query(&self, http: &Http, query: &str) -> Vec<Value> {
        let url = format!("{}/api/v1/query", self.url);
        let body = form(&[("query", query)]);
        let (status, answer) = http
            .send(
                http::Method::POST,
                &url,
                &[("content-type", "application/x-www-form-urlencoded")],
                body,
            )
            .await;
        let answer = service::json(&answer);
        assert_eq!(
            (status, answer["status"].as_str()),
            (200, Some("success")),
            "{query}: {answer}"
        );
        answer["data"]["result"].as_array().expect("result").clone()
    }

    /// Asks `query` until its result is non-empty and passes `check`;
    /// fails after `PATIENCE`, showing the scrape target's state.
    async fn eventually(&self, http: &Http, query: &str, check: impl Fn(&[Value]) -> bool) -> Vec<Value> {
        let started = Instant::now();
        loop {
            let result = self.query(http, query).await;
            if !result.is_empty() && check(&result) {
                return result;
            }
            if started.elapsed() > PATIENCE {
                let (_, targets) = http.get(&format!("{}/api/v1/targets", self.url)).await;
                panic!(
                    "no data within {PATIENCE:?} for\n  {query}\nlast result: {result:?}\ntargets: {targets}"
                );
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
