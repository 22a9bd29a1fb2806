//! What a worker executes, and what comes back.

use crate::bytecode_cache::{BytecodeCacheConfig, CacheLookup};
use crate::event::EventSink;
use crate::ledger_feed::LedgerFeed;
use crate::limits::Limits;
use crate::link::HostLink;
use crate::outcome::{ConsoleLine, Interruption};
use crate::state::LedgerEntry;
use resumable_host::HostResult;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::sync::mpsc;

/// One run, ready to execute.
pub(crate) struct Job {
    pub source: Arc<str>,
    pub source_hash: [u8; 32],
    /// Sorted full names of the host functions the script may call.
    pub functions: Arc<[String]>,
    pub limits: Limits,
    pub replay: Replay,
    pub inbox: mpsc::Receiver<WorkerMessage>,
    pub abort: Arc<AtomicBool>,
    pub can_interrupt: bool,
    /// How host calls (and the consumption of a stored continuation) leave the worker.
    pub link: Option<HostLink>,
    /// Where live events go; `None` when nobody asked for them (then none are made).
    pub events: Option<Box<dyn EventSink>>,
    /// Bounds of the worker's bytecode cache.
    pub cache: BytecodeCacheConfig,
    /// Set by the worker: whether the bytecode came from its cache.
    pub lookup: Option<CacheLookup>,
}

/// The recorded past of the run (empty for a first run).
#[derive(Serialize, Deserialize)]
pub(crate) struct Replay {
    pub logical_run_id: Arc<str>,
    pub seed: u64,
    pub start_clock: f64,
    /// The recorded calls (none yet when `streamed`).
    pub ledger: Vec<LedgerEntry>,
    /// A continuation that the worker receives while it is authenticated and decoded
    /// (never sent to a worker process, which gets the whole ledger).
    #[serde(skip)]
    pub streamed: Option<Streamed>,
    /// Decisions for interrupted calls, by 1-based call index.
    pub resolutions: HashMap<u32, Value>,
}

/// A continuation the worker takes over before its state is decoded: it reads the state's
/// head from `feed` and checks it, and only then starts the script (whose seed, clock and run
/// id come from that head). Only authenticated parts of the state arrive in `feed`.
pub(crate) struct Streamed {
    pub feed: LedgerFeed,
    /// The scope the state must have been made for.
    pub scope_hash: [u8; 32],
    /// How many calls the state records, once its head has arrived.
    pub count: usize,
}

/// Sent to the worker while a run executes.
pub(crate) enum WorkerMessage {
    /// A host call that is not settled inline has finished.
    Settled(u32, HostResult),
    /// The caller gave up on the run.
    Abort,
}

/// A run's result before its continuation is encoded.
#[derive(Serialize, Deserialize)]
pub(crate) enum RawOutcome {
    Completed { value: Value, console: Vec<ConsoleLine> },
    Interrupted { ledger: Vec<LedgerEntry>, interruptions: Vec<Interruption>, console: Vec<ConsoleLine> },
}
