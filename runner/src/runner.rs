//! The public entry point: a [`Runner`] executes [`RunRequest`]s.

use crate::bytecode_cache::{BytecodeCacheConfig, RunnerStats, StatsCounters};
use crate::clock::Clock;
use crate::continuation::{Claim, ContinuationCodec, Inspection, Opened, StateStream};
use crate::determinism::{fresh_seed, wall_clock_ms};
use crate::error::{ConfigError, ErrorCode, RunError};
use crate::event::EventSink;
use crate::event_queue::EventQueue;
use crate::handle::RunHandle;
use crate::job::{Job, PreparedRun, RawOutcome, Replay, Streamed, WorkerMessage};
use crate::limits::{Limit, LimitOverrides, Limits};
use crate::link::{HostLink, LocalHost};
use crate::outcome::{Completion, Outcome, Resolution, Suspension};
use crate::pool::{Pool, Task, answer_soon};
use crate::process::{ProcessConfig, ProcessJob, ProcessPool};
use crate::scope::Scope;
use crate::state::{
    CallOutcome, ContinuationState, LedgerEntry, StateHead, check_head, source_hash, unknown_interruption,
};
use base64::Engine as _;
use resumable_host::{CancelSignal, HostFunctions};
use serde_json::Value;
use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::time::Duration;

/// Audience used when a request names none.
pub const DEFAULT_AUDIENCE: &str = "default";

/// How a [`Runner`] is set up. Every field is validated by [`Runner::new`].
#[derive(Clone)]
pub struct RunnerConfig {
    workers: usize,
    queue_capacity: usize,
    limits: Limits,
    codec: Option<ContinuationCodec>,
    processes: Option<ProcessConfig>,
    bytecode_cache: BytecodeCacheConfig,
    clock: Clock,
}

impl Default for RunnerConfig {
    fn default() -> Self {
        RunnerConfig {
            workers: thread_count(),
            queue_capacity: 1024,
            limits: Limits::default(),
            codec: None,
            processes: None,
            bytecode_cache: BytecodeCacheConfig::default(),
            clock: Clock::system(),
        }
    }
}

fn thread_count() -> usize {
    std::thread::available_parallelism().map(|n| n.get()).unwrap_or(2)
}

impl RunnerConfig {
    /// Defaults: one worker per core, a queue of 1,024 runs, default limits, no
    /// continuation codec, the default bytecode cache.
    pub fn new() -> Self {
        Self::default()
    }

    /// Number of worker threads (1 to 1,024).
    pub fn workers(mut self, workers: usize) -> Self {
        self.workers = workers;
        self
    }

    /// Runs that may wait for a worker before `RUN_CONCURRENCY_LIMIT` (1 to 1,000,000).
    pub fn queue_capacity(mut self, capacity: usize) -> Self {
        self.queue_capacity = capacity;
        self
    }

    /// Limits applied to every run unless the request overrides them.
    pub fn limits(mut self, limits: Limits) -> Self {
        self.limits = limits;
        self
    }

    /// Bounds (entries, bytes, age) of each worker's bytecode cache.
    pub fn bytecode_cache(mut self, config: BytecodeCacheConfig) -> Self {
        self.bytecode_cache = config;
        self
    }

    /// Runs scripts in killable worker processes instead of threads of this
    /// process (see [`ProcessConfig`]). Choose processes for scripts you do not
    /// trust; threads start faster and suit trusted, embedded use.
    pub fn processes(mut self, config: ProcessConfig) -> Self {
        self.processes = Some(config);
        self
    }

    /// The codec that turns continuations into tokens (signed, sealed or stored).
    /// Without one, scripts that never interrupt still run; an interrupt fails
    /// with `RUN_CONFIGURATION_ERROR`.
    pub fn codec(mut self, codec: impl Into<ContinuationCodec>) -> Self {
        self.codec = Some(codec.into());
        self
    }

