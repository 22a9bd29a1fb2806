//! The JSON body extractor of the API: size-limited, strictly typed, with our error shape.

use axum::body::Bytes;
use axum::extract::{FromRequest, Request};
use axum::http::StatusCode;
use serde::de::DeserializeOwned;

use super::error::ApiError;

/// The largest request body the API reads (a 256 KiB script may grow when JSON-escaped).
pub const MAX_BODY_BYTES: usize = 1024 * 1024;

/// When a request's body must have arrived whole: set per request by the server's connections
/// ([`super::ConnectionLimits::body_timeout`] after its headers). Reading a body past it is 408
/// `REQUEST_TIMEOUT`, so a client that sends a body a byte at a time cannot hold a connection;
/// once the body is read, the handler runs to its end, however long that takes.
#[derive(Clone, Copy, Debug)]
pub struct BodyDeadline(pub tokio::time::Instant);

/// The request's body, within its [`BodyDeadline`] (none when the request has none).
pub(super) async fn read_body<S: Send + Sync>(req: Request, state: &S) -> Result<Bytes, ApiError> {
    let deadline = req.extensions().get::<BodyDeadline>().copied();
    let read = Bytes::from_request(req, state);
    let read = match deadline {
        Some(BodyDeadline(at)) => tokio::time::timeout_at(at, read).await.map_err(|_| {
            ApiError::new(StatusCode::REQUEST_TIMEOUT, "REQUEST_TIMEOUT", "the request body did not arrive in time")
        })?,
        None => read.await,
    };
    read.map_err(|rejection| {
        if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::too_large(format!("the request body is larger than {MAX_BODY_BYTES} bytes"))
        } else {
            ApiError::bad_request("the request body could not be read")
        }
    })
}

/// A JSON request body of type `T`: malformed JSON, unknown fields and wrong types are 400 with
/// the parser's message; a body over [`MAX_BODY_BYTES`] is 413.
#[derive(Debug)]
pub struct ApiJson<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for ApiJson<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<ApiJson<T>, ApiError> {
        match read_json(req, state).await? {
            Some(value) => Ok(ApiJson(value)),
            None => Err(ApiError::bad_request("a JSON body is required")),
        }
    }
}

/// Like [`ApiJson`], with `T::default()` for an empty body.
#[derive(Debug)]
pub struct ApiJsonOrDefault<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned + Default> FromRequest<S> for ApiJsonOrDefault<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<ApiJsonOrDefault<T>, ApiError> {
        Ok(ApiJsonOrDefault(read_json(req, state).await?.unwrap_or_default()))
    }
}

/// The body decoded as `T`, or `None` when it is empty.
async fn read_json<S: Send + Sync, T: DeserializeOwned>(req: Request, state: &S) -> Result<Option<T>, ApiError> {
    let bytes = read_body(req, state).await?;
    if bytes.is_empty() {
        return Ok(None);
    }
    serde_json::from_slice(&bytes).map(Some).map_err(|e| ApiError::bad_request(format!("invalid JSON body: {e}")))
}
