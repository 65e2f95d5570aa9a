//! The page: one HTML file, its CSS and script inline, which reads the JSON
//! routes from the browser.

use axum::http::header::{CACHE_CONTROL, CONTENT_SECURITY_POLICY, CONTENT_TYPE};
use axum::response::IntoResponse;

const PAGE: &str = include_str!("page.html");

/// Nothing loads from elsewhere, and no other site may frame the page to
/// trick a click on its buttons.
const POLICY: &str = "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; \
     connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

/// `GET /`.
pub(super) async fn page() -> impl IntoResponse {
    (
        [
            (CONTENT_TYPE, "text/html; charset=utf-8"),
            (CONTENT_SECURITY_POLICY, POLICY),
            (CACHE_CONTROL, "no-store"),
        ],
        PAGE,
    )
}
