//! `GET /v1/automations` and `GET /v1/sessions`: the caller's tenant's runs, newest first, a page
//! at a time.

use axum::Json;
use axum::extract::{Query, State};
use resumable_workflow::{RunCursor, RunStatus};
use serde::Deserialize;
use serde_json::{Value, json};

use super::AppState;
use super::auth::{Caller, Role};
use super::error::ApiError;
use super::routes::run_id;
use crate::automation::MAX_HISTORY_PAGE;
use crate::session::SessionsShown;

/// The items of a page unless `limit` says.
const DEFAULT_LIMIT: u32 = 50;

/// `?status=&cursor=&limit=`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HistoryQuery {
    #[serde(default)]
    status: Option<String>,
    #[serde(default)]
    cursor: Option<String>,
    #[serde(default)]
    limit: Option<String>,
}

impl HistoryQuery {
    /// The cursor and the limit, or what is wrong with them.
    fn page(&self) -> Result<(Option<RunCursor>, u32), ApiError> {
        let limit = match self.limit.as_deref() {
            None => DEFAULT_LIMIT,
            Some(limit) => limit
                .parse::<u32>()
                .ok()
                .filter(|n| (1..=MAX_HISTORY_PAGE).contains(n))
                .ok_or_else(|| ApiError::bad_request(format!("limit must be between 1 and {MAX_HISTORY_PAGE}")))?,
        };
        let cursor = self.cursor.as_deref().map(parse_cursor).transpose()?;
        Ok((cursor, limit))
    }
}

/// A page's `next`: the creation time and id of its last run, `MS.ID`.
pub(super) fn cursor_text(cursor: &RunCursor) -> String {
    format!("{}.{}", cursor.created_at_ms, cursor.run_id)
}

pub(super) fn parse_cursor(text: &str) -> Result<RunCursor, ApiError> {
    let invalid = || ApiError::bad_request("cursor must be a page's next, as it was given");
    let (at, id) = text.split_once('.').ok_or_else(invalid)?;
    let created_at_ms = at.parse::<i64>().ok().filter(|ms| *ms >= 0).ok_or_else(invalid)?;
    Ok(RunCursor { created_at_ms, run_id: run_id(id).ok_or_else(invalid)? })
}

/// The caller's tenant's automations, newest first: `{automations, next}`, filtered by
/// `status` (one or several, comma-separated). Needs the submitter or the approver role.
pub async fn automations(
    State(state): State<AppState>,
    caller: Caller,
    query: Result<Query<HistoryQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<Value>, ApiError> {
    caller.require_any(&[Role::SUBMITTER, Role::APPROVER])?;
    let Query(query) = query.map_err(|e| ApiError::bad_request(format!("invalid query: {}", e.body_text())))?;
    let (cursor, limit) = query.page()?;
    let statuses = match query.status.as_deref() {
        None | Some("") => Vec::new(),
        Some(list) => list.split(',').map(|s| s.parse::<RunStatus>()).collect::<Result<_, _>>().map_err(|_| {
            ApiError::bad_request("status must be pending, running, waiting, completed, failed or cancelled")
        })?,
    };
    let page = state.automations.list(&caller.tenant, &statuses, cursor, limit).await?;
    let automations: Vec<Value> = page.items.iter().map(|a| a.to_json()).collect();
    Ok(Json(json!({ "automations": automations, "next": page.next.as_ref().map(cursor_text) })))
}

/// The caller's tenant's sessions, newest first: `{sessions, next}`, filtered by `status`
/// (`live` or `ended`). Needs the submitter or the approver role.
pub async fn sessions(
    State(state): State<AppState>,
    caller: Caller,
    query: Result<Query<HistoryQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<Value>, ApiError> {
    caller.require_any(&[Role::SUBMITTER, Role::APPROVER])?;
    let Query(query) = query.map_err(|e| ApiError::bad_request(format!("invalid query: {}", e.body_text())))?;
    let (cursor, limit) = query.page()?;
    let shown = match query.status.as_deref() {
        None | Some("") => SessionsShown::All,
        Some("live") => SessionsShown::Live,
        Some("ended") => SessionsShown::Ended,
        Some(_) => return Err(ApiError::bad_request("status must be live or ended")),
    };
    let page = state
        .automations
        .sessions()
        .list(&caller.tenant, shown, cursor, limit)
        .await
        .map_err(|e| ApiError::internal(e.to_string()))?;
    let sessions: Vec<Value> = page.items.iter().map(|s| s.to_json()).collect();
    Ok(Json(json!({ "sessions": sessions, "next": page.next.as_ref().map(cursor_text) })))
}
