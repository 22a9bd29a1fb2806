//! `GET /v1/events?from=CURSOR`: the caller's tenant's feed, every event of its automations and
//! sessions as NDJSON, from a cursor on, live.

use std::time::Duration;

use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::Response;
use futures_util::stream;
use serde::Deserialize;
use serde_json::json;

use super::AppState;
use super::auth::{Caller, Role};
use super::error::ApiError;
use super::routes::ndjson;

/// How long the feed stays silent at most: then it sends a heartbeat line, so that proxies keep
/// the connection and a client that left is noticed.
pub const HEARTBEAT: Duration = Duration::from_secs(20);

/// `?from=`: a cursor (the first event to send; 1, or 0, is the first), or `latest` for only what
/// comes next.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FeedQuery {
    #[serde(default)]
    from: Option<String>,
}

/// The feed from `?from=` as NDJSON, one `{cursor, kind, id, index, event}` per line, and a
/// `{"heartbeat": true, "next": CURSOR}` line after [`HEARTBEAT`] without one; open until the
/// client leaves or the server shuts down. A client that reconnects with the last cursor it saw
/// plus one misses nothing and sees nothing twice. A cursor beyond the next one is 409
/// `CURSOR_AHEAD`. Needs the submitter or the approver role.
pub async fn feed(
    State(state): State<AppState>,
    caller: Caller,
    query: Result<Query<FeedQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Response, ApiError> {
    caller.require_any(&[Role::SUBMITTER, Role::APPROVER])?;
    let Query(query) = query.map_err(|e| ApiError::bad_request(format!("invalid query: {}", e.body_text())))?;
    let head = state.automations.feed_head(&caller.tenant).await?;
    let from = match query.from.as_deref() {
        None => 1,
        Some("latest") => head + 1,
        Some(cursor) => cursor.parse::<u64>().map_err(|_| {
            ApiError::bad_request("from must be a cursor (a whole number, as a line's cursor plus one) or latest")
        })?,
    };
    if from > head + 1 {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "CURSOR_AHEAD",
            format!("the feed's last cursor is {head}: read from {} or less", head + 1),
        ));
    }
    let slot = state.streams.take(&caller.key_id)?;
    let feed = state.automations.feed(&caller.tenant, from);
    let lines = stream::unfold(feed, |mut feed| async move {
        let line = match tokio::time::timeout(HEARTBEAT, feed.next()).await {
            Err(_) => Ok(json!({ "heartbeat": true, "next": feed.next_cursor() })),
            Ok(Ok(event)) => serde_json::to_value(event).map_err(|e| e.to_string()),
            Ok(Err(e)) => Err(e.to_string()),
        };
        Some((line, feed))
    });
    Ok(ndjson(lines, state.shutting_down, slot))
}