    /// The clock continuations are issued and checked by (the system clock unless set): a
    /// token's issue time, expiry and age, a stored token's lifetime. A stored token's expiry is
    /// also checked by its store, with the store's own clock.
    pub fn clock(mut self, clock: Clock) -> Self {
        self.clock = clock;
        self
    }
}

impl fmt::Debug for RunnerConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RunnerConfig")
            .field("workers", &self.workers)
            .field("queue_capacity", &self.queue_capacity)
            .field("limits", &self.limits)
            .field("codec", &self.codec)
            .field("bytecode_cache", &self.bytecode_cache)
            .field("clock", &self.clock)
            .finish()
    }
}

/// One script to run, or to resume.
#[derive(Clone, Debug)]
pub struct RunRequest {
    source: Arc<str>,
    host: HostFunctions,
    context: Value,
    audience: String,
    limits: LimitOverrides,
    continuation: Option<Arc<str>>,
    resolutions: Vec<Resolution>,
    cancel: Option<CancelSignal>,
    logical_run_id: Option<String>,
    isolation: Option<Arc<str>>,
}

impl RunRequest {
    /// A run of `source`, a function body (top-level `await` and `return` allowed).
    pub fn new(source: impl Into<Arc<str>>) -> Self {
        RunRequest {
            source: source.into(),
            host: HostFunctions::empty(),
            context: Value::Null,
            audience: DEFAULT_AUDIENCE.to_string(),
            limits: LimitOverrides::new(),
            continuation: None,
            resolutions: Vec::new(),
            cancel: None,
            logical_run_id: None,
            isolation: None,
        }
    }

    /// The host functions the script may call.
    pub fn host(mut self, host: HostFunctions) -> Self {
        self.host = host;
        self
    }

    /// Any JSON bound into the continuation's scope (tenant, policy version…).
    pub fn context(mut self, context: Value) -> Self {
        self.context = context;
        self
    }

    /// Who the continuation is for; a token only resumes under the same audience.
    pub fn audience(mut self, audience: impl Into<String>) -> Self {
        self.audience = audience.into();
        self
    }

    /// Per-run limit overrides.
    pub fn limits(mut self, limits: LimitOverrides) -> Self {
        self.limits = limits;
        self
    }

    /// Resumes from `continuation` with decisions for some or all pending interruptions.
    pub fn resume(
        mut self,
        continuation: impl Into<String>,
        resolutions: impl IntoIterator<Item = Resolution>,
    ) -> Self {
        self.continuation = Some(continuation.into().into());
        self.resolutions = resolutions.into_iter().collect();
        self
    }

    /// A signal that aborts the run (`RUN_ABORTED`) when fired.
    pub fn cancel(mut self, signal: CancelSignal) -> Self {
        self.cancel = Some(signal);
        self
    }

    /// Sets the logical run id of a first run (ignored on resume, where the
    /// continuation's id is kept). Default: a random id.
    pub fn logical_run_id(mut self, id: impl Into<String>) -> Self {
        self.logical_run_id = Some(id.into());
        self
    }

    /// In process mode, runs with different isolation keys never share a worker process: a
    /// worker that ran a script of one key (a tenant, say) is never given a run of another, so a
    /// script that took its worker over cannot see other keys' sources, contexts or decisions.
    /// Runs without a key share workers with each other only.
    pub fn isolation(mut self, key: impl Into<Arc<str>>) -> Self {
        self.isolation = Some(key.into());
        self
    }
}

/// Runs scripts on a pool of worker threads or worker processes. Cheap to
/// clone; share one per process.
#[derive(Clone)]
pub struct Runner {
    inner: Arc<Inner>,
}

/// Where scripts execute.
enum Backend {
    Threads(Pool),
    Processes(Box<ProcessPool>),
}

struct Inner {
    backend: Backend,
    limits: Limits,
    codec: Option<ContinuationCodec>,
    bytecode_cache: BytecodeCacheConfig,
    clock: Clock,
    stats: Arc<StatsCounters>,
}

