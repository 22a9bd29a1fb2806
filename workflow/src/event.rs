//! The per-run event log: every state change appends one or more events, ordered by `seq`.

use crate::error::UnknownName;
use std::fmt;
use std::str::FromStr;
use std::time::SystemTime;

use serde_json::Value;

use crate::ids::RunId;

/// What an event records.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum EventKind {
    /// The run was created (payload: workflow, input, idempotency key).
    RunCreated,
    /// A worker claimed the run (payload: owner, attempt).
    RunStarted,
    /// The execution suspended (payload: wake time, if any).
    RunSuspended,
    /// The run completed (payload: output).
    RunCompleted,
    /// The run failed (payload: error).
    RunFailed,
    /// The run was cancelled (payload: reason).
    RunCancelled,
    /// A step attempt started (payload: position, name, attempt).
    StepStarted,
    /// A step completed (payload: position, attempt, result).
    StepCompleted,
    /// A step failed for good (payload: position, attempt, error).
    StepFailed,
    /// A step attempt failed and will be retried (payload: position, attempt, error, retry time).
    StepRetrying,
    /// A hook was created (payload: position, metadata). Tokens are never logged: a token is the
    /// capability to resume its hook.
    HookCreated,
    /// A hook received a payload (payload: position, index).
    HookReceived,
    /// A hook was disposed (payload: position).
    HookDisposed,
    /// A hook could not be created because another run owns its token (payload: position, owner).
    HookConflict,
    /// A durable timer was created (payload: position, due time).
    WaitCreated,
    /// A durable timer was resolved (payload: position, `fired`: true when it fired, false when
    /// the hook it raced against won).
    WaitCompleted,
    /// The run appended an event to its stream (payload: position, index).
    StreamEmitted,
}

impl EventKind {
    /// All kinds, in declaration order.
    pub const ALL: [EventKind; 17] = [
        EventKind::RunCreated,
        EventKind::RunStarted,
        EventKind::RunSuspended,
        EventKind::RunCompleted,
        EventKind::RunFailed,
        EventKind::RunCancelled,
        EventKind::StepStarted,
        EventKind::StepCompleted,
        EventKind::StepFailed,
        EventKind::StepRetrying,
        EventKind::HookCreated,
        EventKind::HookReceived,
        EventKind::HookDisposed,
        EventKind::HookConflict,
        EventKind::WaitCreated,
        EventKind::WaitCompleted,
        EventKind::StreamEmitted,
    ];

    /// The kind as stored (`"run_created"`, `"step_completed"`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            EventKind::RunCreated => "run_created",
            EventKind::RunStarted => "run_started",
            EventKind::RunSuspended => "run_suspended",
            EventKind::RunCompleted => "run_completed",
            EventKind::RunFailed => "run_failed",
            EventKind::RunCancelled => "run_cancelled",
            EventKind::StepStarted => "step_started",
            EventKind::StepCompleted => "step_completed",
            EventKind::StepFailed => "step_failed",
            EventKind::StepRetrying => "step_retrying",
            EventKind::HookCreated => "hook_created",
            EventKind::HookReceived => "hook_received",
            EventKind::HookDisposed => "hook_disposed",
            EventKind::HookConflict => "hook_conflict",
            EventKind::WaitCreated => "wait_created",
            EventKind::WaitCompleted => "wait_completed",
            EventKind::StreamEmitted => "stream_emitted",
        }
    }
}

impl fmt::Display for EventKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for EventKind {
    type Err = UnknownName;

    fn from_str(s: &str) -> Result<EventKind, UnknownName> {
        EventKind::ALL
            .into_iter()
            .find(|k| k.as_str() == s)
            .ok_or_else(|| UnknownName { what: "event kind", name: s.to_string() })
    }
}

/// One entry of a run's event log.
#[derive(Clone, Debug, PartialEq)]
pub struct Event {
    /// The run it belongs to.
    pub run_id: RunId,
    /// Its position in the run's log: 1, 2, 3, ... without gaps.
    pub seq: u64,
    /// What it records.
    pub kind: EventKind,
    /// Details, as JSON.
    pub payload: Value,
    /// When it was appended.
    pub created_at: SystemTime,
}
