//! Decision batches: what an approver sends to decide some or all of a round's pending
//! interruptions (see [`super::round`] for how batches add up).

use std::fmt;

use serde::{Deserialize, Serialize};

use super::interruption_id::InterruptionId;
use serde_json::Value;

/// The most characters a decision's reason may have.
pub const MAX_REASON_CHARS: usize = 1_000;

/// One decision: approve or reject one pending interruption.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Decision {
    /// The interruption decided (`interrupt-<k>`).
    pub interruption_id: InterruptionId,
    /// Whether it is approved.
    pub approved: bool,
    /// Why, shown to the script and in the automation's events.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// A batch of decisions for one round, as delivered to the automation's hook.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DecisionBatch {
    /// The decisions.
    pub decisions: Vec<Decision>,
    /// Who decided (an actor name from the server's configuration).
    #[serde(default)]
    pub actor: String,
}

/// Why a batch cannot be applied to a round.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum InvalidDecisions {
    /// The batch is empty.
    Empty,
    /// An id that is not pending in this round.
    Unknown(InterruptionId),
    /// An id decided twice.
    Duplicate(InterruptionId),
    /// A reason longer than [`MAX_REASON_CHARS`].
    ReasonTooLong(InterruptionId),
}

impl fmt::Display for InvalidDecisions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            InvalidDecisions::Empty => f.write_str("no decisions given"),
            InvalidDecisions::Unknown(id) => write!(f, "{id:?} is not a pending request of this round"),
            InvalidDecisions::Duplicate(id) => write!(f, "{id:?} is decided more than once"),
            InvalidDecisions::ReasonTooLong(id) => {
                write!(f, "the reason for {id:?} is longer than {MAX_REASON_CHARS} characters")
            }
        }
    }
}

impl std::error::Error for InvalidDecisions {}

impl DecisionBatch {
    /// The batch as JSON (the hook payload).
    pub fn to_value(&self) -> Value {
        serde_json::to_value(self).unwrap_or(Value::Null)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn unknown_fields_are_refused() {
        let bad = json!({ "decisions": [{ "interruptionId": "interrupt-1", "approved": true, "extra": 1 }] });
        assert!(serde_json::from_value::<DecisionBatch>(bad).is_err());
        let good = json!({ "decisions": [{ "interruptionId": "interrupt-1", "approved": false, "reason": "no" }] });
        let batch: DecisionBatch = serde_json::from_value(good.clone()).unwrap();
        assert_eq!(batch.to_value(), json!({ "decisions": good["decisions"], "actor": "" }));
    }
}
