//! The fault suite: real worker processes (the `fault_worker` binary) lock
//! through real servers and write through a fenced store, while the test
//! kills, pauses and restarts things. Each scenario runs on every engine with
//! a [`Breakable`] fixture (`fault_suite!` makes the tests), skipping with a
//! printed reason where the engine lacks what it needs, and appends its
//! figures (recovery times, overlaps, stale writes refused) to
//! `fault-figures.txt` in the test's target tmp dir, which `scripts/test`
//! prints at the end.

use std::time::{Duration, Instant};

use dlock_core::kit::{Capabilities, Fencing};

use crate::{Breakable, Fixture};

mod elections;
mod harness;
mod jobs;
mod locks;
mod permits;

pub use elections::*;
pub use harness::*;
pub use jobs::*;
pub use locks::*;
pub use permits::*;

/// Expands to one `#[test]` per fault scenario for the engine of
/// `$fixture` (a [`Breakable`] fixture type); put it in a module named
/// after the engine.
#[macro_export]
macro_rules! fault_suite {
    ($fixture:ty) => {
        $crate::fault_suite! { @tests $fixture;
            holder_killed_frees_the_lock_in_time,
            holder_paused_past_its_lease_is_cancelled_or_fenced,
            server_restarted_with_a_holder_and_waiters,
            server_gone_mid_wait_fails_within_the_wait,
            servers_gone_silent_bound_every_call,
            flash_sale_across_four_processes,
            transfers_across_four_processes,
            a_ring_of_processes_finds_its_deadlock,
            permits_in_a_flash_sale_across_four_processes,
            permit_holder_killed_returns_its_permit_in_time,
            permit_holder_paused_past_its_lease_learns_it_lost,
            permit_holders_and_waiters_across_a_server_restart,
            a_leader_killed_is_followed_within_its_lease,
            a_leader_paused_past_its_lease_stops_before_it_acts_again,
            a_server_restart_ends_the_term_and_a_candidate_leads_again,
            skewed_schedules_run_each_period_exactly_once,
            a_job_killed_mid_run_frees_the_lock_within_its_lease,
            a_job_exiting_right_after_its_run_keeps_others_out_until_hold_at_least,
        }
    };
    (@tests $fixture:ty; $($scenario:ident,)*) => {
        $(
            #[test]
            fn $scenario() {
                $crate::fault_suite::$scenario::<$fixture>(&$crate::paths!());
            }
        )*
    };
}

const LONG: Duration = Duration::from_secs(60);

/// The lease of the scenarios where no holder fails: long enough that no
/// pause of a busy machine outlasts it.
const CALM_LEASE: &str = "10s";

/// How far the engine of `fixture` trusts its fences.
fn fencing(fixture: &impl Fixture) -> Fencing {
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    runtime.block_on(crate::engine(fixture)).capabilities().fencing
}

/// Whether `F`'s engine has what `scenario` needs (`lacks` names it); says
/// so if not.
fn offers<F: Fixture>(
    fixture: &F,
    scenario: &str,
    lacks: &str,
    has: impl FnOnce(&Capabilities) -> bool,
) -> bool {
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let offered = has(&runtime.block_on(crate::engine(fixture)).capabilities());
    if !offered {
        println!("faults: SKIPPED {scenario} on {}: {lacks}", F::NAME);
    }
    offered
}

/// Whether `F`'s setup can be crashed as a whole; says so if not.
fn crashes<F: Breakable>(scenario: &str) -> bool {
    if !F::CRASHES {
        println!(
            "faults: SKIPPED {scenario} on {}: no single server to crash",
            F::NAME
        );
    }
    F::CRASHES
}

/// Once `waiters` are connected and queued, crashes the server and starts
/// it again 1.5 s later; when it crashed.
fn outage<F: Breakable>(setup: &mut Setup<F>, waiters: &[Worker]) -> Instant {
    waiters.iter().for_each(|waiter| waiter.ready(LONG));
    std::thread::sleep(Duration::from_millis(500));
    let crashed_at = Instant::now();
    setup.fixture.kill();
    std::thread::sleep(Duration::from_millis(1500));
    setup.fixture.restart();
    crashed_at
}
