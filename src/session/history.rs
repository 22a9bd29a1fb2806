//! A tenant's sessions, newest first, a page at a time.

use std::time::SystemTime;

use resumable_workflow::{RunCursor, RunFilter, RunId, RunInfo, RunStatus};
use serde_json::{Value, json};

use super::{SessionError, SessionInput, Sessions, WORKFLOW};
use crate::automation::{MAX_HISTORY_PAGE, Page};
use crate::db::to_ms;

/// Which sessions a listing shows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SessionsShown {
    /// All of them.
    All,
    /// Those that take commands (active or hibernated).
    Live,
    /// Those that ended (destroyed, idle past their end, or cancelled).
    Ended,
}

/// One session as a listing shows it (its commands are on its own page).
#[derive(Clone, Debug, PartialEq)]
pub struct SessionSummary {
    /// Its id.
    pub id: RunId,
    /// Who started it.
    pub created_by: String,
    /// Whether it takes commands.
    pub live: bool,
    /// When it started.
    pub created_at: SystemTime,
    /// When it last changed.
    pub updated_at: SystemTime,
    /// When it ended.
    pub ended_at: Option<SystemTime>,
}

impl SessionSummary {
    fn of(run: RunInfo) -> Option<SessionSummary> {
        let input: SessionInput = serde_json::from_value(run.input).ok()?;
        Some(SessionSummary {
            id: run.id,
            created_by: input.created_by,
            live: !run.status.is_terminal(),
            created_at: run.created_at,
            updated_at: run.updated_at,
            ended_at: run.completed_at,
        })
    }

    /// The summary as the API's JSON.
    pub fn to_json(&self) -> Value {
        json!({
            "id": self.id,
            "createdBy": self.created_by,
            "live": self.live,
            "createdAt": to_ms(self.created_at),
            "updatedAt": to_ms(self.updated_at),
            "endedAt": self.ended_at.map(to_ms),
        })
    }
}

impl Sessions {
    /// The sessions of `tenant`, newest first, after `cursor`, at most `limit` (1 to
    /// [`MAX_HISTORY_PAGE`]).
    pub async fn list(
        &self,
        tenant: &str,
        shown: SessionsShown,
        cursor: Option<RunCursor>,
        limit: u32,
    ) -> Result<Page<SessionSummary>, SessionError> {
        let statuses = match shown {
            SessionsShown::All => vec![],
            SessionsShown::Live => vec![RunStatus::Pending, RunStatus::Running, RunStatus::Waiting],
            SessionsShown::Ended => vec![RunStatus::Completed, RunStatus::Failed, RunStatus::Cancelled],
        };
        let filter = RunFilter {
            statuses,
            cursor,
            limit: Some(limit.clamp(1, MAX_HISTORY_PAGE)),
            ..RunFilter::default().feed(tenant).workflow(WORKFLOW)
        };
        let page = self.engine.list_runs(&filter).await?;
        Ok(Page { items: page.runs.into_iter().filter_map(SessionSummary::of).collect(), next: page.next_cursor })
    }
}
