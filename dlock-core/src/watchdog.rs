//! Keeps a hold's lease alive and turns lasting failure into the lost signal.

use std::sync::Arc;

use tokio::task::AbortHandle;
use tokio::time::{Instant, sleep_until, timeout_at};

use crate::LostReason;
use crate::hold::Hold;
use crate::metrics::Event;

/// Starts renewing `hold` every lease/3. The hold aborts it on release.
pub(crate) fn spawn(hold: Arc<Hold>) -> AbortHandle {
    tokio::spawn(run(hold)).abort_handle()
}

async fn run(hold: Arc<Hold>) {
    let engine = hold.ctx.engine.engine.clone();
    let lease = hold.req.lease;
    let mut pushed = engine
        .lost(&hold.req)
        .unwrap_or_else(|| Box::pin(std::future::pending()));
    // The lease runs from when the granting request was sent, not answered.
    let mut renewed_at = hold.lease_from;
    let mut pause = lease / 3;
    loop {
        let deadline = renewed_at + lease;
        tokio::select! {
            _ = sleep_until((Instant::now() + pause).min(deadline)) => {}
            _ = &mut pushed => return hold.mark_lost(LostReason::Engine),
        }
        if Instant::now() >= deadline {
            return hold.mark_lost(LostReason::LeaseElapsed);
        }
        let sent = Instant::now();
        match timeout_at(deadline, engine.renew(&hold.req)).await {
            Ok(Ok(true)) => {
                renewed_at = sent;
                pause = lease / 3;
                hold.ctx.labels.event(hold.req.mode, Event::Renewed);
            }
            Ok(Ok(false)) => return hold.mark_lost(LostReason::Rejected),
            // Keep trying, more often, until the lease runs out.
            Ok(Err(_)) | Err(_) => {
                pause = lease / 9;
                hold.ctx.labels.event(hold.req.mode, Event::RenewalFailed);
            }
        }
    }
}
