//! The audit trail of operators' acts on holders: a `tracing` warning per
//! act, target `dlock::audit`, and a count per act in
//! [`OPERATOR_ACTS`](crate::metrics::OPERATOR_ACTS). Holders are named by
//! their records (label, fence, owner digest), never by their owner ids.

use crate::kit::process_label;
use crate::{Lock, LockView, Only};

/// Records that `what` was done through `lock` to the holds `only`
/// admits, which `seen` showed just before (`None`: the engine keeps no
/// records, or they could not be read), reaching `reached` of them.
pub(crate) fn acted(lock: &Lock, what: &'static str, only: &Only, seen: Option<&LockView>, reached: u32) {
    let holders = match seen {
        Some(view) => {
            let admitted = view.holders.iter().filter(|h| only.admits_record(h));
            let named: Vec<String> = admitted.map(named).collect();
            named.join(", ")
        }
        None => "unknown: the engine keeps no records".to_owned(),
    };
    let by = lock.operator().map_or_else(process_label, str::to_owned);
    tracing::warn!(
        target: "dlock::audit",
        group = lock.group(),
        lock = lock.name(),
        act = what,
        only = %only,
        holders,
        reached,
        by,
        "an operator acted on holders"
    );
    metrics::counter!(
        crate::metrics::OPERATOR_ACTS,
        "group" => lock.group().to_owned(),
        "engine" => lock.engine_name().to_owned(),
        "act" => what,
    )
    .increment(1);
}

/// `host:1234 fence 7 owner 0a1b2c3d`, with what the record shows.
fn named(holder: &crate::HolderRecord) -> String {
    let mut named = holder
        .label
        .clone()
        .unwrap_or_else(|| "another client".to_owned());
    if let Some(fence) = holder.fence {
        named += &format!(" fence {fence}");
    }
    if let Some(owner) = &holder.owner {
        named += &format!(" owner {owner}");
    }
    named
}
