//! What an automation writes: the events of its stream, and the metadata of each round's hook.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::decision::Decision;
use super::expiry::OnExpiry;
use super::interruption_id::InterruptionId;
use super::workflow::PendingRequest;

/// One event of an automation's stream (`{"type": "approval_requested", …}`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
#[non_exhaustive]
pub enum AutomationEvent {
    /// A round asked for approval of these requests.
    ApprovalRequested {
        /// The round (1 for the first).
        round: u32,
        /// What the script asked for.
        pending: Vec<PendingRequest>,
        /// What the script wrote to its console in the round (`{level, text}` per line).
        #[serde(default)]
        console: Vec<Value>,
    },
    /// A round still waits: its approvers are reminded of what is undecided.
    Reminder {
        /// The round.
        round: u32,
        /// The requests still undecided.
        pending: Vec<PendingRequest>,
    },
    /// Requests of a round expired undecided: the system decides them (`on_expiry = "reject"`:
    /// rejected with the reason `expired`), or fails the automation (`"fail"`).
    Expired {
        /// The round.
        round: u32,
        /// The requests that expired.
        interruptions: Vec<InterruptionId>,
        /// What their expiry does.
        #[serde(rename = "onExpiry")]
        on_expiry: OnExpiry,
    },
    /// Every request of a round was decided.
    Decided {
        /// The round.
        round: u32,
        /// Who decided, comma-separated when several did.
        actor: String,
        /// The decision on each request.
        decisions: Vec<Decision>,
    },
    /// The script returned.
    Completed {
        /// The round it returned in.
        round: u32,
        /// What it returned.
        value: Value,
        /// What it wrote to its console in that round.
        #[serde(default)]
        console: Vec<Value>,
    },
    /// The automation failed.
    Failed {
        /// The round it failed in (absent when it asked for too many rounds).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        round: Option<u32>,
        /// The error code.
        code: String,
        /// What went wrong.
        message: String,
        /// What the script wrote to its console in that round.
        #[serde(default)]
        console: Vec<Value>,
    },
}

impl AutomationEvent {
    /// The event's name, its `type` (`approval_requested`, `reminder`, `expired`, `decided`,
    /// `completed`, `failed`).
    pub fn name(&self) -> &'static str {
        match self {
            AutomationEvent::ApprovalRequested { .. } => "approval_requested",
            AutomationEvent::Reminder { .. } => "reminder",
            AutomationEvent::Expired { .. } => "expired",
            AutomationEvent::Decided { .. } => "decided",
            AutomationEvent::Completed { .. } => "completed",
            AutomationEvent::Failed { .. } => "failed",
        }
    }

    /// The event as the JSON of the stream.
    pub fn to_value(&self) -> Value {
        serde_json::to_value(self).unwrap_or(Value::Null)
    }
}

/// What a round's hook says about itself, for authorizing a decision before it is delivered.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct HookMetadata {
    /// The tenant of the automation.
    pub tenant: String,
    /// The automation.
    pub automation: String,
    /// The round.
    pub round: u32,
    /// The requests to decide.
    pub pending: Vec<PendingRequest>,
}

impl HookMetadata {
    /// The metadata of a hook, if it is an automation round's.
    pub fn of(value: &Value) -> Option<HookMetadata> {
        serde_json::from_value(value.clone()).ok()
    }

    /// The metadata as the hook's JSON.
    pub fn to_value(&self) -> Value {
        serde_json::to_value(self).unwrap_or(Value::Null)
    }
}
