//! The engine's writes: a key written or removed only at the revision its
//! writer last saw, each with a TTL, and the server's last word on a key.

use std::time::Duration;

use async_nats::HeaderMap;
use async_nats::jetstream::context::PublishErrorKind;
use async_nats::jetstream::message::PublishMessage;
use async_nats::jetstream::stream::LastRawMessageErrorKind;
use dlock_core::kit::EngineError;

use super::keys::Stake;
use super::mirror::Found;
use super::{MARKERS_KEPT, NatsEngine, failed};

/// What a conditional write did.
pub(crate) enum Wrote {
    /// Written, at this revision.
    Done(u64),
    /// The key's last revision was not the one expected.
    Refused,
}

/// A TTL in the whole seconds `Nats-TTL` counts, rounded up.
fn seconds(ttl: Duration) -> String {
    ttl.as_millis().div_ceil(1000).max(1).to_string()
}

impl NatsEngine {
    pub(crate) fn subject(&self, key: &str) -> String {
        format!("$KV.{}.{key}", self.bucket)
    }

    /// Writes `stake` to `key` for `ttl`, if the key's last revision is
    /// `expected` (0: the key has none).
    pub(crate) async fn put(
        &self,
        key: &str,
        stake: &Stake,
        expected: u64,
        ttl: Duration,
    ) -> Result<Wrote, EngineError> {
        let payload = serde_json::to_vec(stake).map_err(failed)?;
        let mut headers = HeaderMap::new();
        headers.insert("Nats-TTL", seconds(ttl).as_str());
        self.publish(key, headers, payload, expected).await
    }

    /// Removes `key` if its last revision is `expected`: a purge, or for
    /// an operator's force release a delete, which its holder can tell
    /// apart. Either leaves a marker the server drops in time.
    pub(crate) async fn remove(&self, key: &str, expected: u64, forced: bool) -> Result<Wrote, EngineError> {
        let mut headers = HeaderMap::new();
        headers.insert("KV-Operation", if forced { "DEL" } else { "PURGE" });
        if !forced {
            headers.insert("Nats-Rollup", "sub");
        }
        headers.insert("Nats-TTL", seconds(MARKERS_KEPT).as_str());
        self.publish(key, headers, Vec::new(), expected).await
    }

    pub(crate) async fn publish(
        &self,
        key: &str,
        mut headers: HeaderMap,
        payload: Vec<u8>,
        expected: u64,
    ) -> Result<Wrote, EngineError> {
        headers.insert(
            "Nats-Expected-Last-Subject-Sequence",
            expected.to_string().as_str(),
        );
        let message = PublishMessage::build().headers(headers).payload(payload.into());
        let acked = async { self.js.send_publish(self.subject(key), message).await?.await };
        match acked.await {
            Ok(ack) => Ok(Wrote::Done(ack.sequence)),
            Err(e) if e.kind() == PublishErrorKind::WrongLastSequence => Ok(Wrote::Refused),
            Err(e) => Err(failed(e)),
        }
    }

    /// `key`'s last message, read from the stream's leader: the live key,
    /// or `None` if it has none or its last message removed it.
    pub(crate) async fn last(&self, key: &str) -> Result<Option<Found>, EngineError> {
        Ok(self.last_message(key).await?.and_then(|last| last.found))
    }

    /// `key`'s last message, read from the stream's leader; `None` if it
    /// has none.
    pub(crate) async fn last_message(&self, key: &str) -> Result<Option<Last>, EngineError> {
        let message = match self
            .stream
            .get_last_raw_message_by_subject(&self.subject(key))
            .await
        {
            Ok(message) => message,
            Err(e) if e.kind() == LastRawMessageErrorKind::NoMessageFound => return Ok(None),
            Err(e) => return Err(failed(e)),
        };
        let removal = message
            .headers
            .get("KV-Operation")
            .map(|v| v.to_string())
            .or_else(|| {
                message
                    .headers
                    .get("Nats-Marker-Reason")
                    .map(|_| "EXPIRED".to_owned())
            });
        let stake = match removal {
            Some(_) => None,
            None => serde_json::from_slice::<Stake>(&message.payload).ok(),
        };
        Ok(Some(Last {
            revision: message.sequence,
            found: stake.map(|stake| Found {
                key: key.to_owned(),
                revision: message.sequence,
                created: stake.c.unwrap_or(message.sequence),
                stake,
            }),
            removal,
        }))
    }
}

/// A key's last message.
pub(crate) struct Last {
    pub revision: u64,
    /// The live key, if the message is one.
    pub found: Option<Found>,
    /// What removed it, if it did: `PURGE` (its holder), `DEL` (an
    /// operator), `EXPIRED`.
    pub removal: Option<String>,
}
