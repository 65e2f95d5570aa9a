//! The behaviour suite every engine passes unchanged, published so an
//! engine written outside this repository can run it too.
//!
//! A test file names an async factory of the engine under test and gets
//! one test per case:
//!
//! ```
//! // tests/conformance_memory.rs: one #[tokio::test] per case.
//! use std::sync::Arc;
//! use dlock::engines::memory::MemoryEngine;
//!
//! dlock::engines::conformance_suite!(|| async { Arc::new(MemoryEngine::new()) as Arc<dyn dlock::kit::Engine> });
//! # fn main() {}
//! ```
//!
//! Cases are plain async functions in [`cases`] taking a [`Harness`]; each
//! case uses its own random group, so cases can share one server. A case
//! that needs what an engine's [`Capabilities`] lack is skipped, its name
//! and the reason printed (`conformance: SKIPPED ...`).

pub mod cases;
mod counter;
mod faults;

use std::sync::Arc;
use std::time::Duration;

use dlock_core::config::{Polling, Queue};
use dlock_core::kit::{Capabilities, Engine, Expiry, Fairness, Fencing, Records};
use dlock_core::{Election, Error, Lock, Only, Registry, Semaphore, Settings, Wait};

pub use counter::{FencedRegister, GuardedCounter, Occupancy};
pub use faults::Faults;

/// Timing used by every case: short enough to keep the suite quick, long
/// enough for a loopback server under a loaded 2-core machine.
pub const SETTINGS: Settings = Settings {
    lease: Duration::from_secs(2),
    wait: Wait::For(Duration::from_secs(20)),
    poll: Polling::Exponential {
        initial: Duration::from_millis(5),
        max: Duration::from_millis(100),
    },
    queue: Queue::Engine,
    call_timeout: Duration::from_secs(5),
    deadlock_warning: Duration::from_secs(10),
    deadlock_check: Duration::from_secs(1),
};

/// What a case works with: the engine under test, seen by two clients.
pub struct Harness {
    /// The engine itself, for raw requests (a peer that crashes, say).
    pub engine: Arc<dyn Engine>,
    /// The path from `registry` to the engine, with counters and fault knobs.
    pub faults: Arc<Faults>,
    /// The client under test, going through `faults`.
    pub registry: Registry,
    /// A second client on the same engine, as another process would be.
    pub peer: Registry,
    /// The peer's path to the engine: no fault is set on it, it only counts.
    pub peer_faults: Arc<Faults>,
    /// This case's own random group: cases can share one server.
    pub group: String,
}

impl Harness {
    /// A harness on `engine`, with [`SETTINGS`].
    pub fn new(engine: Arc<dyn Engine>) -> Self {
        let faults = Arc::new(Faults::new(engine.clone()));
        let peer_faults = Arc::new(Faults::new(engine.clone()));
        Harness {
            registry: Registry::with_engine("under-test", faults.clone(), SETTINGS)
                .expect("the engine serves the conformance settings"),
            peer: Registry::with_engine("peer", peer_faults.clone(), SETTINGS)
                .expect("the engine serves the conformance settings"),
            engine,
            faults,
            peer_faults,
            group: format!("conformance-{:08x}", rand_suffix()),
        }
    }

    /// Lock `name` of this case's group, through the client under test.
    pub fn lock(&self, name: &str) -> Lock {
        self.registry.locks(&self.group).get(name)
    }

    /// The same lock seen by the peer client.
    pub fn peer_lock(&self, name: &str) -> Lock {
        self.peer.locks(&self.group).get(name)
    }

    /// Semaphore `name` of this case's group, admitting `permits`, through
    /// the client under test.
    pub fn semaphore(&self, name: &str, permits: u32) -> Semaphore {
        self.registry.locks(&self.group).semaphore(name, permits)
    }

    /// The same semaphore seen by the peer client.
    pub fn peer_semaphore(&self, name: &str, permits: u32) -> Semaphore {
        self.peer.locks(&self.group).semaphore(name, permits)
    }

