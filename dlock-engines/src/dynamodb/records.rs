//! Records: a consistent read of a lock's or semaphore's item shows each
//! hold's label, owner digest, fence, lease and last renewal (by its
//! holder's clock); a `Query` on the group's partition lists them all.
//! There is no queue, so no waiters show.

use aws_sdk_dynamodb::types::AttributeValue;
use dlock_core::kit::EngineError;
use dlock_core::{HolderRecord, LockKey, LockView, Mode};

use super::item::{Entry, entries};
use super::update::{Attrs, number_of};
use super::{DynamoDbEngine, Place, failed};

pub(super) async fn inspect(
    engine: &DynamoDbEngine,
    key: &LockKey,
    permits: Option<u32>,
) -> Result<LockView, EngineError> {
    let place = match permits {
        None => Place::lock(key),
        Some(_) => Place::semaphore(key),
    };
    let found = engine.read(&place).await?;
    let mut view = view(key.group(), key.name(), &place, &found);
    if permits.is_some() {
        view.permits = view.permits.or(permits);
    }
    Ok(view)
}

/// Every lock and semaphore of `group` with an item; the core leaves out
/// free ones.
pub(super) async fn list(engine: &DynamoDbEngine, group: &str) -> Result<Vec<LockView>, EngineError> {
    let mut views = Vec::new();
    let mut start = None;
    loop {
        let page = engine
            .client
            .query()
            .table_name(&engine.table)
            .key_condition_expression("pk = :pk")
            .expression_attribute_values(":pk", AttributeValue::S(group.to_owned()))
            .consistent_read(true)
            .set_exclusive_start_key(start)
            .return_consumed_capacity(aws_sdk_dynamodb::types::ReturnConsumedCapacity::Total)
            .send()
            .await
            .map_err(|e| failed(e.into_service_error()))?;
        engine.spent.reads(page.consumed_capacity());
        for found in page.items() {
            let Some(sk) = found.get("sk").and_then(|sk| sk.as_s().ok()) else {
                continue;
            };
            let place = Place {
                pk: group.to_owned(),
                sk: sk.clone(),
            };
            if let Some(name) = place.name(found) {
                views.push(view(group, name, &place, found));
            }
        }
        start = page.last_evaluated_key;
        if start.is_none() {
            return Ok(views);
        }
    }
}

fn view(group: &str, name: &str, place: &Place, found: &Attrs) -> LockView {
    let semaphore = place.sk.starts_with("s:") || place.sk.starts_with("t:");
    let mut holders: Vec<(Option<u64>, HolderRecord)> =
        entries(found).iter().map(|e| (e.fence, holder(e))).collect();
    holders.sort_by_key(|(fence, _)| *fence);
    LockView {
        group: group.to_owned(),
        name: name.to_owned(),
        permits: semaphore
            .then(|| number_of(found.get("c")).map(|c| c as u32))
            .flatten(),
        holders: holders.into_iter().map(|(_, holder)| holder).collect(),
        waiters: Vec::new(),
    }
}

fn holder(entry: &Entry) -> HolderRecord {
    let record = HolderRecord {
        label: entry.label.clone(),
        mode: match entry.is_reader() {
            true => Mode::Read,
            false => Mode::Write,
        },
        fence: entry.fence,
        slot: entry.slot(),
        since: entry.since,
        owner: entry.owner.map(|owner| owner.digest()),
        ..HolderRecord::default()
    };
    match entry.renewed {
        Some(renewed) => record.leased(renewed + entry.lease, entry.lease),
        None => record,
    }
}
