//! Headless Chromium, driven through chromedriver's WebDriver protocol on
//! loopback: enough of the protocol to load a page, read what it renders,
//! type and click as a person would, and take a screenshot.

use std::cell::Cell;
use std::fs::File;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use base64::Engine as _;
use dlock_testkit::server::{free_port, kill_group, serve, spawn_watched};
use serde_json::{Value, json};

use crate::service::Http;

/// The flags that run Chromium headless here: no sandbox (root in a
/// container), and nothing that reaches beyond loopback on its own.
const CHROMIUM_FLAGS: [&str; 10] = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--window-size=1280,480",
];

/// The key under which WebDriver names an element.
const ELEMENT: &str = "element-6066-11e4-a52e-4f735466cecf";

/// Held by each running chromedriver: one browser at a time, since two
/// side by side on a small machine would slow each other's pages, and the
/// refresh's time is measured against a bound.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// A chromedriver on a free loopback port, with a fresh Chromium profile;
/// it and the browsers it started are killed when dropped.
pub struct Chromedriver {
    child: Child,
    url: String,
    profile: PathBuf,
    _turn: MutexGuard<'static, ()>,
}

impl Chromedriver {
    /// Waits for the other tests' browsers to close, starts chromedriver
    /// and returns once its `/status` says it is ready for a session, not
    /// merely listening.
    pub fn start() -> Self {
        // A test that failed with its browser open left the lock poisoned, not taken.
        let turn = ONE_AT_A_TIME
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let dir = dlock_testkit::server::scratch("chromium");
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("temp dir");
        let log = dir.join("chromedriver.log");
        let port = Cell::new(0);
        let child = serve(
            "chromedriver",
            Duration::from_secs(60),
            Some(&log),
            || {
                port.set(free_port());
                let out = File::create(&log).expect("chromedriver log");
                let mut command = Command::new("chromedriver");
                command
                    .arg(format!("--port={}", port.get()))
                    .stdout(out.try_clone().expect("log"))
                    .stderr(out);
                spawn_watched(command, "chromedriver")
            },
            || is_ready(port.get()),
        );
        Chromedriver {
            child,
            url: format!("http://127.0.0.1:{}", port.get()),
            profile: dir.join("profile"),
            _turn: turn,
        }
    }
}

impl Drop for Chromedriver {
    fn drop(&mut self) {
        kill_group(&mut self.child);
        let _ = std::fs::remove_dir_all(self.profile.parent().expect("temp dir"));
    }
}

/// Whether chromedriver on `port` answers `/status` with `ready: true`.
fn is_ready(port: u16) -> bool {
    let Ok(mut stream) = TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(5)));
    let request = "GET /status HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n";
    if stream.write_all(request.as_bytes()).is_err() {
        return false;
    }
    // Read until the body is whole JSON: chromedriver keeps the connection
    // open whatever the request asks.
    let (mut answer, mut chunk) = (Vec::new(), [0; 4096]);
    while let Ok(read @ 1..) = stream.read(&mut chunk) {
        answer.extend_from_slice(&chunk[..read]);
        let answer = String::from_utf8_lossy(&answer);
        let body = answer.split_once("\r\n\r\n").map_or("", |(_, body)| body);
        if let Ok(status) = serde_json::from_str::<Value>(body) {
            return status["value"]["ready"] == true;
        }
    }
    false
}

/// One browser session: a headless Chromium window.
pub struct Browser {
    http: Http,
    session: String,
}

impl Browser {
    /// Opens a session of `driver`; a prompt the page opens (`alert`) stays
    /// open, for [`Browser::alert`] to find.
    pub async fn open(driver: &Chromedriver) -> Self {
        let mut args = CHROMIUM_FLAGS.map(String::from).to_vec();
        args.push(format!("--user-data-dir={}", driver.profile.display()));
        let capabilities = json!({ "capabilities": { "alwaysMatch": {
            "browserName": "chrome",
            "unhandledPromptBehavior": "ignore",
            "goog:chromeOptions": { "binary": "/usr/bin/chromium", "args": args },
        }}});
        let http = Http::default();
        let created = command(
            &http,
            http::Method::POST,
            &format!("{}/session", driver.url),
            capabilities,
        )
        .await;
        let id = created["sessionId"].as_str().expect("a session id");
        Browser {
            http,
            session: format!("{}/session/{id}", driver.url),
        }
    }

