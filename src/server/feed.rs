//! `GET /v1/events?from=CURSOR`: the caller's tenant's feed, every event of its automations and
//! sessions as NDJSON, from a cursor on, live.

use axum::extract::{Query, State};
use axum::response::Response;
use futures_util::stream;

use super::AppState;
use super::auth::{Caller, Role};
use super::error::ApiError;
use super::routes::{EventsQuery, ndjson};

/// The feed from `?from=CURSOR` (the first event when absent) as NDJSON, one
/// `{cursor, kind, id, index, event}` per line, open until the client leaves or the server
/// shuts down. A client that reconnects with the last cursor it saw plus one misses nothing and
/// sees nothing twice. Needs the submitter or the approver role.
pub async fn feed(
    State(state): State<AppState>,
    caller: Caller,
    query: Result<Query<EventsQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Response, ApiError> {
    caller.require_any(&[Role::SUBMITTER, Role::APPROVER])?;
    let Query(query) = query.map_err(|e| ApiError::bad_request(format!("invalid query: {}", e.body_text())))?;
    let feed = state.automations.feed(&caller.tenant, query.from);
    let lines = stream::unfold(feed, |mut feed| async move {
        let line = match feed.next().await {
            Ok(event) => serde_json::to_value(event).map_err(|e| e.to_string()),
            Err(e) => Err(e.to_string()),
        };
        Some((line, feed))
    });
    Ok(ndjson(lines, state.shutting_down))
}
