//! The context a workflow function receives: memoized steps, hooks and durable timers.

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;
use tokio::sync::Notify;

use crate::error::{StepError, StepFailure, WorkflowError};
use crate::execution::{Abort, Execution};
use crate::hook::Hook;
use crate::ids::RunId;
use crate::step::{RetryPolicy, StepContext};
use crate::store::{
    Fence, HookCreation, HookState, OpRecord, RunHistory, StepState, StepUpdate, Store, WaitRecord, WaitState,
};
use crate::time::{Millis, duration_ms, now_ms, to_ms};

/// The handle a workflow function uses to do durable work. Cheap to clone.
///
/// Steps, hooks and timers take *positions* 0, 1, 2, ... in the order the workflow first polls
/// them; a replay must ask for the same operations in the same order (a workflow must be
/// deterministic), otherwise the run fails with a nondeterminism error.
#[derive(Clone)]
pub struct WorkflowContext {
    inner: Arc<Inner>,
}

struct Inner {
    run_id: RunId,
    workflow: String,
    fence: Fence,
    store: Arc<dyn Store>,
    history: RunHistory,
    exec: Arc<Execution>,
    /// Signalled after every appended stream event (wakes this process's stream readers).
    streamed: Arc<Notify>,
}

impl fmt::Debug for WorkflowContext {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WorkflowContext")
            .field("run_id", &self.inner.run_id)
            .field("workflow", &self.inner.workflow)
            .field("attempt", &self.inner.fence.attempt)
            .finish()
    }
}

fn describe(op: &OpRecord) -> String {
    match op {
        OpRecord::Step(s) => format!("step {:?}", s.name),
        OpRecord::Hook(h) => format!("hook {:?}", h.token),
        OpRecord::Wait(_) => "sleep".to_owned(),
        OpRecord::Emit(_) => "emit".to_owned(),
    }
}

impl WorkflowContext {
    pub(crate) fn new(
        workflow: String,
        fence: Fence,
        store: Arc<dyn Store>,
        history: RunHistory,
        exec: Arc<Execution>,
        streamed: Arc<Notify>,
    ) -> WorkflowContext {
        WorkflowContext {
            inner: Arc::new(Inner { run_id: fence.run_id.clone(), workflow, fence, store, history, exec, streamed }),
        }
    }

    /// The id of the run being executed.
    pub fn run_id(&self) -> &RunId {
        &self.inner.run_id
    }

    /// The name of the workflow being executed.
    pub fn workflow(&self) -> &str {
        &self.inner.workflow
    }

    fn exec(&self) -> &Execution {
        &self.inner.exec
    }

    fn store(&self) -> &dyn Store {
        &*self.inner.store
    }

    /// Stops the execution with a nondeterminism error: the history has `recorded` at `position`.
    async fn nondeterministic<T>(&self, position: u32, recorded: &OpRecord, asked: String) -> T {
        let message = format!(
            "nondeterministic workflow: operation {position} was recorded as {} but is now {asked}",
            describe(recorded)
        );
        self.exec().abort(Abort::Nondeterminism(message)).await
    }

    /// Runs `f` as a memoized step with the default [`RetryPolicy`] (3 retries).
    ///
    /// See [`WorkflowContext::step_with`].
    pub async fn step<T, F, Fut>(&self, name: &str, f: F) -> Result<T, WorkflowError>
    where
        T: Serialize + DeserializeOwned + Send,
        F: FnOnce(StepContext) -> Fut + Send,
        Fut: Future<Output = Result<T, StepError>> + Send,
    {
        self.step_with(name, RetryPolicy::default(), f).await
    }

