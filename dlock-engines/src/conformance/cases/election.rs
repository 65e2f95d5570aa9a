//! The leader election cases: one leader at a time with rising terms, an
//! observer that sees each leader and never an older term, and a leader
//! cut off that stops its work before the next one leads.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use dlock_core::Error;
use tokio::sync::{Mutex, Notify};

use super::{SETTLE, within};
use crate::conformance::{FencedRegister, Harness, Occupancy, SETTINGS};

/// Four candidates, two on each client, campaign for three terms each:
/// never two leaders at once, every term greater than the one before, and
/// `leader()` names the leader by its term while it leads.
pub async fn one_leader_at_a_time_with_rising_terms(h: &Harness) {
    let inside = Arc::new(Occupancy::new(1));
    let terms = Arc::new(Mutex::new(Vec::new()));
    let misreported = Arc::new(AtomicU64::new(0));
    let candidates = (0..4).map(|i| {
        let election = match i % 2 {
            0 => h.election("leader"),
            _ => h.peer_election("leader"),
        };
        let (inside, terms, misreported) = (inside.clone(), terms.clone(), misreported.clone());
        tokio::spawn(async move {
            for _ in 0..3 {
                let term = election.campaign().await.expect("campaign");
                terms.lock().await.push(term.number());
                let seen = election.leader().await.expect("leader");
                if seen.map(|leader| leader.term) != Some(term.number()) {
                    misreported.fetch_add(1, Ordering::SeqCst);
                }
                inside.visit(Duration::from_millis(30)).await;
                term.resign().await.expect("resign");
            }
        })
    });
    for candidate in candidates.collect::<Vec<_>>() {
        within(Duration::from_secs(30), "twelve terms", candidate)
            .await
            .expect("candidate task");
    }
    assert_eq!(inside.entries(), 12);
    assert_eq!(inside.over(), 0, "two leaders at once");
    assert_eq!(
        misreported.load(Ordering::SeqCst),
        0,
        "leader() named another term"
    );
    let terms = terms.lock().await;
    assert!(
        terms.windows(2).all(|pair| pair[0] < pair[1]),
        "terms out of order: {terms:?}"
    );
    assert_eq!(h.election("leader").leader().await.expect("leader"), None);
}

/// An observer on the peer reports the leader, then nobody, then the next
/// leader with a greater term, then nobody again: every change, in order.
pub async fn observe_reports_each_leader_and_never_an_older_term(h: &Harness) {
    let election = h.election("observed");
    let mut observer = h.peer_election("observed").observe();
    let limit = Duration::from_secs(5);
    assert_eq!(
        within(limit, "the first report", observer.next())
            .await
            .expect("observe"),
        None
    );

    let first = election.campaign().await.expect("campaign");
    let seen = within(limit, "the first leader", observer.next())
        .await
        .expect("observe");
    let seen = seen.expect("a leader");
    assert_eq!(seen.term, first.number());
    assert!(seen.label.is_some(), "a dlock leader shows its label");
    let first_term = first.number();
    first.resign().await.expect("resign");
    assert_eq!(
        within(limit, "vacancy", observer.next()).await.expect("observe"),
        None
    );

    let second = h.peer_election("observed").campaign().await.expect("campaign");
    let seen = within(limit, "the second leader", observer.next())
        .await
        .expect("observe");
    assert_eq!(seen.map(|leader| leader.term), Some(second.number()));
    assert!(second.number() > first_term);
    second.resign().await.expect("resign");
    assert_eq!(
        within(limit, "vacancy", observer.next()).await.expect("observe"),
        None
    );
}

/// A campaign with a value of its own shows it as the leader's label
/// where the engine keeps one; elsewhere it is `Unsupported` before any
/// engine call. A value that is no printable line is a config error.
pub async fn a_campaign_shows_its_value_where_the_engine_keeps_one(h: &Harness) {
    let bad = h.election("valued").with_value("two\nlines");
    assert!(
        matches!(bad, Err(Error::Config { .. })),
        "a value with a new line"
    );
    // On etcd it would pass for a dlock reader's key, beside the leader.
    let posing = h.election("valued").with_value("dlock read x");
    assert!(
        matches!(posing, Err(Error::Config { .. })),
        "a value posing as a record"
    );
    let election = h.election("valued").with_value("10.0.0.7:8080").expect("a value");
    if !h.capabilities().election_values {
        let calls = h.faults.calls();
        let refused = election.campaign().await.expect_err("a value it cannot keep");
        assert!(matches!(refused, Error::Unsupported { .. }), "{refused}");
        assert_eq!(h.faults.calls(), calls, "refused, it reached the engine");
        return;
    }
    let term = election.campaign().await.expect("campaign");
    let seen = h.peer_election("valued").leader().await.expect("leader");
    let seen = seen.expect("a leader");
    assert_eq!(
        (seen.label.as_deref(), seen.term),
        (Some("10.0.0.7:8080"), term.number())
    );
    term.resign().await.expect("resign");
}

