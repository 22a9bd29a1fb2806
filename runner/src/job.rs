//! What the caller hands a worker, and what comes back.

use crate::error::RunError;
use crate::limits::Limits;
use crate::outcome::{ConsoleLine, Interruption};
use crate::state::LedgerEntry;
use resumable_host::{CancelSignal, HostFunctions, HostResult};
use serde_json::Value;
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::sync::mpsc;

/// One run, ready to execute.
pub(crate) struct Job {
    pub source: Arc<str>,
    pub source_hash: [u8; 32],
    pub host: HostFunctions,
    pub limits: Limits,
    pub replay: Replay,
    pub tokio: tokio::runtime::Handle,
    pub inbox: mpsc::Receiver<WorkerMessage>,
    pub inbox_sender: mpsc::Sender<WorkerMessage>,
    pub abort: Arc<AtomicBool>,
    pub can_interrupt: bool,
    pub host_cancel: CancelSignal,
    pub reply: tokio::sync::oneshot::Sender<Result<RawOutcome, RunError>>,
}

/// The recorded past of the run (empty for a first run).
pub(crate) struct Replay {
    pub logical_run_id: Arc<str>,
    pub seed: u64,
    pub start_clock: f64,
    pub ledger: Vec<LedgerEntry>,
    /// Decisions for interrupted calls, by 1-based call index.
    pub resolutions: HashMap<u32, Value>,
}

/// Sent to the worker while a run executes.
pub(crate) enum WorkerMessage {
    /// A host call that was handed to the async runtime has finished.
    Settled(u32, HostResult),
    /// The caller gave up on the run.
    Abort,
}

/// A run's result before its continuation is encoded.
pub(crate) enum RawOutcome {
    Completed { value: Value, console: Vec<ConsoleLine> },
    Interrupted { ledger: Vec<LedgerEntry>, interruptions: Vec<Interruption>, console: Vec<ConsoleLine> },
}
