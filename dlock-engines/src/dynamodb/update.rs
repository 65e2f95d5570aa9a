//! One conditional `UpdateItem`, built up from its parts: the clauses of
//! its update and condition expressions, with every attribute name and
//! value passed as a placeholder (names hold `:`, values hold anything).

use std::collections::HashMap;

use aws_sdk_dynamodb::types::{
    AttributeValue, ConsumedCapacity, ReturnConsumedCapacity, ReturnValue,
    ReturnValuesOnConditionCheckFailure,
};
use dlock_core::kit::EngineError;

use super::{DynamoDbEngine, Place, failed};

/// An item's attributes, as the SDK gives them.
pub(super) type Attrs = HashMap<String, AttributeValue>;

/// What an update came to: done, with the attributes it wrote (their new
/// values), or refused by its condition, with the item as it was.
pub(super) enum Outcome {
    Done(Attrs),
    Refused(Attrs),
}

#[derive(Default)]
pub(super) struct Update {
    set: Vec<String>,
    remove: Vec<String>,
    add: Vec<String>,
    conditions: Vec<String>,
    names: HashMap<String, String>,
    values: HashMap<String, AttributeValue>,
}

impl Update {
    /// The placeholder of attribute (or map key) `attr`.
    pub fn name(&mut self, attr: &str) -> String {
        if let Some((placeholder, _)) = self.names.iter().find(|(_, a)| *a == attr) {
            return placeholder.clone();
        }
        let placeholder = format!("#n{}", self.names.len());
        self.names.insert(placeholder.clone(), attr.to_owned());
        placeholder
    }

    /// The placeholder of `value`.
    pub fn value(&mut self, value: AttributeValue) -> String {
        let placeholder = format!(":v{}", self.values.len());
        self.values.insert(placeholder.clone(), value);
        placeholder
    }

    /// `SET <clause>`.
    pub fn set(&mut self, clause: String) -> &mut Self {
        self.set.push(clause);
        self
    }

    /// `REMOVE <path>`.
    pub fn remove(&mut self, path: String) -> &mut Self {
        self.remove.push(path);
        self
    }

    /// `ADD <path> <value>`.
    pub fn add(&mut self, path: String, by: i64) -> &mut Self {
        let by = self.value(number(by));
        self.add.push(format!("{path} {by}"));
        self
    }

    /// A clause of the condition, all of which must hold.
    pub fn only_if(&mut self, condition: String) -> &mut Self {
        self.conditions.push(condition);
        self
    }

    /// `path = value`, a condition.
    pub fn equals(&mut self, path: String, value: AttributeValue) -> &mut Self {
        let value = self.value(value);
        self.only_if(format!("{path} = {value}"))
    }

    fn expression(&self) -> String {
        let mut parts = Vec::new();
        for (word, clauses) in [("SET", &self.set), ("REMOVE", &self.remove), ("ADD", &self.add)] {
            if !clauses.is_empty() {
                parts.push(format!("{word} {}", clauses.join(", ")));
            }
        }
        parts.join(" ")
    }
}

impl DynamoDbEngine {
    /// Sends `update` for the item at `place`; the new values of what it
    /// wrote, or the whole item as it was if its condition failed.
    pub(super) async fn update(&self, place: &Place, update: Update) -> Result<Outcome, EngineError> {
        let condition = (!update.conditions.is_empty()).then(|| update.conditions.join(" AND "));
        let sent = self
            .client
            .update_item()
            .table_name(&self.table)
            .key("pk", AttributeValue::S(place.pk.clone()))
            .key("sk", AttributeValue::S(place.sk.clone()))
            .update_expression(update.expression())
            .set_condition_expression(condition)
            .set_expression_attribute_names((!update.names.is_empty()).then_some(update.names))
            .set_expression_attribute_values((!update.values.is_empty()).then_some(update.values))
            .return_values(ReturnValue::UpdatedNew)
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld)
            .return_consumed_capacity(ReturnConsumedCapacity::Total)
            .send()
            .await;
        match sent {
            Ok(done) => {
                self.spent.writes(done.consumed_capacity());
                Ok(Outcome::Done(done.attributes.unwrap_or_default()))
            }
            Err(err) => match err.into_service_error() {
                aws_sdk_dynamodb::operation::update_item::UpdateItemError::ConditionalCheckFailedException(
                    refused,
                ) => {
                    self.spent.refused();
                    Ok(Outcome::Refused(refused.item.unwrap_or_default()))
                }
                other => Err(failed(other)),
            },
        }
    }

    /// The item at `place`, read consistently; empty if there is none.
    pub(super) async fn read(&self, place: &Place) -> Result<Attrs, EngineError> {
        let read = self
            .client
            .get_item()
            .table_name(&self.table)
            .key("pk", AttributeValue::S(place.pk.clone()))
            .key("sk", AttributeValue::S(place.sk.clone()))
            .consistent_read(true)
            .return_consumed_capacity(ReturnConsumedCapacity::Total)
            .send()
            .await
            .map_err(|e| failed(e.into_service_error()))?;
        self.spent.reads(read.consumed_capacity());
        Ok(read.item.unwrap_or_default())
    }
}

/// The capacity units this engine's requests consumed, as DynamoDB
/// reported them, counted as metrics: what a user pays per request.
pub(super) struct Spent {
    read: metrics::Counter,
    written: metrics::Counter,
}

/// Counts read and write capacity units, labelled by engine and table.
pub const CAPACITY_UNITS: &str = "dlock_dynamodb_capacity_units_total";

impl Spent {
    pub fn new(engine: &str, table: &str) -> Spent {
        let counter = |kind: &'static str| {
            let labels = [
                ("engine", engine.to_owned()),
                ("table", table.to_owned()),
                ("kind", kind.to_owned()),
            ];
            metrics::counter!(CAPACITY_UNITS, &labels)
        };
        Spent {
            read: counter("read"),
            written: counter("write"),
        }
    }

    pub fn reads(&self, spent: Option<&ConsumedCapacity>) {
        self.read.increment(units(spent));
    }

    pub fn writes(&self, spent: Option<&ConsumedCapacity>) {
        self.written.increment(units(spent));
    }

    /// A write its condition refused: DynamoDB bills it as a write, but
    /// reports nothing; one unit, what an item up to 1 KB costs.
    pub fn refused(&self) {
        self.written.increment(1);
    }
}

/// Whole units, rounded up (a consistent read or a write is at least one).
fn units(spent: Option<&ConsumedCapacity>) -> u64 {
    spent
        .and_then(ConsumedCapacity::capacity_units)
        .map_or(0, |u| u.ceil() as u64)
}

pub(super) fn number(n: i64) -> AttributeValue {
    AttributeValue::N(n.to_string())
}

pub(super) fn text(s: impl Into<String>) -> AttributeValue {
    AttributeValue::S(s.into())
}

/// A number attribute's value, if it is one.
pub(super) fn number_of(value: Option<&AttributeValue>) -> Option<u64> {
    value?.as_n().ok()?.parse().ok()
}
