//! The randomized fault run: five worker processes (the `fault_worker` binary)
//! loop over one lock with a 1 s lease and `on_lost = "ignore"`, each
//! reading and then writing the fenced store (or, with [`Contended::Permits`],
//! `permit_worker`s over a semaphore, each reading and writing its slot's
//! store, [`SlotStores`](crate::store::SlotStores), whether its permit was lost or not), while a driver, from a
//! seeded generator, pauses a worker past its lease, kills and respawns
//! one, crashes and restarts the server (one of several, or a failover
//! where the setup has one), and kills the clients' connections. The fixed
//! scenarios of [`fault_suite`](mod@crate::fault_suite) each test one fault;
//! this finds what their mix does.
//!
//! The lock's workers also write a second store through dlock's own fenced
//! adapter: a row of a real PostgreSQL table ([`FencedRow`]), on a server
//! of its own that no fault touches, its value the count of its writes.
//!
//! It checks what must hold under any faults: no update lost (in either
//! store), no fence
//! handed out twice (for permits: no write refused to a holder whose
//! permit was never lost, and no more tokens writing at once than
//! permits), and no silence (no worker entering) longer than the
//! engine's [`Breakable::recovers_within`] after the end of the last fault;
//! per worker too where the engine queues fairly. Faults stop for that
//! long plus a second at the end, so a worker stuck for good is caught
//! even when faults came faster than the bound.

use std::time::{Duration, Instant};

use dlock_core::kit::{Fairness, Fencing};

use crate::fault_suite::{Paths, Setup, Worker};
use crate::fenced_row::FencedRow;
use crate::fixtures::postgres::Postgres;
use crate::{Breakable, Fixture, engine};

/// Workers contending for the one lock or semaphore.
const WORKERS: usize = 5;

/// What the workers contend for.
#[derive(Clone, Copy, Debug)]
pub enum Contended {
    Lock,
    /// A semaphore of this many permits.
    Permits(u32),
}

/// What one run measured; [`run`] has already checked it.
#[derive(Debug, Default)]
pub struct Outcome {
    /// Faults applied, by kind: pauses, kills, outages, connection kills.
    pub faults: [u32; 4],
    /// Workers started again after they could not connect at startup.
    pub restarts: u32,
    /// Critical sections entered.
    pub entered: u64,
    /// Writes the store accepted, and reads and writes it refused as stale.
    pub writes: u64,
    /// Writes the PostgreSQL table's fenced row accepted.
    pub table_writes: i64,
    /// Stale reads and writes refused.
    pub refused: u64,
    /// Pairs of critical sections open at once (the fence kept them apart).
    pub overlaps: u64,
    /// Permits: the most tokens whose accepted operations spanned one
    /// instant, over all slots.
    pub most_writers: u64,
    /// Permits: writes refused to a holder whose permit was never lost.
    pub sound_refused: u64,
    /// The longest time nobody entered, past the end of the fault before.
    pub silence: Duration,
    /// The longest time one worker did not enter, likewise.
    pub worker_silence: Duration,
}

/// A small seeded generator (SplitMix64): the same seed, the same faults.
struct Dice(u64);

impl Dice {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    fn millis(&mut self, low: u64, high: u64) -> Duration {
        Duration::from_millis(low + self.below(high - low))
    }
}

/// One worker slot: the process and when its silence started counting.
struct Seat {
    worker: Worker,
    since: Instant,
}

