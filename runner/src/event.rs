//! What a live run reports while it runs: [`RunEvent`]s, in the order things happened.

use crate::error::{ErrorCode, RunError};
use crate::outcome::{ConsoleLevel, Outcome};
use crate::state::CallOutcome;
use crate::text::clip;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Host-call values and payloads whose JSON text is longer than this are left
/// out of events (their size is still given), so that one event stays small.
pub const EVENT_VALUE_BYTES: usize = 16 * 1024;

/// One thing that happened in a run. Serialized as one JSON object tagged by
/// `type` (`{"type":"call_started","index":1,"name":"orders.get"}`).
///
/// A run's events end with exactly one terminal event: `completed`,
/// `interrupted` or `failed`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
#[non_exhaustive]
pub enum RunEvent {
    /// The script called a host function, and the host function is now running.
    CallStarted {
        /// 1-based call index (the `k` of `interrupt-<k>`).
        index: u32,
        /// Full function name, such as `orders.get`.
        name: String,
    },
    /// The script made a call that a resumed run serves from its ledger: the
    /// host function does not run again, and no `call_started` or
    /// `call_completed` follows. This includes an interrupted call that the
    /// resume leaves undecided (it stays pending). An interrupted call resumed
    /// with a decision is not replayed; it runs again, live (`call_started`).
    CallReplayed {
        /// 1-based call index.
        index: u32,
        /// Full function name.
        name: String,
    },
    /// A live host call settled.
    CallCompleted {
        /// 1-based call index.
        index: u32,
        /// Full function name.
        name: String,
        /// How it settled.
        outcome: CallSettlement,
    },
    /// The script wrote a console line (only lines within the console limit,
    /// then one `truncated` line).
    Console {
        /// Which console method.
        level: ConsoleLevel,
        /// The formatted line.
        text: String,
    },
    /// The consumer read events more slowly than the run made them: `missed`
    /// events were dropped here. Only live events are ever dropped; the
    /// terminal event always arrives.
    Lagged {
        /// How many events were dropped.
        missed: u64,
    },
    /// Terminal: the run paused on these interruptions.
    Interrupted {
        /// Ids of the pending interruptions (`interrupt-<k>`).
        interruptions: Vec<String>,
    },
    /// Terminal: the script returned `value`.
    Completed {
        /// The returned value.
        value: Value,
    },
    /// Terminal: the run failed.
    Failed {
        /// Code and message of the run's error.
        error: EventError,
    },
}

/// How a live host call settled.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "status", rename_all = "snake_case")]
#[non_exhaustive]
pub enum CallSettlement {
    /// The host function returned a value.
    Fulfilled {
        /// The value, unless its JSON text is over [`EVENT_VALUE_BYTES`].
        #[serde(default, skip_serializing_if = "Option::is_none")]
        value: Option<Value>,
        /// Length of the value's JSON text.
        bytes: usize,
    },
    /// The host function failed; the script sees a `RUN_HOST_FUNCTION_ERROR`.
    Rejected {
        /// Code and message (cut to [`EVENT_VALUE_BYTES`]).
        error: EventError,
    },
    /// The host function interrupted the run.
    Interrupted {
        /// `interrupt-<k>`.
        interruption_id: String,
        /// The payload, unless its JSON text is over [`EVENT_VALUE_BYTES`].
        #[serde(default, skip_serializing_if = "Option::is_none")]
        payload: Option<Value>,
        /// Length of the payload's JSON text.
        bytes: usize,
    },
}

/// An error as events report it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EventError {
    /// Stable code such as `RUN_TIMEOUT`.
    pub code: ErrorCode,
    /// Human-readable explanation.
    pub message: String,
}

impl RunEvent {
    /// Whether this event ends the run's events (`completed`, `interrupted`, `failed`).
    pub fn is_terminal(&self) -> bool {
        matches!(self, RunEvent::Completed { .. } | RunEvent::Interrupted { .. } | RunEvent::Failed { .. })
    }

    /// The terminal event for a run's result.
    pub(crate) fn ending(result: &Result<Outcome, RunError>) -> RunEvent {
        match result {
            Ok(Outcome::Completed(done)) => RunEvent::Completed { value: done.value.clone() },
            Ok(Outcome::Interrupted(paused)) => {
                RunEvent::Interrupted { interruptions: paused.interruptions.iter().map(|i| i.id.clone()).collect() }
            }
            Err(error) => RunEvent::Failed { error: EventError { code: error.code, message: error.message.clone() } },
        }
    }
}

impl CallSettlement {
    /// The settlement of call `index` from its ledger outcome.
    pub(crate) fn of(index: u32, outcome: &CallOutcome) -> CallSettlement {
        match outcome {
            CallOutcome::Fulfilled(text) => CallSettlement::Fulfilled { value: small_json(text), bytes: text.len() },
            CallOutcome::Interrupted(text) => CallSettlement::Interrupted {
                interruption_id: format!("interrupt-{index}"),
                payload: small_json(text),
                bytes: text.len(),
            },
            CallOutcome::Rejected { message, .. } => CallSettlement::Rejected {
                error: EventError {
                    code: ErrorCode::HostFunctionError,
                    message: clip(message, EVENT_VALUE_BYTES).to_string(),
                },
            },
        }
    }
}

/// The value of JSON `text`, when it is short enough to put into an event.
fn small_json(text: &str) -> Option<Value> {
    (text.len() <= EVENT_VALUE_BYTES).then(|| serde_json::from_str(text).ok()).flatten()
}

/// Where a worker puts the events of one run.
pub(crate) trait EventSink: Send {
    /// Reports one live event; never blocks the run.
    fn emit(&self, event: RunEvent);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_are_tagged_in_snake_case() {
        let event = RunEvent::CallCompleted {
            index: 2,
            name: "tools.echo".into(),
            outcome: CallSettlement::of(2, &CallOutcome::Fulfilled("[1]".into())),
        };
        let text = serde_json::to_string(&event).unwrap();
        assert_eq!(
            text,
            r#"{"type":"call_completed","index":2,"name":"tools.echo","outcome":{"status":"fulfilled","value":[1],"bytes":3}}"#
        );
        assert_eq!(serde_json::from_str::<RunEvent>(&text).unwrap(), event);
    }

    #[test]
    fn large_values_are_left_out_but_sized() {
        let text = format!("\"{}\"", "x".repeat(EVENT_VALUE_BYTES));
        let CallSettlement::Fulfilled { value, bytes } =
            CallSettlement::of(1, &CallOutcome::Fulfilled(text.as_str().into()))
        else {
            panic!("fulfilled")
        };
        assert_eq!((value, bytes), (None, text.len()));
        let long = CallOutcome::Rejected { message: "é".repeat(EVENT_VALUE_BYTES), details: None };
        let CallSettlement::Rejected { error } = CallSettlement::of(1, &long) else { panic!("rejected") };
        assert!(error.message.len() <= EVENT_VALUE_BYTES);
    }
}
