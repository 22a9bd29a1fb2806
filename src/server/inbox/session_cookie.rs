//! The session cookie: the signed-in API key itself (base64url-encoded so that any key is a
//! valid cookie value), `HttpOnly` (page scripts cannot read it), `SameSite=Strict` (other sites'
//! requests do not carry it), `Path=/`, and `Secure` when the server is configured to be
//! reached over HTTPS. It has no expiry: it ends with the browser session or on sign-out.
//!
//! The key is checked against the configured keys on every request, so removing a key from the
//! configuration signs its sessions out.

use std::convert::Infallible;

use axum::extract::{FromRequestParts, OptionalFromRequestParts};
use axum::http::HeaderMap;
use axum::http::header::COOKIE;
use axum::http::request::Parts;
use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;

use super::csrf::CsrfKey;
use super::error::PageError;
use crate::server::AppState;
use crate::server::auth::{ApiKeys, Caller};
use crate::server::throttle::client_ip;

/// The cookie's name.
pub const NAME: &str = "resumable_inbox";

/// The longest API key the sign-in form accepts (a cookie holds about 4 KiB).
pub const MAX_KEY_BYTES: usize = 1024;

/// A signed-in caller and the cookie value that signed it in.
#[derive(Clone, Debug)]
pub struct Session {
    /// Who is signed in.
    pub caller: Caller,
    value: String,
}

impl Session {
    /// The CSRF token of this session's forms.
    pub fn csrf_token(&self, key: &CsrfKey) -> String {
        key.token(&self.value)
    }

    /// Whether `token` is this session's CSRF token.
    pub fn csrf_valid(&self, key: &CsrfKey, token: &str) -> bool {
        key.verify(&self.value, token)
    }

    /// The session of the request's cookie, if it holds a configured key (only the first
    /// [`MAX_PRESENTED`] values of the cookie are looked at).
    pub fn of(headers: &HeaderMap, keys: &ApiKeys) -> Option<Session> {
        presented(headers).take(MAX_PRESENTED).find_map(|value| {
            let key = decode(value)?;
            let caller = keys.caller(&key)?;
            Some(Session { caller, value: value.to_owned() })
        })
    }
}

/// The cookie value holding `key`.
fn encode(key: &str) -> String {
    URL_SAFE_NO_PAD.encode(key.as_bytes())
}

fn decode(value: &str) -> Option<String> {
    let bytes = URL_SAFE_NO_PAD.decode(value.as_bytes()).ok()?;
    (bytes.len() <= MAX_KEY_BYTES).then_some(())?;
    String::from_utf8(bytes).ok()
}

/// Every value of a cookie called [`NAME`] in the request's `Cookie` headers.
fn presented(headers: &HeaderMap) -> impl Iterator<Item = &str> {
    headers
        .get_all(COOKIE)
        .iter()
        .filter_map(|h| h.to_str().ok())
        .flat_map(|h| h.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .filter(|(name, _)| *name == NAME)
        .map(|(_, value)| value.trim_matches('"'))
}

fn attributes(secure: bool) -> &'static str {
    if secure { "HttpOnly; SameSite=Strict; Path=/; Secure" } else { "HttpOnly; SameSite=Strict; Path=/" }
}

/// The `Set-Cookie` value that signs `key` in.
pub fn set(key: &str, secure: bool) -> String {
    format!("{NAME}={}; {}", encode(key), attributes(secure))
}

/// The `Set-Cookie` value that signs out.
pub fn clear(secure: bool) -> String {
    format!("{NAME}=; {}; Max-Age=0", attributes(secure))
}

/// The most values of the session cookie one request may present.
pub const MAX_PRESENTED: usize = 4;

/// The request's session; a cookie with no configured key counts as a failed authentication of
/// the client, and a client with too many of those is refused for a while.
fn authenticate(parts: &Parts, state: &AppState) -> Result<Option<Session>, PageError> {
    let client = client_ip(parts);
    state.throttle.check(client).map_err(PageError::throttled)?;
    let session = Session::of(&parts.headers, &state.keys);
    if session.is_none() && presented(&parts.headers).next().is_some() {
        state.throttle.failed(client);
    }
    Ok(session)
}

impl FromRequestParts<AppState> for Session {
    type Rejection = PageError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Session, PageError> {
        authenticate(parts, state)?.ok_or_else(|| PageError::unauthorized("Sign in to continue."))
    }
}

impl OptionalFromRequestParts<AppState> for Session {
    type Rejection = Infallible;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Option<Session>, Infallible> {
        // A refused client sees the sign-in form, whose post is refused in turn.
        Ok(authenticate(parts, state).unwrap_or(None))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn headers(cookies: &[&str]) -> HeaderMap {
        let mut headers = HeaderMap::new();
        for c in cookies {
            headers.append(COOKIE, HeaderValue::from_str(c).unwrap());
        }
        headers
    }

    #[test]
    fn the_cookie_holds_a_configured_key() {
        let keys = ApiKeys::demo();
        let set = set("demo-acme", false);
        assert_eq!(set, "resumable_inbox=ZGVtby1hY21l; HttpOnly; SameSite=Strict; Path=/");
        assert!(super::set("demo-acme", true).ends_with("; Secure"));
        assert!(clear(false).contains("Max-Age=0"));
        let value = set.split(';').next().unwrap();
        let session = Session::of(&headers(&["theme=dark", &format!("a=b; {value}")]), &keys).unwrap();
        assert_eq!(session.caller.actor, "acme-demo");
        let key = CsrfKey::derive(&[1; 32]);
        assert!(session.csrf_valid(&key, &session.csrf_token(&key)));
        assert!(Session::of(&headers(&["resumable_inbox=bm90LWEta2V5"]), &keys).is_none(), "unknown key");
        assert!(Session::of(&headers(&["resumable_inbox=%%%"]), &keys).is_none());
        assert!(Session::of(&headers(&["other=ZGVtby1hY21l"]), &keys).is_none());
        assert!(Session::of(&headers(&[]), &keys).is_none());
    }
}
