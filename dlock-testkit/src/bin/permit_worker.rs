//! The fault suite's permit holder (tests/faults.rs starts several): takes a
//! permit of the semaphore `faults/<key>` of `--permits` on the engine its
//! config names, reads its slot's fenced store (`--slots`, see
//! `store.rs`) with its token, stays `--stay-ms` inside, stamping the
//! visits log (`--store`; see `visits.rs`) every few milliseconds while
//! its permit is valid, writes its slot's store one higher, and lets go.
//! The write goes out even when the permit was lost: the store, not the
//! holder, must refuse a holder whose slot went to another.
//!
//! ```text
//! permit_worker --config dlock.toml --store /tmp/visits --slots /tmp/slots
//!               --permits 3 [--key k] [--tasks 1] [--cycles 1] [--stay-ms 0]
//! ```
//!
//! `SIGUSR1` ends the stay at once, this visit's and every later one's: a
//! test lets a holder go when it has seen what it needed.
//!
//! Prints `ready` once its engine is connected, `entered <fence>` on taking
//! each permit, `sound-refused <fence>` when the store refused the write
//! of a holder whose permit was never lost, and at the end `bought=B
//! lost=L failed=F refused=R sound_refused=S`: visits made whole (stamped
//! and written), permits found lost (the visit cut short), other errors;
//! writes the store refused, and of those, the sound holders'.

use std::io::Write;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use dlock::Semaphore;
use dlock_testkit::store::SlotStores;
use dlock_testkit::visits::Visits;
use dlock_testkit::worker_flags::Flags;
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::watch;

/// How a visit ended.
enum Visit {
    Whole,
    Lost,
    /// The store refused the write, and the permit was never lost.
    SoundRefused,
}

/// One visit, staying `stay` or until `go`; `refused` counts the writes
/// the store refused.
async fn visit(
    semaphore: &Semaphore,
    (visits, slots): (&Visits, &SlotStores),
    (stay, mut go): (Duration, watch::Receiver<bool>),
    refused: &AtomicU64,
) -> Result<Visit, dlock::Error> {
    let guard = semaphore.acquire().await?;
    let fence = guard.fence();
    println!("entered {fence}");
    let _ = std::io::stdout().flush();
    let store = guard
        .slot()
        .and_then(|slot| slots.slot(slot))
        .expect("a permit holds one of the semaphore's slots");
    store.mark(fence, "enter");
    let read = store.read(fence);
    let whole = tokio::select! {
        whole = visits.stay_holding(&guard, stay) => whole,
        _ = go.wait_for(|go| *go) => !guard.is_lost(),
    };
    let wrote = read.and_then(|value| store.write(fence, value + 1));
    store.mark(fence, "exit");
    let released = guard.release().await;
    let kept = match released {
        // Lost already: how the release went says nothing more.
        _ if !whole => false,
        Ok(()) => true,
        Err(dlock::Error::Lost { .. }) => false,
        Err(e) => return Err(e),
    };
    if wrote.is_err() {
        refused.fetch_add(1, Ordering::SeqCst);
    }
    Ok(match (kept, wrote) {
        (true, Ok(())) => Visit::Whole,
        (true, Err(_)) => {
            // Said at once: the random fault run kills its workers.
            println!("sound-refused {fence}");
            Visit::SoundRefused
        }
        (false, _) => Visit::Lost,
    })
}

#[tokio::main]
async fn main() -> ExitCode {
    let known = ["key", "permits", "tasks", "cycles", "stay-ms", "slots"];
    let flags = match Flags::parse("permit_worker", &known) {
        Ok(flags) => flags,
        Err(code) => return code,
    };
    let mut usr1 = signal(SignalKind::user_defined1()).expect("SIGUSR1 handler");
    let (let_go, go) = watch::channel(false);
    tokio::spawn(async move {
        usr1.recv().await;
        let_go.send_replace(true);
        // Kept alive, so that waiting on `go` never sees it closed.
        std::future::pending::<()>().await;
    });
    if let Err(code) = flags.connect().await {
        return code;
    }
    let permits = u32::try_from(flags.number("permits", 1)).expect("--permits fits u32");
    let semaphore = dlock::semaphore("faults", flags.text("key", "k"), permits);
    let visits = Arc::new(Visits::open(&flags.store()));
    let slots = Arc::new(SlotStores::open(flags.text("slots", "").as_ref(), permits));
    let stay = Duration::from_millis(flags.number("stay-ms", 0));
    let (tasks, cycles) = (flags.number("tasks", 1), flags.number("cycles", 1));
    // bought, lost, failed, refused, sound_refused
    let counts: Arc<[AtomicU64; 5]> = Arc::new(Default::default());
    let mut running = tokio::task::JoinSet::new();
    for _ in 0..tasks {
        let (semaphore, visits, slots, counts, go) = (
            semaphore.clone(),
            visits.clone(),
            slots.clone(),
            counts.clone(),
            go.clone(),
        );
        running.spawn(async move {
            for _ in 0..cycles {
                let ended = match visit(&semaphore, (&visits, &slots), (stay, go.clone()), &counts[3]).await {
                    Ok(Visit::Whole) => 0,
                    Ok(Visit::Lost) => 1,
                    Ok(Visit::SoundRefused) => 4,
                    Err(e) => {
                        eprintln!("permit_worker: {e}");
                        2
                    }
                };
                counts[ended].fetch_add(1, Ordering::SeqCst);
            }
        });
    }
    while let Some(done) = running.join_next().await {
        done.expect("holder panicked");
    }
    let [bought, lost, failed, refused, sound_refused] = counts.each_ref().map(|c| c.load(Ordering::SeqCst));
    println!("bought={bought} lost={lost} failed={failed} refused={refused} sound_refused={sound_refused}");
    ExitCode::SUCCESS
}