impl fmt::Debug for Runner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Runner").field("limits", &self.inner.limits).finish_non_exhaustive()
    }
}

impl Runner {
    /// Validates `config` and starts the workers.
    pub fn new(config: RunnerConfig) -> Result<Runner, ConfigError> {
        if !(1..=1024).contains(&config.workers) {
            return Err(ConfigError(format!("workers must be from 1 to 1024, got {}", config.workers)));
        }
        if !(1..=1_000_000).contains(&config.queue_capacity) {
            return Err(ConfigError(format!(
                "queue capacity must be from 1 to 1000000, got {}",
                config.queue_capacity
            )));
        }
        config.bytecode_cache.validate()?;
        let stats = Arc::new(StatsCounters::default());
        let backend = match config.processes {
            None => Backend::Threads(Pool::new(config.workers, config.queue_capacity, stats.clone())?),
            Some(processes) => {
                if !processes.program.exists() {
                    return Err(ConfigError(format!("worker program {} does not exist", processes.program.display())));
                }
                Backend::Processes(Box::new(ProcessPool::new(
                    processes,
                    config.workers,
                    config.queue_capacity,
                    stats.clone(),
                )))
            }
        };
        let inner = Inner {
            backend,
            limits: config.limits,
            codec: config.codec,
            bytecode_cache: config.bytecode_cache,
            clock: config.clock,
            stats,
        };
        Ok(Runner { inner: Arc::new(inner) })
    }

    /// The runner's default limits.
    pub fn limits(&self) -> &Limits {
        &self.inner.limits
    }

    /// Counters since the runner started (bytecode cache hits and misses, worker processes started
    /// and stopped) and the worker processes busy and idle now.
    pub fn stats(&self) -> RunnerStats {
        self.inner.stats.snapshot()
    }

    /// How the worker process that answered last was confined; `None` in thread mode or before
    /// a worker process answered. Run a trivial script first to learn it at start-up.
    pub fn worker_confinement(&self) -> Option<crate::process::Confinement> {
        match &self.inner.backend {
            Backend::Processes(pool) => pool.confinement(),
            Backend::Threads(_) => None,
        }
    }

    /// Runs (or resumes) a script. Must be called from within a tokio runtime;
    /// host functions run on that runtime. The same as `start(request).outcome()`.
    pub async fn run(&self, request: RunRequest) -> Result<Outcome, RunError> {
        self.execute_request(&request, None).await
    }

    /// A run of `request` to consume as it happens: await its outcome, stream
    /// its [`RunEvent`](crate::RunEvent)s, or pipe them to a writer as NDJSON
    /// (see [`RunHandle`]). Nothing runs until the handle is used.
    pub fn start(&self, request: RunRequest) -> RunHandle {
        RunHandle::new(self.clone(), request)
    }

    /// Runs `request`, reporting live events to `events` when given.
    pub(crate) async fn execute_request(
        &self,
        request: &RunRequest,
        events: Option<Arc<EventQueue>>,
    ) -> Result<Outcome, RunError> {
        if request.cancel.as_ref().is_some_and(CancelSignal::is_cancelled) {
            return Err(RunError::new(ErrorCode::Aborted, "the run was cancelled by its caller before it started"));
        }
        let limits = self.inner.limits.overridden_by(&request.limits);
        if request.source.len() as u64 > limits.get(Limit::Source) {
            return Err(RunError::new(
                ErrorCode::SourceTooLarge,
                format!(
                    "the source is {} bytes, over the limit of {}",
                    request.source.len(),
                    limits.get(Limit::Source)
                ),
            ));
        }
        if tokio::runtime::Handle::try_current().is_err() {
            return Err(RunError::new(
                ErrorCode::ConfigurationError,
                "Runner::run must be called inside a tokio runtime",
            ));
        }
        let source_hash = source_hash(&request.source);
        let scope = Scope::new(&request.audience, &request.host, &request.context, &source_hash);
        let (replay, claim, rest) = self.replay(request, &limits, &source_hash, &scope).await?;
        let run = PreparedRun {
            source: request.source.clone(),
            source_hash,
            scope,
            functions: request.host.names().map(str::to_string).collect(),
            limits,
            replay,
            can_interrupt: self.inner.codec.is_some(),
            cache: self.inner.bytecode_cache,
        };
        let result = self.execute(request, run, claim.clone(), rest, events).await;
        if let Some(claim) = claim {
            claim.release_unless_consumed().await;
        }
        result
    }

