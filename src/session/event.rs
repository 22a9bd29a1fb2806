//! The events of a session's stream.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// One event of a session's stream (`{"type": "command_start", …}`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", rename_all_fields = "camelCase")]
#[non_exhaustive]
pub enum SessionEvent {
    /// The session started.
    Created {
        /// Its id.
        session: String,
        /// Its tenant.
        tenant: String,
        /// Who started it.
        created_by: String,
        /// How long it stays in memory without a command before it hibernates.
        idle_ms: u64,
        /// The time cap of each command.
        command_timeout_ms: u64,
    },
    /// It became `active`, `hibernated`, `resuming` or `destroyed`.
    Status {
        /// The status.
        status: String,
        /// Who destroyed it.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        by: Option<String>,
    },
    /// A command started, as the automation named.
    CommandStart {
        /// The command's number (1 for the first).
        command: u64,
        /// The automation that runs it.
        automation: String,
        /// Who sent it.
        submitted_by: String,
    },
    /// What a command wrote to its console.
    CommandOutput {
        /// The command's number.
        command: u64,
        /// The lines, `{level, text}` each.
        console: Vec<Value>,
    },
    /// A command ended: `completed` with its value, `failed` or `cancelled` with its error, or
    /// `skipped` (the session's end was requested before it started).
    CommandEnd {
        /// The command's number.
        command: u64,
        /// The automation that ran it (none when skipped).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        automation: Option<String>,
        /// How it ended.
        status: String,
        /// Its value, once completed.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        value: Option<Value>,
        /// `{code, message}`, once failed or cancelled.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        error: Option<Value>,
    },
}

impl SessionEvent {
    /// The event as the JSON of the stream.
    pub fn to_value(&self) -> Value {
        serde_json::to_value(self).unwrap_or(Value::Null)
    }
}
