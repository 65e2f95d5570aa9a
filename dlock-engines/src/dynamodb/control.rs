//! An operator's hand on a lock's or a semaphore's holds: one read of the
//! item, then an update per hold meant, on the condition that the entry
//! still has the owner and fence read. Force release removes the entry and
//! leaves word for its holder, `k:<owner>`, which the holder reads and
//! removes when its renewal fails ([`forced_out`]). Revoke marks the entry
//! `x`, which the holder's next renewal reads back.
//!
//! Fences need nothing: every grant takes the next value of the item's
//! counter, so the holder after a forced one gets a greater token.

use aws_sdk_dynamodb::types::AttributeValue;
use dlock_core::Only;
use dlock_core::kit::{EngineError, OwnerId, Request};

use super::item::{Entry, READERS, entries, fence_of};
use super::update::{Outcome, Update, number, text};
use super::{DynamoDbEngine, Place, taken};

pub(super) enum Act {
    Force,
    Revoke,
}

/// Where word is left that `owner` was forced out.
fn word(owner: OwnerId) -> String {
    format!("k:{owner}")
}

/// Acts on each hold of the item at `place` that `only` admits; how many
/// it reached.
pub(super) async fn act(
    engine: &DynamoDbEngine,
    place: &Place,
    only: &Only,
    act: Act,
) -> Result<u32, EngineError> {
    let found = engine.read(place).await?;
    let mut reached = 0;
    for entry in entries(&found) {
        let digest = entry.owner.map(OwnerId::digest);
        if !only.admits(entry.fence, digest.as_deref()) {
            continue;
        }
        let update = match act {
            Act::Force => forcing(&entry),
            Act::Revoke => revoking(&entry),
        };
        if let Outcome::Done(_) = engine.update(place, update).await? {
            reached += 1;
        }
    }
    Ok(reached)
}

/// The update's condition: the entry is still the hold read.
fn same_hold(update: &mut Update, entry: &Entry) {
    let (e, o) = (update.name(&entry.name), update.name("o"));
    let owner = entry.owner.map_or_else(String::new, |owner| owner.to_string());
    update.equals(format!("{e}.{o}"), text(owner));
    if let Some(fence) = entry.fence {
        let fe = update.name(&fence_of(&entry.name));
        update.equals(fe, number(fence as i64));
    }
}

fn forcing(entry: &Entry) -> Update {
    let mut update = Update::default();
    same_hold(&mut update, entry);
    let (e, fe) = (update.name(&entry.name), update.name(&fence_of(&entry.name)));
    update.remove(e).remove(fe);
    if entry.is_reader() {
        let rc = update.name(READERS);
        update.add(rc, -1);
    }
    if let Some(owner) = entry.owner {
        let (k, yes) = (
            update.name(&word(owner)),
            update.value(AttributeValue::Bool(true)),
        );
        update.set(format!("{k} = {yes}"));
    }
    update
}

fn revoking(entry: &Entry) -> Update {
    let mut update = Update::default();
    same_hold(&mut update, entry);
    let (e, x) = (update.name(&entry.name), update.name("x"));
    let yes = update.value(AttributeValue::Bool(true));
    update.set(format!("{e}.{x} = {yes}"));
    update
}

/// Whether word was left that `req`'s hold was forced out; the word is
/// taken away as it is read.
pub(super) async fn forced_out(engine: &DynamoDbEngine, req: &Request) -> Result<bool, EngineError> {
    let Some(held) = taken(req) else { return Ok(false) };
    let mut update = Update::default();
    let k = update.name(&word(req.owner));
    update.remove(k.clone()).only_if(format!("attribute_exists({k})"));
    Ok(matches!(
        engine.update(&held.place, update).await?,
        Outcome::Done(_)
    ))
}
