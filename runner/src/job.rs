//! What a worker executes, and what comes back.

use crate::bytecode_cache::{BytecodeCacheConfig, CacheLookup};
use crate::event::EventSink;
use crate::ledger_feed::LedgerFeed;
use crate::limits::Limits;
use crate::link::HostLink;
use crate::outcome::{ConsoleLine, Interruption};
use crate::scope::Scope;
use crate::state::LedgerEntry;
use resumable_host::HostResult;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::sync::mpsc::{self, RecvTimeoutError};
use std::time::Duration;

/// A run as the engine needs it: the script, what it may call, its limits and its recorded past.
/// A worker thread gets it inside a [`Job`]; a worker process gets it in a frame.
#[derive(Serialize, Deserialize)]
pub(crate) struct PreparedRun {
    pub source: Arc<str>,
    pub source_hash: [u8; 32],
    /// The scope (audience, context, host functions and their signatures) a continuation must
    /// have been made for, and that one made of this run is bound to.
    pub scope: Scope,
    /// Sorted full names of the host functions the script may call.
    pub functions: Arc<[String]>,
    pub limits: Limits,
    pub replay: Replay,
    /// Whether the runner can sign a continuation (without, an interruption fails the run).
    pub can_interrupt: bool,
    /// Bounds of the worker's bytecode cache.
    pub cache: BytecodeCacheConfig,
}

/// One run, ready to execute, with the ends it talks through.
pub(crate) struct Job {
    pub run: PreparedRun,
    /// Where settled host calls and an abort arrive.
    pub inbox: Box<dyn Inbox + Send>,
    /// Set when the caller gives up (in a worker process, by the abort signal); the engine checks
    /// it between jobs and in its interrupt handler.
    pub abort: Arc<AtomicBool>,
    /// How host calls (and the consumption of a stored continuation) leave the worker.
    pub link: Option<HostLink>,
    /// Where live events go; `None` when nobody asked for them (then none are made).
    pub events: Option<Box<dyn EventSink>>,
    /// Set by the worker: whether the bytecode came from its cache.
    pub lookup: Option<CacheLookup>,
}

/// Where the messages a run waits for come from: a channel in thread mode, the pipe from the
/// parent in a worker process.
pub(crate) trait Inbox {
    /// The next message, waiting at most `timeout`.
    fn next(&self, timeout: Duration) -> Result<WorkerMessage, RecvTimeoutError>;
}

impl Inbox for mpsc::Receiver<WorkerMessage> {
    fn next(&self, timeout: Duration) -> Result<WorkerMessage, RecvTimeoutError> {
        self.recv_timeout(timeout)
    }
}

/// The recorded past of the run (empty for a first run).
#[derive(Serialize, Deserialize)]
pub(crate) struct Replay {
    pub logical_run_id: Arc<str>,
    pub seed: u64,
    pub start_clock: f64,
    /// The recorded calls (none yet when `streamed`).
    pub ledger: Vec<LedgerEntry>,
    /// A continuation that the worker receives while it is authenticated and decoded (a worker
    /// process parses it itself, as it arrives through the pipe).
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
    /// How many calls the state records, once its head has arrived.
    pub count: usize,
}

/// Sent to the worker while a run executes.
pub(crate) enum WorkerMessage {
    /// A host call that is not settled inline has finished.
    Settled {
        index: u32,
        result: HostResult,
        /// The logical time of the settle, chosen by the parent in process mode; `None` when the
        /// engine reads the wall clock itself.
        clock: Option<f64>,
    },
    /// The caller gave up on the run.
    Abort,
}

/// A run's result before its continuation is encoded.
#[derive(Serialize, Deserialize)]
pub(crate) enum RawOutcome {
    Completed { value: Value, console: Vec<ConsoleLine> },
    Interrupted { ledger: Vec<LedgerEntry>, interruptions: Vec<Interruption>, console: Vec<ConsoleLine> },
}
