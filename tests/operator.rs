//! What an operator does, on every engine with a server: the `dlock`
//! command, as a process, against a holder and a waiter made here (a
//! registry each, as two processes would have): `show`, `revoke`,
//! `release --force`. What an engine declares it cannot do must come back
//! as exit code 1 naming what it lacks, and the lock must stay as it was.

#![cfg(feature = "cli")]

use std::path::PathBuf;
use std::process::{Command, Output};
use std::time::Duration;

use dlock::{Config, LostReason, Registry};
use dlock_testkit::Fixture;

/// Holders hear of a revocation or a forced release at their next
/// renewal: a third of this lease, then the call.
const LEASE: Duration = Duration::from_secs(2);

struct Operated {
    config: PathBuf,
    holding: Registry,
    waiting: Registry,
}

impl Operated {
    async fn on<F: Fixture>(fixture: &F) -> Self {
        let text = format!(
            "[defaults]\nclient_name = \"ops 1\"\n[engines.main]\n{}\n[groups.ops]\n",
            fixture.engine_config()
        );
        let config = dlock_testkit::server::scratch(&format!("operator-{}.toml", F::NAME));
        std::fs::write(&config, &text).expect("write config");
        let parsed = Config::parse(&text, []).expect("config");
        let kinds = dlock::engines::kinds();
        Operated {
            config,
            holding: Registry::build(&parsed, &kinds).await.expect("registry"),
            waiting: Registry::build(&parsed, &kinds).await.expect("registry"),
        }
    }

    fn dlock(&self, args: &[&str]) -> Output {
        Command::new(env!("CARGO_BIN_EXE_dlock"))
            .arg("--config")
            .arg(&self.config)
            .args(args)
            .output()
            .expect("run dlock")
    }
}

/// The exit code 1 and message of what the engine lacks.
fn assert_lacks(out: &Output, what: &str) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{what}: {stderr}");
    assert!(stderr.contains("does not support"), "{what}: {stderr}");
}

async fn operate<F: Fixture>() {
    let fixture = F::start();
    let ops = Operated::on(&fixture).await;
    let capabilities = ops.holding.engine("main").expect("the engine").capabilities();
    let guard = ops
        .holding
        .locks("ops")
        .get("stuck")
        .with_lease(LEASE)
        .lock()
        .await
        .expect("lock");
    let waiter = tokio::spawn({
        let lock = ops.waiting.locks("ops").get("stuck").with_lease(LEASE);
        async move { lock.lock_for(Duration::from_secs(30)).await.expect("waiter") }
    });

    let shown = ops.dlock(&["show", "ops/stuck", "--json"]);
    if capabilities.records == dlock::kit::Records::None {
        assert_lacks(&shown, "show");
    } else {
        assert_eq!(shown.status.code(), Some(0), "{shown:?}");
        let json: serde_json::Value = serde_json::from_slice(&shown.stdout).expect("json");
        assert_eq!(json[0]["holders"][0]["label"], "ops 1", "{json}");
        assert_eq!(json[0]["holders"][0]["owner"], guard.owner_digest(), "{json}");
    }

    let revoked = ops.dlock(&["revoke", "ops/stuck", "--json"]);
    if capabilities.control {
        assert_eq!(revoked.status.code(), Some(0), "{revoked:?}");
        let json: serde_json::Value = serde_json::from_slice(&revoked.stdout).expect("json");
        assert_eq!(json["asked"], 1, "{json}");
        tokio::time::timeout(LEASE, guard.revoked())
            .await
            .expect("the holder hears it was asked");
    } else {
        assert_lacks(&revoked, "revoke");
    }
    assert!(!guard.is_lost(), "asking takes nothing");

    let forced = ops.dlock(&["release", "--force", "ops/stuck"]);
    if !capabilities.control {
        assert_lacks(&forced, "release --force");
        assert!(!waiter.is_finished(), "a refused release let the waiter in");
        guard.release().await.expect("release");
        let next = waiter.await.expect("task");
        next.release().await.expect("release");
        return;
    }
    assert_eq!(forced.status.code(), Some(0), "{forced:?}");
    let next = tokio::time::timeout(Duration::from_secs(10), waiter)
        .await
        .expect("the waiter's turn")
        .expect("task");
    if capabilities.fencing != dlock::kit::Fencing::None {
        assert!(next.fence() > guard.fence(), "the next token is greater");
    }
    let reason = tokio::time::timeout(LEASE * 2, guard.lost())
        .await
        .expect("the old holder hears it");
    assert_eq!(reason, LostReason::ForceReleased);
    next.release().await.expect("release");
    let nothing = ops.dlock(&["release", "--force", "ops/stuck"]);
    assert_eq!(nothing.status.code(), Some(3), "nothing held: {nothing:?}");
}

macro_rules! operator {
    ($name:ident, $fixture:ty, $feature:literal) => {
        #[cfg(feature = $feature)]
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $name() {
            operate::<$fixture>().await;
        }
    };
}

dlock_testkit::every_setup!(operator);
