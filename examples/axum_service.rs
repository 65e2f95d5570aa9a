//! An HTTP service (axum) whose handlers are guarded by `#[distributed_lock]`,
//! with its metrics served to Prometheus.
//!
//! | route | lock | answer |
//! |---|---|---|
//! | `POST /accounts/{id}/pay`, body `{"cents": 5}` | write, group `account`, key `{id}` | `{"balance": 995}`; 409 if the balance is short |
//! | `GET /accounts/{id}` | read, the same lock | `{"balance": 995}` |
//! | `GET /metrics` | none | every series, Prometheus's text format |
//!
//! Every account opens with 1000 cents. The ledger refuses a write whose
//! fencing token is older than the last it accepted, so even a handler that
//! lost its lock mid-payment cannot overwrite a newer balance.
//!
//! ```text
//! cargo run -p dlock-examples --example axum_service -- [--config dlock.toml] [--listen 127.0.0.1:3000]
//! curl -X POST -H 'content-type: application/json' -d '{"cents": 5}' localhost:3000/accounts/7/pay
//! ```
//!
//! Without `--config`, the `DLOCK_*` variables alone make the configuration
//! (`DLOCK_DEFAULTS__WAIT=2s`); with none, the embedded memory engine serves.
//! `LISTEN_ADDR` stands for `--listen`. The bound address is printed on
//! stdout; Ctrl-C or SIGTERM stops taking connections, lets requests in flight
//! finish and exits 0.

use std::collections::HashMap;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use dlock::distributed_lock;
use metrics_exporter_prometheus::PrometheusBuilder;
use serde::{Deserialize, Serialize};

const OPENING_BALANCE: i64 = 1000;

/// Storage that takes a write only with a fence newer than the last one.
#[derive(Default)]
struct Ledger {
    accounts: Mutex<HashMap<u64, (i64, u64)>>,
}

impl Ledger {
    fn read(&self, account: u64) -> i64 {
        let accounts = self.accounts.lock().unwrap();
        accounts
            .get(&account)
            .map_or(OPENING_BALANCE, |(balance, _)| *balance)
    }

    fn write(&self, account: u64, balance: i64, fence: u64) -> Result<(), ServiceError> {
        let mut accounts = self.accounts.lock().unwrap();
        let entry = accounts.entry(account).or_insert((OPENING_BALANCE, 0));
        if fence <= entry.1 {
            return Err(ServiceError::StaleFence);
        }
        *entry = (balance, fence);
        Ok(())
    }
}

#[derive(Deserialize)]
struct Payment {
    cents: i64,
}

#[derive(Serialize)]
struct Balance {
    balance: i64,
}

#[derive(Debug)]
enum ServiceError {
    Lock(dlock::Error),
    Insufficient { balance: i64 },
    StaleFence,
}

impl From<dlock::Error> for ServiceError {
    fn from(e: dlock::Error) -> Self {
        ServiceError::Lock(e)
    }
}

impl IntoResponse for ServiceError {
    fn into_response(self) -> Response {
        let (status, error) = match self {
            ServiceError::Insufficient { balance } => {
                (StatusCode::CONFLICT, format!("insufficient funds ({balance})"))
            }
            // Both are worth a retry: the lock was busy, lost or unreachable.
            ServiceError::StaleFence => (StatusCode::SERVICE_UNAVAILABLE, "stale fencing token".into()),
            ServiceError::Lock(e) => (StatusCode::SERVICE_UNAVAILABLE, e.to_string()),
        };
        (status, Json(serde_json::json!({ "error": error }))).into_response()
    }
}

// The key names what the `Path` pattern binds: `<id>` is the `{id}` of the route.
#[distributed_lock(group = "account", key = "<id>", wait = "10s")]
async fn pay(
    State(ledger): State<Arc<Ledger>>,
    Path(id): Path<u64>,
    Json(payment): Json<Payment>,
) -> Result<Json<Balance>, ServiceError> {
    let balance = ledger.read(id);
    tokio::time::sleep(Duration::from_millis(1)).await; // a real service would await its database here
    if balance < payment.cents {
        return Err(ServiceError::Insufficient { balance });
    }
    let fence = dlock::fence().expect("inside a locked fn");
    ledger.write(id, balance - payment.cents, fence)?;
    Ok(Json(Balance {
        balance: balance - payment.cents,
    }))
}

#[distributed_lock(group = "account", key = "<id>", mode = "read")]
async fn balance(
    State(ledger): State<Arc<Ledger>>,
    Path(id): Path<u64>,
) -> Result<Json<Balance>, ServiceError> {
    Ok(Json(Balance {
        balance: ledger.read(id),
    }))
}

#[tokio::main]
async fn main() -> ExitCode {
    // The recorder first: dlock registers its series on first use. Buckets
    // make the histograms Prometheus histograms (the dashboard's
    // `histogram_quantile` needs them); without, the exporter writes summaries.
    let buckets = [
        0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
    ];
    let metrics = PrometheusBuilder::new()
        .set_buckets(&buckets)
        .expect("buckets")
        .install_recorder()
        .expect("the first recorder");
    let upkeep = metrics.clone();
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(Duration::from_secs(5)).await;
            upkeep.run_upkeep();
        }
    });

    let mut config_file = None;
    let mut listen = std::env::var("LISTEN_ADDR").unwrap_or_else(|_| "127.0.0.1:3000".into());
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match (arg.as_str(), args.next()) {
            ("--config", Some(path)) => config_file = Some(path),
            ("--listen", Some(address)) => listen = address,
            _ => {
                eprintln!("usage: axum_service [--config FILE] [--listen ADDRESS]");
                return ExitCode::from(2);
            }
        }
    }
    if let Err(e) = init_dlock(config_file.as_deref()).await {
        eprintln!("axum_service: {e}");
        return ExitCode::from(2);
    }

    let app = axum::Router::new()
        .route("/accounts/{id}/pay", post(pay))
        .route("/accounts/{id}", get(balance))
        .route("/metrics", get(move || std::future::ready(metrics.render())))
        .with_state(Arc::new(Ledger::default()));
    let listener = match tokio::net::TcpListener::bind(&listen).await {
        Ok(listener) => listener,
        Err(e) => {
            eprintln!("axum_service: cannot listen on {listen}: {e}");
            return ExitCode::from(2);
        }
    };
    println!(
        "listening on http://{}",
        listener.local_addr().expect("bound address")
    );
    match axum::serve(listener, app)
        .with_graceful_shutdown(stop_requested())
        .await
    {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("axum_service: {e}");
            ExitCode::FAILURE
        }
    }
}

/// The file, with `DLOCK_*` overrides; or the `DLOCK_*` variables alone
/// (none at all: the embedded memory engine).
async fn init_dlock(config_file: Option<&str>) -> Result<(), dlock::Error> {
    let config = match config_file {
        Some(path) => dlock::Config::from_file(path)?,
        None => dlock::Config::parse("", std::env::vars())?,
    };
    dlock::init(config).await
}

/// Ctrl-C or SIGTERM (what `kill`, systemd and Kubernetes send).
async fn stop_requested() {
    let mut terminate =
        tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).expect("a SIGTERM handler");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = terminate.recv() => {}
    }
    eprintln!("axum_service: stopping; requests in flight finish first");
}
