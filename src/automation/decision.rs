//! Decision batches: what an approver sends to answer a round's pending interruptions, and the
//! validation that every pending request is decided exactly once.

use std::collections::BTreeSet;
use std::fmt;

use resumable_runner::Resolution;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

/// The most characters a decision's reason may have.
pub const MAX_REASON_CHARS: usize = 1_000;

/// One decision: approve or reject one pending interruption.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Decision {
    /// The interruption decided (`interrupt-<k>`).
    pub interruption_id: String,
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
    Unknown(String),
    /// An id decided twice.
    Duplicate(String),
    /// A pending id without a decision.
    Missing(String),
    /// A reason longer than [`MAX_REASON_CHARS`].
    ReasonTooLong(String),
}

impl fmt::Display for InvalidDecisions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            InvalidDecisions::Empty => f.write_str("no decisions given"),
            InvalidDecisions::Unknown(id) => write!(f, "{id:?} is not a pending request of this round"),
            InvalidDecisions::Duplicate(id) => write!(f, "{id:?} is decided more than once"),
            InvalidDecisions::Missing(id) => write!(f, "{id:?} is pending but not decided"),
            InvalidDecisions::ReasonTooLong(id) => {
                write!(f, "the reason for {id:?} is longer than {MAX_REASON_CHARS} characters")
            }
        }
    }
}

impl std::error::Error for InvalidDecisions {}

impl DecisionBatch {
    /// Checks that the batch decides every id of `pending` exactly once and nothing else.
    pub fn validate<'a>(&self, pending: impl IntoIterator<Item = &'a str>) -> Result<(), InvalidDecisions> {
        let pending: BTreeSet<&str> = pending.into_iter().collect();
        if self.decisions.is_empty() {
            return Err(InvalidDecisions::Empty);
        }
        let mut seen = BTreeSet::new();
        for d in &self.decisions {
            if !pending.contains(d.interruption_id.as_str()) {
                return Err(InvalidDecisions::Unknown(d.interruption_id.clone()));
            }
            if !seen.insert(d.interruption_id.as_str()) {
                return Err(InvalidDecisions::Duplicate(d.interruption_id.clone()));
            }
            if d.reason.as_ref().is_some_and(|r| r.chars().count() > MAX_REASON_CHARS) {
                return Err(InvalidDecisions::ReasonTooLong(d.interruption_id.clone()));
            }
        }
        match pending.iter().find(|id| !seen.contains(*id)) {
            Some(id) => Err(InvalidDecisions::Missing((*id).to_owned())),
            None => Ok(()),
        }
    }

    /// The resolutions the script is resumed with: `{approved, reason}` per interruption.
    pub fn resolutions(&self) -> Vec<Resolution> {
        self.decisions
            .iter()
            .map(|d| {
                let value = json!({ "approved": d.approved, "reason": d.reason, "decidedBy": [self.actor] });
                Resolution::new(d.interruption_id.clone(), value)
            })
            .collect()
    }

    /// The batch as JSON (the hook payload).
    pub fn to_value(&self) -> Value {
        serde_json::to_value(self).unwrap_or(Value::Null)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn batch(ids: &[&str]) -> DecisionBatch {
        DecisionBatch {
            decisions: ids
                .iter()
                .map(|id| Decision { interruption_id: (*id).to_owned(), approved: true, reason: None })
                .collect(),
            actor: "a".into(),
        }
    }

    #[test]
    fn every_pending_id_exactly_once() {
        let pending = ["interrupt-1", "interrupt-2"];
        assert_eq!(batch(&["interrupt-2", "interrupt-1"]).validate(pending), Ok(()));
        assert_eq!(batch(&[]).validate(pending), Err(InvalidDecisions::Empty));
        assert_eq!(
            batch(&["interrupt-1", "interrupt-9"]).validate(pending),
            Err(InvalidDecisions::Unknown("interrupt-9".into()))
        );
        assert_eq!(
            batch(&["interrupt-1", "interrupt-1"]).validate(pending),
            Err(InvalidDecisions::Duplicate("interrupt-1".into()))
        );
        assert_eq!(batch(&["interrupt-1"]).validate(pending), Err(InvalidDecisions::Missing("interrupt-2".into())));
        let mut long = batch(&["interrupt-1", "interrupt-2"]);
        long.decisions[0].reason = Some("x".repeat(MAX_REASON_CHARS + 1));
        assert_eq!(long.validate(pending), Err(InvalidDecisions::ReasonTooLong("interrupt-1".into())));
    }

    #[test]
    fn unknown_fields_are_refused() {
        let bad = json!({ "decisions": [{ "interruptionId": "interrupt-1", "approved": true, "extra": 1 }] });
        assert!(serde_json::from_value::<DecisionBatch>(bad).is_err());
        let good = json!({ "decisions": [{ "interruptionId": "interrupt-1", "approved": false, "reason": "no" }] });
        let batch: DecisionBatch = serde_json::from_value(good).unwrap();
        assert_eq!(batch.resolutions()[0].value, json!({ "approved": false, "reason": "no", "decidedBy": [""] }));
    }
}
