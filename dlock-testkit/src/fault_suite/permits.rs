//! The semaphore's fault scenarios: permit holders killed and paused, a
//! server restarted under holders and waiters, a flash sale of permits.
//! Each holder also reads and writes its slot's fenced store with its
//! token ([`SlotStores`]); every scenario checks what those show.

use std::time::{Duration, Instant};

use crate::Breakable;
use crate::store::{SlotReport, SlotStores};
use crate::visits::Visits;

use super::harness::{Paths, Setup, Summary, Worker, finish_all};
use super::{CALM_LEASE, LONG, crashes, offers, outage};

/// Whether `F`'s engine has semaphores; says so if not.
fn semaphores<F: Breakable>(fixture: &F, scenario: &str) -> bool {
    offers(fixture, scenario, "no semaphores", |c| c.semaphore)
}

/// What the slot stores must show after any scenario on `permits`: no
/// update lost, no two tokens' accepted operations interleaved in one
/// slot, no more tokens writing at once than permits, and (the workers
/// say) no write refused to a holder whose permit was never lost.
fn check_slots(stores: &SlotStores, permits: u32, summaries: &[Summary]) -> SlotReport {
    let report = stores.report();
    assert_eq!(report.lost_updates, 0, "an update was lost: {report:?}");
    assert_eq!(
        report.slot_overlaps, 0,
        "two holders' writes interleaved in one slot: {report:?}"
    );
    assert!(
        report.most_writers <= u64::from(permits),
        "{} writers at once on {permits} permits",
        report.most_writers
    );
    let sound: u64 = summaries.iter().map(|s| s.sound_refused).sum();
    assert_eq!(
        sound, 0,
        "a holder whose permit was never lost was refused: {summaries:?}"
    );
    report
}

/// Four processes, each with 8 holders of 5 visits of 20 ms, on a
/// semaphore of 3: never more than 3 valid holders at once, counted from
/// the stays the processes stamped; 3 at once at some point (the permits
/// run in parallel); every visit made.
pub fn permits_in_a_flash_sale_across_four_processes<F: Breakable>(paths: &Paths) {
    const PERMITS: usize = 3;
    let setup = Setup::<F>::start(paths, "permit-sale");
    if !semaphores(&setup.fixture, "permits_in_a_flash_sale_across_four_processes") {
        return;
    }
    let config = setup.config_leased(CALM_LEASE, "60s", "engine");
    let visits = setup.log("permit-sale");
    let (slots, stores) = setup.slot_stores(PERMITS as u32);
    let args = [
        "--permits",
        "3",
        "--tasks",
        "8",
        "--cycles",
        "5",
        "--stay-ms",
        "20",
    ];
    let started = Instant::now();
    let workers: Vec<Worker> = (0..4)
        .map(|_| setup.permit_worker(&config, (&visits, &slots), &args))
        .collect();
    let printed = finish_all(workers, LONG, true);
    let took = started.elapsed();
    let summaries: Vec<Summary> = printed.iter().map(|lines| Summary::from_lines(lines)).collect();
    let bought: u64 = summaries.iter().map(|s| s.bought).sum();
    assert_eq!(bought, 4 * 8 * 5, "every visit made whole: {summaries:?}");
    let stays = Visits::stays(&visits);
    assert_eq!(stays.len(), 4 * 8 * 5, "a stay per visit");
    let most = Visits::most_at_once(&stays);
    assert!(
        most <= PERMITS,
        "{most} valid holders at once, of {PERMITS} permits"
    );
    assert_eq!(most, PERMITS, "the permits never ran together");
    let report = check_slots(&stores, PERMITS as u32, &summaries);
    assert_eq!(report.writes, bought, "every visit wrote its slot's store");
    setup.figure(format!(
        "semaphore of 3, 4 processes × 8 holders × 5 visits of 20 ms: at most {most} inside at once, {bought} visits in {took:.2?}; \
         slot stores: {} writes, none lost, at most {} writers at once",
        report.writes, report.most_writers
    ));
}

/// One of two permit holders SIGKILLed: a waiter gets its permit once the
/// lease (or the session) runs out, while the other holder keeps its own.
pub fn permit_holder_killed_returns_its_permit_in_time<F: Breakable>(paths: &Paths) {
    let setup = Setup::<F>::start(paths, "permit-killed");
    if !semaphores(&setup.fixture, "permit_holder_killed_returns_its_permit_in_time") {
        return;
    }
    let config = setup.config("30s");
    let visits = setup.log("permit-killed");
    let (slots, stores) = setup.slot_stores(2);
    let permit =
        |stay: &str| setup.permit_worker(&config, (&visits, &slots), &["--permits", "2", "--stay-ms", stay]);
    let killed = permit("60000");
    killed.entered(LONG);
    // Stays until let go, once the waiter is done: however long a busy
    // machine takes to get there.
    let kept = permit("60000");
    kept.entered(LONG);
    let waiter = permit("0");
    waiter.ready(LONG);
    std::thread::sleep(Duration::from_millis(300));
    let killed_at = Instant::now();
    killed.signal("-KILL");
    let fresh = waiter.entered(LONG);
    let recovered = killed_at.elapsed();
    let waiter = waiter.finish(LONG);
    assert_eq!(waiter.bought, 1);
    kept.signal("-USR1");
    let kept = kept.finish(LONG);
    check_slots(&stores, 2, &[waiter, kept.clone()]);
    assert_eq!(
        (kept.bought, kept.lost),
        (1, 0),
        "the other holder kept its permit: {kept:?}"
    );
    let (bound, what) = setup.fixture.frees_dead_holder_within();
    assert!(recovered < bound, "the permit came back only after {recovered:?}");
    let stays = Visits::stays(&visits);
    let waited = stays
        .iter()
        .find(|s| s.fence == fresh)
        .expect("the waiter's stay");
    assert!(
        stays
            .iter()
            .any(|s| s.fence != fresh && s.from < waited.from && s.to > waited.from),
        "the waiter got in while the other holder was still inside, so by the killed one's permit"
    );
    assert!(Visits::most_at_once(&stays) <= 2, "more than 2 inside at once");
    setup.figure(format!(
        "permit holder SIGKILLed → its permit back after {recovered:.2?} ({what})"
    ));
}

