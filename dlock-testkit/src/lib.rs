//! dlock's own test support, not published: real servers on loopback
//! ports for every engine, a proxy that cuts the network, certificates, a
//! fenced store, and the cross-process fault suites with their worker
//! binaries (`fault_worker`, `transfer_worker`).
//!
//! The conformance cases themselves are published with the engines
//! (`dlock::engines::conformance`), so an engine written elsewhere runs
//! them too; this crate only gives them this repository's servers:
//!
//! ```ignore
//! // tests/conformance_redis.rs: one #[tokio::test] per case.
//! dlock_testkit::conformance_suite!(dlock_testkit::fixtures::redis::Redis);
//! ```

pub mod certificates;
pub mod deadlocks;
pub mod fault_suite;
pub mod fenced_row;
mod fixture;
pub mod fixtures;
pub mod held_writes;
pub mod printed;
pub mod proxy;
pub mod random_faults;
pub mod server;
pub mod silence;
pub mod store;
pub mod visits;
pub mod worker_flags;

use std::time::Duration;

use dlock_core::{Error, Guard, Lock, Semaphore};

pub use fixture::{Breakable, Fixture, engine};

/// Expands to one `#[tokio::test]` per conformance case, on the engine of
/// `$fixture` (a [`Fixture`] type), started once for the file: `fixture()`
/// gives it. Two more put a silent server in its place ([`silence`]), and
/// one more holds the engine's declared capabilities to the guarantee table
/// of this repository (`docs/guarantees.md`).
#[macro_export]
macro_rules! conformance_suite {
    ($fixture:ty) => {
        /// The server(s) this file's conformance cases share.
        pub fn fixture() -> &'static $fixture {
            static FIXTURE: ::std::sync::OnceLock<$fixture> = ::std::sync::OnceLock::new();
            FIXTURE.get_or_init(<$fixture as $crate::Fixture>::start)
        }
        $crate::__engines::conformance_suite!(|| $crate::engine(fixture()));

        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn startup_against_a_silent_server_fails_in_time() {
            $crate::silence::assert_startup_against_a_silent_server_fails_in_time(fixture()).await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn calls_end_in_time_through_a_black_hole() {
            $crate::silence::assert_calls_end_in_time_through_a_black_hole(fixture()).await;
        }

        #[tokio::test]
        async fn capabilities_are_as_the_guarantee_doc_says() {
            let doc = ::std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/guarantees.md");
            $crate::assert_capabilities_documented(fixture(), &doc).await;
        }
    };
}

/// Checks that the guarantee table's capability row, in the column that
/// names `fixture`'s engine, starts with the words of what the engine
/// declares ([`Capabilities::words`](dlock_core::kit::Capabilities::words));
/// more may follow after a `;`.
pub async fn assert_capabilities_documented<F: Fixture>(fixture: &F, doc: &std::path::Path) {
    let text = std::fs::read_to_string(doc).unwrap_or_else(|e| panic!("read {}: {e}", doc.display()));
    let cell = documented_capabilities(&text, F::NAME);
    let declared = engine(fixture).await.capabilities().words();
    let documented = cell.split(';').next().unwrap_or_default().trim();
    assert_eq!(
        documented,
        declared,
        "docs/guarantees.md says {} has other capabilities than it declares",
        F::NAME
    );
}

/// The cells of a markdown table row.
pub fn table_cells(row: &str) -> Vec<String> {
    row.trim()
        .trim_matches('|')
        .split(" | ")
        .map(|cell| cell.trim().to_owned())
        .collect()
}

/// The capability row's cell for `kind` in the guarantee table `doc`
/// (`docs/guarantees.md`): a column is headed by its kinds, then the cargo
/// feature in parentheses.
pub fn documented_capabilities(doc: &str, kind: &str) -> String {
    let row = |start: &str| doc.lines().find(|l| l.starts_with(start)).map(table_cells);
    let header = row("| guarantee |").expect("the guarantee table");
    let declared = row("| capabilities ").expect("the capability row");
    let column = header
        .iter()
        .position(|head| {
            head.split(" (")
                .next()
                .unwrap_or_default()
                .split(", ")
                .any(|k| k == kind)
        })
        .unwrap_or_else(|| panic!("no column of the guarantee table names {kind}"));
    declared[column].clone()
}