/// `run_while_leader` runs its work with the term. Cut off from the
/// server, the leader's work is cancelled once its term is lost, the peer
/// leads with a greater term, and a fenced store refuses the old term.
/// Reconnected, it campaigns again, leads once the peer resigns, with a
/// greater term still, and returns its work's output.
pub async fn a_leader_cut_off_stops_and_the_next_leads(h: &Harness) {
    let lease = Duration::from_secs(1);
    let register = Arc::new(FencedRegister::default());
    let cancelled = Arc::new(Notify::new());
    let (led, mut leading) = tokio::sync::mpsc::unbounded_channel();
    let leader = tokio::spawn({
        let election = h.election("cut").with_lease(lease);
        let (register, cancelled) = (register.clone(), cancelled.clone());
        let mut runs = 0;
        async move {
            election
                .run_while_leader(move |term| {
                    runs += 1;
                    led.send(term).expect("the case listens");
                    let writes = if runs == 1 { u32::MAX } else { 3 };
                    let (register, stamp) = (register.clone(), Stamp(cancelled.clone()));
                    async move {
                        for _ in 0..writes {
                            if register.write(term).is_err() {
                                break;
                            }
                            tokio::time::sleep(Duration::from_millis(20)).await;
                        }
                        std::mem::forget(stamp);
                        term
                    }
                })
                .await
        }
    });
    let first = within(Duration::from_secs(5), "the first term", leading.recv()).await;
    let first = first.expect("led");
    let was_cancelled = cancelled.notified();
    h.faults.set_cut(true);
    let next = h.peer_election("cut").with_lease(lease);
    let second = within(Duration::from_secs(10), "the peer's term", next.campaign()).await;
    let second = second.expect("the peer leads");
    within(lease, "the cut-off leader's work cancelled", was_cancelled).await;
    assert!(
        second.number() > first,
        "term {} not above {first}",
        second.number()
    );
    register.write(second.number()).expect("the new leader writes");
    assert_eq!(
        register.write(first),
        Err(second.number()),
        "the old term is refused"
    );

    h.faults.set_cut(false);
    tokio::time::sleep(SETTINGS.poll.max_interval() * 3).await;
    assert!(leading.try_recv().is_err(), "led again while the peer leads");
    let second_term = second.number();
    second.resign().await.expect("resign");
    let third = within(Duration::from_secs(10), "the third term", leading.recv()).await;
    let third = third.expect("led");
    assert!(third > second_term);
    let output = within(Duration::from_secs(10), "the work's end", leader).await;
    assert_eq!(output.expect("leader task").expect("run_while_leader"), third);
    let after = h.election("cut").leader().await.expect("leader");
    assert_eq!(after, None, "resigned at the end");
}

/// A leader running `run_while_leader`, asked to step down (revoked),
/// stops its work and resigns, so the candidate waiting leads, with a
/// greater term; it campaigns again and leads once that one resigns.
pub async fn a_leader_asked_to_step_down_lets_the_next_lead(h: &Harness) {
    let (led, mut leading) = tokio::sync::mpsc::unbounded_channel();
    let leader = tokio::spawn({
        let election = h.election("step-down");
        async move {
            election
                .run_while_leader(move |term| {
                    led.send(term).expect("the case listens");
                    std::future::pending::<()>()
                })
                .await
        }
    });
    let first = within(Duration::from_secs(5), "the first term", leading.recv()).await;
    let first = first.expect("led");
    let next = tokio::spawn({
        let election = h.peer_election("step-down");
        async move { election.campaign().await }
    });
    tokio::time::sleep(SETTLE).await;
    assert_eq!(h.peer_lock("step-down").revoke().await.expect("revoke"), 1);
    let term = within(SETTINGS.lease * 2, "the next leads", next).await;
    let term = term.expect("task").expect("campaign");
    assert!(term.number() > first, "term {} not above {first}", term.number());
    let stepped_down = term.number();
    term.resign().await.expect("resign");
    let again = within(Duration::from_secs(5), "leading again", leading.recv()).await;
    assert!(again.expect("led") > stepped_down);
    leader.abort();
}

/// Notifies when dropped before it is forgotten: a work future cancelled.
struct Stamp(Arc<Notify>);

impl Drop for Stamp {
    fn drop(&mut self) {
        self.0.notify_one();
    }
}