/// A permit holder SIGSTOPped past its lease: the next waiter gets in; on
/// resuming, the paused holder finds its permit lost and stamps no more, so
/// no two valid holders ever overlap on one permit.
pub fn permit_holder_paused_past_its_lease_learns_it_lost<F: Breakable>(paths: &Paths) {
    let setup = Setup::<F>::start(paths, "permit-paused");
    if !semaphores(
        &setup.fixture,
        "permit_holder_paused_past_its_lease_learns_it_lost",
    ) {
        return;
    }
    let config = setup.config("30s");
    let visits = setup.log("permit-paused");
    let (slots, stores) = setup.slot_stores(1);
    let holder = setup.permit_worker(
        &config,
        (&visits, &slots),
        &["--permits", "1", "--stay-ms", "5000"],
    );
    holder.entered(LONG);
    let waiter = setup.permit_worker(&config, (&visits, &slots), &["--permits", "1"]);
    waiter.ready(LONG);
    std::thread::sleep(Duration::from_millis(300));
    let stopped_at = Instant::now();
    holder.signal("-STOP");
    waiter.entered(LONG);
    let recovered = stopped_at.elapsed();
    let waiter = waiter.finish(LONG);
    assert_eq!(waiter.bought, 1);
    holder.signal("-CONT");
    let holder = holder.finish(LONG);
    let report = check_slots(&stores, 1, &[waiter, holder.clone()]);
    assert_eq!(
        (report.writes, report.stale_refused),
        (1, 1),
        "the slot's next holder wrote, and the paused one's late write was refused"
    );
    assert_eq!(
        (holder.bought, holder.lost),
        (0, 1),
        "the paused holder learned it lost: {holder:?}"
    );
    let (bound, what) = setup.fixture.frees_dead_holder_within();
    assert!(
        recovered < bound,
        "the waiter got in only {recovered:?} after the pause"
    );
    let most = Visits::most_at_once(&Visits::stays(&visits));
    assert_eq!(most, 1, "a paused holder stamped past its lease, beside the next");
    setup.figure(format!(
        "permit holder SIGSTOPped past its lease: next holder in after {recovered:.2?} ({what}), the paused one lost"
    ));
}

/// The server crashes with both permits of two held and two waiters, and
/// is back 1.5 s later: each holder hears it lost its permit, and both
/// waiters are served.
pub fn permit_holders_and_waiters_across_a_server_restart<F: Breakable>(paths: &Paths) {
    let scenario = "permit_holders_and_waiters_across_a_server_restart";
    if !crashes::<F>(scenario) {
        return;
    }
    let mut setup = Setup::<F>::start(paths, "permit-restart");
    if !semaphores(&setup.fixture, scenario) {
        return;
    }
    let config = setup.config("30s");
    let visits = setup.log("permit-restart");
    let (slots, stores) = setup.slot_stores(2);
    // Held far past the outage; each stay ends at its loss (see
    // `server_restarted_with_a_holder_and_waiters`).
    let holders: Vec<Worker> = (0..2)
        .map(|_| {
            setup.permit_worker(
                &config,
                (&visits, &slots),
                &["--permits", "2", "--stay-ms", "30000"],
            )
        })
        .collect();
    holders.iter().for_each(|holder| {
        holder.entered(LONG);
    });
    let waiters: Vec<Worker> = (0..2)
        .map(|_| {
            setup.permit_worker(
                &config,
                (&visits, &slots),
                &["--permits", "2", "--stay-ms", "100"],
            )
        })
        .collect();
    let restarted_at = outage(&mut setup, &waiters);
    let mut summaries = Vec::new();
    for holder in holders {
        let summary = holder.finish(LONG);
        assert_eq!(
            (summary.lost, summary.bought),
            (1, 0),
            "a holder kept its permit across the outage: {summary:?}"
        );
        summaries.push(summary);
    }
    for waiter in waiters {
        let summary = waiter.finish(LONG);
        assert_eq!(
            (summary.bought, summary.failed),
            (1, 0),
            "a waiter was not served: {summary:?}"
        );
        summaries.push(summary);
    }
    check_slots(&stores, 2, &summaries);
    let most = Visits::most_at_once(&Visits::stays(&visits));
    assert!(most <= 2, "{most} valid holders at once on 2 permits");
    setup.figure(format!(
        "server down 1.5 s with 2 permit holders and 2 waiters: both holders lost, both waiters done {:.2?} after the crash",
        restarted_at.elapsed()
    ));
}