    async fn execute(
        &self,
        request: &RunRequest,
        run: PreparedRun,
        claim: Option<Arc<Claim>>,
        rest: Option<StateStream>,
        events: Option<Arc<EventQueue>>,
    ) -> Result<Outcome, RunError> {
        let (source_hash, scope, limits) = (run.source_hash, run.scope.clone(), run.limits);
        let mut seed = run.replay.seed;
        let mut start_clock = run.replay.start_clock;
        let mut logical_run_id = run.replay.logical_run_id.clone();

        let (raw, decoded) = match &self.inner.backend {
            Backend::Threads(pool) => {
                let events = events.map(|queue| Box::new(queue) as Box<dyn EventSink>);
                self.run_on_thread(pool, request, run, claim, rest, events).await
            }
            Backend::Processes(pool) => {
                let job = ProcessJob {
                    run,
                    rest,
                    key: request.isolation.clone().unwrap_or_else(|| Arc::from("")),
                    host: request.host.clone(),
                    claim,
                    cancel: request.cancel.clone().unwrap_or_default(),
                    events,
                };
                pool.run(job).await
            }
        };
        // A streamed continuation's head, as this process decoded it (the worker ran on the same,
        // authenticated, one).
        if let Some(head) = decoded {
            (seed, start_clock, logical_run_id) = (head.seed, head.start_clock, head.logical_run_id.into());
        }
        match raw? {
            RawOutcome::Completed { value, console } => Ok(Outcome::Completed(Completion { value, console })),
            RawOutcome::Interrupted { ledger, interruptions, console } => {
                let functions = scope.used_by(&ledger)?;
                let state = ContinuationState {
                    source_hash,
                    scope_hash: scope.hash(&functions),
                    logical_run_id: logical_run_id.to_string(),
                    seed,
                    start_clock,
                    functions: Some(functions),
                    ledger,
                };
                let codec = self.inner.codec.as_ref().ok_or_else(no_codec)?;
                let continuation = codec.issue(&state, &request.audience, &limits, self.inner.clock.now()).await?;
                Ok(Outcome::Interrupted(Suspension {
                    interruptions,
                    continuation,
                    logical_run_id: logical_run_id.to_string(),
                    console,
                }))
            }
        }
    }

