//! What a server that stops answering does to an engine, checked on every
//! engine's fixture: startup against a listener that accepts and never
//! answers fails within `connect_timeout`, and once the network turns into
//! a black hole mid-run every call ends within its bound, a holder hears
//! that it lost within its lease, and the engine serves again once the
//! network heals. The servers are the fixture's own, reached through
//! [`CutProxy`]s put in its config in place of their addresses.

use std::collections::BTreeMap;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use dlock_core::config::{Polling, Queue};
use dlock_core::kit::{Engine, Records};
use dlock_core::{Error, Registry, Settings, Wait};

use crate::Fixture;
use crate::proxy::{CutProxy, SilentListener};

/// The `connect_timeout` these checks set.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
/// Each engine call's bound, `call_timeout`, in the black hole.
const CALL_TIMEOUT: Duration = Duration::from_secs(1);
/// The lease of the holds that hear they lost.
const LEASE: Duration = Duration::from_secs(3);
/// The wait of an acquire and a campaign in the black hole.
const WAIT: Duration = Duration::from_secs(2);
/// What a bound may be late by on a loaded machine: timers fire late and
/// the error path takes a few scheduling rounds.
const LATE: Duration = Duration::from_secs(1);

/// `config` (an `[engines.<name>]` table's body) with each loopback
/// address in it replaced by `to(address)`, and `connect_timeout` set to
/// [`CONNECT_TIMEOUT`]; the addresses found, in order.
pub fn config_via(config: &str, mut to: impl FnMut(SocketAddr) -> SocketAddr) -> (String, Vec<SocketAddr>) {
    const HOST: &str = "127.0.0.1:";
    let (mut out, mut rest, mut found) = (String::new(), config, Vec::new());
    while let Some(at) = rest.find(HOST) {
        let digits = rest[at + HOST.len()..]
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(rest.len() - at - HOST.len());
        let end = at + HOST.len() + digits;
        let address: SocketAddr = rest[at..end].parse().expect("a loopback address");
        found.push(address);
        out.push_str(&rest[..at]);
        out.push_str(&to(address).to_string());
        rest = &rest[end..];
    }
    out.push_str(rest);
    out.push_str(&format!(
        "\nconnect_timeout = \"{}ms\"\n",
        CONNECT_TIMEOUT.as_millis()
    ));
    (out, found)
}

/// Builds an engine from an `[engines.main]` body, as an application would.
pub(crate) async fn build(body: &str) -> Result<Arc<dyn Engine>, Error> {
    let config = dlock_core::Config::parse(&format!("[engines.main]\n{body}"), std::iter::empty())?;
    dlock_engines::kinds()
        .build("main", &config.engines["main"])
        .await
}

/// Starting `F`'s engine with every server address pointed at a
/// [`SilentListener`] fails within [`CONNECT_TIMEOUT`] and a margin, as
/// `Error::Unavailable` naming the engine, its kind and the address.
pub async fn assert_startup_against_a_silent_server_fails_in_time<F: Fixture>(fixture: &F) {
    if !F::HAS_SERVER {
        println!("silence: SKIPPED on {}: no server to go silent", F::NAME);
        return;
    }
    let silent = SilentListener::start().await;
    let (body, found) = config_via(&fixture.engine_config(), |_| silent.address);
    assert!(
        !found.is_empty(),
        "{}: no 127.0.0.1 address in its config",
        F::NAME
    );
    let started = Instant::now();
    let built = tokio::time::timeout(Duration::from_secs(60), build(&body))
        .await
        .unwrap_or_else(|_| panic!("{}: startup against a silent server hung for 60 s", F::NAME));
    let took = started.elapsed();
    let Err(err) = built else {
        panic!("{}: started against a server that never answers", F::NAME);
    };
    let message = err.to_string();
    assert!(
        matches!(err, Error::Unavailable { .. }),
        "{}: not Unavailable: {message}",
        F::NAME
    );
    assert!(
        message.contains("`main`") && message.contains(&silent.address.to_string()),
        "{}: the error names neither the engine nor the address: {message}",
        F::NAME
    );
    assert!(
        took < CONNECT_TIMEOUT + LATE,
        "{}: startup against a silent server took {took:?}, past connect_timeout {CONNECT_TIMEOUT:?}",
        F::NAME
    );
    println!(
        "silence: {} startup against a silent server failed after {took:.2?}: {message}",
        F::NAME
    );
}

