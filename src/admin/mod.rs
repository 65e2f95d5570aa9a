//! A web page of who holds which lock and who waits, for an
//! [axum](https://docs.rs/axum) application to mount (cargo feature `admin`).
//!
//! ```no_run
//! # async fn serve() -> std::io::Result<()> {
//! let admin = dlock::admin::Admin::new(dlock::registry()).groups(["order", "stock"]);
//! let app = axum::Router::new().nest_service("/dlock", admin.router());
//! # let listener = tokio::net::TcpListener::bind("127.0.0.1:3000").await?;
//! # axum::serve(listener, app).await
//! # }
//! ```
//!
//! Mounted with `nest_service`, the page answers at `/dlock` and `/dlock/`;
//! axum's `nest` would route `/dlock` alone.
//!
//! Relative to where it is mounted:
//!
//! | route | answers |
//! |---|---|
//! | `GET /` | the page: a table per group, a page of it at a time, refreshed every second |
//! | `GET /api` | `{"groups": [...], "actions": bool}`: what the page shows |
//! | `GET /api/locks/{group}` | a page of the group's listing (below) |
//! | `GET /api/locks/{group}/lock?name=NAME` | one lock's view, as `dlock show GROUP/NAME --json` prints it, unwrapped from its one-element array |
//! | `GET /api/locks/{group}/deadlocks` | the cycles of waits through the group's locks, as `dlock deadlocks GROUP --json` prints them; the page marks their rows and names each cycle above the table |
//! | `POST /api/locks/{group}/release?name=NAME[&permits=N][&if_fence=F][&if_owner=D]` | [`Lock::force_release_only`](crate::Lock::force_release_only) (with `permits`, [`Semaphore::force_release_only`](crate::Semaphore::force_release_only)), with [`Admin::actions`] only |
//! | `POST /api/locks/{group}/revoke?name=NAME[&permits=N][&if_fence=F][&if_owner=D]` | [`Lock::revoke_only`](crate::Lock::revoke_only) (with `permits`, [`Semaphore::revoke_only`](crate::Semaphore::revoke_only)), with [`Admin::actions`] only |
//!
//! A lock's name goes in the query, percent-encoded, never in the path: a
//! browser rewrites the path segments `.` and `..`, names like any other.
//! An action with `if_fence` or `if_owner` reaches only the hold with that
//! fence or owner digest, checked by the engine as it acts: the page's
//! buttons send those of the holders they showed, after the operator
//! confirms, so a lock that changed hands since keeps its new holder. The
//! audit trail names who acted: `the admin page`, or with a token given by
//! [`Admin::operator`], `the admin page (<its name>)`.
//!
//! The listing comes a page at a time, sorted by name, each view as
//! `dlock locks GROUP --json` prints it:
//! `{"locks": [...], "before": 0, "total": 10000, "held": 9998, "waiting": 3, "more": true}`.
//! `?contains=TEXT` keeps the names holding `TEXT`, and the counts are of
//! those: `total` views, `held` of them held by someone, `waiting` requests
//! waiting for them. `?limit=N` takes `N` views (100 unless given, at most
//! 1000), and any more of its last name, which a lock and semaphores may
//! share; `?after=NAME` starts past `NAME`, the last of the page before.
//! `before` counts the views before the page; `more` says one follows. The
//! page is cut from the engine's listing of the whole group: the browser
//! receives one page, the engine is still read in full.
//!
//! A group not given to [`Admin::groups`] is 404. A failing engine is 502
//! with the error's text (which names the engine and its address, never a
//! secret), an engine lacking the records or the action 501; the page then
//! keeps the group's last rows, greyed, and says since when it fails.
//!
//! The page shows every name and label as text, never as markup: both come
//! from whoever takes locks. Owner ids never leave the process; the views
//! carry their digests only.
//!
//! Nothing here authenticates readers: mount the router behind whatever
//! guards the application's other internal pages. The actions need the
//! token besides, as `Authorization: Bearer <token>`; the page asks the
//! operator for it and keeps it in the tab's `sessionStorage`. A browser
//! sends that header to another origin only after a CORS preflight, which
//! the router never grants, so another site cannot make a visitor's
//! browser release a lock.

mod api;
mod listing;
mod page;

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::Router;
use axum::routing::{get, post};

use crate::{Locks, Registry};

/// Builds the admin [`Router`]: which registry, which groups, whether the
/// release and revoke actions are on.
pub struct Admin<'r> {
    registry: &'r Registry,
    groups: Vec<String>,
    tokens: Vec<Token>,
}

/// A token the actions take, and whom the audit trail names for it.
#[derive(Clone)]
struct Token {
    secret: String,
    operator: String,
}

impl<'r> Admin<'r> {
    /// An admin page of `registry`'s locks ([`crate::registry`] for the
    /// global one), showing no group until [`groups`](Self::groups) names some.
    pub fn new(registry: &'r Registry) -> Self {
        Admin {
            registry,
            groups: Vec::new(),
            tokens: Vec::new(),
        }
    }

    /// The groups the page shows and the API answers for; any other is 404.
    pub fn groups<I, S>(mut self, groups: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.groups.extend(groups.into_iter().map(Into::into));
        self
    }

    /// Turns on the release and revoke actions, for requests carrying
    /// `Authorization: Bearer <token>`. Off by default: a page anyone
    /// reaching it may read should not be a way to break a lock.
    ///
    /// # Panics
    ///
    /// If `token` is empty.
    pub fn actions(self, token: impl Into<String>) -> Self {
        self.with_token(token.into(), "the admin page".to_owned())
    }

    /// Turns on the actions, as [`actions`](Self::actions) does, for one
    /// operator's own token: the audit trail names who acted with it as
    /// `the admin page (<operator>)`. Give each operator one, and an act
    /// is traced to a person, not to whoever knew the shared token.
    ///
    /// # Panics
    ///
    /// If `token` is empty, or another token is the same.
    pub fn operator(self, operator: &str, token: impl Into<String>) -> Self {
        self.with_token(token.into(), format!("the admin page ({operator})"))
    }

    fn with_token(mut self, secret: String, operator: String) -> Self {
        assert!(!secret.is_empty(), "dlock::admin: the actions' token is empty");
        let taken = self.tokens.iter().any(|token| token.secret == secret);
        assert!(!taken, "dlock::admin: two of the actions' tokens are the same");
        self.tokens.push(Token { secret, operator });
        self
    }

    /// The routes, to mount with [`Router::nest_service`] (or merge at the root).
    pub fn router<S>(&self) -> Router<S>
    where
        S: Clone + Send + Sync + 'static,
    {
        let groups = (self.groups.iter())
            .map(|group| (group.clone(), self.registry.locks(group)))
            .collect();
        let shown = Shown {
            groups,
            tokens: self.tokens.clone(),
        };
        Router::new()
            .route("/", get(page::page))
            .route("/api", get(api::overview))
            .route("/api/locks/{group}", get(api::list))
            .route("/api/locks/{group}/lock", get(api::show))
            .route("/api/locks/{group}/deadlocks", get(api::deadlocks))
            .route("/api/locks/{group}/release", post(api::release))
            .route("/api/locks/{group}/revoke", post(api::revoke))
            .with_state(Arc::new(shown))
    }
}

/// What the handlers share: the groups shown and the actions' tokens.
struct Shown {
    groups: BTreeMap<String, Locks>,
    tokens: Vec<Token>,
}
