//! How far the decisions on one round have come.
//!
//! Approvers decide a round's requests in batches, each delivered to the round's hook. A batch
//! may decide only some requests (those its decider's roles allow); a request with a quorum
//! needs that many distinct approvers, and one rejection rejects it. The round goes on once
//! every request is decided.
//!
//! The server and the workflow fold the same payloads, in the order the hook received them,
//! with [`RoundProgress::apply`], so both agree on which batch counted: a batch that decides a
//! request decided already, or that its decider decided before, counts for nothing.

use resumable_runner::Resolution;
use serde::Serialize;
use serde_json::{Value, json};

use super::decision::{DecisionBatch, InvalidDecisions, MAX_REASON_CHARS};
use super::interruption_id::InterruptionId;
use super::workflow::PendingRequest;

/// Why a batch counts for nothing at its place.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// It is malformed for this round.
    Invalid(InvalidDecisions),
    /// A request it decides was decided already, or by this decider already.
    AlreadyDecided,
}

/// One request's decisions so far.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RequestProgress {
    /// The interruption.
    pub interruption_id: InterruptionId,
    /// How many distinct approvers must approve it.
    pub quorum: u32,
    /// Who approved it so far, in order.
    pub approved_by: Vec<String>,
    /// Who rejected it, if someone did.
    pub rejected_by: Option<String>,
    /// The reason the script is resumed with: the rejection's, or else the last approval's.
    #[serde(skip)]
    pub reason: Option<String>,
}

impl RequestProgress {
    /// Whether the request is decided: rejected, or approved by its quorum.
    pub fn is_decided(&self) -> bool {
        self.rejected_by.is_some() || self.approved_by.len() >= self.quorum as usize
    }
}

/// The decisions on one round's requests so far.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct RoundProgress {
    pub(crate) requests: Vec<RequestProgress>,
}

impl RoundProgress {
    /// No decision yet on `pending`.
    pub(crate) fn new(pending: &[PendingRequest]) -> RoundProgress {
        // Only a connector's request carries a quorum (from its configuration).
        let quorum = |p: &PendingRequest| match p.request["kind"] == crate::connector::APPROVAL_KIND {
            true => p.request["quorum"].as_u64().and_then(|q| u32::try_from(q).ok()).unwrap_or(1),
            false => 1,
        };
        RoundProgress {
            requests: pending
                .iter()
                .map(|p| RequestProgress {
                    interruption_id: p.interruption_id.clone(),
                    quorum: quorum(p).max(1),
                    approved_by: Vec::new(),
                    rejected_by: None,
                    reason: None,
                })
                .collect(),
        }
    }

    /// The progress after `payloads`, in order (payloads that count for nothing are skipped).
    pub(crate) fn replay(pending: &[PendingRequest], payloads: &[Value]) -> RoundProgress {
        let mut progress = RoundProgress::new(pending);
        for payload in payloads {
            if let Ok(batch) = serde_json::from_value::<DecisionBatch>(payload.clone()) {
                let _ = progress.apply(&batch);
            }
        }
        progress
    }

    /// Whether `batch` would count, as a whole, at this point.
    pub(crate) fn check(&self, batch: &DecisionBatch) -> Result<(), Refusal> {
        if batch.decisions.is_empty() {
            return Err(Refusal::Invalid(InvalidDecisions::Empty));
        }
        let mut seen = std::collections::BTreeSet::new();
        for decision in &batch.decisions {
            let id = &decision.interruption_id;
            let Some(request) = self.requests.iter().find(|r| &r.interruption_id == id) else {
                return Err(Refusal::Invalid(InvalidDecisions::Unknown(id.clone())));
            };
            if !seen.insert(id.as_str()) {
                return Err(Refusal::Invalid(InvalidDecisions::Duplicate(id.clone())));
            }
            if decision.reason.as_ref().is_some_and(|r| r.chars().count() > MAX_REASON_CHARS) {
                return Err(Refusal::Invalid(InvalidDecisions::ReasonTooLong(id.clone())));
            }
            if request.is_decided() || request.approved_by.contains(&batch.actor) {
                return Err(Refusal::AlreadyDecided);
            }
        }
        Ok(())
    }

    /// Counts `batch`, unless it would count for nothing.
    pub(crate) fn apply(&mut self, batch: &DecisionBatch) -> Result<(), Refusal> {
        self.check(batch)?;
        for decision in &batch.decisions {
            if let Some(request) = self.requests.iter_mut().find(|r| r.interruption_id == decision.interruption_id) {
                if decision.approved {
                    request.approved_by.push(batch.actor.clone());
                    if decision.reason.is_some() {
                        request.reason.clone_from(&decision.reason);
                    }
                } else {
                    // A rejection says why in its own words (or not at all).
                    request.rejected_by = Some(batch.actor.clone());
                    request.reason.clone_from(&decision.reason);
                }
            }
        }
        Ok(())
    }

