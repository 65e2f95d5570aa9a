//! Labels, registered once. A record carries a six-character reference to
//! its process's label, not the label: a held lock's gate then costs the
//! same memory whatever the host is called. The label itself lives in
//! `{dlock:}:label:<reference>` (one hash tag, so one node of a cluster and
//! one `MGET` reads them all; no lock's tag, as a group is never empty),
//! written at connect and again every minute, kept an hour.
//!
//! With it, the connection is named after the label (`CLIENT SETNAME`), so
//! `CLIENT LIST` maps a holder's label to its connection, as PostgreSQL's
//! `application_name` does. Redis takes no space or control character in
//! a name: those become `_`. A connection that reconnects is named again
//! at the next turn, within the minute.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use dlock_core::kit::EngineError;
use redis::AsyncCommands;
use tokio::task::JoinHandle;

use super::connection::Connection;

const KEEP: Duration = Duration::from_secs(3600);
const AGAIN: Duration = Duration::from_secs(60);
/// References a reader remembers before it starts over.
const REMEMBERED: usize = 4096;

/// The reference of `label`: FNV-1a over it, six base-62 digits (35 bits;
/// two labels that meet show each other's, nothing worse).
pub(crate) fn reference(label: &str) -> String {
    let hash = label.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |hash, byte| {
        (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3)
    });
    const DIGITS: &[u8] = b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";
    (0..6)
        .scan(hash, |rest, _| {
            let digit = DIGITS[(*rest % 62) as usize] as char;
            *rest /= 62;
            Some(digit)
        })
        .collect()
}

/// `label` as Redis takes a connection's name: printable ASCII, no space.
fn connection_name(label: &str) -> String {
    let name = label.chars().map(|c| if c.is_ascii_graphic() { c } else { '_' });
    name.collect()
}

fn key(reference: &str) -> String {
    format!("{{dlock:}}:label:{reference}")
}

/// This engine's label, kept registered while the engine lives, and the
/// labels it has read.
pub(crate) struct Labels {
    /// What this engine's records carry.
    pub reference: String,
    known: Mutex<HashMap<String, String>>,
    renewing: JoinHandle<()>,
}

impl Labels {
    /// What a request's record carries as its label: the reference, then
    /// its lease in hex ms, so that a reader tells the renewal that set
    /// the hold's deadline ([`records::tagged`](super::records::tagged)).
    pub fn tag(&self, lease_ms: u64) -> String {
        format!("{} {lease_ms:x}", self.reference)
    }

    /// Registers `label` and keeps it registered.
    pub async fn register(connection: &Connection, label: &str) -> redis::RedisResult<Labels> {
        let reference = reference(label);
        let (key, label) = (key(&reference), label.to_owned());
        let name = connection_name(&label);
        let write = move |mut connection: Connection| {
            let (key, label, name) = (key.clone(), label.clone(), name.clone());
            async move {
                connection.set_ex::<_, _, ()>(key, label, KEEP.as_secs()).await?;
                // A server whose ACL refuses it only loses the name.
                let mut named = redis::cmd("CLIENT");
                named.arg("SETNAME").arg(name);
                let _ = named.query_async::<()>(&mut connection).await;
                Ok::<_, redis::RedisError>(())
            }
        };
        write(connection.clone()).await?;
        let connection = connection.clone();
        let renewing = tokio::spawn(async move {
            loop {
                tokio::time::sleep(AGAIN).await;
                // A failure is retried at the next turn, well within KEEP.
                let _ = write(connection.clone()).await;
            }
        });
        Ok(Labels {
            reference,
            known: Mutex::default(),
            renewing,
        })
    }

    /// The labels of `references`, each read from the server at most once
    /// (a reference always names the same label); one `MGET` for those not
    /// read before. One no longer registered has none.
    pub async fn resolve<'r>(
        &self,
        connection: &Connection,
        references: impl IntoIterator<Item = &'r str>,
    ) -> Result<HashMap<String, String>, EngineError> {
        let mut found = HashMap::new();
        let mut unknown = Vec::new();
        {
            let known = self.known();
            for reference in references {
                if let Some(label) = known.get(reference) {
                    found.insert(reference.to_owned(), label.clone());
                } else if !reference.is_empty() {
                    unknown.push(reference.to_owned());
                }
            }
        }
        unknown.sort_unstable();
        unknown.dedup();
        if unknown.is_empty() {
            return Ok(found);
        }
        let keys: Vec<String> = unknown.iter().map(|r| key(r)).collect();
        let labels: Vec<Option<String>> = redis::cmd("MGET")
            .arg(&keys)
            .query_async(&mut connection.clone())
            .await
            .map_err(EngineError::failed)?;
        let mut known = self.known();
        if known.len() + unknown.len() > REMEMBERED {
            known.clear();
        }
        for (reference, label) in unknown.into_iter().zip(labels) {
            if let Some(label) = label {
                known.insert(reference.clone(), label.clone());
                found.insert(reference, label);
            }
        }
        Ok(found)
    }

    fn known(&self) -> std::sync::MutexGuard<'_, HashMap<String, String>> {
        self.known.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Drop for Labels {
    fn drop(&mut self) {
        self.renewing.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reference_is_six_plain_characters_the_same_for_the_same_label() {
        let r = reference("billing-7f9c:4242");
        assert_eq!(r.len(), 6);
        assert!(r.bytes().all(|b| b.is_ascii_alphanumeric()), "{r}");
        assert_eq!(r, reference("billing-7f9c:4242"));
        assert_ne!(r, reference("billing-7f9c:4243"));
    }

    #[test]
    fn a_connection_is_named_after_its_label_as_redis_takes_names() {
        assert_eq!(connection_name("billing-7f9c:4242"), "billing-7f9c:4242");
        assert_eq!(connection_name("worker 3\tné"), "worker_3_n_");
    }
}
