//! What the engine reports about runs, and the options to start one.

use crate::error::UnknownName;
use std::fmt;
use std::str::FromStr;
use std::time::SystemTime;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::ids::RunId;

/// The lifecycle state of a run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum RunStatus {
    /// Created, not yet claimed by a worker, or runnable again after a wake-up.
    Pending,
    /// Claimed by a worker that is executing it.
    Running,
    /// Suspended on a hook, a timer or a step retry; holds no worker.
    Waiting,
    /// Finished with an output.
    Completed,
    /// Finished with an error.
    Failed,
    /// Cancelled from outside; its hooks and timers were disposed.
    Cancelled,
}

impl RunStatus {
    /// The status as stored and shown (`"pending"`, `"running"`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            RunStatus::Pending => "pending",
            RunStatus::Running => "running",
            RunStatus::Waiting => "waiting",
            RunStatus::Completed => "completed",
            RunStatus::Failed => "failed",
            RunStatus::Cancelled => "cancelled",
        }
    }

    /// Whether the run has ended; a terminal run accepts nothing more.
    pub fn is_terminal(self) -> bool {
        matches!(self, RunStatus::Completed | RunStatus::Failed | RunStatus::Cancelled)
    }
}

impl fmt::Display for RunStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for RunStatus {
    type Err = UnknownName;

    fn from_str(s: &str) -> Result<RunStatus, UnknownName> {
        Ok(match s {
            "pending" => RunStatus::Pending,
            "running" => RunStatus::Running,
            "waiting" => RunStatus::Waiting,
            "completed" => RunStatus::Completed,
            "failed" => RunStatus::Failed,
            "cancelled" => RunStatus::Cancelled,
            other => return Err(UnknownName { what: "run status", name: other.to_string() }),
        })
    }
}

/// A snapshot of one run.
#[derive(Clone, Debug, PartialEq)]
pub struct RunInfo {
    /// The run's id.
    pub id: RunId,
    /// The name of the workflow it runs.
    pub workflow: String,
    /// Its current status.
    pub status: RunStatus,
    /// The JSON input it was started with.
    pub input: Value,
    /// The workflow's output, once completed.
    pub output: Option<Value>,
    /// The error message, once failed (or the reason, once cancelled).
    pub error: Option<String>,
    /// The idempotency key it was started with, if any.
    pub idempotency_key: Option<String>,
    /// The run that started it as a child, if any.
    pub parent_run_id: Option<RunId>,
    /// How many times a worker claimed it (the current lease attempt).
    pub attempt: u32,
    /// When it was created.
    pub created_at: SystemTime,
    /// When it last changed.
    pub updated_at: SystemTime,
    /// When a worker first claimed it.
    pub started_at: Option<SystemTime>,
    /// When it ended.
    pub completed_at: Option<SystemTime>,
}

/// Options of [`Engine::start`](crate::Engine::start).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StartOptions {
    /// A second start with the same key returns the existing run instead of creating one.
    pub idempotency_key: Option<String>,
    /// The feed the run joins: every event it and its child runs append to their streams can
    /// also be read, with those of every other run of the feed, by
    /// [`Engine::read_feed`](crate::Engine::read_feed).
    pub feed: Option<String>,
}

impl StartOptions {
    /// Options with the given idempotency key.
    pub fn with_idempotency_key(key: impl Into<String>) -> StartOptions {
        StartOptions { idempotency_key: Some(key.into()), feed: None }
    }

    /// These options, with the run in `feed`.
    pub fn in_feed(mut self, feed: impl Into<String>) -> StartOptions {
        self.feed = Some(feed.into());
        self
    }
}

/// Which runs [`Engine::list_runs`](crate::Engine::list_runs) returns. Every set field must match.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RunFilter {
    /// Only runs of this workflow.
    pub workflow: Option<String>,
    /// Only runs in one of these statuses (all statuses when empty).
    pub statuses: Vec<RunStatus>,
    /// Only children of this run.
    pub parent_run_id: Option<RunId>,
    /// Only runs in this feed ([`StartOptions::feed`]; children are in their parent's).
    pub feed: Option<String>,
    /// Only runs created at or after this time.
    pub created_after: Option<SystemTime>,
    /// Only runs created before this time.
    pub created_before: Option<SystemTime>,
    /// At most this many runs per page (100 when `None`; capped at [`RunFilter::MAX_LIMIT`]).
    pub limit: Option<u32>,
    /// Continue after the page that returned this cursor ([`RunPage::next_cursor`]).
    pub cursor: Option<RunCursor>,
}

impl RunFilter {
    /// The default page size.
    pub const DEFAULT_LIMIT: u32 = 100;
    /// The largest page size.
    pub const MAX_LIMIT: u32 = 1_000;

    /// The page size this filter asks for, within bounds.
    pub fn page_size(&self) -> u32 {
        self.limit.unwrap_or(RunFilter::DEFAULT_LIMIT).clamp(1, RunFilter::MAX_LIMIT)
    }

    /// Only runs of this workflow.
    pub fn workflow(mut self, workflow: impl Into<String>) -> RunFilter {
        self.workflow = Some(workflow.into());
        self
    }

    /// Only runs in this status (may be given several times).
    pub fn status(mut self, status: RunStatus) -> RunFilter {
        self.statuses.push(status);
        self
    }

    /// Only runs in this feed.
    pub fn feed(mut self, feed: impl Into<String>) -> RunFilter {
        self.feed = Some(feed.into());
        self
    }

    /// At most `limit` runs per page.
    pub fn limit(mut self, limit: u32) -> RunFilter {
        self.limit = Some(limit);
        self
    }
}

/// Where a page of [`Engine::list_runs`](crate::Engine::list_runs) ended: the creation time (ms
/// since the Unix epoch) and id of its last run. Runs are listed newest first.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct RunCursor {
    /// The last run's creation time, in milliseconds since the Unix epoch.
    pub created_at_ms: i64,
    /// The last run's id.
    pub run_id: RunId,
}

/// One page of runs, newest first.
#[derive(Clone, Debug, PartialEq)]
pub struct RunPage {
    /// The runs of this page.
    pub runs: Vec<RunInfo>,
    /// Pass this as [`RunFilter::cursor`] to read the next page; `None` on the last page.
    pub next_cursor: Option<RunCursor>,
}
