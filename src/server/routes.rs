//! The `/v1` handlers: plain async functions; extractors authenticate and validate.

use axum::Json;
use axum::body::Body;
use axum::extract::{Path, Query, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use futures_util::{StreamExt, stream};
use serde::Deserialize;
use serde_json::{Value, json};

use super::AppState;
use super::auth::{Caller, Role};
use super::body::ApiJson;
use super::error::ApiError;
use super::stream_slots::StreamSlot;
use crate::automation::{Decision, DecisionBatch};
use resumable_workflow::{RunId, StreamReader};
use tokio::sync::watch;

/// The largest script accepted.
pub const MAX_SOURCE_BYTES: usize = 256 * 1024;

/// The most approvals one listing returns.
const MAX_APPROVALS: usize = 500;

/// `POST /v1/automations`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct SubmitRequest {
    source: String,
    #[serde(default)]
    context: Value,
    #[serde(default)]
    idempotency_key: Option<String>,
}

/// `POST /v1/automations/{id}/decisions`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DecisionsRequest {
    decisions: Vec<Decision>,
}

/// `?from=N` of the events stream.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EventsQuery {
    #[serde(default)]
    pub(super) from: u64,
}

/// `id` as a run id, when it has the shape of one.
pub(super) fn run_id(id: &str) -> Option<RunId> {
    let valid = id.len() <= 64 && id.starts_with("run_") && id[4..].bytes().all(|b| b.is_ascii_hexdigit());
    valid.then(|| RunId::from(id))
}

/// The automation id in a path; anything that cannot be one is 404.
pub(super) fn automation_id(id: &str) -> Result<RunId, ApiError> {
    run_id(id).ok_or_else(|| ApiError::not_found("no such automation"))
}

/// Submits a script; 202 with its id.
pub async fn submit(
    State(state): State<AppState>,
    caller: Caller,
    ApiJson(req): ApiJson<SubmitRequest>,
) -> Result<Response, ApiError> {
    caller.require(Role::SUBMITTER)?;
    if req.source.len() > MAX_SOURCE_BYTES {
        return Err(ApiError::too_large(format!("the script is larger than {MAX_SOURCE_BYTES} bytes")));
    }
    if req.idempotency_key.as_ref().is_some_and(|k| k.is_empty() || k.len() > 200 || k.contains('\0')) {
        return Err(ApiError::bad_request("idempotencyKey must have 1 to 200 characters, none of them NUL"));
    }
    let id =
        state.automations.submit(&caller.tenant, &req.source, req.context, caller.actor(), req.idempotency_key).await?;
    Ok((StatusCode::ACCEPTED, Json(json!({ "id": id }))).into_response())
}

/// One automation; its `source` and `calls` only for a caller that reads automations' contents
/// (`null` for an auditor, say).
pub async fn get(
    State(state): State<AppState>,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let view = state.automations.get(&caller.tenant, &automation_id(&id)?).await?;
    let mut json = view.to_json();
    if !caller.reads_automations() {
        json["source"] = Value::Null;
        json["calls"] = Value::Null;
    }
    Ok(Json(json))
}