    /// Runs a job on a worker thread of this process; also answers the head of a streamed
    /// continuation, as this thread decoded it.
    async fn run_on_thread(
        &self,
        pool: &Pool,
        request: &RunRequest,
        run: PreparedRun,
        claim: Option<Arc<Claim>>,
        rest: Option<StateStream>,
        events: Option<Box<dyn EventSink>>,
    ) -> (Result<RawOutcome, RunError>, Option<StateHead>) {
        let limits = run.limits;
        let (reply, mut answer) = tokio::sync::oneshot::channel();
        let (inbox_sender, inbox) = mpsc::channel();
        let abort = Arc::new(AtomicBool::new(false));
        let link = HostLink::Local(LocalHost {
            functions: request.host.clone(),
            tokio: tokio::runtime::Handle::current(),
            inbox: inbox_sender.clone(),
            cancel: CancelSignal::new(),
            claim,
            tasks: Default::default(),
        });
        let job = Job { run, inbox: Box::new(inbox), abort: abort.clone(), link: Some(link), events, lookup: None };
        if let Err(error) = pool.submit(Task { job, reply }) {
            // A forged state is refused as such.
            return (Err(rest.and_then(|rest| rest.authenticate().err()).unwrap_or(error)), None);
        }
        // The worker replays the continuation while its state is authenticated and decoded here.
        let (mut decoded, mut authentic) = (None, Ok(()));
        if let Some(rest) = rest {
            (decoded, authentic) = rest.finish();
        }
        let mut stop = StopOnDrop { abort, inbox: inbox_sender, armed: true };
        let cancel = request.cancel.clone().unwrap_or_default();
        // A worker stuck in one long native operation cannot be interrupted in
        // thread mode; the caller still gets its answer.
        let backstop = limits.timeout() + Duration::from_secs(1) + limits.timeout() / 2;
        let result = tokio::select! {
            result = answer_soon(pool, &mut answer) => result.unwrap_or_else(|| Err(RunError::internal("the worker stopped"))),
            _ = cancel.cancelled() => {
                stop.fire();
                match tokio::time::timeout(Duration::from_secs(1), &mut answer).await {
                    Ok(Ok(result)) => result,
                    _ => Err(RunError::new(ErrorCode::Aborted, "the run was cancelled by its caller")),
                }
            }
            _ = tokio::time::sleep(backstop) => {
                stop.fire();
                Err(RunError::new(ErrorCode::Timeout, "the run did not stop at its time limit and was abandoned"))
            }
        };
        stop.armed = false;
        // A forged chunk is the verdict, whatever the worker made of the authentic ones first.
        (authentic.and(result), decoded)
    }

    /// Verifies `token` (signature, expiry, store state) and describes its pending
    /// interruptions without consuming anything.
    pub async fn inspect(&self, token: &str) -> Result<Inspection, RunError> {
        self.inner.codec.as_ref().ok_or_else(no_codec)?.inspect_at(token, self.inner.clock.now()).await
    }

    /// Verifies the continuation and resolutions (claiming a stored token), or
    /// starts a fresh history.
    async fn replay(
        &self,
        request: &RunRequest,
        limits: &Limits,
        source: &[u8; 32],
        scope: &Scope,
    ) -> Result<(Replay, Option<Arc<Claim>>, Option<StateStream>), RunError> {
        let Some(token) = &request.continuation else {
            return Ok((fresh_replay(request)?, None, None));
        };
        if request.resolutions.is_empty() {
            // It could only stop at the same interruptions again, having used the token up.
            return Err(RunError::protocol("a resume must decide at least one interruption; none was given"));
        }
        let codec = self.inner.codec.as_ref().ok_or_else(no_codec)?;
        // A worker can replay a continuation while this thread authenticates and decodes its state.
        match codec.open(token, &request.audience, limits, self.inner.clock.now()).await? {
            Opened::Whole { state, claim } => match resumed_replay(state, request, limits, source, scope) {
                Ok(replay) => Ok((replay, claim, None)),
                Err(error) => {
                    if let Some(claim) = claim {
                        claim.release_unless_consumed().await;
                    }
                    Err(error)
                }
            },
            Opened::Streamed { feed, rest } => {
                let resolutions = match resolutions_of(request, None) {
                    Ok(resolutions) => resolutions,
                    // A forged state is refused as such.
                    Err(error) => return Err(rest.authenticate().err().unwrap_or(error)),
                };
                let streamed = Streamed { feed, count: 0 };
                // The run id, seed and clock are the state's, which the worker reads from the
                // head that arrives first in the feed.
                let replay = Replay {
                    logical_run_id: Arc::from(""),
                    seed: 0,
                    start_clock: 0.0,
                    ledger: Vec::new(),
                    streamed: Some(streamed),
                    resolutions,
                };
                Ok((replay, None, Some(rest)))
            }
        }
    }
}

fn no_codec() -> RunError {
    RunError::new(
        ErrorCode::ConfigurationError,
        "the run needs a continuation, but the runner has no continuation codec (secret or store) configured",
    )
}

