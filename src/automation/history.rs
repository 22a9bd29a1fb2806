//! A tenant's automations, newest first, a page at a time: the run history.

use std::time::SystemTime;

use resumable_workflow::{RunCursor, RunFilter, RunId, RunInfo, RunStatus};
use serde_json::{Value, json};

use super::view::run_error;
use super::{AutomationError, AutomationInput, Automations, WORKFLOW};
use crate::db::to_ms;

/// The most automations one page holds.
pub const MAX_PAGE: u32 = 200;

/// One automation as the history lists it (its rounds and console are on its own page).
#[derive(Clone, Debug, PartialEq)]
pub struct AutomationSummary {
    /// Its id.
    pub id: RunId,
    /// Its status.
    pub status: RunStatus,
    /// Who submitted it.
    pub submitted_by: String,
    /// The session whose command it runs, if any.
    pub session: Option<String>,
    /// The script's return value, once completed.
    pub result: Option<Value>,
    /// `{code, message}`, once failed or cancelled.
    pub error: Option<Value>,
    /// When it was submitted.
    pub created_at: SystemTime,
    /// When it last changed.
    pub updated_at: SystemTime,
    /// When it ended.
    pub completed_at: Option<SystemTime>,
}

impl AutomationSummary {
    fn of(run: RunInfo) -> Option<AutomationSummary> {
        let error = run_error(&run);
        let input: AutomationInput = serde_json::from_value(run.input).ok()?;
        Some(AutomationSummary {
            id: run.id,
            status: run.status,
            submitted_by: input.submitted_by,
            session: input.session,
            result: run.output.and_then(|output| output.get("value").cloned()),
            error,
            created_at: run.created_at,
            updated_at: run.updated_at,
            completed_at: run.completed_at,
        })
    }

    /// The summary as the API's JSON.
    pub fn to_json(&self) -> Value {
        json!({
            "id": self.id,
            "status": self.status,
            "submittedBy": self.submitted_by,
            "session": self.session,
            "result": self.result,
            "error": self.error,
            "createdAt": to_ms(self.created_at),
            "updatedAt": to_ms(self.updated_at),
            "completedAt": self.completed_at.map(to_ms),
        })
    }
}

/// One page of a history, newest first.
#[derive(Clone, Debug, PartialEq)]
pub struct Page<T> {
    /// Its items.
    pub items: Vec<T>,
    /// Where the next page starts; `None` on the last.
    pub next: Option<RunCursor>,
}

impl Automations {
    /// The automations of `tenant` (those its sessions ran included), newest first, in one of
    /// `statuses` (any when empty), after `cursor`, at most `limit` (1 to [`MAX_PAGE`]).
    pub async fn list(
        &self,
        tenant: &str,
        statuses: &[RunStatus],
        cursor: Option<RunCursor>,
        limit: u32,
    ) -> Result<Page<AutomationSummary>, AutomationError> {
        let filter = RunFilter {
            statuses: statuses.to_vec(),
            cursor,
            limit: Some(limit.clamp(1, MAX_PAGE)),
            ..RunFilter::default().feed(tenant).workflow(WORKFLOW)
        };
        let page = self.engine.list_runs(&filter).await?;
        Ok(Page { items: page.runs.into_iter().filter_map(AutomationSummary::of).collect(), next: page.next_cursor })
    }
}
