//! The engine: registered workflows, the public API, and the workers that execute runs.

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::Value;
use tokio::sync::{Notify, broadcast, watch};
use tokio::task::JoinHandle;

use crate::changes::RunChanges;
use crate::context::WorkflowContext;
use crate::error::{EngineError, WorkflowError};
use crate::event::Event;
use crate::execution::{Abort, Execution};
use crate::failure_log::FailureLog;
use crate::feed::FeedReader;
use crate::hook::{HookInfo, ResumeReceipt};
use crate::ids::{RunId, random_hex};
use crate::registry::Registry;
use crate::run::{RunFilter, RunInfo, RunPage, RunStatus, StartOptions};
use crate::store::{NewRun, Store, WakeHints};
use crate::stream::StreamReader;
use crate::worker;

/// Tuning of an [`Engine`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EngineOptions {
    /// Concurrent executions (worker tasks); 0 makes a client-only engine that executes nothing.
    pub workers: usize,
    /// How long a claim lasts without a heartbeat; a crashed worker's runs are taken over after it.
    pub lease: Duration,
    /// The fallback poll interval (wake-ups inside one process are immediate; this catches work
    /// created by other processes sharing the database).
    pub poll_interval: Duration,
    /// A name for this engine's leases (`engine` by default); a random suffix makes it unique
    /// per engine instance.
    pub owner: Option<String>,
}

impl Default for EngineOptions {
    fn default() -> EngineOptions {
        EngineOptions { workers: 4, lease: Duration::from_secs(30), poll_interval: Duration::from_secs(1), owner: None }
    }
}

/// What the engine and its workers share.
pub(crate) struct Shared {
    pub(crate) store: Arc<dyn Store>,
    pub(crate) registry: Registry,
    pub(crate) options: EngineOptions,
    pub(crate) owner: String,
    /// Signalled (one worker at a time) when a run may have become claimable; a worker that
    /// claims one wakes the next.
    pub(crate) wake: Notify,
    /// Signalled per run when it changed state or appended to its stream (for waiters and
    /// stream readers).
    pub(crate) changes: RunChanges,
    /// Executions in progress in this process, to abort them at once on cancel.
    pub(crate) executing: Mutex<HashMap<RunId, Arc<Execution>>>,
    /// Failures of the workers' claims, reported in the log.
    pub(crate) claim_failures: FailureLog,
}

/// Stops the workers when the last [`Engine`] handle is dropped.
struct Lifetime {
    shutdown: watch::Sender<bool>,
    workers: Mutex<Vec<JoinHandle<()>>>,
}

impl Drop for Lifetime {
    fn drop(&mut self) {
        let _ = self.shutdown.send(true);
    }
}

/// Builds an [`Engine`]: register the workflows, then [`build`](EngineBuilder::build).
pub struct EngineBuilder {
    store: Arc<dyn Store>,
    registry: Registry,
    options: EngineOptions,
}

impl EngineBuilder {
    /// Registers a workflow under `name`:
    /// `async fn(ctx: WorkflowContext, input: Value) -> Result<Value, WorkflowError>`.
    pub fn register<F, Fut>(mut self, name: &str, f: F) -> EngineBuilder
    where
        F: Fn(WorkflowContext, Value) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Value, WorkflowError>> + Send + 'static,
    {
        self.registry.insert(name, f);
        self
    }

    /// Replaces all options.
    pub fn options(mut self, options: EngineOptions) -> EngineBuilder {
        self.options = options;
        self
    }

    /// Sets the number of workers.
    pub fn workers(mut self, workers: usize) -> EngineBuilder {
        self.options.workers = workers;
        self
    }

    /// Sets the lease duration.
    pub fn lease(mut self, lease: Duration) -> EngineBuilder {
        self.options.lease = lease;
        self
    }

    /// Sets the fallback poll interval.
    pub fn poll_interval(mut self, interval: Duration) -> EngineBuilder {
        self.options.poll_interval = interval;
        self
    }

    /// Starts the engine's workers on the current Tokio runtime. They pick up at once the runs
    /// left pending, waiting on due timers, or held by expired leases (for example after a crash).
    ///
    /// # Panics
    /// Outside a Tokio runtime.
    pub fn build(self) -> Engine {
        // Unique per engine instance even with a configured name: a restarted engine must be able to
        // take over the leases its previous incarnation left behind.
        let name = self.options.owner.as_deref().unwrap_or("engine");
        let owner = format!("{name}-{}", random_hex(8));
        let shared = Arc::new(Shared {
            store: self.store,
            registry: self.registry,
            options: self.options,
            owner,
            wake: Notify::new(),
            changes: RunChanges::default(),
            executing: Mutex::new(HashMap::new()),
            claim_failures: FailureLog::new("claiming runs"),
        });
        let (shutdown, rx) = watch::channel(false);
        let mut workers: Vec<JoinHandle<()>> = (0..shared.options.workers)
            .map(|_| tokio::spawn(worker::run_worker(Arc::clone(&shared), rx.clone())))
            .collect();
        if let Some(signal) = shared.store.wake_signal() {
            let runs = shared.store.changed_runs();
            workers.push(tokio::spawn(forward_wake_signal(signal, runs, Arc::downgrade(&shared), rx)));
        }
        Engine { shared, lifetime: Arc::new(Lifetime { shutdown, workers: Mutex::new(workers) }) }
    }
}