/// The history of a first run.
fn fresh_replay(request: &RunRequest) -> Result<Replay, RunError> {
    if !request.resolutions.is_empty() {
        return Err(RunError::protocol("resolutions were given without a continuation"));
    }
    let logical_run_id = match &request.logical_run_id {
        Some(id) if !id.is_empty() && id.len() <= 256 => id.clone(),
        Some(_) => {
            return Err(RunError::new(ErrorCode::ConfigurationError, "a logical run id must be 1 to 256 bytes"));
        }
        None => new_run_id(),
    };
    Ok(Replay {
        logical_run_id: logical_run_id.into(),
        seed: fresh_seed(),
        start_clock: wall_clock_ms(),
        ledger: Vec::new(),
        streamed: None,
        resolutions: HashMap::new(),
    })
}

/// Checks a decoded continuation against this request: same source and scope, and
/// resolutions that each answer one pending interruption.
fn resumed_replay(
    state: ContinuationState,
    request: &RunRequest,
    limits: &Limits,
    source: &[u8; 32],
    scope: &Scope,
) -> Result<Replay, RunError> {
    let (head, ledger) = state.into_parts();
    check_head(&head, source, scope, limits)?;
    let resolutions = resolutions_of(request, Some(&ledger))?;
    Ok(Replay {
        logical_run_id: head.logical_run_id.into(),
        seed: head.seed,
        start_clock: head.start_clock,
        ledger,
        streamed: None,
        resolutions,
    })
}

/// The decisions of `request` by call index. With `ledger`, each must answer one of its
/// interrupted calls; without, the worker checks that once it has the whole ledger.
fn resolutions_of(request: &RunRequest, ledger: Option<&[LedgerEntry]>) -> Result<HashMap<u32, Value>, RunError> {
    let mut resolutions = HashMap::new();
    for resolution in &request.resolutions {
        let index = parse_interruption_id(&resolution.interruption_id)
            .filter(|&i| {
                ledger.is_none_or(|ledger| {
                    ledger.get(i as usize - 1).is_some_and(|e| matches!(e.outcome, CallOutcome::Interrupted(_)))
                })
            })
            .ok_or_else(|| unknown_interruption(&resolution.interruption_id))?;
        if resolutions.insert(index, resolution.value.clone()).is_some() {
            return Err(RunError::protocol(format!("interruption {} is resolved twice", resolution.interruption_id)));
        }
    }
    Ok(resolutions)
}

/// `interrupt-<k>` with k ≥ 1 in canonical decimal.
fn parse_interruption_id(id: &str) -> Option<u32> {
    let digits = id.strip_prefix("interrupt-")?;
    if digits.is_empty() || digits.starts_with('0') || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok().filter(|&k| k >= 1)
}

fn new_run_id() -> String {
    let mut bytes = [0u8; 16];
    if getrandom::fill(&mut bytes).is_err() {
        bytes = (fresh_seed() as u128 ^ ((wall_clock_ms() as u128) << 64)).to_le_bytes();
    }
    format!("run_{}", base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes))
}

/// Tells the worker to stop if the caller goes away or gives up.
struct StopOnDrop {
    abort: Arc<AtomicBool>,
    inbox: mpsc::Sender<WorkerMessage>,
    armed: bool,
}

impl StopOnDrop {
    fn fire(&self) {
        self.abort.store(true, Ordering::SeqCst);
        let _ = self.inbox.send(WorkerMessage::Abort);
    }
}

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        if self.armed {
            self.fire();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interruption_ids_are_canonical() {
        assert_eq!(parse_interruption_id("interrupt-1"), Some(1));
        assert_eq!(parse_interruption_id("interrupt-42"), Some(42));
        for bad in [
            "interrupt-0",
            "interrupt-01",
            "interrupt-",
            "interrupt--1",
            "interrupt-1 ",
            "x-1",
            "interrupt-99999999999",
        ] {
            assert_eq!(parse_interruption_id(bad), None, "{bad}");
        }
    }
}