    /// Election `name` of this case's group, through the client under test.
    pub fn election(&self, name: &str) -> Election {
        self.registry.locks(&self.group).election(name)
    }

    /// The same election seen by the peer client.
    pub fn peer_election(&self, name: &str) -> Election {
        self.peer.locks(&self.group).election(name)
    }

    /// Requests both clients have in the engine's queue, counted so far.
    pub fn queued(&self) -> u64 {
        self.faults.queued() + self.peer_faults.queued()
    }

    /// What the engine under test declares.
    pub fn capabilities(&self) -> Capabilities {
        self.engine.capabilities()
    }

    /// Whether fences are ordered at all, so cases may compare them.
    pub fn fenced(&self) -> bool {
        self.capabilities().fencing != Fencing::None
    }

    /// Checks that `asking` for `what` is refused as `Unsupported`, before
    /// any engine call.
    async fn assert_unsupported<T>(&self, what: &str, asking: impl Future<Output = Result<T, Error>>) {
        let calls = self.faults.calls();
        let Err(err) = asking.await else {
            panic!("{what} must be refused");
        };
        assert!(
            matches!(err, Error::Unsupported { .. }),
            "{what}: expected Unsupported, got {err}"
        );
        assert_eq!(self.faults.calls(), calls, "{what}, refused, reached the engine");
    }

    /// Checks that a read of lock `name` is refused as `Unsupported`.
    pub async fn assert_read_refused(&self, name: &str) {
        self.assert_unsupported("a read", self.lock(name).read()).await;
    }

    /// Checks that a semaphore `name` is refused as `Unsupported`.
    pub async fn assert_semaphore_refused(&self, name: &str) {
        self.assert_unsupported("a semaphore", self.semaphore(name, 2).acquire())
            .await;
    }

    /// Checks that a permit of semaphore `name` names no slot, as its
    /// engine declares.
    pub async fn assert_no_slot(&self, name: &str) {
        let permit = self.semaphore(name, 2).acquire().await.expect("a permit");
        assert_eq!(permit.slot(), None, "a slot from an engine that declares none");
        permit.release().await.expect("release");
    }

    /// Checks that inspecting lock `name` is refused as `Unsupported`.
    pub async fn assert_records_refused(&self, name: &str) {
        self.assert_unsupported("inspecting a lock", self.lock(name).inspect())
            .await;
    }

    /// Checks that listing this case's group is refused as `Unsupported`.
    pub async fn assert_listing_refused(&self) {
        let locks = self.registry.locks(&self.group);
        self.assert_unsupported("listing a group", locks.list()).await;
    }

