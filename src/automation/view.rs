//! What the service reports about automations, and its errors.

use std::fmt;
use std::time::SystemTime;

use resumable_workflow::{Engine, EngineError, RunId, RunInfo, RunStatus};
use serde::Serialize;
use serde_json::{Value, json};

use super::decision::{DecisionBatch, InvalidDecisions};
use super::event::AutomationEvent;
use super::host_calls::RoundCall;
use super::workflow::{AutomationInput, PendingRequest};
use crate::db::to_ms;

/// The most stream events read to summarize one automation.
const MAX_SUMMARY_EVENTS: u32 = 10_000;

/// A round waiting for its decision batch.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PendingApproval {
    /// The automation.
    pub automation_id: RunId,
    /// The round (1 for the first approval the script asked for).
    pub round: u32,
    /// What the script asked for; decide every one.
    pub requests: Vec<PendingRequest>,
    /// The decisions on each request so far (approvals against its quorum).
    pub progress: Vec<super::round::RequestProgress>,
    /// When the approval was requested.
    #[serde(serialize_with = "serialize_time")]
    pub requested_at: SystemTime,
    /// Who submitted the automation (a `four_eyes` request is not theirs to decide).
    pub submitted_by: String,
}

impl PendingApproval {
    /// Whether `actor`, holding `roles`, may decide `request` of this round: a role its function
    /// names (or `approver`), and not their own submission when the function needs four eyes.
    pub fn may_decide(&self, request: &PendingRequest, roles: &[&str], actor: &str) -> bool {
        super::refusal(request, roles, actor, &self.submitted_by).is_none()
    }
}

fn serialize_time<S: serde::Serializer>(t: &SystemTime, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_i64(to_ms(*t))
}

/// A round that asked for approval: what the script asked for and, once decided, the decisions.
#[derive(Clone, Debug, PartialEq)]
pub struct RoundRecord {
    /// The round (1 for the first approval the script asked for).
    pub round: u32,
    /// What the script asked for.
    pub requests: Vec<PendingRequest>,
    /// What the script wrote to its console in this round (`{level, text}` per line).
    pub console: Vec<Value>,
    /// The decisions and who made them, once the round was decided.
    pub decision: Option<DecisionBatch>,
}

/// One automation as its tenant sees it.
#[derive(Clone, Debug, PartialEq)]
pub struct AutomationView {
    /// Its id.
    pub id: RunId,
    /// Its tenant.
    pub tenant: String,
    /// Who submitted it.
    pub submitted_by: String,
    /// Its status.
    pub status: RunStatus,
    /// The script's return value, once completed.
    pub result: Option<Value>,
    /// `{code, message}`, once failed or cancelled.
    pub error: Option<Value>,
    /// Rounds that asked for approval so far.
    pub rounds: u32,
    /// The open approval, if one waits for a decision.
    pub pending: Option<PendingApproval>,
    /// Every round that asked for approval, oldest first, with its decisions.
    pub history: Vec<RoundRecord>,
    /// What the script wrote to its console in its last round, once it ended.
    pub console: Vec<Value>,
    /// The script's source.
    pub source: String,
    /// The host calls its rounds made so far, round by round.
    pub calls: Vec<RoundCall>,
    /// When it was submitted, last changed and ended.
    pub created_at: SystemTime,
    /// When it last changed.
    pub updated_at: SystemTime,
    /// When it ended.
    pub completed_at: Option<SystemTime>,
}

impl AutomationView {
    pub(crate) fn new(
        run: RunInfo,
        input: AutomationInput,
        pending: Option<PendingApproval>,
        log: &EventLog,
        calls: Vec<RoundCall>,
    ) -> AutomationView {
        let error = run_error(&run);
        AutomationView {
            id: run.id,
            tenant: input.tenant,
            submitted_by: input.submitted_by,
            status: run.status,
            result: if run.status == RunStatus::Completed { log.result() } else { None },
            error,
            rounds: log.rounds().0,
            pending,
            history: log.history(),
            console: log.final_console(),
            source: input.source,
            calls,
            created_at: run.created_at,
            updated_at: run.updated_at,
            completed_at: run.completed_at,
        }
    }