/// Turns the store's cross-process wake-up hints into this engine's local wake-ups: a worker looks
/// for work only when a run may have become runnable; the waiters of a run that another process
/// named as changed look again, and every waiter looks on a change that names no run (or when
/// this engine fell behind the named ones).
async fn forward_wake_signal(
    mut signal: watch::Receiver<WakeHints>,
    mut runs: Option<broadcast::Receiver<RunId>>,
    shared: std::sync::Weak<Shared>,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut seen = *signal.borrow_and_update();
    loop {
        let named = async {
            match runs.as_mut() {
                Some(runs) => runs.recv().await,
                None => std::future::pending().await,
            }
        };
        let run = tokio::select! {
            changed = signal.changed() => match changed {
                Ok(()) => None,
                Err(_) => return,
            },
            named = named => Some(named),
            changed = shutdown.changed() => if changed.is_err() || *shutdown.borrow() { return } else { continue },
        };
        let Some(shared) = shared.upgrade() else { return };
        match run {
            Some(Ok(run)) => shared.changes.notify(&run),
            Some(Err(broadcast::error::RecvError::Lagged(_))) => shared.changes.notify_all(),
            Some(Err(broadcast::error::RecvError::Closed)) => runs = None,
            None => {
                let hints = *signal.borrow_and_update();
                if hints.work != seen.work {
                    shared.wake.notify_one();
                }
                if hints.changes != seen.changes {
                    shared.changes.notify_all();
                }
                seen = hints;
            }
        }
    }
}

/// The durable workflow engine. Cheap to clone; the workers stop when the last clone is dropped
/// or on [`shutdown`](Engine::shutdown).
#[derive(Clone)]
pub struct Engine {
    shared: Arc<Shared>,
    lifetime: Arc<Lifetime>,
}

/// A handle on an [`Engine`] that does not keep it running: workflows that need the engine they
/// run on hold this, so dropping every [`Engine`] still stops it.
#[derive(Clone, Debug)]
pub struct WeakEngine {
    shared: std::sync::Weak<Shared>,
    lifetime: std::sync::Weak<Lifetime>,
}

impl WeakEngine {
    /// The engine, while some [`Engine`] handle keeps it alive.
    pub fn upgrade(&self) -> Option<Engine> {
        Some(Engine { shared: self.shared.upgrade()?, lifetime: self.lifetime.upgrade()? })
    }
}

impl fmt::Debug for Engine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Engine").field("owner", &self.shared.owner).field("options", &self.shared.options).finish()
    }
}

impl Engine {
    /// A handle that does not keep the engine running.
    pub fn downgrade(&self) -> WeakEngine {
        WeakEngine { shared: Arc::downgrade(&self.shared), lifetime: Arc::downgrade(&self.lifetime) }
    }

    /// Starts building an engine over `store`.
    pub fn builder(store: Arc<dyn Store>) -> EngineBuilder {
        EngineBuilder { store, registry: Registry::default(), options: EngineOptions::default() }
    }

    /// The store the engine uses.
    pub fn store(&self) -> &Arc<dyn Store> {
        &self.shared.store
    }

    /// Starts a run of the registered workflow `workflow`. With an idempotency key that an
    /// existing run has, returns that run's id and starts nothing.
    pub async fn start(&self, workflow: &str, input: Value, options: StartOptions) -> Result<RunId, EngineError> {
        if self.shared.registry.get(workflow).is_none() {
            return Err(EngineError::UnknownWorkflow(workflow.to_owned()));
        }
        let run = NewRun {
            workflow: workflow.to_owned(),
            input,
            idempotency_key: options.idempotency_key,
            parent_run_id: None,
            feed: options.feed,
        };
        let created = self.shared.store.create_run(run).await?;
        if created.created {
            self.shared.wake.notify_one();
        }
        Ok(created.run_id)
    }

    /// Reads a run.
    pub async fn get_run(&self, id: &RunId) -> Result<RunInfo, EngineError> {
        self.shared.store.get_run(id).await?.ok_or_else(|| EngineError::RunNotFound(id.clone()))
    }

    /// Lists runs matching `filter`, newest first, one page at a time (see [`RunPage::next_cursor`]).
    pub async fn list_runs(&self, filter: &RunFilter) -> Result<RunPage, EngineError> {
        Ok(self.shared.store.list_runs(filter).await?)
    }

