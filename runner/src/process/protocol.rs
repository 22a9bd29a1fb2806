//! The messages between the runner (parent) and a worker process (child).

use crate::bytecode_cache::CacheLookup;
use crate::error::RunError;
use crate::event::RunEvent;
use crate::job::PreparedRun;
use crate::outcome::ConsoleLine;
use resumable_host::{HostError, HostFailure, HostResult};
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Everything a child needs to run one script.
#[derive(Serialize, Deserialize)]
pub(crate) struct JobSpec {
    pub run: PreparedRun,
    /// Whether the child sends live events.
    pub events: bool,
    /// Whether the child may poll the pipe for a moment before it sleeps (a core is free for it).
    pub spin: bool,
}

/// Parent to child.
#[derive(Serialize, Deserialize)]
pub(crate) enum ToChild {
    /// A run to execute. Its prior ledger is left out of the JSON: what follows is the length of
    /// a continuation state, then that state in its encoding (whose head gives the run id, seed
    /// and clock), possibly still being decoded by the parent.
    Run(Box<JobSpec>),
    /// How a host call ended, and the logical time of the settle (the parent keeps the clock).
    /// An abort is a signal, not a frame (see `Worker::abort`).
    Settled { index: u32, outcome: CallOutcomeFrame, clock: f64 },
}

/// Child to parent.
#[derive(Serialize, Deserialize)]
pub(crate) enum ToParent {
    Call {
        index: u32,
        function: String,
        arguments: String,
        /// Whether the worker resumes an interrupted call here; the parent supplies the decision
        /// itself, from the ledger and resolutions it holds.
        resumed: bool,
    },
    /// A live event of the run, sent in the order it happened (before `Done`).
    Event(RunEvent),
    /// The run's answer, and whether its bytecode came from the child's cache.
    Done(Result<Answer, RunError>, Option<CacheLookup>),
}

/// How a run ended, as a worker reports it. It holds no ledger and no interruptions: the parent
/// builds those from the calls it served itself, so a worker cannot change what a continuation
/// records or what approvers are asked.
#[derive(Serialize, Deserialize)]
pub(crate) enum Answer {
    Completed {
        value: Value,
        console: Vec<ConsoleLine>,
    },
    /// Interrupted: when each call the parent served settled, in the script's view.
    Interrupted {
        settled: Vec<Settlement>,
        console: Vec<ConsoleLine>,
    },
}

/// When a call that crossed the pipe settled: its place among the run's settles (none for an
/// interrupted call). It decides only in which order the script's own replay settles its calls.
#[derive(Serialize, Deserialize)]
pub(crate) struct Settlement {
    pub index: u32,
    pub settle_order: Option<u32>,
}

/// A host call's result, without the host's internal details.
#[derive(Clone, Serialize, Deserialize)]
pub(crate) enum CallOutcomeFrame {
    Value(Value),
    Interrupt(Value),
    Failed { message: String, details: Option<Value> },
}

impl From<HostResult> for CallOutcomeFrame {
    fn from(result: HostResult) -> Self {
        match result {
            Ok(value) => CallOutcomeFrame::Value(value),
            Err(HostError::Interrupt(payload)) => CallOutcomeFrame::Interrupt(payload),
            Err(HostError::Failed(failure)) => {
                CallOutcomeFrame::Failed { message: failure.message, details: failure.details }
            }
            Err(_) => CallOutcomeFrame::Failed { message: "the host function failed".into(), details: None },
        }
    }
}

impl From<CallOutcomeFrame> for HostResult {
    fn from(frame: CallOutcomeFrame) -> Self {
        match frame {
            CallOutcomeFrame::Value(value) => Ok(value),
            CallOutcomeFrame::Interrupt(payload) => Err(HostError::Interrupt(payload)),
            CallOutcomeFrame::Failed { message, details } => {
                Err(HostError::Failed(HostFailure { message, details, internal: None }))
            }
        }
    }
}