    /// The view as the API's JSON.
    pub fn to_json(&self) -> Value {
        json!({
            "id": self.id,
            "tenant": self.tenant,
            "submittedBy": self.submitted_by,
            "status": self.status,
            "result": self.result,
            "error": self.error,
            "rounds": self.rounds,
            "pendingApproval": self.pending,
            "source": self.source,
            "calls": self.calls,
            "createdAt": to_ms(self.created_at),
            "updatedAt": to_ms(self.updated_at),
            "completedAt": self.completed_at.map(to_ms),
        })
    }
}

/// Splits a failed automation's `CODE: message` error text.
pub(crate) fn error_of(error: &str) -> (String, String) {
    match error.split_once(": ") {
        Some((code, message))
            if !code.is_empty() && code.chars().all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_') =>
        {
            (code.to_owned(), message.to_owned())
        }
        _ => ("AUTOMATION_FAILED".to_owned(), error.to_owned()),
    }
}

/// `{code, message}` of an automation run that failed or was cancelled.
pub(crate) fn run_error(run: &RunInfo) -> Option<Value> {
    match run.status {
        RunStatus::Failed => {
            let (code, message) = error_of(run.error.as_deref().unwrap_or_default());
            Some(json!({ "code": code, "message": message }))
        }
        RunStatus::Cancelled => Some(json!({ "code": "AUTOMATION_CANCELLED", "message": run.error })),
        _ => None,
    }
}

/// The automation's stream, summarized.
pub(crate) struct EventLog {
    events: Vec<AutomationEvent>,
}

impl EventLog {
    pub(crate) async fn read(engine: &Engine, id: &RunId) -> Result<EventLog, AutomationError> {
        let events = engine.store().read_stream(id, 0, MAX_SUMMARY_EVENTS).await.map_err(EngineError::from)?;
        // Events this build does not know (a newer release's) are left out of the summary.
        let events = events.into_iter().filter_map(|(_, e)| serde_json::from_value(e).ok()).collect();
        Ok(EventLog { events })
    }

    /// (rounds that asked for approval, whether the last of them was decided).
    pub(crate) fn rounds(&self) -> (u32, bool) {
        let last = self
            .events
            .iter()
            .rev()
            .find_map(|e| match e {
                AutomationEvent::ApprovalRequested { round, .. } => Some(*round),
                _ => None,
            })
            .unwrap_or(0);
        let decided = self.events.iter().any(|e| matches!(e, AutomationEvent::Decided { round, .. } if *round == last));
        (last, decided)
    }

    /// The last round that asked for approval and was not decided yet, with its requests.
    pub(crate) fn open_round(&self) -> Option<(u32, Vec<PendingRequest>)> {
        let (round, decided) = self.rounds();
        if round == 0 || decided {
            return None;
        }
        self.events.iter().rev().find_map(|e| match e {
            AutomationEvent::ApprovalRequested { round: r, pending, .. } if *r == round => {
                Some((round, pending.clone()))
            }
            _ => None,
        })
    }

    /// Every round that asked for approval, with its decisions once made.
    pub(crate) fn history(&self) -> Vec<RoundRecord> {
        let mut rounds: Vec<RoundRecord> = Vec::new();
        for event in &self.events {
            match event {
                AutomationEvent::ApprovalRequested { round, pending, console } => rounds.push(RoundRecord {
                    round: *round,
                    requests: pending.clone(),
                    console: console.clone(),
                    decision: None,
                }),
                AutomationEvent::Decided { round, actor, decisions } => {
                    if let Some(record) = rounds.iter_mut().rev().find(|r| r.round == *round) {
                        record.decision = Some(DecisionBatch { decisions: decisions.clone(), actor: actor.clone() });
                    }
                }
                _ => {}
            }
        }
        rounds
    }

