//! Keeps a hold's lease alive and turns lasting failure into the lost signal.

use std::sync::Arc;

use tokio::task::AbortHandle;
use tokio::time::{Instant, sleep_until, timeout_at};

use crate::hold::Hold;
use crate::metrics::Event;
use crate::{LostReason, trace};

/// Starts renewing `hold` a third of the way through each validity. The hold
/// aborts it on release.
pub(crate) fn spawn(hold: Arc<Hold>) -> AbortHandle {
    tokio::spawn(run(hold)).abort_handle()
}

async fn run(hold: Arc<Hold>) {
    let engine = hold.group.engine.clone();
    let lease = hold.req.lease;
    let mut pushed = engine
        .lost(&hold.req)
        .unwrap_or_else(|| Box::pin(std::future::pending()));
    let mut pause = match hold.valid_until() {
        // A handed-over grant may be valid for less than the lease.
        Some(until) => (until.saturating_duration_since(Instant::now()) / 3).min(lease / 3),
        None => return,
    };
    loop {
        let Some(deadline) = hold.valid_until() else {
            return;
        };
        tokio::select! {
            _ = sleep_until((Instant::now() + pause).min(deadline)) => {}
            _ = &mut pushed => return hold.mark_lost(LostReason::Engine),
        }
        if hold.lost_reason().is_some() {
            return;
        }
        let sent = Instant::now();
        match timeout_at(deadline, engine.renew(&hold.req)).await {
            Ok(Ok(true)) => {
                hold.renewed(sent);
                pause = lease / 3;
                hold.group.labels.event(hold.req.mode, Event::Renewed);
            }
            Ok(Ok(false)) => return hold.mark_lost(LostReason::Rejected),
            // Keep trying, more often, until the validity runs out.
            failed => {
                pause = lease / 9;
                hold.group.labels.event(hold.req.mode, Event::RenewalFailed);
                match failed {
                    Ok(Err(e)) => trace::renewal_failed(&hold.span, &e),
                    _ => trace::renewal_failed(&hold.span, &"no answer while the lease lasted"),
                }
            }
        }
    }
}
