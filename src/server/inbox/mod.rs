//! The approval inbox: server-rendered HTML pages next to the `/v1` API, for people who approve
//! or reject what scripts ask for.
//!
//! - `GET /`: the sign-in form, or the tenant's pending approvals (decision forms for approvers);
//! - `POST /login` (`key`), `POST /logout`: the session cookie ([`session_cookie`]);
//! - `GET /automations/{id}`: one automation, its requests, decisions, result and live events;
//! - `GET /automations/{id}/events?from=N`: its events as NDJSON, for the page's script;
//! - `POST /automations/{id}/decide`: decides the open round ([`decision_form`]);
//! - `GET /static/inbox.js`, `GET /static/inbox.css`, `GET /favicon.ico` (204).
//!
//! Posts that change anything need the session cookie *and* the session's CSRF token
//! ([`csrf`]); every value shown is escaped ([`html`]); every response carries the security
//! headers of [`headers`].

mod assets;
mod automation_page;
pub mod csrf;
pub mod decision_form;
mod error;
mod form;
mod format;
pub mod headers;
mod history_page;
pub mod html;
mod inbox_page;
mod layout;
mod pages;
mod request;
pub mod session_cookie;
mod sessions_page;

use axum::Router;
use axum::middleware;
use axum::routing::{get, post};

pub use csrf::CsrfKey;
pub use error::PageError;

use super::AppState;

/// How the inbox signs people in and protects its forms.
#[derive(Clone, Debug)]
pub struct InboxSettings {
    /// The key of the forms' CSRF tokens.
    pub csrf: CsrfKey,
    /// Whether the session cookie is marked `Secure` (only sent over HTTPS): set it when the
    /// server is reached over TLS, e.g. behind a terminating proxy; leave it off for plain
    /// `http://localhost`, where browsers would not send a `Secure` cookie back.
    pub secure_cookies: bool,
}

impl InboxSettings {
    /// Settings whose CSRF key derives from the server's secret, so tokens survive restarts.
    pub fn from_secret(secret: &[u8], secure_cookies: bool) -> InboxSettings {
        InboxSettings { csrf: CsrfKey::derive(secret), secure_cookies }
    }

    /// Settings with a random CSRF key of this process (forms shown before a restart stop working)
    /// and cookies without `Secure`.
    pub fn ephemeral() -> InboxSettings {
        InboxSettings { csrf: CsrfKey::random(), secure_cookies: false }
    }
}

/// The inbox's routes, with the security headers on every response.
pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/", get(pages::index))
        .route("/login", post(pages::login))
        .route("/logout", post(pages::logout))
        .route("/history", get(pages::history))
        .route("/sessions", get(pages::sessions))
        .route("/sessions/{id}", get(pages::session))
        .route("/automations/{id}", get(pages::automation))
        .route("/automations/{id}/events", get(pages::events))
        .route("/automations/{id}/decide", post(pages::decide))
        .route("/static/inbox.js", get(assets::script))
        .route("/static/inbox.css", get(assets::stylesheet))
        .route("/favicon.ico", get(assets::favicon))
        .layer(middleware::from_fn(headers::security_headers))
}