/// Runs the randomized faults on `F` for `duration` with `seed`, the
/// workers contending for `what`, then a quiet stretch; panics, naming
/// the seed, if a check fails.
pub fn run<F: Breakable>(paths: &Paths, seed: u64, duration: Duration, what: Contended) -> Outcome {
    println!(
        "{}: random faults on {what:?}, seed {seed}, {duration:?}",
        F::NAME
    );
    let name = match what {
        Contended::Lock => format!("random-{seed}"),
        Contended::Permits(_) => format!("random-permits-{seed}"),
    };
    let mut setup = Setup::<F>::start(paths, &name);
    let capabilities = tokio::runtime::Runtime::new()
        .expect("runtime")
        .block_on(engine(&setup.fixture))
        .capabilities();
    let bound = setup.fixture.recovers_within();
    let (path, store) = setup.store("random");
    let permits = match what {
        Contended::Lock => 0,
        Contended::Permits(n) => n,
    };
    let (slots, slot_stores) = setup.slot_stores(permits);
    let visits = setup.log("random-visits");
    let config = setup.config("10s");
    let forever = ["--cycles", "1000000000"];
    let (table_url, table) = (tables().server.url(), format!("random_{seed}"));
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    if let Contended::Lock = what {
        runtime.block_on(FencedRow::create(&table_url, &table));
    }
    let on_table = ["--table-url", &table_url, "--table", &table];
    let launch = || match what {
        Contended::Lock => Worker::start(
            &paths.worker,
            &config,
            &path,
            &[
                &forever[..],
                &["--hold-ms", "10", "--on-lost", "ignore"],
                &on_table[..],
            ]
            .concat(),
        ),
        Contended::Permits(_) => Worker::start(
            &paths.permit_worker,
            &config,
            &visits,
            &[
                &forever[..],
                &["--slots", slots.to_str().expect("a path in UTF-8")],
                &["--permits", &permits.to_string(), "--stay-ms", "10"],
            ]
            .concat(),
        ),
    };
    let mut dice = Dice(seed);
    let mut out = Outcome::default();
    let began = Instant::now();
    let mut seats: Vec<Seat> = (0..WORKERS)
        .map(|_| Seat {
            worker: launch(),
            since: began,
        })
        .collect();
    let mut last_entrant = 0;
    let mut last_entry = began;
    let mut fault_ended = began;
    let mut next_fault = began + dice.millis(300, 1500);
    // What the last fault was, for a failure's message.
    let mut last_fault = "none";
    let check_silence = |seats: &[Seat],
                         last_entry: Instant,
                         fault_ended: Instant,
                         last_fault: &str,
                         out: &mut Outcome| {
        let now = Instant::now();
        let silent = now - last_entry.max(fault_ended);
        out.silence = out.silence.max(silent);
        assert!(
            silent <= bound,
            "{} seed {seed}: nobody entered for {silent:?} (bound {bound:?}) after {last_fault}",
            F::NAME
        );
        for slot in seats {
            let silent = now - slot.since.max(fault_ended);
            out.worker_silence = out.worker_silence.max(silent);
            // Without a queue a worker may starve while others get in.
            if capabilities.fairness == Fairness::Fifo {
                assert!(
                    silent <= bound,
                    "{} seed {seed}: a worker did not enter for {silent:?} (bound {bound:?}) after {last_fault}",
                    F::NAME
                );
            }
        }
    };
    let quiet = bound + Duration::from_secs(1);
    while began.elapsed() < duration + quiet {
        for slot in &mut seats {
            // A worker started just before an outage or a connection kill
            // fails to connect and exits, as it should (exit code 2, the
            // error printed); a supervisor starts it again. Anything else
            // is a crash.
            if let Some(status) = slot.worker.exited() {
                assert_eq!(
                    status.code(),
                    Some(2),
                    "{} seed {seed}: a worker crashed: {status}",
                    F::NAME
                );
                out.restarts += 1;
                slot.worker = launch();
            }
        }
        for (i, slot) in seats.iter_mut().enumerate() {
            let (entered, refused) = slot.worker.news();
            out.sound_refused += refused;
            if !entered.is_empty() {
                out.entered += entered.len() as u64;
                slot.since = Instant::now();
                last_entry = slot.since;
                last_entrant = i;
            }
        }
        check_silence(&seats, last_entry, fault_ended, last_fault, &mut out);
        if Instant::now() >= next_fault && began.elapsed() < duration {
            // The holder most of the time, so that pauses and kills bite.
            let victim = if dice.below(4) > 0 {
                last_entrant
            } else {
                dice.below(WORKERS as u64) as usize
            };
            let kind = dice.below(4) as usize;
            let applied = match kind {
                0 => {
                    seats[victim].worker.signal("-STOP");
                    std::thread::sleep(dice.millis(1100, 1800));
                    seats[victim].worker.signal("-CONT");
                    true
                }
                1 => {
                    let (entered, refused) = seats[victim].worker.news();
                    (out.entered, out.sound_refused) =
                        (out.entered + entered.len() as u64, out.sound_refused + refused);
                    seats[victim].worker.signal("-KILL");
                    seats[victim] = Seat {
                        worker: launch(),
                        since: Instant::now(),
                    };
                    true
                }
                2 => {
                    let down = dice.millis(0, 1500);
                    let pick = dice.next();
                    setup.fixture.outage(pick, down)
                }
                _ => setup.fixture.kill_connections(),
            };
            if applied {
                out.faults[kind] += 1;
                last_fault = ["a pause", "a kill", "an outage", "connection kills"][kind];
                fault_ended = Instant::now();
            }
            next_fault = fault_ended + dice.millis(300, 2000);
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    drop(seats);
    match what {
        Contended::Lock => {
            let report = store.report();
            (out.writes, out.refused, out.overlaps) = (report.writes, report.stale_refused, report.overlaps);
            assert_eq!(
                store.value(),
                report.writes,
                "{} seed {seed}: an update was lost",
                F::NAME
            );
            let (value, writes) =
                runtime.block_on(async { FencedRow::open(&table_url, &table).await.totals().await });
            assert_eq!(
                value,
                writes,
                "{} seed {seed}: the fenced PostgreSQL row lost an update",
                F::NAME
            );
            assert!(
                writes > 0,
                "{} seed {seed}: the fenced row was never written",
                F::NAME
            );
            out.table_writes = writes;
        }
        Contended::Permits(n) => {
            let report = slot_stores.report();
            (out.writes, out.refused, out.most_writers) =
                (report.writes, report.stale_refused, report.most_writers);
            assert_eq!(
                report.lost_updates,
                0,
                "{} seed {seed}: an update was lost: {report:?}",
                F::NAME
            );
            assert_eq!(
                report.slot_overlaps,
                0,
                "{} seed {seed}: two holders' writes interleaved in one slot: {report:?}",
                F::NAME
            );
            assert!(
                report.most_writers <= u64::from(n),
                "{} seed {seed}: {} writers at once on {n} permits",
                F::NAME,
                report.most_writers
            );
            assert_eq!(
                out.sound_refused,
                0,
                "{} seed {seed}: permit holders whose permits were never lost were refused",
                F::NAME
            );
        }
    }
    if capabilities.fencing != Fencing::None {
        let repeated = match what {
            Contended::Lock => store.repeated_fences(),
            Contended::Permits(_) => slot_stores.repeated_fences(),
        };
        assert!(
            repeated.is_empty(),
            "{} seed {seed}: fences handed out twice: {repeated:?}",
            F::NAME
        );
    }
    assert!(out.entered > 0, "{} seed {seed}: nobody ever entered", F::NAME);
    setup.figure(format!(
        "random faults on {what:?}, seed {seed}, {duration:?} then {quiet:?} quiet: pauses {} kills {} outages {} connection kills {}; \
         workers started again after a failed start {}; entered {}, writes {}, stale refused {}, overlaps {}, most writers at once {}{}; longest silence {:.2?}, one worker's {:.2?} (bound {bound:?})",
        out.faults[0],
        out.faults[1],
        out.faults[2],
        out.faults[3],
        out.restarts,
        out.entered,
        out.writes,
        out.refused,
        out.overlaps,
        out.most_writers,
        match what {
            Contended::Lock => format!(", writes to the fenced PostgreSQL row {} (as many as its value)", out.table_writes),
            Contended::Permits(_) => String::new(),
        },
        out.silence,
        out.worker_silence,
    ));
    out
}

/// The PostgreSQL server of the fenced rows, one for the whole run.
fn tables() -> &'static Postgres {
    static TABLES: std::sync::OnceLock<Postgres> = std::sync::OnceLock::new();
    TABLES.get_or_init(Postgres::start)
}