/// Through a black hole: `F`'s engine, with every server behind a
/// [`CutProxy`], holds a lock (and leads an election where it can); the
/// network then goes silent. Every call fails within its bound, the
/// holder hears it lost within its lease, and once the network heals the
/// engine serves again.
pub async fn assert_calls_end_in_time_through_a_black_hole<F: Fixture>(fixture: &F) {
    if F::ADDRESSES_FROM_SERVERS {
        println!(
            "silence: SKIPPED black hole on {}: its client learns the addresses it talks to from the servers, past any proxy in the config",
            F::NAME
        );
        return;
    }
    if !F::HAS_SERVER {
        println!(
            "silence: SKIPPED black hole on {}: no server to go silent",
            F::NAME
        );
        return;
    }
    let mut proxies = BTreeMap::new();
    let (_, found) = config_via(&fixture.engine_config(), |a| a);
    assert!(
        !found.is_empty(),
        "{}: no 127.0.0.1 address in its config",
        F::NAME
    );
    for address in found {
        if let std::collections::btree_map::Entry::Vacant(slot) = proxies.entry(address) {
            slot.insert(CutProxy::start(address).await);
        }
    }
    let (body, _) = config_via(&fixture.engine_config(), |a| proxies[&a].address);
    let engine = build(&body)
        .await
        .expect("the engine connects through the proxies");
    let silence = || proxies.values().for_each(|proxy| proxy.silence());
    let heal = || proxies.values().for_each(|proxy| proxy.heal());
    assert_calls_end_in_time_while_silent(F::NAME, engine, silence, heal).await;
}

