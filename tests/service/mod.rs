//! The `axum_service` example as a real process, and a small HTTP client,
//! for `tests/axum_service.rs`, `tests/prometheus.rs` and `tests/admin.rs`.

#![allow(dead_code, reason = "each test file uses part of it")]

use std::io::{BufRead, BufReader, Read};
use std::process::{Child, ChildStdout, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use dlock_testkit::server::{example, spawn_watched};
use http_body_util::BodyExt;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

/// Every account opens with this many cents (the example's `OPENING_BALANCE`).
pub const OPENING_BALANCE: i64 = 1000;

/// The longest any one request may take, queueing for a lock included.
const ANSWER_WITHIN: Duration = Duration::from_secs(30);

/// A running `axum_service`, killed with its process group if the test ends early.
pub struct Service {
    child: Child,
    /// Kept open: a service writing to a closed pipe would fail.
    _stdout: BufReader<ChildStdout>,
    /// `http://127.0.0.1:<port>`, as the service printed it.
    pub url: String,
}

impl Service {
    /// Starts the example on a free loopback port and reads the address it printed.
    pub fn start() -> Service {
        Self::start_with(&[])
    }

    /// [`Service::start`] with environment variables set (`DLOCK_*` config).
    pub fn start_with(env: &[(&str, &str)]) -> Service {
        let mut command = Command::new(example("axum_service"));
        command
            .args(["--listen", "127.0.0.1:0"])
            .envs(env.iter().copied())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = spawn_watched(command, "axum_service");
        let mut stdout = BufReader::new(child.stdout.take().expect("piped stdout"));
        let mut line = String::new();
        stdout
            .read_line(&mut line)
            .expect("read the service's first line");
        let Some(url) = line.trim().strip_prefix("listening on ").map(str::to_owned) else {
            let _ = child.wait();
            let mut stderr = String::new();
            let _ = child
                .stderr
                .take()
                .expect("piped stderr")
                .read_to_string(&mut stderr);
            panic!("axum_service printed {line:?}, not its address; stderr: {stderr}");
        };
        Service {
            child,
            _stdout: stdout,
            url,
        }
    }

    /// The process id, for signals.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends SIGTERM and waits (at most 10 s) for the exit; returns the
    /// status and what the service wrote on stderr.
    pub fn terminate(mut self) -> (ExitStatus, String) {
        let sent = Command::new("kill")
            .args(["-TERM", &self.pid().to_string()])
            .status()
            .expect("run kill");
        assert!(sent.success(), "kill -TERM {}", self.pid());
        let started = Instant::now();
        let status = loop {
            if let Some(status) = self.child.try_wait().expect("wait for the service") {
                break status;
            }
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "axum_service still running 10 s after SIGTERM"
            );
            std::thread::sleep(Duration::from_millis(20));
        };
        let mut stderr = String::new();
        let _ = self
            .child
            .stderr
            .take()
            .expect("piped stderr")
            .read_to_string(&mut stderr);
        (status, stderr)
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// An HTTP/1.1 client with a connection pool, for loopback addresses only.
#[derive(Clone)]
pub struct Http {
    client: Client<HttpConnector, String>,
}

impl Default for Http {
    fn default() -> Self {
        Http {
            client: Client::builder(TokioExecutor::new()).build_http(),
        }
    }
}

impl Http {
    /// Sends `body` with `headers`; the status and the body as text.
    pub async fn send(
        &self,
        method: http::Method,
        url: &str,
        headers: &[(&str, &str)],
        body: String,
    ) -> (u16, String) {
        assert!(url.starts_with("http://127.0.0.1:"), "loopback only: {url}");
        let mut request = http::Request::builder().method(method).uri(url);
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        let request = request.body(body).expect("request");
        let exchange = async {
            let response = self
                .client
                .request(request)
                .await
                .unwrap_or_else(|e| panic!("{url}: {e}"));
            let status = response.status().as_u16();
            let body = response.into_body().collect().await.expect("response body");
            (status, String::from_utf8_lossy(&body.to_bytes()).into_owned())
        };
        // A server that stops answering fails the test instead of hanging it.
        tokio::time::timeout(ANSWER_WITHIN, exchange)
            .await
            .unwrap_or_else(|_| panic!("{url}: no answer within {ANSWER_WITHIN:?}"))
    }

    pub async fn get(&self, url: &str) -> (u16, String) {
        self.send(http::Method::GET, url, &[], String::new()).await
    }

    /// `POST /accounts/{account}/pay`: the status and the JSON answer.
    pub async fn pay(&self, service: &str, account: u64, cents: i64) -> (u16, serde_json::Value) {
        let url = format!("{service}/accounts/{account}/pay");
        let body = serde_json::json!({ "cents": cents }).to_string();
        let (status, body) = self
            .send(
                http::Method::POST,
                &url,
                &[("content-type", "application/json")],
                body,
            )
            .await;
        (status, json(&body))
    }

    /// `GET /accounts/{account}`: the balance.
    pub async fn balance(&self, service: &str, account: u64) -> i64 {
        let (status, body) = self.get(&format!("{service}/accounts/{account}")).await;
        assert_eq!(status, 200, "balance of {account}: {body}");
        json(&body)["balance"]
            .as_i64()
            .unwrap_or_else(|| panic!("balance of {account}: {body}"))
    }
}

pub fn json(text: &str) -> serde_json::Value {
    serde_json::from_str(text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"))
}
