//! What dlock tells `tracing`, under the target `dlock` (`RUST_LOG=dlock=debug`):
//!
//! | span or event | level | fields |
//! |---|---|---|
//! | span `acquire`: one engine acquisition, to grant or failure | debug | `group`, `key`, `mode`, `engine`, `permits`, then `wait_ms`, `outcome`, and if it waited, `waited_for` |
//! | span `hold`: grant to the hold's end (a sibling of `acquire`, which it follows from) | debug | `group`, `key`, `mode`, `engine`, `permits`, `fence` |
//! | event "lock wait ended without the lock" (in `acquire`) | debug | `error` |
//! | event "lock renewal failed; retrying" (in `hold`) | warn | `error` |
//! | event "lock lost" (in `hold`) | warn | `reason` |
//! | event "lock revoked: asked to let go" (in `hold`) | info | |
//!
//! A semaphore's permit has `mode` = `permit` and `permits` = its count;
//! a lock has no `permits`.
//!
//! An acquisition that has to wait names whom it waits behind: `waited_for`
//! holds the holders' labels (`client_name`), as the engine's records show
//! them, read beside the wait so it is not slowed; and the `hold` spans of
//! holders in this process are linked to it (`follows_from`), so a
//! subscriber that keeps traces shows the holder's trace.
//!
//! Reentries make no span: they never reach the engine. With no subscriber,
//! or one that leaves `dlock` at info, each call site costs one check of
//! the level filter and nothing else: fields are never evaluated.

use std::time::Duration;

use tracing::{Span, field};

use crate::kit::Request;
use crate::metrics::Series;

/// The span of one engine acquisition.
pub(crate) fn acquisition(req: &Request, engine: &str) -> Span {
    tracing::debug_span!(
        target: "dlock",
        "acquire",
        group = req.key.group(),
        key = req.key.name(),
        mode = Series::of(req).mode(),
        engine,
        permits = req.permits(),
        wait_ms = field::Empty,
        outcome = field::Empty,
        waited_for = field::Empty,
    )
}

/// Records the labels of whom an acquisition waited behind.
pub(crate) fn waited_for(span: &Span, holders: &crate::LockView) {
    let labels: Vec<&str> = holders
        .holders
        .iter()
        .map(|h| h.label.as_deref().unwrap_or("(unlabelled)"))
        .collect();
    if !labels.is_empty() {
        span.record("waited_for", labels.join(", "));
    }
}

/// Records how the acquisition ended, and after how long.
pub(crate) fn waited(span: &Span, took: Duration, outcome: &str) {
    // A disabled span still looks each field up by name: skip it.
    if !span.is_disabled() {
        span.record("wait_ms", took.as_secs_f64() * 1e3);
        span.record("outcome", outcome);
    }
}

/// The span of a hold: a child of the caller's span, following from the
/// acquisition that granted it.
pub(crate) fn hold(req: &Request, engine: &str, acquired: &Span) -> Span {
    let span = tracing::debug_span!(
        target: "dlock",
        "hold",
        group = req.key.group(),
        key = req.key.name(),
        mode = Series::of(req).mode(),
        engine,
        permits = req.permits(),
        fence = req.fence,
    );
    span.follows_from(acquired);
    span
}

pub(crate) fn not_acquired(span: &Span, error: &crate::Error) {
    tracing::debug!(target: "dlock", parent: span, %error, "lock wait ended without the lock");
}

pub(crate) fn renewal_failed(span: &Span, error: &dyn std::fmt::Display) {
    tracing::warn!(target: "dlock", parent: span, %error, "lock renewal failed; retrying");
}

pub(crate) fn lost(span: &Span, reason: crate::LostReason) {
    tracing::warn!(target: "dlock", parent: span, %reason, "lock lost");
}

pub(crate) fn revoked(span: &Span) {
    tracing::info!(target: "dlock", parent: span, "lock revoked: asked to let go");
}