    /// Runs `f` as a memoized step: at most once to completion for this step position.
    ///
    /// The result (or the final error) is recorded and returned as-is by every replay without
    /// calling `f`. A retryable [`StepError`] schedules another attempt after the policy's backoff
    /// (the run suspends meanwhile, holding no worker); a fatal one, or a retryable one once the
    /// retries are spent, fails the step and is returned as [`WorkflowError::Step`]. An attempt
    /// interrupted by a crash counts as a failed attempt. `f` sees its attempt number and a stable
    /// step id through [`StepContext`].
    pub async fn step_with<T, F, Fut>(&self, name: &str, policy: RetryPolicy, f: F) -> Result<T, WorkflowError>
    where
        T: Serialize + DeserializeOwned + Send,
        F: FnOnce(StepContext) -> Fut + Send,
        Fut: Future<Output = Result<T, StepError>> + Send,
    {
        let position = self.exec().next_position();
        let inflight = self.exec().enter();
        let fence = &self.inner.fence;
        let failure = |message: String, attempts: u32| {
            WorkflowError::Step(StepFailure { step: name.to_owned(), position, message, attempts })
        };
        match self.inner.history.ops.get(&position) {
            None => {}
            Some(OpRecord::Step(s)) if s.name == name => match &s.state {
                StepState::Completed(v) => return Ok(serde_json::from_value(v.clone())?),
                StepState::Failed(e) => return Err(failure(e.clone(), s.attempts)),
                StepState::Retrying { retry_at, .. } if *retry_at > now_ms() => {
                    drop(inflight);
                    return self.exec().block(Some(*retry_at)).await;
                }
                state if s.attempts > policy.max_retries => {
                    // The last allowed attempt failed (or was interrupted) without recording an end.
                    let error = match state {
                        StepState::Retrying { error, .. } => error.clone(),
                        _ => format!("attempt {} was interrupted", s.attempts),
                    };
                    let update = StepUpdate::Failed { attempt: s.attempts, error: error.clone() };
                    if let Err(e) = self.store().update_step(fence, position, update).await {
                        return self.exec().abort(e.into()).await;
                    }
                    return Err(failure(error, s.attempts));
                }
                _ => {}
            },
            Some(other) => return self.nondeterministic(position, other, format!("step {name:?}")).await,
        }
        let attempt = match self.store().start_step(fence, position, name).await {
            Ok(a) => a,
            Err(e) => return self.exec().abort(e.into()).await,
        };
        let result = f(StepContext::new(&self.inner.run_id, name, position, attempt)).await;
        let result = result.and_then(|v| Ok((serde_json::to_value(&v)?, v)));
        let (update, outcome) = match result {
            Ok((value, v)) => (StepUpdate::Completed { attempt, result: value }, Ok(v)),
            Err(e) if e.retryable && attempt <= policy.max_retries => {
                let retry_at = now_ms().saturating_add(duration_ms(policy.backoff(attempt)));
                let update = StepUpdate::Retrying { attempt, error: e.message, retry_at };
                if let Err(e) = self.store().update_step(fence, position, update).await {
                    return self.exec().abort(e.into()).await;
                }
                drop(inflight);
                return self.exec().block(Some(retry_at)).await;
            }
            Err(e) => (StepUpdate::Failed { attempt, error: e.message.clone() }, Err(failure(e.message, attempt))),
        };
        if let Err(e) = self.store().update_step(fence, position, update).await {
            return self.exec().abort(e.into()).await;
        }
        outcome
    }

    /// Creates a hook owning `token`, with `metadata` readable from outside by token
    /// ([`Engine::get_hook`](crate::Engine::get_hook)).
    ///
    /// Tokens are unique among active hooks of all runs: when another run's active hook owns the
    /// token, this returns [`WorkflowError::HookConflict`] naming that run (and a replay returns
    /// the same conflict). The hook is disposed when the run ends, freeing the token.
    pub async fn hook(&self, token: &str, metadata: Value) -> Result<Hook, WorkflowError> {
        let position = self.exec().next_position();
        let _inflight = self.exec().enter();
        let state = match self.inner.history.ops.get(&position) {
            Some(OpRecord::Hook(h)) if h.token == token => h.state.clone(),
            Some(other) => return self.nondeterministic(position, other, format!("hook {token:?}")).await,
            None => match self.store().create_hook(&self.inner.fence, position, token, &metadata).await {
                Ok(HookCreation::Created) => HookState::Active,
                Ok(HookCreation::Conflict { owner_run_id }) => HookState::Conflict { owner_run_id },
                Err(e) => return self.exec().abort(e.into()).await,
            },
        };
        match state {
            HookState::Conflict { owner_run_id } => {
                Err(WorkflowError::HookConflict { token: token.to_owned(), owner_run_id })
            }
            HookState::Active | HookState::Disposed => Ok(Hook::new(self.clone(), position, token.to_owned())),
        }
    }

