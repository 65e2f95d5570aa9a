//! The election suite: real `leader_worker` processes campaign for one
//! election on a real server, each writing a fenced store with its term
//! while it leads, and one observes, while the test kills, pauses and
//! restarts things. The store's journal holds each term's interval: no
//! two overlap, and no write comes from a term after the next began. An
//! engine that cannot elect ([`Capabilities::election`]) skips them.

use std::time::{Duration, Instant};

use dlock_core::kit::Capabilities;

use super::{Paths, Setup, Worker, offers};
use crate::Breakable;
use crate::store::FencedStore;

/// A wait for one line of a worker.
const LONG: Duration = Duration::from_secs(60);

/// The term in a `leading <term>` or `stopped <term>` line.
fn term(line: &str) -> u64 {
    line.rsplit(' ')
        .next()
        .and_then(|t| t.parse().ok())
        .expect("a term")
}

/// A leader (started with `leader_args`) and a candidate queued behind
/// it, and an observer that has reported the leader.
struct Race<F> {
    setup: Setup<F>,
    store: FencedStore,
    observer: Worker,
    leader: Worker,
    term: u64,
    next: Worker,
}

impl<F: Breakable> Race<F> {
    /// The race, or `None` where the engine cannot elect (said so).
    fn start(paths: &Paths, scenario: &str, test: &str, leader_args: &[&str]) -> Option<Self> {
        let setup = Setup::<F>::start(paths, test);
        if !offers(
            &setup.fixture,
            scenario,
            "no leader election",
            Capabilities::election,
        ) {
            return None;
        }
        let (path, store) = setup.store("terms");
        let config = setup.config("30s");
        let observer = setup.leader_worker(&config, &path, &["--observe", "1"]);
        let leader = setup.leader_worker(&config, &path, leader_args);
        let term = term(&leader.line("leading", LONG).0);
        // Seen before anything happens to it, however slowly it started.
        observer.line(&format!("observed {term}"), LONG);
        let next = setup.leader_worker(&config, &path, &[]);
        next.ready(LONG);
        // Time to queue behind the leader.
        std::thread::sleep(Duration::from_millis(300));
        Some(Race {
            setup,
            store,
            observer,
            leader,
            term,
            next,
        })
    }

    /// The terms the observer reported, the first leader's and on up to
    /// and with `last`: never one older than one before it.
    fn observed_up_to(&self, last: u64) -> Vec<u64> {
        let mut terms = vec![self.term];
        while terms.last() != Some(&last) {
            let (line, _) = self.observer.line("observed", LONG);
            if let Ok(term) = line["observed ".len()..]
                .split(' ')
                .next()
                .unwrap_or_default()
                .parse()
            {
                terms.push(term);
            }
        }
        assert!(
            terms.windows(2).all(|pair| pair[0] < pair[1]),
            "the observer went back: {terms:?}"
        );
        terms
    }

    /// Operations the store's journal shows for `old` after `new` began:
    /// writes or reads of a deposed term, accepted or refused.
    fn acts_after(&self, old: u64, new: u64) -> Vec<String> {
        let (old, began) = (old.to_string(), format!(" {new} enter"));
        self.store
            .journal_lines()
            .into_iter()
            .skip_while(|line| !line.ends_with(&began))
            .filter(|line| {
                let fields: Vec<&str> = line.split(' ').collect();
                fields[2] == old && fields[3] != "exit"
            })
            .collect()
    }
}

/// The leader SIGKILLed: the candidate behind it leads within the lease
/// (or session), with a greater term; the observer reports both, in order.
pub fn a_leader_killed_is_followed_within_its_lease<F: Breakable>(paths: &Paths) {
    let scenario = "a_leader_killed_is_followed_within_its_lease";
    let Some(race) = Race::<F>::start(paths, scenario, "elect-killed", &[]) else {
        return;
    };
    let killed = Instant::now();
    race.leader.signal("-KILL");
    let (line, led) = race.next.line("leading", LONG);
    let (took, next) = (led - killed, term(&line));
    assert!(next > race.term, "term {next} after {}", race.term);
    let (bound, what) = race.setup.fixture.frees_dead_holder_within();
    assert!(took < bound, "the next led {took:?} after the kill ({what})");
    let seen = race.observed_up_to(next);
    std::thread::sleep(Duration::from_millis(200));
    let report = race.store.report();
    assert_eq!((report.overlaps, report.stale_refused), (0, 0), "{report:?}");
    assert_eq!(race.store.value(), report.writes, "a write was lost");
    race.setup.figure(format!(
        "leader SIGKILLed → the next leads after {took:.2?} ({what}); observer saw terms {seen:?}"
    ));
}

