//! Writes that land only while the hold is current: one
//! `TransactWriteItems`, whose first item checks that the hold's entry
//! still has this owner and fence, then the user's own items.

use aws_sdk_dynamodb::operation::transact_write_items::TransactWriteItemsError;
use aws_sdk_dynamodb::types::{AttributeValue, ConditionCheck, ReturnConsumedCapacity, TransactWriteItem};
use dlock_core::kit::{EngineError, HeldBy, held_by};
use dlock_core::{Error, HeldLock};

use super::{DynamoDbEngine, failed, fence_of, number, taken, text};

/// A hold's writes to DynamoDB, in one transaction with a check of the
/// hold: none lands once another holder has taken the lock over, or an
/// operator forced this one out. The items may be on any table of the
/// same account and region, up to 99 (DynamoDB's 100 with the check).
///
/// Without a server clock, a hold ends when someone takes it over (a
/// lease after a waiter first saw it unrenewed): a holder paused longer
/// than its lease still writes while nobody has, which is safe, as
/// nobody else holds.
///
/// ```no_run
/// # async fn demo() -> Result<(), dlock::Error> {
/// use dlock::engines::dynamodb::HeldTransaction;
/// use dlock::engines::dynamodb::aws_sdk_dynamodb::types::{AttributeValue, Put, TransactWriteItem};
///
/// let guard = dlock::lock("jobs", "import").lock().await?;
/// let put = Put::builder()
///     .table_name("app")
///     .item("pk", AttributeValue::S("cursor".into()))
///     .item("at", AttributeValue::N("4096".into()))
///     .build()
///     .expect("a table and an item");
/// // Err(Lost) if the hold has ended: then nothing was written.
/// HeldTransaction::of(&guard)?.item(TransactWriteItem::builder().put(put).build()).commit().await?;
/// # Ok(())
/// # }
/// ```
pub struct HeldTransaction<'a> {
    held: HeldBy<'a, DynamoDbEngine>,
    items: Vec<TransactWriteItem>,
}

impl<'a> HeldTransaction<'a> {
    /// The held writes of `guard`'s hold; `Unsupported` where it is not
    /// on a DynamoDB engine.
    pub fn of(guard: &'a impl AsRef<HeldLock>) -> Result<Self, Error> {
        let held = held_by(guard.as_ref(), "dynamodb::HeldTransaction")?;
        Ok(HeldTransaction {
            held,
            items: Vec::new(),
        })
    }

    /// Adds `item` (a put, an update, a delete or a condition check of the
    /// user's own) to the transaction.
    pub fn item(mut self, item: TransactWriteItem) -> Self {
        self.items.push(item);
        self
    }

    /// Writes the items if the hold is still current; `Err(Lost)`, with
    /// nothing written, otherwise. A condition of the user's own that
    /// fails cancels the whole transaction too: the error names each
    /// item's reason. Sent once: should the answer not come within
    /// `call_timeout`, the error says so and whether it landed is unknown.
    pub async fn commit(self) -> Result<(), Error> {
        let engine = self.held.store();
        let req = self.held.request();
        let check = taken(req).map(|taken| {
            ConditionCheck::builder()
                .table_name(&engine.table)
                .key("pk", AttributeValue::S(taken.place.pk.clone()))
                .key("sk", AttributeValue::S(taken.place.sk.clone()))
                .condition_expression("#e.#o = :owner AND #f = :fence")
                .expression_attribute_names("#e", &taken.entry)
                .expression_attribute_names("#o", "o")
                .expression_attribute_names("#f", fence_of(&taken.entry))
                .expression_attribute_values(":owner", text(req.owner.to_string()))
                .expression_attribute_values(":fence", number(req.fence as i64))
                .build()
        });
        let items = self.items;
        self.held
            .write(async move {
                let Some(check) = check else {
                    return Ok(None);
                };
                let check = TransactWriteItem::builder()
                    .condition_check(check.map_err(failed)?)
                    .build();
                let sent = engine
                    .client
                    .transact_write_items()
                    .set_transact_items(Some([vec![check], items].concat()))
                    .return_consumed_capacity(ReturnConsumedCapacity::Total)
                    .send()
                    .await;
                match sent {
                    Ok(done) => {
                        for spent in done.consumed_capacity() {
                            engine.spent.writes(Some(spent));
                        }
                        Ok(Some(()))
                    }
                    Err(err) => cancelled(engine, err.into_service_error()),
                }
            })
            .await
    }
}

/// A cancelled transaction: refused if the hold's check failed, else an
/// error naming each of the user's items' reasons, counted from 1.
fn cancelled(engine: &DynamoDbEngine, err: TransactWriteItemsError) -> Result<Option<()>, EngineError> {
    let TransactWriteItemsError::TransactionCanceledException(cancelled) = err else {
        return Err(failed(err));
    };
    let reasons = cancelled.cancellation_reasons();
    engine.spent.refused();
    if reasons.first().and_then(|r| r.code()) == Some("ConditionalCheckFailed") {
        return Ok(None);
    }
    let named: Vec<String> = reasons
        .iter()
        .enumerate()
        .skip(1)
        .filter_map(|(at, reason)| Some(format!("item {at}: {}", reason.code().filter(|c| *c != "None")?)))
        .collect();
    Err(EngineError::failed(format!(
        "the held transaction was cancelled ({})",
        named.join(", ")
    )))
}