    /// Whether the engine has what `case` needs; if not, says so. A case
    /// needing read mode or semaphores first checks that asking for them is
    /// `Unsupported`.
    pub async fn has(&self, case: &str, need: Need) -> bool {
        let capabilities = self.capabilities();
        let missing = match need {
            Need::Read if !capabilities.read => {
                self.assert_read_refused(case).await;
                Some("no read mode (Unsupported checked)")
            }
            Need::Semaphore if !capabilities.semaphore => {
                self.assert_semaphore_refused(case).await;
                Some("no semaphores (Unsupported checked)")
            }
            Need::Slots if !capabilities.slots => {
                self.assert_no_slot(case).await;
                Some("permits without slots: one fence across them (no slot checked)")
            }
            Need::Records if capabilities.records == Records::None => {
                self.assert_records_refused(case).await;
                Some("no records (Unsupported checked)")
            }
            Need::Listed if capabilities.records != Records::Listed => {
                self.assert_listing_refused().await;
                Some("cannot list a group's locks (Unsupported checked)")
            }
            Need::ForceRelease if !capabilities.control => {
                let lock = self.lock(case);
                self.assert_unsupported("force release", lock.force_release())
                    .await;
                Some("no force release (Unsupported checked)")
            }
            Need::PermitControl if !capabilities.permit_control => {
                let semaphore = self.semaphore(case, 2);
                self.assert_unsupported(
                    "force release of permits",
                    semaphore.force_release_only(&Only::any()),
                )
                .await;
                Some("no force release or revocation of permits (Unsupported checked)")
            }
            Need::Revoke if !capabilities.control => {
                let lock = self.lock(case);
                self.assert_unsupported("revocation", lock.revoke()).await;
                Some("no revocation (Unsupported checked)")
            }
            Need::HoldAtLeast if !capabilities.hold_at_least => {
                let lock = self.lock(case).with_hold_at_least(Duration::from_secs(1));
                self.assert_unsupported("hold at least", lock.lock()).await;
                Some("no hold at least (Unsupported checked)")
            }
            Need::Election if !capabilities.election() => {
                let election = self.registry.locks(&self.group).election(case);
                self.assert_unsupported("an election", election.campaign()).await;
                Some("no leader election (Unsupported checked)")
            }
            Need::Watch if !capabilities.watch => {
                let locks = self.registry.locks(&self.group);
                self.assert_unsupported("a watch", locks.watch()).await;
                Some("no watch of its own (Unsupported checked)")
            }
            Need::Fifo if capabilities.fairness != Fairness::Fifo => Some("no queue on the server"),
            Need::Fencing if capabilities.fencing == Fencing::None => Some("fences are not ordered"),
            Need::Lease if capabilities.expiry != Expiry::Lease => {
                Some("holds end with the session or connection, not a lease")
            }
            _ => None,
        };
        if let Some(why) = missing {
            println!("conformance: SKIPPED {case} on {}: {why}", self.engine.kind());
        }
        missing.is_none()
    }
}

/// What a case needs beyond exclusive locks, named in the case list.
#[derive(Clone, Copy, Debug)]
pub enum Need {
    /// Read mode.
    Read,
    /// A queue on the server (`Fairness::Fifo`).
    Fifo,
    /// Ordered fences.
    Fencing,
    /// Holds that end when their lease runs out (`Expiry::Lease`).
    Lease,
    /// Semaphores.
    Semaphore,
    /// Permits in slots, each fenced on its own.
    Slots,
    /// Records of who holds and waits, by name.
    Records,
    /// Records of a whole group.
    Listed,
    /// Ending a hold from outside.
    ForceRelease,
    /// Asking holders to let go.
    Revoke,
    /// Ending a permit's hold from outside, or asking its holder to let go.
    PermitControl,
    /// Letting go while the server keeps others out a while longer.
    HoldAtLeast,
    /// Leader election: terms that only grow, shown in the records.
    Election,
    /// The engine's own watch on a group's records.
    Watch,
}

fn rand_suffix() -> u32 {
    (dlock_core::kit::OwnerId::random().as_u128() & 0xffff_ffff) as u32
}

/// Runs every case in turn, each on a fresh harness over an engine from
/// `factory`: for checks that need the whole suite done first (no key left).
pub async fn run_each<F, Fut>(factory: F)
where
    F: Fn() -> Fut,
    Fut: Future<Output = Arc<dyn Engine>>,
{
    crate::conformance_suite!(@list @each factory);
}

