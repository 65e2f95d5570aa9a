//! Fenced requests to a service of your own (feature `fenced-http`).
//!
//! The holder sends its token with each request, in [`headers`]: the lock
//! ([`LOCK`]), the fence ([`FENCE`]) and, for a permit, the slot
//! ([`SLOT`]). The service that owns the storage takes [`Fenced`] in its
//! handlers: it raises the service's [`HighWater`] mark for the lock (and
//! slot) to the token and refuses the request with `409 Conflict` if a
//! greater token has been seen, `400 Bad Request` if a header is missing
//! or garbled, before the handler runs.
//!
//! The mark is kept behind [`HighWater`]: [`InMemory`] for a single
//! process, or one of your own in the service's database, so that it
//! outlives the process and is shared by its replicas.
//!
//! ```no_run
//! use std::sync::Arc;
//!
//! use axum::{Router, routing::put};
//! use dlock::fenced::http::{Fenced, HighWater, InMemory};
//!
//! async fn save(fenced: Fenced, body: String) -> &'static str {
//!     // Only the current holder of `fenced.lock` (and slot) gets here.
//!     "saved"
//! }
//!
//! # async fn serve() -> std::io::Result<()> {
//! let marks: Arc<dyn HighWater> = Arc::new(InMemory::default());
//! let app = Router::new().route("/orders/42", put(save)).with_state(marks);
//! # let _: Router = app;
//! # Ok(())
//! # }
//!
//! // The holder:
//! # async fn call(guard: &dlock::Guard, client: &impl Fn(axum::http::HeaderMap)) {
//! let headers = dlock::fenced::http::headers(guard); // send these with the request
//! # }
//! ```

use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::{Arc, Mutex};

use axum::extract::{FromRef, FromRequestParts};
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};

use super::Token;
use crate::kit::async_trait;
use crate::{BoxError, Guard};

/// The header naming the lock: its group and name, `/`-separated, every
/// byte outside visible ASCII (and `%`) as `%XX`.
pub const LOCK: HeaderName = HeaderName::from_static("dlock-lock");
/// The header carrying the fence, in decimal.
pub const FENCE: HeaderName = HeaderName::from_static("dlock-fence");
/// The header carrying a permit's slot, in decimal; absent for a lock.
pub const SLOT: HeaderName = HeaderName::from_static("dlock-slot");

/// The headers of a request made under `guard`'s hold.
pub fn headers(guard: &Guard) -> HeaderMap {
    let key = guard.key();
    let mut lock = String::new();
    for byte in format!("{}/{}", key.group(), key.name()).bytes() {
        match byte {
            b'%' | ..=b' ' | 0x7f.. => write!(lock, "%{byte:02X}").expect("to a String"),
            _ => lock.push(char::from(byte)),
        }
    }
    let token = Token::of(guard);
    let mut headers = HeaderMap::new();
    headers.insert(LOCK, HeaderValue::try_from(lock).expect("visible ASCII"));
    headers.insert(FENCE, HeaderValue::from(token.fence));
    if let Some(slot) = token.slot {
        headers.insert(SLOT, HeaderValue::from(slot));
    }
    headers
}

/// What raising a mark found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Raised {
    /// The token is not below the mark, which is now the token.
    Accepted,
    /// The mark, `seen`, is above the token; it stays.
    Stale {
        /// The mark.
        seen: u64,
    },
}

/// The greatest token a service has seen per resource (a lock, or a slot
/// of a semaphore).
#[async_trait]
pub trait HighWater: Send + Sync {
    /// Raises `resource`'s mark to `token` unless it is above. Atomic per
    /// resource: of two calls at once, one sees the other's token.
    async fn raise(&self, resource: &str, token: u64) -> Result<Raised, BoxError>;
}

/// The marks in this process's memory.
#[derive(Debug, Default)]
pub struct InMemory(Mutex<HashMap<String, u64>>);

#[async_trait]
impl HighWater for InMemory {
    async fn raise(&self, resource: &str, token: u64) -> Result<Raised, BoxError> {
        let mut marks = self.0.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let mark = marks.entry(resource.to_owned()).or_default();
        if token < *mark {
            return Ok(Raised::Stale { seen: *mark });
        }
        *mark = token;
        Ok(Raised::Accepted)
    }
}

/// A request whose token was the greatest its resource has seen: an
/// extractor, taken before the handler runs. The state gives the marks as
/// `Arc<dyn HighWater>` ([`FromRef`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fenced {
    /// The lock, as [`LOCK`] gave it.
    pub lock: String,
    /// The request's token.
    pub token: Token,
}

impl Fenced {
    /// The resource whose mark the request raised: the lock, and for a
    /// permit `#<slot>` after it.
    pub fn resource(&self) -> String {
        match self.token.slot {
            Some(slot) => format!("{}#{slot}", self.lock),
            None => self.lock.clone(),
        }
    }
}

/// Why a request was refused.
#[derive(Debug)]
pub enum Refused {
    /// `400`: a header is missing or garbled; names it.
    Header(HeaderName),
    /// `409`: the resource has seen a greater token.
    Stale {
        /// The request's token.
        token: u64,
        /// The greatest seen.
        seen: u64,
    },
    /// `500`: the marks could not be raised. The error goes to the log
    /// (target `dlock`), not to the client.
    HighWater,
}

impl IntoResponse for Refused {
    fn into_response(self) -> Response {
        match self {
            Refused::Header(name) => (
                StatusCode::BAD_REQUEST,
                format!("missing or garbled header {name}"),
            )
                .into_response(),
            Refused::Stale { token, seen } => (
                StatusCode::CONFLICT,
                format!("stale fence: token {token} is below {seen}, which this service has seen"),
            )
                .into_response(),
            Refused::HighWater => (
                StatusCode::INTERNAL_SERVER_ERROR,
                "the fence could not be checked",
            )
                .into_response(),
        }
    }
}

impl<S> FromRequestParts<S> for Fenced
where
    S: Send + Sync,
    Arc<dyn HighWater>: FromRef<S>,
{
    type Rejection = Refused;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Refused> {
        let text = |name: HeaderName| match parts.headers.get(&name).map(HeaderValue::to_str) {
            Some(Ok(value)) if !value.is_empty() => Ok(value),
            _ => Err(Refused::Header(name)),
        };
        let number = |name: HeaderName| text(name.clone())?.parse().map_err(|_| Refused::Header(name));
        let lock = text(LOCK)?;
        let fence = number(FENCE)?;
        let slot = match parts.headers.contains_key(SLOT) {
            true => {
                Some(number(SLOT).and_then(|slot| u32::try_from(slot).map_err(|_| Refused::Header(SLOT)))?)
            }
            false => None,
        };
        let fenced = Fenced {
            lock: lock.to_owned(),
            token: Token { fence, slot },
        };
        let marks = Arc::<dyn HighWater>::from_ref(state);
        match marks.raise(&fenced.resource(), fence).await {
            Ok(Raised::Accepted) => Ok(fenced),
            Ok(Raised::Stale { seen }) => Err(Refused::Stale { token: fence, seen }),
            Err(error) => {
                tracing::error!(target: "dlock", %error, "fenced request: the high-water mark could not be raised");
                Err(Refused::HighWater)
            }
        }
    }
}