/// The leader SIGSTOPped past its lease: the candidate leads; resumed, the
/// old leader's first act is to stop (its term is lost), before any read
/// or write of the store, and it campaigns again behind the new leader.
pub fn a_leader_paused_past_its_lease_stops_before_it_acts_again<F: Breakable>(paths: &Paths) {
    // Writing once a second, stopped right after a write: never inside the
    // store's file lock, nor between its read and its write.
    let scenario = "a_leader_paused_past_its_lease_stops_before_it_acts_again";
    let Some(race) = Race::<F>::start(paths, scenario, "elect-paused", &["--every-ms", "1000"]) else {
        return;
    };
    race.leader.printed();
    race.leader.line("wrote", LONG);
    let paused = Instant::now();
    race.leader.signal("-STOP");
    let (line, led) = race.next.line("leading", LONG);
    let (took, next) = (led - paused, term(&line));
    assert!(next > race.term, "term {next} after {}", race.term);
    std::thread::sleep(Duration::from_millis(300));
    race.leader.signal("-CONT");
    let (first, _) = race.leader.line("", LONG);
    assert_eq!(
        first,
        format!("stopped {}", race.term),
        "the resumed leader's first line"
    );
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(
        race.leader.try_line("leading", Duration::ZERO),
        None,
        "led again beside the new leader"
    );
    let late = race.acts_after(race.term, next);
    assert!(
        late.is_empty(),
        "the deposed leader acted after the next began: {late:?}"
    );
    let report = race.store.report();
    assert_eq!(report.stale_refused, 0, "{report:?}");
    assert_eq!(race.store.value(), report.writes, "a write was lost");
    let seen = race.observed_up_to(next);
    race.setup.figure(format!(
        "leader SIGSTOPped past its lease → the next leads after {took:.2?}; resumed, it stopped before acting; observer saw terms {seen:?}"
    ));
}

/// The server crashes under a leader and is back 1.5 s later: the term
/// ends, and a candidate leads again, with a greater term. Fenced writes
/// stay whole: any overlap has its stale writes refused.
pub fn a_server_restart_ends_the_term_and_a_candidate_leads_again<F: Breakable>(paths: &Paths) {
    if !F::CRASHES {
        println!(
            "election: SKIPPED a_server_restart_ends_the_term_and_a_candidate_leads_again on {}: not one server",
            F::NAME
        );
        return;
    }
    let scenario = "a_server_restart_ends_the_term_and_a_candidate_leads_again";
    let Some(mut race) = Race::<F>::start(paths, scenario, "elect-restart", &[]) else {
        return;
    };
    let crashed = Instant::now();
    race.setup.fixture.kill();
    std::thread::sleep(Duration::from_millis(1500));
    race.setup.fixture.restart();
    let (line, _) = race.leader.line("stopped", LONG);
    assert_eq!(term(&line), race.term);
    let deadline = Instant::now() + LONG;
    let next = loop {
        assert!(Instant::now() < deadline, "nobody led after the restart");
        let step = Duration::from_millis(50);
        if let Some((line, _)) = race
            .next
            .try_line("leading", step)
            .or_else(|| race.leader.try_line("leading", step))
        {
            break term(&line);
        }
    };
    let back = crashed.elapsed();
    assert!(next > race.term, "term {next} after {}", race.term);
    let seen = race.observed_up_to(next);
    std::thread::sleep(Duration::from_millis(200));
    let report = race.store.report();
    assert!(report.overlaps == 0 || report.stale_refused > 0, "{report:?}");
    assert_eq!(race.store.value(), report.writes, "a write was lost");
    race.setup.figure(format!(
        "server down 1.5 s under a leader: its term ended, a candidate led again {back:.2?} after the crash; overlaps {}; observer saw terms {seen:?}",
        report.overlaps
    ));
}