/// Expands to one `#[tokio::test]` per conformance case for the engine made by
/// `$factory` (an async closure returning `Arc<dyn Engine>`).
#[macro_export]
macro_rules! conformance_suite {
    // The one list of cases, each with what it needs beyond exclusive locks:
    // every way of running them goes through it.
    (@list $($then:tt)*) => {
        $crate::conformance_suite! { $($then)*;
            mutual_exclusion [],
            readers_overlap [Read],
            writer_excludes_readers_and_writers [],
            fifo_order [Fifo],
            queued_readers_admitted_together [Read, Fifo],
            reentrancy_makes_no_engine_call [],
            spawned_tasks_do_not_inherit [],
            downgrade_write_to_read [Read],
            upgrade_is_an_error [Read],
            try_lock_does_not_queue [],
            wait_timeout [],
            cancelled_waiter_leaves_queue [],
            waiters_dropped_mid_call_leave_nothing_behind [],
            guard_dropped_in_cancelled_task_frees_lock [],
            lease_expiry_frees_abandoned_holder [Lease],
            fencing_is_monotonic [Fencing],
            lost_when_renewals_fail [],
            a_grant_heard_after_its_lease_is_confirmed [],
            lost_when_server_drops_hold [Lease],
            key_edge_cases [],
            invalid_keys_are_rejected [],
            what_the_engine_lacks_is_a_typed_error [],
            semaphore_admits_at_most_its_permits [Semaphore],
            semaphore_admits_its_permits_together [Semaphore],
            semaphore_serves_waiters_in_order [Semaphore, Fifo],
            semaphore_count_must_agree [Semaphore],
            semaphore_reentry_takes_no_second_permit [Semaphore],
            semaphore_is_not_the_lock_of_its_name [Semaphore],
            semaphore_fences_rise [Semaphore, Fencing],
            semaphore_permit_of_an_abandoned_holder_returns [Semaphore, Lease],
            semaphore_holder_cut_off_learns_it_lost [Semaphore],
            semaphore_slots_fence_a_pool [Semaphore, Fencing, Slots],
            records_show_holders_and_waiters [Records],
            records_show_every_sharing_holder [Records],
            records_never_show_an_owner_id [Records],
            list_shows_a_groups_held_locks [Listed],
            a_watch_hears_each_hold_begin_and_end [Listed, Watch],
            force_release_fences_out_the_old_holder [ForceRelease],
            force_release_only_ends_the_hold_looked_at [ForceRelease, Records],
            revoke_asks_holders_to_let_go [Revoke],
            a_permits_holder_is_asked_and_forced_out_by_its_digest [Semaphore, PermitControl],
            hold_at_least_keeps_others_out_after_the_release [HoldAtLeast],
            hold_at_most_ends_the_hold_and_frees_the_lock [],
            one_leader_at_a_time_with_rising_terms [Election],
            observe_reports_each_leader_and_never_an_older_term [Election],
            a_campaign_shows_its_value_where_the_engine_keeps_one [Election],
            a_leader_cut_off_stops_and_the_next_leads [Election, Lease],
            a_leader_asked_to_step_down_lets_the_next_lead [Election, Revoke],
            a_deadlock_between_two_clients_is_broken [Listed],
            a_deadlock_among_three_clients_is_broken [Listed],
        }
    };
    (@tests $factory:expr; $($case:ident [$($need:ident),*],)*) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn $case() {
                let engine = ($factory)().await;
                let harness = $crate::conformance::Harness::new(engine);
                $crate::conformance_suite!(@run harness $case [$($need),*]);
            }
        )*
    };
    (@each $factory:ident; $($case:ident [$($need:ident),*],)*) => {
        // Each case boxed with its engine's making: inline, the whole list
        // polled as one future needs more stack than a test thread has.
        $(
            ::std::boxed::Box::pin(async {
                let harness = $crate::conformance::Harness::new($factory().await);
                $crate::conformance_suite!(@run harness $case [$($need),*]);
            })
            .await;
        )*
    };
    (@run $harness:ident $case:ident [$($need:ident),*]) => {
        // Boxed, the checks of what it needs too: the whole list run in one
        // future would overflow a test thread's stack in a debug build.
        ::std::boxed::Box::pin(async {
            if true $(&& $harness.has(stringify!($case), $crate::conformance::Need::$need).await)* {
                $crate::conformance::cases::$case(&$harness).await;
            }
        })
        .await;
    };
    ($factory:expr) => {
        $crate::conformance_suite! { @list @tests $factory }
    };
}