    /// Whether every request is decided.
    pub(crate) fn is_decided(&self) -> bool {
        self.requests.iter().all(RequestProgress::is_decided)
    }

    /// Whether request `id` is decided.
    pub(crate) fn decides(&self, id: &InterruptionId) -> bool {
        self.requests.iter().any(|r| &r.interruption_id == id && r.is_decided())
    }

    /// Whether `actor` decided request `id`.
    pub(crate) fn decided_by(&self, id: &InterruptionId, actor: &str) -> bool {
        self.requests.iter().any(|r| {
            &r.interruption_id == id
                && (r.approved_by.iter().any(|a| a == actor) || r.rejected_by.as_deref() == Some(actor))
        })
    }

    /// What the script is resumed with, once decided: `{approved, reason, decidedBy}` per request.
    pub(crate) fn resolutions(&self) -> Vec<Resolution> {
        self.requests
            .iter()
            .map(|r| {
                let (approved, by) = match &r.rejected_by {
                    Some(actor) => (false, vec![actor.clone()]),
                    None => (true, r.approved_by.clone()),
                };
                Resolution::new(
                    r.interruption_id.clone(),
                    json!({ "approved": approved, "reason": r.reason, "decidedBy": by }),
                )
            })
            .collect()
    }

    /// The round's decisions as one batch (for its history), by everyone who decided.
    pub(crate) fn as_batch(&self) -> DecisionBatch {
        let mut deciders: Vec<String> = Vec::new();
        let decisions = self
            .requests
            .iter()
            .map(|r| {
                for actor in r.approved_by.iter().chain(&r.rejected_by) {
                    if !deciders.contains(actor) {
                        deciders.push(actor.clone());
                    }
                }
                super::decision::Decision {
                    interruption_id: r.interruption_id.clone(),
                    approved: r.rejected_by.is_none(),
                    reason: r.reason.clone(),
                }
            })
            .collect();
        DecisionBatch { decisions, actor: deciders.join(", ") }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::automation::decision::Decision;

    fn pending(quorums: &[u64]) -> Vec<PendingRequest> {
        quorums
            .iter()
            .enumerate()
            .map(|(i, q)| PendingRequest {
                interruption_id: format!("interrupt-{}", i + 1).into(),
                function: "f.g".into(),
                request: json!({ "kind": crate::connector::APPROVAL_KIND, "quorum": q }),
                deadline: None,
            })
            .collect()
    }

    fn batch(actor: &str, decisions: &[(&str, bool)]) -> DecisionBatch {
        DecisionBatch {
            decisions: decisions
                .iter()
                .map(|(id, approved)| Decision { interruption_id: (*id).into(), approved: *approved, reason: None })
                .collect(),
            actor: actor.into(),
        }
    }

    #[test]
    fn a_quorum_needs_distinct_approvers_and_one_rejection_rejects() {
        let mut round = RoundProgress::new(&pending(&[2, 1]));
        round.apply(&batch("bob", &[("interrupt-1", true)])).unwrap();
        assert!(!round.is_decided());
        assert_eq!(round.apply(&batch("bob", &[("interrupt-1", true)])), Err(Refusal::AlreadyDecided));
        round.apply(&batch("carol", &[("interrupt-1", true), ("interrupt-2", true)])).unwrap();
        assert!(round.is_decided());
        assert_eq!(round.resolutions()[0].value["decidedBy"], json!(["bob", "carol"]));
        assert_eq!(round.apply(&batch("dave", &[("interrupt-2", false)])), Err(Refusal::AlreadyDecided));

        let mut rejected = RoundProgress::new(&pending(&[2]));
        let mut approved = batch("bob", &[("interrupt-1", true)]);
        approved.decisions[0].reason = Some("fine by me".into());
        rejected.apply(&approved).unwrap();
        rejected.apply(&batch("carol", &[("interrupt-1", false)])).unwrap();
        assert!(rejected.is_decided());
        assert_eq!(
            rejected.resolutions()[0].value,
            json!({ "approved": false, "reason": null, "decidedBy": ["carol"] })
        );
    }

    #[test]
    fn a_batch_counts_as_a_whole_or_not_at_all() {
        let mut round = RoundProgress::new(&pending(&[1, 1]));
        round.apply(&batch("bob", &[("interrupt-1", true)])).unwrap();
        let mixed = batch("carol", &[("interrupt-2", true), ("interrupt-1", true)]);
        assert_eq!(round.apply(&mixed), Err(Refusal::AlreadyDecided));
        assert!(!round.decides(&"interrupt-2".into()), "nothing of a refused batch counts");
        let unknown = batch("carol", &[("interrupt-9", true)]);
        assert_eq!(round.check(&unknown), Err(Refusal::Invalid(InvalidDecisions::Unknown("interrupt-9".into()))));
        let replayed = RoundProgress::replay(&pending(&[1, 1]), &[batch("bob", &[("interrupt-1", true)]).to_value()]);
        assert!(replayed.decides(&"interrupt-1".into()) && !replayed.is_decided());
    }
}