    /// Payload `index` of the hook at `position`; blocks until it arrives.
    pub(crate) async fn hook_payload(&self, position: u32, index: u64) -> Result<Value, WorkflowError> {
        let inflight = self.exec().enter();
        let recorded = match self.inner.history.ops.get(&position) {
            Some(OpRecord::Hook(h)) => usize::try_from(index).ok().and_then(|i| h.payloads.get(i)),
            _ => None,
        };
        if let Some(p) = recorded {
            return Ok(p.clone());
        }
        match self.store().hook_payload(&self.inner.run_id, position, index).await {
            Ok(Some(v)) => Ok(v),
            Ok(None) => {
                drop(inflight);
                self.exec().block(None).await
            }
            Err(e) => self.exec().abort(e.into()).await,
        }
    }

    /// Appends `event` to the run's stream and returns its index (0, 1, 2, ...).
    ///
    /// Readers ([`Engine::read_stream`](crate::Engine::read_stream)) receive it at once and can
    /// read it again from any index later. An emit is a recorded operation at its position, like
    /// a step: a replay returns the recorded index without appending the event again.
    pub async fn emit<T: Serialize + ?Sized>(&self, event: &T) -> Result<u64, WorkflowError> {
        let position = self.exec().next_position();
        let _inflight = self.exec().enter();
        match self.inner.history.ops.get(&position) {
            Some(OpRecord::Emit(e)) => return Ok(e.index),
            Some(other) => return self.nondeterministic(position, other, "emit".to_owned()).await,
            None => {}
        }
        let value = serde_json::to_value(event)?;
        match self.store().append_stream(&self.inner.fence, position, &value).await {
            Ok(index) => {
                self.inner.streamed.notify_waiters();
                Ok(index)
            }
            Err(e) => self.exec().abort(e.into()).await,
        }
    }

    /// Sleeps durably for `duration`: the timer is kept in the database and survives restarts.
    pub async fn sleep(&self, duration: Duration) {
        self.wait(|| now_ms().saturating_add(duration_ms(duration))).await;
    }

    /// Sleeps durably until `deadline` (returns at once if it has passed).
    pub async fn sleep_until(&self, deadline: SystemTime) {
        self.wait(|| to_ms(deadline)).await;
    }

    /// The durable timer at the next position; `due` is computed only on first execution.
    async fn wait(&self, due: impl FnOnce() -> Millis) {
        let position = self.exec().next_position();
        let inflight = self.exec().enter();
        let fence = &self.inner.fence;
        let record = match self.inner.history.ops.get(&position) {
            Some(OpRecord::Wait(w)) => w.clone(),
            Some(other) => return self.nondeterministic(position, other, "sleep".to_owned()).await,
            None => {
                let due_at = due();
                if let Err(e) = self.store().create_wait(fence, position, due_at).await {
                    return self.exec().abort(e.into()).await;
                }
                WaitRecord { due_at, state: WaitState::Pending }
            }
        };
        match record.state {
            WaitState::Fired | WaitState::Cancelled => {}
            WaitState::Pending if record.due_at <= now_ms() => {
                if let Err(e) = self.store().fire_wait(fence, position).await {
                    self.exec().abort::<()>(e.into()).await;
                }
            }
            WaitState::Pending => {
                drop(inflight);
                self.exec().block::<()>(Some(record.due_at)).await;
            }
        }
    }
}
