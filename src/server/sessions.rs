//! The `/v1/sessions` handlers: start a session, queue commands, follow its events, cancel the
//! running command, destroy it. Any request for an ended or unknown session answers 410 with a
//! body that says what happened and how to go on.

use std::time::Duration;

use axum::Json;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::json;

use super::AppState;
use super::auth::{Caller, Role};
use super::body::{ApiJson, ApiJsonOrDefault};
use super::error::ApiError;
use super::routes::{EventsQuery, MAX_SOURCE_BYTES, ndjson_events, run_id};
use crate::session::{SessionError, SessionOptions};
use resumable_workflow::RunId;

/// The command that destroys the session, queued like any other.
pub const DESTROY_COMMAND: &str = "/destroy";

/// `POST /v1/sessions`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct StartRequest {
    #[serde(default)]
    idle_ms: Option<u64>,
    #[serde(default)]
    command_timeout_ms: Option<u64>,
}

/// `POST /v1/sessions/{id}/commands`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CommandRequest {
    source: String,
}

/// A failed session request: the caller's errors (auth, role, body) keep their own status and
/// code; a session that is gone is 410 with what happened and how to go on.
#[derive(Debug)]
#[non_exhaustive]
pub enum Failure {
    /// An ordinary API error.
    Api(ApiError),
    /// An error of the session service.
    Session(SessionError),
}

impl IntoResponse for Failure {
    fn into_response(self) -> Response {
        let error = match self {
            Failure::Api(e) => return e.into_response(),
            Failure::Session(e) => e,
        };
        let message = error.to_string();
        match error {
            SessionError::Gone { id, status } => {
                let body = json!({ "error": {
                    "code": "SESSION_GONE",
                    "message": message,
                    "session": id,
                    "status": status,
                    "retryable": false,
                    "next": "start a new session with POST /v1/sessions",
                }});
                (StatusCode::GONE, Json(body)).into_response()
            }
            SessionError::Invalid(_) => ApiError::bad_request(message).into_response(),
            SessionError::NotRunning => ApiError::new(StatusCode::CONFLICT, "NOT_RUNNING", message).into_response(),
            SessionError::Full(_) => ApiError::new(StatusCode::CONFLICT, "SESSION_FULL", message).into_response(),
            SessionError::QuotaExceeded(_) => {
                ApiError::new(StatusCode::TOO_MANY_REQUESTS, "QUOTA_EXCEEDED", message).into_response()
            }
            SessionError::Internal(_) => ApiError::internal(message).into_response(),
            // The cause is in the log; the caller learns that the act stands.
            SessionError::Audit(_) => ApiError::audit_unavailable().into_response(),
        }
    }
}

impl From<ApiError> for Failure {
    fn from(e: ApiError) -> Self {
        Failure::Api(e)
    }
}

impl From<SessionError> for Failure {
    fn from(e: SessionError) -> Self {
        Failure::Session(e)
    }
}

fn session_id(id: &str) -> Result<RunId, SessionError> {
    run_id(id).ok_or_else(|| SessionError::Gone { id: id.chars().take(64).collect(), status: "unknown" })
}

/// Starts a session; 201 with its id.
pub async fn start(
    State(state): State<AppState>,
    caller: Caller,
    ApiJsonOrDefault(req): ApiJsonOrDefault<StartRequest>,
) -> Result<Response, Failure> {
    caller.require(Role::SUBMITTER)?;
    let defaults = SessionOptions::default();
    let options = SessionOptions {
        idle: req.idle_ms.map_or(defaults.idle, Duration::from_millis),
        command_timeout: req.command_timeout_ms.map_or(defaults.command_timeout, Duration::from_millis),
    };
    let id = state.automations.sessions().start(&caller.tenant, caller.actor(), options).await?;
    Ok((StatusCode::CREATED, Json(json!({ "id": id, "status": "active" }))).into_response())
}

/// One session.
pub async fn get(State(state): State<AppState>, caller: Caller, Path(id): Path<String>) -> Result<Response, Failure> {
    caller.require_any(&[Role::SUBMITTER, Role::APPROVER])?;
    let view = state.automations.sessions().get(&caller.tenant, &session_id(&id)?).await?;
    Ok(Json(view).into_response())
}

/// Queues a command; 202 with its number. The command `/destroy` ends the session instead.
pub async fn command(
    State(state): State<AppState>,
    caller: Caller,
    Path(id): Path<String>,
    ApiJson(req): ApiJson<CommandRequest>,
) -> Result<Response, Failure> {
    caller.require(Role::SUBMITTER)?;
    let id = session_id(&id)?;
    let sessions = state.automations.sessions();
    if req.source.trim() == DESTROY_COMMAND {
        sessions.destroy(&caller.tenant, &id, caller.actor()).await?;
        return Ok((StatusCode::ACCEPTED, Json(json!({ "session": id, "status": "destroyed" }))).into_response());
    }
    if req.source.len() > MAX_SOURCE_BYTES {
        return Err(ApiError::too_large(format!("the script is larger than {MAX_SOURCE_BYTES} bytes")).into());
    }
    let command = sessions.command(&caller.tenant, &id, &req.source, caller.actor()).await?;
    Ok((StatusCode::ACCEPTED, Json(json!({ "session": id, "command": command }))).into_response())
}

/// Cancels the running command; 202 with its number.
pub async fn cancel(
    State(state): State<AppState>,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<Response, Failure> {
    caller.require(Role::SUBMITTER)?;
    let id = session_id(&id)?;
    let command = state.automations.sessions().cancel_command(&caller.tenant, &id, caller.actor()).await?;
    Ok((StatusCode::ACCEPTED, Json(json!({ "session": id, "command": command, "status": "cancelled" })))
        .into_response())
}

/// Destroys the session; 202.
pub async fn destroy(
    State(state): State<AppState>,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<Response, Failure> {
    caller.require(Role::SUBMITTER)?;
    let id = session_id(&id)?;
    state.automations.sessions().destroy(&caller.tenant, &id, caller.actor()).await?;
    Ok((StatusCode::ACCEPTED, Json(json!({ "session": id, "status": "destroyed" }))).into_response())
}

/// The session's events as NDJSON from `?from=N`: the history, then live. Disconnecting only
/// detaches the client; the session and its command go on.
pub async fn events(
    State(state): State<AppState>,
    caller: Caller,
    Path(id): Path<String>,
    query: Result<Query<EventsQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Response, Failure> {
    caller.require_any(&[Role::SUBMITTER, Role::APPROVER])?;
    let Query(query) = query.map_err(|e| ApiError::bad_request(format!("invalid query: {}", e.body_text())))?;
    let slot = state.streams.take(&caller.key_id)?;
    let reader = state.automations.sessions().events(&caller.tenant, &session_id(&id)?, query.from).await?;
    Ok(ndjson_events(reader, state.shutting_down, slot))
}
