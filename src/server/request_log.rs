//! A request id and a span for every HTTP request.
//!
//! Each request gets an id: the `x-request-id` header it came with when that is a short token
//! of letters, digits, `-`, `_`, `.` and `:` (a proxy's or the client's id, so that their logs and
//! ours match), or else a new UUID. The id is returned in the response's `x-request-id` header,
//! and every event logged while the request is handled is in its span, `request`, with the
//! method, the path (never the query string, which may hold secrets) and the id. Headers
//! (`Authorization`, cookies) and bodies are never logged. When the response starts, one event at
//! `info` says its status and latency; a 5xx is also logged as an error.

use axum::extract::Request;
use axum::http::HeaderName;
use tower_http::LatencyUnit;
use tower_http::classify::{ServerErrorsAsFailures, SharedClassifier};
use tower_http::request_id::{MakeRequestUuid, PropagateRequestIdLayer, RequestId, SetRequestIdLayer};
use tower_http::trace::{DefaultOnRequest, DefaultOnResponse, MakeSpan, TraceLayer};
use tracing::Level;

/// The header that carries the request id, both ways.
const REQUEST_ID_HEADER: HeaderName = HeaderName::from_static("x-request-id");

/// The longest incoming request id kept; a longer one is replaced.
const MAX_INCOMING_ID: usize = 128;

/// Gives each request without a (well-formed) id a new one (the outermost of the three layers).
pub(super) fn set_id() -> SetRequestIdLayer<MakeRequestUuid> {
    SetRequestIdLayer::new(REQUEST_ID_HEADER, MakeRequestUuid)
}

/// Copies the request's id to its response.
pub(super) fn propagate_id() -> PropagateRequestIdLayer {
    PropagateRequestIdLayer::new(REQUEST_ID_HEADER)
}

/// The span of each request, and its events.
pub(super) type Trace =
    TraceLayer<SharedClassifier<ServerErrorsAsFailures>, RequestSpan, DefaultOnRequest, DefaultOnResponse>;

/// The span of each request ([`RequestSpan`]), an event at `debug` when it starts and one at
/// `info` when its response starts.
pub(super) fn trace() -> Trace {
    TraceLayer::new_for_http()
        .make_span_with(RequestSpan)
        .on_request(DefaultOnRequest::new().level(Level::DEBUG))
        .on_response(DefaultOnResponse::new().level(Level::INFO).latency_unit(LatencyUnit::Millis))
}

/// Makes the `request` span: `method`, `path` and `request_id`; no header, no query, no body.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct RequestSpan;

impl<B> MakeSpan<B> for RequestSpan {
    fn make_span(&mut self, request: &axum::http::Request<B>) -> tracing::Span {
        let id = request.extensions().get::<RequestId>().and_then(|id| id.header_value().to_str().ok());
        tracing::info_span!(
            "request",
            method = %request.method(),
            path = request.uri().path(),
            request_id = id.unwrap_or_default(),
        )
    }
}

/// Removes an incoming `x-request-id` that is not a well-formed id, so that [`set_id`] gives the
/// request a new one: the log never holds a caller's arbitrary text as an id.
pub(super) async fn drop_malformed_id(mut request: Request) -> Request {
    let keep = request.headers().get(&REQUEST_ID_HEADER).is_none_or(|id| well_formed(id.as_bytes()));
    if !keep {
        request.headers_mut().remove(&REQUEST_ID_HEADER);
    }
    request
}

/// Whether `id` may be kept as a request's id.
fn well_formed(id: &[u8]) -> bool {
    !id.is_empty()
        && id.len() <= MAX_INCOMING_ID
        && id.iter().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b':'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_of_proxies_are_kept_and_anything_else_is_not() {
        assert!(well_formed(b"3f2a9c1e-7b4d-4e8a-9c1f-0a2b3c4d5e6f"));
        assert!(well_formed(b"req_01HX:edge.7"));
        assert!(!well_formed(b""));
        assert!(!well_formed(b"Bearer key-alice-0001"));
        assert!(!well_formed(b"a\"b"));
        assert!(!well_formed("é".as_bytes()));
        assert!(!well_formed(&[b'a'; MAX_INCOMING_ID + 1]));
        assert!(well_formed(&[b'a'; MAX_INCOMING_ID]));
    }
}