    /// Reads a run's event log, in order.
    pub async fn events(&self, id: &RunId) -> Result<Vec<Event>, EngineError> {
        Ok(self.shared.store.events(id).await?)
    }

    /// Waits until the run has ended (completed, failed or cancelled) and returns it.
    pub async fn wait_for(&self, id: &RunId, timeout: Duration) -> Result<RunInfo, EngineError> {
        self.wait_until(id, timeout, |r| r.status.is_terminal()).await
    }

    /// Waits until `done` holds for the run and returns it; [`EngineError::Timeout`] after `timeout`.
    pub async fn wait_until(
        &self,
        id: &RunId,
        timeout: Duration,
        done: impl Fn(&RunInfo) -> bool,
    ) -> Result<RunInfo, EngineError> {
        let deadline = tokio::time::Instant::now() + timeout;
        let listener = self.shared.changes.listen(id);
        loop {
            let changed = listener.next_change();
            let run = self.get_run(id).await?;
            if done(&run) {
                return Ok(run);
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(EngineError::Timeout(id.clone()));
            }
            // Changes made by other processes are only seen by polling.
            let poll = tokio::time::sleep(Duration::from_millis(25));
            tokio::select! {
                _ = changed => {}
                _ = poll => {}
                _ = tokio::time::sleep_until(deadline) => {}
            }
        }
    }

    /// Cancels a run that has not ended: it becomes cancelled, its hooks are disposed and its
    /// timers cancelled in one transaction; an execution in progress stops writing. Returns the
    /// run's status afterwards (a run that already ended keeps its status).
    pub async fn cancel(&self, id: &RunId) -> Result<RunStatus, EngineError> {
        let status = self.shared.store.cancel_run(id, "cancelled").await?;
        let running = self.shared.executing.lock().unwrap_or_else(|p| p.into_inner()).get(id).cloned();
        if let Some(exec) = running {
            exec.abort_now(Abort::LeaseLost);
        }
        self.shared.changes.notify(id);
        Ok(status)
    }

    /// Reads the active hook with this token: its run and metadata, so that an endpoint can
    /// authorize a caller before resuming. `None` when no active hook has the token.
    pub async fn get_hook(&self, token: &str) -> Result<Option<HookInfo>, EngineError> {
        Ok(self.shared.store.get_hook(token).await?)
    }

    /// The first `count` payloads the hook at `position` of run `id` received, in the order they
    /// arrived (fewer when fewer arrived).
    pub async fn hook_payloads(&self, id: &RunId, position: u32, count: u64) -> Result<Vec<Value>, EngineError> {
        let mut payloads = Vec::new();
        for index in 0..count {
            match self.shared.store.hook_payload(id, position, index).await? {
                Some(payload) => payloads.push(payload.value),
                None => break,
            }
        }
        Ok(payloads)
    }

    /// Delivers `payload` to the active hook with this token and wakes its run.
    /// [`EngineError::HookNotFound`] when the token is unknown or its hook was disposed.
    pub async fn resume_hook(&self, token: &str, payload: Value) -> Result<ResumeReceipt, EngineError> {
        let receipt = self.shared.store.resume_hook(token, payload).await?;
        self.shared.wake.notify_one();
        Ok(receipt)
    }

    /// Reads the run's stream from index `from_index` on: the events already written, then each
    /// new one as it is appended, ending once the run has ended and every event was delivered.
    /// [`EngineError::RunNotFound`] when no run has this id.
    pub async fn read_stream(&self, run_id: &RunId, from_index: u64) -> Result<StreamReader, EngineError> {
        self.get_run(run_id).await?;
        Ok(StreamReader::new(Arc::clone(&self.shared), run_id.clone(), from_index))
    }

    /// Reads the feed `feed` from number `from` on (1 is its first event): the stream events of all
    /// its runs, each once, in the order they committed, then each new one as it commits. The
    /// reader never ends; a client that reconnects opens a new one from the number after the last
    /// one it saw.
    pub fn read_feed(&self, feed: &str, from: u64) -> FeedReader {
        FeedReader::new(Arc::clone(&self.shared), feed.to_owned(), from)
    }

    /// The number of the last event of `feed` (0 before its first): read from one more to follow
    /// only what comes next.
    pub async fn feed_head(&self, feed: &str) -> Result<u64, EngineError> {
        Ok(self.shared.store.feed_head(feed).await?)
    }

    /// Stops the workers and waits for them. Executions in progress are abandoned; their runs
    /// are taken over by any engine once their leases expire.
    pub async fn shutdown(&self) {
        let _ = self.lifetime.shutdown.send(true);
        let workers: Vec<JoinHandle<()>> =
            std::mem::take(&mut *self.lifetime.workers.lock().unwrap_or_else(|p| p.into_inner()));
        for w in workers {
            let _ = w.await;
        }
    }
}
