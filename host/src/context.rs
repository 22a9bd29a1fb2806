//! What a host function knows about the call it serves.

use crate::{CancelSignal, HostError};
use serde_json::Value;
use std::sync::Arc;

/// The decision for an interrupted call, given when the run is resumed.
#[derive(Debug, Clone, PartialEq)]
pub struct Resume {
    /// The interruption being answered (`interrupt-<k>`).
    pub interruption_id: String,
    /// The payload the call interrupted with.
    pub payload: Value,
    /// The value the decider supplied.
    pub resolution: Value,
}

/// Per-call context handed to every host function.
#[derive(Debug, Clone)]
pub struct HostCallContext {
    logical_run_id: Arc<str>,
    function: Arc<str>,
    index: u32,
    resume: Option<Resume>,
    cancel: CancelSignal,
}

impl HostCallContext {
    /// Builds a context. The runner does this for every call; embedders need it
    /// only to unit-test their host functions.
    pub fn new(
        logical_run_id: impl Into<Arc<str>>,
        function: impl Into<Arc<str>>,
        index: u32,
        resume: Option<Resume>,
        cancel: CancelSignal,
    ) -> Self {
        Self { logical_run_id: logical_run_id.into(), function: function.into(), index, resume, cancel }
    }

    /// Id of the logical run; stable across every resume of one script.
    pub fn logical_run_id(&self) -> &str {
        &self.logical_run_id
    }

    /// Full name of the function being called (`orders.refund`).
    pub fn function(&self) -> &str {
        &self.function
    }

    /// 1-based index of this call in the order the script made its calls.
    pub fn index(&self) -> u32 {
        self.index
    }

    /// Set when this call interrupted before and is now being run again with a decision.
    pub fn resume(&self) -> Option<&Resume> {
        self.resume.as_ref()
    }

    /// The id an interruption of this call has: `interrupt-<index>`.
    pub fn interruption_id(&self) -> String {
        format!("interrupt-{}", self.index)
    }

    /// `logical_run_id:interruption_id`: the same on the first attempt and on every
    /// resume of this call, so an effect keyed by it happens once.
    pub fn idempotency_key(&self) -> String {
        format!("{}:{}", self.logical_run_id, self.interruption_id())
    }

    /// Builds the error that pauses the run with `payload`; return it as `Err`.
    pub fn interrupt(&self, payload: Value) -> HostError {
        HostError::Interrupt(payload)
    }

    /// Fires when the run ends before this call settled (timeout, abort, limit).
    pub fn cancel_signal(&self) -> &CancelSignal {
        &self.cancel
    }

    /// Whether the run has given up on this call.
    pub fn is_cancelled(&self) -> bool {
        self.cancel.is_cancelled()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_derive_from_run_and_index() {
        let ctx = HostCallContext::new("run-7", "orders.refund", 3, None, CancelSignal::new());
        assert_eq!(ctx.interruption_id(), "interrupt-3");
        assert_eq!(ctx.idempotency_key(), "run-7:interrupt-3");
        assert!(ctx.interrupt(Value::Null).is_interrupt());
    }
}
