//! The JSON routes: the same views, serialized the same way, as the `dlock`
//! command prints with `--json`, and the two actions.

use std::sync::Arc;

use axum::Json;
use axum::extract::{Path, Query, State};
use axum::http::header::{AUTHORIZATION, WWW_AUTHENTICATE};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{Value, json};
use subtle::ConstantTimeEq;

use super::Shown;
use super::listing::{Listing, Page};
use crate::{Acted, Cycle, Error, LockView, Locks, Only, Reached};

/// Why a request got no view.
pub(super) enum Failure {
    /// A group the application did not give the page.
    Unshown(String),
    /// The application did not turn the actions on.
    ActionsOff,
    /// The actions' token is missing or wrong.
    Unauthorized,
    Lock(Error),
}

impl From<Error> for Failure {
    fn from(error: Error) -> Self {
        Failure::Lock(error)
    }
}

impl IntoResponse for Failure {
    fn into_response(self) -> Response {
        match self {
            Failure::Unshown(group) => {
                (StatusCode::NOT_FOUND, format!("group `{group}` is not shown here")).into_response()
            }
            Failure::ActionsOff => (
                StatusCode::NOT_FOUND,
                "release and revoke are off: the application has not turned on actions",
            )
                .into_response(),
            Failure::Unauthorized => (
                StatusCode::UNAUTHORIZED,
                [(WWW_AUTHENTICATE, "Bearer")],
                "release and revoke need the header `Authorization: Bearer <token>` with the application's token",
            )
                .into_response(),
            Failure::Lock(error) => (status(&error), error.to_string()).into_response(),
        }
    }
}

/// An engine's failure is a bad gateway: the page works, the server behind it does not.
fn status(error: &Error) -> StatusCode {
    match error {
        Error::Engine { .. } | Error::Listing { .. } | Error::Unavailable { .. } => StatusCode::BAD_GATEWAY,
        Error::Unsupported { .. } => StatusCode::NOT_IMPLEMENTED,
        Error::InvalidKey { .. } => StatusCode::BAD_REQUEST,
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

impl Shown {
    fn locks(&self, group: &str) -> Result<&Locks, Failure> {
        (self.groups.get(group)).ok_or_else(|| Failure::Unshown(group.to_owned()))
    }

    /// Who acts, if the request shows one of the actions' tokens.
    fn authorize(&self, headers: &HeaderMap) -> Result<&str, Failure> {
        if self.tokens.is_empty() {
            return Err(Failure::ActionsOff);
        }
        // The scheme's name is case-insensitive (RFC 7235); the token is not.
        let given = (headers.get(AUTHORIZATION))
            .and_then(|value| value.to_str().ok())
            .and_then(|value| value.split_once(' '))
            .and_then(|(scheme, token)| scheme.eq_ignore_ascii_case("bearer").then_some(token))
            .ok_or(Failure::Unauthorized)?;
        // In constant time, against every token: neither how much of a
        // guess matched nor which token did may show in the timing.
        let mut operator = None;
        for token in &self.tokens {
            if bool::from(given.as_bytes().ct_eq(token.secret.as_bytes())) {
                operator = Some(token.operator.as_str());
            }
        }
        operator.ok_or(Failure::Unauthorized)
    }
}

/// `?name=`: the lock a route is for.
#[derive(Deserialize)]
pub(super) struct Named {
    name: String,
}

/// `GET /api`: the groups to show and whether the page offers the actions.
pub(super) async fn overview(State(shown): State<Arc<Shown>>) -> Json<Value> {
    Json(json!({
        "groups": shown.groups.keys().collect::<Vec<_>>(),
        "actions": !shown.tokens.is_empty(),
    }))
}

/// `GET /api/locks/{group}?contains=&after=&limit=`: a page of the
/// group's listing. The engine lists the whole group; the page is cut here.
pub(super) async fn list(
    State(shown): State<Arc<Shown>>,
    Path(group): Path<String>,
    Query(page): Query<Page>,
) -> Result<Json<Listing>, Failure> {
    Ok(Json(page.of(shown.locks(&group)?.list().await?)))
}

/// `GET /api/locks/{group}/lock?name=`.
pub(super) async fn show(
    State(shown): State<Arc<Shown>>,
    Path(group): Path<String>,
    Query(Named { name }): Query<Named>,
) -> Result<Json<LockView>, Failure> {
    Ok(Json(shown.locks(&group)?.get(name).inspect().await?))
}

/// `GET /api/locks/{group}/deadlocks`: the cycles of waits through the
/// group's locks, as `dlock deadlocks GROUP --json` prints them.
pub(super) async fn deadlocks(
    State(shown): State<Arc<Shown>>,
    Path(group): Path<String>,
) -> Result<Json<Vec<Cycle>>, Failure> {
    Ok(Json(shown.locks(&group)?.deadlocks().await?))
}

/// `?name=&permits=&if_fence=&if_owner=`: the lock an action is for (or
/// with `permits`, the semaphore), and the hold it is only for, by the
/// fence and owner digest the page showed.
#[derive(Deserialize)]
pub(super) struct Aimed {
    name: String,
    permits: Option<u32>,
    if_fence: Option<u64>,
    if_owner: Option<String>,
}

/// `POST /api/locks/{group}/release?name=&permits=&if_fence=&if_owner=`:
/// the holds ended ([`Acted`]).
pub(super) async fn release(
    State(shown): State<Arc<Shown>>,
    Path(group): Path<String>,
    Query(aimed): Query<Aimed>,
    headers: HeaderMap,
) -> Result<Json<Acted>, Failure> {
    let lock = format!("{group}/{}", aimed.name);
    let reached = Reached::ForcedOut(aimed.act(&shown, &headers, &group, true).await?);
    Ok(Json(Acted { lock, reached }))
}

/// `POST /api/locks/{group}/revoke?name=&permits=&if_fence=&if_owner=`:
/// the holders asked ([`Acted`]).
pub(super) async fn revoke(
    State(shown): State<Arc<Shown>>,
    Path(group): Path<String>,
    Query(aimed): Query<Aimed>,
    headers: HeaderMap,
) -> Result<Json<Acted>, Failure> {
    let lock = format!("{group}/{}", aimed.name);
    let reached = Reached::Asked(aimed.act(&shown, &headers, &group, false).await?);
    Ok(Json(Acted { lock, reached }))
}

impl Aimed {
    /// Forces out (`force`) or asks to let go the holds aimed at, once the
    /// request shows a token, in the name of its operator: how many it reached.
    async fn act(self, shown: &Shown, headers: &HeaderMap, group: &str, force: bool) -> Result<u32, Failure> {
        let operator = shown.authorize(headers)?;
        let locks = shown.locks(group)?;
        let only = Only {
            fence: self.if_fence,
            owner: self.if_owner,
        };
        let reached = match self.permits {
            Some(n) => {
                let semaphore = locks.semaphore(self.name, n).by(operator);
                match force {
                    true => semaphore.force_release_only(&only).await?,
                    false => semaphore.revoke_only(&only).await?,
                }
            }
            None => {
                let lock = locks.get(self.name).by(operator);
                match force {
                    true => lock.force_release_only(&only).await?,
                    false => lock.revoke_only(&only).await?,
                }
            }
        };
        Ok(reached)
    }
}