    async fn call(&self, method: http::Method, path: &str, body: Value) -> Value {
        command(&self.http, method, &format!("{}{path}", self.session), body).await
    }

    /// Loads `url` and returns once the document has loaded.
    pub async fn goto(&self, url: &str) {
        self.call(http::Method::POST, "/url", json!({ "url": url })).await;
    }

    /// Runs `script` in the page (a function body: `return ...`), with `args`.
    pub async fn run(&self, script: &str, args: Value) -> Value {
        let body = json!({ "script": script, "args": args });
        self.call(http::Method::POST, "/execute/sync", body).await
    }

    /// The elements matching the CSS `selector`, as WebDriver names them.
    pub async fn find_all(&self, selector: &str) -> Vec<String> {
        let body = json!({ "using": "css selector", "value": selector });
        let found = self.call(http::Method::POST, "/elements", body).await;
        let found = found.as_array().expect("a list of elements");
        let id = |e: &Value| e[ELEMENT].as_str().map(str::to_owned);
        (found.iter())
            .map(|e| id(e).unwrap_or_else(|| panic!("not an element: {e}")))
            .collect()
    }

    async fn find(&self, selector: &str) -> String {
        let mut found = self.find_all(selector).await;
        assert_eq!(found.len(), 1, "one element matches {selector}");
        found.remove(0)
    }

    /// Types `text` into the element `selector` finds, key by key.
    pub async fn type_into(&self, selector: &str, text: &str) {
        let element = self.find(selector).await;
        let path = format!("/element/{element}/value");
        self.call(http::Method::POST, &path, json!({ "text": text }))
            .await;
    }

    /// Clicks the element `selector` finds, as a mouse would.
    pub async fn click(&self, selector: &str) {
        let element = self.find(selector).await;
        self.call(
            http::Method::POST,
            &format!("/element/{element}/click"),
            json!({}),
        )
        .await;
    }

    /// The text of the prompt (`alert`) the page has open, if any.
    pub async fn alert(&self) -> Option<String> {
        let url = format!("{}/alert/text", self.session);
        let (status, answer) = send(&self.http, http::Method::GET, &url, Value::Null).await;
        match status {
            200 => Some(answer["value"].as_str().unwrap_or_default().to_owned()),
            _ if answer["value"]["error"] == "no such alert" => None,
            _ => panic!("{url}: {status} {answer}"),
        }
    }

    /// Answers the prompt (`confirm`) the page has open: OK, or with
    /// `accept` false, Cancel.
    pub async fn answer(&self, accept: bool) {
        let route = if accept { "/alert/accept" } else { "/alert/dismiss" };
        self.call(http::Method::POST, route, json!({})).await;
    }

    /// A PNG of the window.
    pub async fn screenshot(&self) -> Vec<u8> {
        let png = self.call(http::Method::GET, "/screenshot", Value::Null).await;
        let png = png.as_str().expect("base64");
        base64::engine::general_purpose::STANDARD
            .decode(png)
            .expect("a PNG in base64")
    }

    /// Ends the session, closing the browser.
    pub async fn close(self) {
        self.call(http::Method::DELETE, "", Value::Null).await;
    }
}

/// A WebDriver command's `value`; an error answer fails the test.
async fn command(http: &Http, method: http::Method, url: &str, body: Value) -> Value {
    let (status, mut answer) = send(http, method, url, body).await;
    assert_eq!(status, 200, "{url}: {answer}");
    answer["value"].take()
}

async fn send(http: &Http, method: http::Method, url: &str, body: Value) -> (u16, Value) {
    let body = if body.is_null() {
        String::new()
    } else {
        body.to_string()
    };
    let headers = [("content-type", "application/json")];
    let (status, text) = http.send(method, url, &headers, body).await;
    let answer = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{url}: not JSON ({e}): {text}"));
    (status, answer)
}