/// `engine`'s calls while its servers are silent, from `silence()` to
/// `heal()`: each fails within its bound, a holder hears it lost within
/// its lease, and once healed the engine serves again.
pub async fn assert_calls_end_in_time_while_silent(
    name: &str,
    engine: Arc<dyn Engine>,
    silence: impl FnOnce(),
    heal: impl FnOnce(),
) {
    let capabilities = engine.capabilities();
    let settings = Settings {
        lease: LEASE,
        wait: Wait::For(WAIT),
        poll: Polling::Exponential {
            initial: Duration::from_millis(5),
            max: Duration::from_millis(100),
        },
        queue: Queue::Engine,
        call_timeout: CALL_TIMEOUT,
        deadlock_warning: Duration::from_secs(10),
        deadlock_check: Duration::from_secs(1),
    };
    let registry = Registry::with_engine("main", engine, settings).expect("registry");
    let group = format!("silence-{}", std::process::id());
    let locks = registry.locks(&group);
    let held = locks.get("held").lock().await.expect("lock before the silence");
    let released = locks
        .get("released")
        .lock()
        .await
        .expect("lock before the silence");
    let term = match capabilities.election() {
        true => Some(
            locks
                .election("leader")
                .campaign()
                .await
                .expect("campaign before the silence"),
        ),
        false => None,
    };

    silence();
    let silent_at = Instant::now();
    let lost = held.lost();
    let lost_after = tokio::spawn(async move {
        lost.await;
        silent_at.elapsed()
    });
    let within_call = CALL_TIMEOUT + LATE;
    let (records, control, election) = (
        capabilities.records,
        capabilities.control,
        capabilities.election(),
    );
    // All at once, each bound from its own start: calls in flight together
    // must each end in time, and the check takes its longest bound, not
    // their sum.
    // Each check runs `call` if its engine offers it.
    macro_rules! check {
        ($on:expr, $what:literal, $bound:expr, $call:expr) => {
            when($on, timed($what, $bound, async { $call.await }))
        };
    }
    let checks = tokio::join!(
        check!(true, "acquire", WAIT + within_call, locks.get("other").lock()),
        check!(true, "try", within_call, locks.get("tried").try_lock()),
        // A release lets a renewal in flight end first: two calls.
        check!(true, "release", CALL_TIMEOUT + within_call, released.release()),
        check!(
            records != Records::None,
            "inspect",
            within_call,
            locks.get("held").inspect()
        ),
        check!(records == Records::Listed, "list", within_call, locks.list()),
        check!(
            control,
            "force release",
            within_call,
            locks.get("held").force_release()
        ),
        check!(control, "revoke", within_call, locks.get("held").revoke()),
        // A campaign waits forever: it gives up once the engine has
        // failed for a lease, with the call then under way.
        check!(
            election,
            "campaign",
            LEASE + within_call,
            locks.election("other-leader").campaign()
        ),
        check!(
            election,
            "observe",
            within_call,
            locks.election("leader").observe().next()
        ),
    );
    let checks: Vec<Result<String, String>> = [
        checks.0, checks.1, checks.2, checks.3, checks.4, checks.5, checks.6, checks.7, checks.8,
    ]
    .into_iter()
    .flatten()
    .collect();
    let heard_by = (silent_at + LEASE + LATE * 2).into();
    let heard_after = tokio::time::timeout_at(heard_by, lost_after).await;
    heal();
    let failures: Vec<&String> = checks.iter().filter_map(|c| c.as_ref().err()).collect();
    assert!(failures.is_empty(), "{}: {failures:#?}", name);
    let Ok(Ok(heard_after)) = heard_after else {
        panic!(
            "{}: a holder behind a silent network did not hear it lost within its lease ({LEASE:?})",
            name
        );
    };
    assert!(
        heard_after <= LEASE + LATE * 2,
        "{}: a holder behind a silent network heard it lost only {heard_after:?} after, past its lease ({LEASE:?})",
        name
    );
    let said: Vec<&String> = checks.iter().filter_map(|c| c.as_ref().ok()).collect();
    println!(
        "silence: {} with its servers silent: {said:?}; holder lost after {heard_after:.2?}",
        name
    );

    // Healed: the engine serves again, its dead connections replaced.
    let healed_at = Instant::now();
    let again = locks.get("after").with_wait(Wait::For(Duration::from_secs(20)));
    let guard = again
        .lock()
        .await
        .expect("the engine serves again once the network heals");
    guard.release().await.expect("release once healed");
    println!(
        "silence: {} served again {:.2?} after its servers answered again",
        name,
        healed_at.elapsed()
    );
    drop(held);
    drop(term);
}

/// `check`'s outcome, if `on`.
async fn when(
    on: bool,
    check: impl Future<Output = Result<String, String>>,
) -> Option<Result<String, String>> {
    match on {
        true => Some(check.await),
        false => None,
    }
}

/// Runs `call` and says how long it took to fail; an error if it
/// succeeded, or took past `bound`.
async fn timed<T>(
    what: &str,
    bound: Duration,
    call: impl Future<Output = Result<T, Error>>,
) -> Result<String, String> {
    let started = Instant::now();
    let outcome = tokio::time::timeout(bound + Duration::from_secs(30), call).await;
    let took = started.elapsed();
    match outcome {
        Err(_) => Err(format!("{what} hung past {:?}", bound + Duration::from_secs(30))),
        Ok(Ok(_)) => Err(format!("{what} succeeded with the network silent")),
        Ok(Err(e)) if took > bound => Err(format!(
            "{what} failed after {took:?}, past its bound {bound:?}: {e}"
        )),
        Ok(Err(e)) => Ok(format!("{what} failed after {took:.2?}: {e}")),
    }
}