/// The automation's events as NDJSON (`{"index", "event"}` per line), live until it ends.
pub async fn events(
    State(state): State<AppState>,
    caller: Caller,
    Path(id): Path<String>,
    query: Result<Query<EventsQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Response, ApiError> {
    caller.require_any(&[Role::SUBMITTER, Role::APPROVER])?;
    let Query(query) = query.map_err(|e| ApiError::bad_request(format!("invalid query: {}", e.body_text())))?;
    let id = automation_id(&id)?;
    let slot = state.streams.take(&caller.key_id)?;
    let reader = state.automations.events(&caller.tenant, &id, query.from).await?;
    Ok(ndjson_events(reader, state.shutting_down, slot))
}

/// A stream's events as an NDJSON response (`{"index", "event"}` per line), live until the run
/// ends or the server shuts down. A client that disconnects only drops its reader.
pub(super) fn ndjson_events(reader: StreamReader, shutting_down: watch::Receiver<bool>, slot: StreamSlot) -> Response {
    let lines = stream::unfold(reader, |mut reader| async move {
        let line = reader.next().await?.map(|(index, event)| json!({ "index": index, "event": event }));
        Some((line, reader))
    });
    ndjson(lines, shutting_down, slot)
}

/// `lines` as an NDJSON response, one JSON value per line, until they end, one fails (logged) or
/// the server shuts down; the stream holds `slot` as long as it is open.
pub(super) fn ndjson<E: std::fmt::Display>(
    lines: impl futures_util::Stream<Item = Result<Value, E>> + Send + 'static,
    shutting_down: watch::Receiver<bool>,
    slot: StreamSlot,
) -> Response {
    let lines = stream::unfold((Box::pin(lines), shutting_down, slot), |(mut lines, mut stop, slot)| async move {
        let next = tokio::select! {
            next = lines.next() => next?,
            // A dropped sender (no graceful shutdown) disables this branch.
            Ok(_) = stop.wait_for(|stopping| *stopping) => return None,
        };
        match next {
            Ok(value) => {
                let mut line = value.to_string();
                line.push('\n');
                Some((Ok::<_, std::io::Error>(line), (lines, stop, slot)))
            }
            Err(e) => {
                tracing::warn!(error = %e, "event stream ended early");
                None
            }
        }
    });
    ([(header::CONTENT_TYPE, "application/x-ndjson")], Body::from_stream(lines)).into_response()
}

/// The caller's tenant's pending approvals, oldest first.
pub async fn approvals(State(state): State<AppState>, caller: Caller) -> Result<Json<Value>, ApiError> {
    caller.require(Role::APPROVER)?;
    let approvals = state.automations.pending_approvals(&caller.tenant, MAX_APPROVALS).await?;
    Ok(Json(json!({ "approvals": approvals })))
}

/// `?limit=N` of the webhook deliveries.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeliveriesQuery {
    #[serde(default = "default_deliveries")]
    limit: usize,
}

fn default_deliveries() -> usize {
    100
}

/// The most delivery attempts one listing returns.
const MAX_DELIVERIES: usize = 1_000;

/// The caller's tenant's newest webhook delivery attempts, newest first.
pub async fn webhook_deliveries(
    State(state): State<AppState>,
    caller: Caller,
    Query(query): Query<DeliveriesQuery>,
) -> Result<Json<Value>, ApiError> {
    let limit = query.limit.clamp(1, MAX_DELIVERIES);
    let attempts = state.automations.deliveries(&caller.tenant, limit).await?;
    Ok(Json(json!({ "deliveries": attempts })))
}

/// The host functions the caller's tenant may call: namespaces, parameters and policies.
pub async fn functions(State(state): State<AppState>, caller: Caller) -> Json<Value> {
    Json(state.automations.connectors().catalog(Some(&caller.tenant)))
}

/// The same functions as a TypeScript declaration, for script authors and models.
pub async fn functions_typescript(State(state): State<AppState>, caller: Caller) -> Response {
    let declaration = state.automations.connectors().typescript(Some(&caller.tenant));
    ([(header::CONTENT_TYPE, "application/typescript; charset=utf-8")], declaration).into_response()
}

/// Decides the open round of an automation; 202 once the batch is delivered.
pub async fn decide(
    State(state): State<AppState>,
    caller: Caller,
    Path(id): Path<String>,
    ApiJson(req): ApiJson<DecisionsRequest>,
) -> Result<Response, ApiError> {
    // Which roles may decide depends on each request: the automation checks them.
    let batch = DecisionBatch { decisions: req.decisions, actor: caller.actor.clone() };
    let roles: Vec<&str> = caller.roles.iter().map(Role::as_str).collect();
    let round =
        state.automations.decide(&caller.tenant, &automation_id(&id)?, batch, &roles, Some(&caller.key_id)).await?;
    crate::fault::reached(crate::fault::FaultPoint::DecisionCommitted);
    tracing::info!(automation = %id, round, actor = %caller.actor, "decision delivered");
    Ok((StatusCode::ACCEPTED, Json(json!({ "id": id, "round": round }))).into_response())
}

/// Cancels an automation.
pub async fn cancel(
    State(state): State<AppState>,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    caller.require(Role::SUBMITTER)?;
    let status = state.automations.cancel(&caller.tenant, &automation_id(&id)?, caller.actor()).await?;
    Ok((StatusCode::ACCEPTED, Json(json!({ "id": id, "status": status }))).into_response())
}

/// Liveness.
pub async fn health() -> Json<Value> {
    Json(json!({ "ok": true }))
}

/// Any other path.
pub async fn fallback() -> ApiError {
    ApiError::not_found("no such endpoint")
}

/// A known path with another method.
pub async fn method_not_allowed() -> ApiError {
    ApiError::new(StatusCode::METHOD_NOT_ALLOWED, "METHOD_NOT_ALLOWED", "this endpoint does not take this method")
}
