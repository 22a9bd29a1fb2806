//! `GET /v1/audit`: the caller's tenant's audit log, in order, a page at a time.

use axum::Json;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use serde::Deserialize;
use serde_json::{Value, json};

use super::AppState;
use super::auth::{Caller, Role};
use super::error::ApiError;
use crate::audit::{AuditError, MAX_PAGE};

/// The entries a page has unless `limit` says.
const DEFAULT_LIMIT: usize = 100;

/// `?from=CURSOR&limit=N`: the entry number to start at (1 by default: the page's `next` is the
/// cursor of the next page) and how many entries to return (1 to [`MAX_PAGE`]).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AuditQuery {
    #[serde(default)]
    from: Option<String>,
    #[serde(default)]
    limit: Option<String>,
}

impl AuditQuery {
    /// The cursor and the limit, or what is wrong with them.
    fn parse(&self) -> Result<(u64, usize), ApiError> {
        let number = |value: &str| value.parse::<u64>().ok().filter(|n| (1..=i64::MAX as u64).contains(n));
        let from = match self.from.as_deref() {
            None => 1,
            Some(cursor) => number(cursor).ok_or_else(|| {
                ApiError::bad_request("from must be a cursor: an entry number of 1 or more, as a page's next")
            })?,
        };
        let limit = match self.limit.as_deref() {
            None => DEFAULT_LIMIT,
            Some(limit) => number(limit)
                .and_then(|n| usize::try_from(n).ok())
                .filter(|n| *n <= MAX_PAGE)
                .ok_or_else(|| ApiError::bad_request(format!("limit must be between 1 and {MAX_PAGE}")))?,
        };
        Ok((from, limit))
    }
}

/// The caller's tenant's entries from `from` on: `{entries, next, head: {seq, hash}}`. Needs the
/// `auditor` role.
pub async fn audit(
    State(state): State<AppState>,
    caller: Caller,
    query: Result<Query<AuditQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<Value>, ApiError> {
    caller.require(Role::AUDITOR)?;
    let Query(query) = query.map_err(|e| ApiError::bad_request(format!("invalid query: {}", e.body_text())))?;
    let (from, limit) = query.parse()?;
    let page = state.automations.audit().page(&caller.tenant, from, limit).await.map_err(|e| match e {
        AuditError::Unavailable(_) => {
            tracing::error!(error = %e, "the audit log cannot be read");
            ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "AUDIT_UNAVAILABLE", "the audit log cannot be read now")
        }
        other => ApiError::internal(other),
    })?;
    Ok(Json(json!({
        "entries": page.entries,
        "next": page.next.to_string(),
        "head": { "seq": page.head_seq, "hash": page.head_hash },
    })))
}