/// A file of the workspace, by its path from the workspace's root.
pub fn workspace_file(path: &str) -> String {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join(path);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
}

/// On an engine that watches its holds (`Lifecycle::revoked`), a revocation
/// and then a force release each reach a holder past its first renewal at
/// once, not at its next renewal: on a 6 s lease renewed every 2 s, each
/// comes a second after a renewal and must be heard within 0.6 s, where
/// the next renewal would take a second.
pub async fn assert_acts_heard_at_once(registry: &dlock_core::Registry) {
    let lease = Duration::from_secs(6);
    let lock = registry.locks("pushed").get("k").with_lease(lease);
    let guard = lock.lock().await.expect("lock");
    tokio::time::sleep(lease / 3 + Duration::from_secs(1)).await;
    assert_eq!(lock.revoke().await.expect("revoke"), 1);
    tokio::time::timeout(Duration::from_millis(600), guard.revoked())
        .await
        .expect("the holder heard of the revocation only at its next renewal");

    // Renewed right away, and again 2 s on: this comes a second after that.
    tokio::time::sleep(lease / 3 + Duration::from_secs(1)).await;
    assert!(!guard.is_lost());
    assert_eq!(lock.force_release().await.expect("force release"), 1);
    tokio::time::timeout(Duration::from_millis(600), guard.lost())
        .await
        .expect("the holder learned it was forced out only at its next renewal");
    assert_eq!(
        guard.held().lost_reason(),
        Some(dlock_core::LostReason::ForceReleased)
    );
}

#[doc(hidden)]
pub use dlock_engines as __engines;

/// Spawns a task that takes `lock` for write and lets go at once; it
/// returns when it got the lock, for tests that time a handoff.
pub fn timed_writer(lock: Lock) -> tokio::task::JoinHandle<std::time::Instant> {
    tokio::spawn(async move {
        let guard = lock.lock().await.expect("lock");
        let at = std::time::Instant::now();
        guard.release().await.expect("release");
        at
    })
}

/// `n` permits of `semaphore`, each taken in a task of its own, as `n`
/// holders in this process would take them: one task's second permit
/// would be its first again.
pub async fn permits_held(semaphore: &Semaphore, n: usize) -> Vec<Guard> {
    let mut held = Vec::new();
    for _ in 0..n {
        let semaphore = semaphore.clone();
        let taken = tokio::spawn(async move { semaphore.acquire().await });
        held.push(taken.await.expect("task").expect("permit"));
    }
    held
}

/// After a failover: `held` still excludes `peer` (the same lock, through
/// another engine), and `peer` gets the lock once `held` is released.
pub async fn assert_still_held(held: Guard, peer: &Lock) {
    assert!(!held.is_lost(), "the hold did not survive the failover");
    assert!(
        peer.try_lock().await.expect("try").is_none(),
        "the hold stopped excluding"
    );
    held.release().await.expect("release");
    peer.try_lock()
        .await
        .expect("try")
        .expect("free after release")
        .release()
        .await
        .expect("release");
}

/// Checks that `connect`, aimed at a server that is not there or refuses
/// it, fails within `limit` as `Error::Unavailable` naming the engine
/// `name` and `address`; the error's message, for its reason.
pub async fn assert_unreachable_is_a_clear_error<T>(
    connect: impl Future<Output = Result<T, Error>>,
    name: &str,
    address: &str,
    limit: Duration,
) -> String {
    let started = std::time::Instant::now();
    let err = connect.await.err().expect("connected to nothing?");
    let took = started.elapsed();
    assert!(took < limit, "took {took:?}");
    let message = err.to_string();
    assert!(matches!(err, Error::Unavailable { .. }), "{message}");
    assert!(
        message.contains(&format!("`{name}`")) && message.contains(address),
        "{message}"
    );
    message
}
