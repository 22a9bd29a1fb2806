//! The static files of the inbox, compiled into the binary: the page script (which follows an
//! automation's events live) and the stylesheet; and no favicon.

use axum::http::StatusCode;
use axum::http::header::{CACHE_CONTROL, CONTENT_TYPE};
use axum::response::IntoResponse;

/// `GET /static/inbox.js`.
pub async fn script() -> impl IntoResponse {
    ([(CONTENT_TYPE, "text/javascript; charset=utf-8"), (CACHE_CONTROL, "no-cache")], include_str!("assets/inbox.js"))
}

/// `GET /static/inbox.css`.
pub async fn stylesheet() -> impl IntoResponse {
    ([(CONTENT_TYPE, "text/css; charset=utf-8"), (CACHE_CONTROL, "no-cache")], include_str!("assets/inbox.css"))
}

/// `GET /favicon.ico`: nothing (204), so browsers do not log a missing icon.
pub async fn favicon() -> StatusCode {
    StatusCode::NO_CONTENT
}