    /// The console of the `completed` or `failed` event, if the automation ended with one.
    pub(crate) fn final_console(&self) -> Vec<Value> {
        self.events
            .iter()
            .rev()
            .find_map(|e| match e {
                AutomationEvent::Completed { console, .. } | AutomationEvent::Failed { console, .. } => {
                    Some(console.clone())
                }
                _ => None,
            })
            .unwrap_or_default()
    }

    /// The value of the `completed` event, if any.
    pub(crate) fn result(&self) -> Option<Value> {
        self.events.iter().rev().find_map(|e| match e {
            AutomationEvent::Completed { value, .. } => Some(value.clone()),
            _ => None,
        })
    }
}

/// An error of the automation service. Each maps to one HTTP status.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum AutomationError {
    /// No automation with this id.
    NotFound,
    /// The automation belongs to another tenant.
    WrongTenant,
    /// The automation has ended (with this status).
    Ended(RunStatus),
    /// The round was decided already (or a concurrent decision won).
    AlreadyDecided,
    /// The automation is not waiting for a decision.
    NotWaiting,
    /// The idempotency key was used before for a different script or context.
    IdempotencyConflict,
    /// The decision batch does not fit the pending requests.
    Invalid(InvalidDecisions),
    /// The decider holds none of the roles that may decide this request.
    NotApprover(super::InterruptionId),
    /// The request is the decider's own, and its function requires a second pair of eyes.
    FourEyes(super::InterruptionId),
    /// The service is misconfigured.
    Config(String),
    /// The engine or the database failed.
    Internal(String),
    /// The act was done, but its audit entry could not be written (`AUDIT_UNAVAILABLE`).
    Audit(String),
    /// The tenant has as many automations under way as its quota allows (`QUOTA_EXCEEDED`).
    QuotaExceeded(String),
}

impl fmt::Display for AutomationError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AutomationError::NotFound => f.write_str("no such automation"),
            AutomationError::WrongTenant => f.write_str("the automation belongs to another tenant"),
            AutomationError::Ended(status) => write!(f, "the automation has ended ({status})"),
            AutomationError::AlreadyDecided => f.write_str("this approval was decided already"),
            AutomationError::NotWaiting => f.write_str("the automation is not waiting for a decision"),
            AutomationError::IdempotencyConflict => {
                f.write_str("this idempotency key was used for a different script or context")
            }
            AutomationError::Invalid(e) => write!(f, "invalid decisions: {e}"),
            AutomationError::NotApprover(id) => write!(f, "this API key holds no role that may decide {id:?}"),
            AutomationError::FourEyes(id) => {
                write!(f, "{id:?} was submitted by this actor, and its function needs another person to decide it")
            }
            AutomationError::Config(m) => write!(f, "configuration error: {m}"),
            AutomationError::Internal(m) => write!(f, "internal error: {m}"),
            AutomationError::Audit(m) => write!(f, "done, but not recorded in the audit log: {m}"),
            AutomationError::QuotaExceeded(m) => f.write_str(m),
        }
    }
}

impl std::error::Error for AutomationError {}

impl From<EngineError> for AutomationError {
    fn from(e: EngineError) -> AutomationError {
        match e {
            EngineError::RunNotFound(_) => AutomationError::NotFound,
            other => AutomationError::Internal(other.to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_codes_are_split_from_messages() {
        assert_eq!(error_of("RUN_TIMEOUT: too slow"), ("RUN_TIMEOUT".into(), "too slow".into()));
        assert_eq!(error_of("something: else"), ("AUTOMATION_FAILED".into(), "something: else".into()));
        assert_eq!(error_of("plain"), ("AUTOMATION_FAILED".into(), "plain".into()));
    }
}
