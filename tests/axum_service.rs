//! The `axum_service` example as a real process, driven over real HTTP:
//! concurrent payments and balance reads leave exact balances, SIGTERM
//! stops it with exit 0, and its config comes from `DLOCK_*` variables.

mod service;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use service::{Http, OPENING_BALANCE, Service};

/// Payments per account, sent by `PAYERS` concurrent clients.
const PAYMENTS: usize = 250;
const PAYERS: usize = 32;
/// Clients reading every balance while the payments run.
const READERS: usize = 4;
/// (account, cents per payment): 250 × 3 = 750 fits the opening 1000, so
/// every payment goes through; 250 × 5 = 1250 does not, so exactly 200 do
/// and 50 are refused.
const PLAN: [(u64, i64); 4] = [(1, 3), (2, 3), (3, 5), (4, 5)];

/// How many payments of `cents` go through, and the balance they leave.
fn expected(cents: i64) -> (i64, i64) {
    let fits = (PAYMENTS as i64).min(OPENING_BALANCE / cents);
    (fits, OPENING_BALANCE - fits * cents)
}

#[derive(Default)]
struct Outcomes {
    /// Per account, the balance each successful payment answered.
    paid: BTreeMap<u64, Vec<i64>>,
    /// Per account, payments refused for want of funds (409).
    refused: BTreeMap<u64, usize>,
    /// Anything else: a stale fence, a lock error, a bad answer.
    unexpected: Vec<String>,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_payments_over_http_leave_exact_balances_and_sigterm_exits_zero() {
    let service = Service::start();
    let url = Arc::new(service.url.clone());
    let http = Http::default();

    let queue: Vec<(u64, i64)> = (0..PAYMENTS).flat_map(|_| PLAN).collect();
    let queue = Arc::new(Mutex::new(queue.into_iter()));
    let outcomes = Arc::new(Mutex::new(Outcomes::default()));
    let paying = Arc::new(AtomicBool::new(true));
    let (reads_during_payments, read_violations) =
        (Arc::new(AtomicU64::new(0)), Arc::new(Mutex::new(Vec::new())));

    // Readers: each balance is one the payments can leave (the opening
    // balance less whole payments, not below the final one) and, seen by one
    // reader, never goes up.
    let readers: Vec<_> = (0..READERS)
        .map(|_| {
            let (http, url, paying) = (http.clone(), url.clone(), paying.clone());
            let (reads, violations) = (reads_during_payments.clone(), read_violations.clone());
            tokio::spawn(async move {
                let mut last = BTreeMap::new();
                while paying.load(Ordering::SeqCst) {
                    for (account, cents) in PLAN {
                        let balance = http.balance(&url, account).await;
                        let floor = expected(cents).1;
                        let previous = *last.get(&account).unwrap_or(&OPENING_BALANCE);
                        if (OPENING_BALANCE - balance) % cents != 0 || balance < floor || balance > previous {
                            violations
                                .lock()
                                .unwrap()
                                .push(format!("account {account}: read {balance} after {previous}"));
                        }
                        last.insert(account, balance);
                        if paying.load(Ordering::SeqCst) {
                            reads.fetch_add(1, Ordering::SeqCst);
                        }
                    }
                }
            })
        })
        .collect();

    let payers: Vec<_> = (0..PAYERS)
        .map(|_| {
            let (http, url, queue, outcomes) = (http.clone(), url.clone(), queue.clone(), outcomes.clone());
            tokio::spawn(async move {
                loop {
                    let Some((account, cents)) = queue.lock().unwrap().next() else {
                        break;
                    };
                    let (status, answer) = http.pay(&url, account, cents).await;
                    let mut outcomes = outcomes.lock().unwrap();
                    match (status, answer["balance"].as_i64()) {
                        (200, Some(balance)) => outcomes.paid.entry(account).or_default().push(balance),
                        (409, _) => *outcomes.refused.entry(account).or_default() += 1,
                        _ => outcomes
                            .unexpected
                            .push(format!("account {account}: {status} {answer}")),
                    }
                }
            })
        })
        .collect();
    for payer in payers {
        payer.await.expect("payer");
    }
    paying.store(false, Ordering::SeqCst);
    for reader in readers {
        reader.await.expect("reader");
    }

    let outcomes = std::mem::take(&mut *outcomes.lock().unwrap());
    assert_eq!(
        outcomes.unexpected,
        Vec::<String>::new(),
        "stale fences or lock errors"
    );
    assert_eq!(*read_violations.lock().unwrap(), Vec::<String>::new());
    assert!(
        reads_during_payments.load(Ordering::SeqCst) > 0,
        "the readers read while payments ran"
    );
    for (account, cents) in PLAN {
        let (fits, left) = expected(cents);
        assert_eq!(http.balance(&url, account).await, left, "account {account}");
        // Each payment answered a balance no other payment answered: two
        // payments that read the same balance (a lost update) would repeat one.
        let mut answered = outcomes.paid.get(&account).cloned().unwrap_or_default();
        answered.sort_unstable_by(|a, b| b.cmp(a));
        let one_by_one: Vec<i64> = (1..=fits).map(|n| OPENING_BALANCE - n * cents).collect();
        assert_eq!(
            answered, one_by_one,
            "account {account}: balances the payments answered"
        );
        let refused = outcomes.refused.get(&account).copied().unwrap_or(0);
        assert_eq!(
            refused as i64,
            PAYMENTS as i64 - fits,
            "account {account}: payments refused"
        );
    }

    // Idle keep-alive connections of `http` are still open: a graceful
    // shutdown must not wait for them.
    let (status, stderr) = tokio::task::spawn_blocking(move || service.terminate())
        .await
        .expect("terminate");
    assert!(status.success(), "exit {status} after SIGTERM; stderr: {stderr}");
    assert!(stderr.contains("stopping"), "{stderr}");
    drop(http);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_config_comes_from_dlock_variables_without_a_file() {
    // An engine named by the environment alone serves, and names the series.
    let service = Service::start_with(&[("DLOCK_ENGINES__LEDGER__KIND", "memory")]);
    let http = Http::default();
    let (status, answer) = http.pay(&service.url, 9, 40).await;
    assert_eq!(
        (status, answer["balance"].as_i64()),
        (200, Some(OPENING_BALANCE - 40))
    );
    let (status, metrics) = http.get(&format!("{}/metrics", service.url)).await;
    assert_eq!(status, 200);
    let acquired = metrics
        .lines()
        .find(|l| {
            l.starts_with("dlock_events_total{")
                && l.contains(r#"mode="write""#)
                && l.contains(r#"event="acquired""#)
        })
        .unwrap_or_else(|| panic!("no acquisitions in:\n{metrics}"));
    assert!(
        acquired.contains(r#"engine="ledger""#) && acquired.ends_with(" 1"),
        "{acquired}"
    );
    let (status, stderr) = tokio::task::spawn_blocking(move || service.terminate())
        .await
        .expect("terminate");
    assert!(status.success(), "exit {status}; stderr: {stderr}");

    // A mistake there fails at startup, naming the field, before listening.
    let output = std::process::Command::new(dlock_testkit::server::example("axum_service"))
        .args(["--listen", "127.0.0.1:0"])
        .env("DLOCK_ENGINES__LEDGER__KIND", "redys")
        .output()
        .expect("run axum_service");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("engines.ledger.kind") && stderr.contains("redys"),
        "{stderr}"
    );
    assert!(output.stdout.is_empty(), "it never listened");
}
