//! An operator's hand on a line's holds: the copy, brought up to date,
//! finds them; force release deletes a holder's key (and a permit's slot)
//! at the revision read, revoke writes it again marked, at that revision.
//! A hold that changed meanwhile is left alone: the write is refused.
//!
//! A holder whose renewal is refused reads its key's last message: a
//! delete (not its own purge, nor an expiry) is a force release
//! ([`forced_out`]). Fences need nothing: the next holder's key is newer.

use dlock_core::Only;
use dlock_core::kit::{EngineError, Request};

use super::keys::Line;
use super::write::Wrote;
use super::{NatsEngine, Rule, queued};

pub(super) enum Act {
    Force,
    Revoke,
}

/// Acts on each hold of `line` that `only` admits; how many it reached.
pub(super) async fn act(
    engine: &NatsEngine,
    line: &Line,
    rule: Rule,
    only: &Only,
    act: Act,
) -> Result<u32, EngineError> {
    let found = engine.read_line(line).await?;
    let slots: Vec<_> = match rule {
        Rule::Lock => Vec::new(),
        Rule::Permits(count) => (0..count)
            .filter_map(|n| engine.mirror.get(&line.slot(n)))
            .collect(),
    };
    let mut reached = 0;
    for hold in &found[..rule.holding(&found)] {
        let slot = slots.iter().find(|s| s.stake.o == hold.stake.o);
        let fence = match rule {
            Rule::Lock => Some(hold.created),
            Rule::Permits(_) => slot.map(|s| s.created),
        };
        let digest = hold.stake.owner().map(|owner| owner.digest());
        if !only.admits(fence, digest.as_deref()) {
            continue;
        }
        let wrote = match act {
            Act::Force => {
                if let Some(slot) = slot {
                    engine.remove(&slot.key, slot.revision, true).await?;
                }
                engine.remove(&hold.key, hold.revision, true).await?
            }
            Act::Revoke => {
                let mut stake = hold.stake.again(hold.created, hold.stake.lease());
                stake.x = true;
                engine
                    .put(&hold.key, &stake, hold.revision, hold.stake.lease())
                    .await?
            }
        };
        if let Wrote::Done(_) = wrote {
            reached += 1;
        }
    }
    Ok(reached)
}

/// Whether `req`'s key was deleted by an operator.
pub(super) async fn forced_out(engine: &NatsEngine, req: &Request) -> Result<bool, EngineError> {
    let Some(current) = queued(req) else {
        return Ok(false);
    };
    let last = engine.last_message(&current.key).await?;
    Ok(last.is_some_and(|last| last.removal.as_deref() == Some("DEL")))
}
