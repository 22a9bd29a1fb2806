//! The context a workflow function receives: memoized steps, hooks and durable timers.

use std::fmt;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

use crate::child::ChildRun;
use crate::engine::Shared;
use crate::error::{StepError, StepFailure, WorkflowError};
use crate::execution::{Abort, Execution};
use crate::hook::Hook;
use crate::ids::{DeterministicRng, RunId};
use crate::step::{RetryPolicy, StepContext};
use crate::store::{
    Fence, HookCreation, HookState, NewRun, OpRecord, RunHistory, StepState, StepUpdate, Store, WaitRecord,
    WaitResolution, WaitState,
};
use crate::time::{Millis, duration_ms, from_ms, now_ms, to_ms};

/// The step name under which [`WorkflowContext::now`] records the clock.
const NOW_STEP: &str = "$now";
/// The step name under which [`WorkflowContext::start_child`] records the child's id.
const START_CHILD_STEP: &str = "$start_child";
/// The step name under which [`ChildRun::result`] records how the child ended.
const CHILD_RESULT_STEP: &str = "$child_result";

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
    shared: Arc<Shared>,
    history: RunHistory,
    exec: Arc<Execution>,
    rng: Mutex<DeterministicRng>,
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

/// How a child run ended, as recorded in its parent's history.
fn child_outcome(run: &crate::RunInfo) -> Value {
    json!({ "status": run.status, "output": run.output, "error": run.error })
}

impl WorkflowContext {
    pub(crate) fn new(
        workflow: String,
        fence: Fence,
        shared: Arc<Shared>,
        history: RunHistory,
        exec: Arc<Execution>,
    ) -> WorkflowContext {
        let rng = Mutex::new(DeterministicRng::for_run(&fence.run_id));
        WorkflowContext {
            inner: Arc::new(Inner { run_id: fence.run_id.clone(), workflow, fence, shared, history, exec, rng }),
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
        &*self.inner.shared.store
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
    /// interrupted by a crash, a shutdown or a lost lease does not use up a retry: interruptions
    /// have their own budget, [`RetryPolicy::max_interruptions`]. `f` sees its attempt number
    /// (every attempt started, interrupted ones included) and a stable step id through
    /// [`StepContext`].
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
        let mut failures = 0;
        match self.inner.history.ops.get(&position) {
            None => {}
            Some(OpRecord::Step(s)) if s.name == name => match &s.state {
                StepState::Completed(v) => return Ok(serde_json::from_value(v.clone())?),
                StepState::Failed(e) => return Err(failure(e.clone(), s.attempts)),
                StepState::Retrying { retry_at, .. } if *retry_at > now_ms() => {
                    drop(inflight);
                    return self.exec().block(Some(*retry_at)).await;
                }
                StepState::Running if s.attempts.saturating_sub(s.failures) > policy.max_interruptions => {
                    let error = format!(
                        "attempt {} was interrupted, and so were {} attempts of this step in all, more than the {} \
                         allowed",
                        s.attempts,
                        s.attempts.saturating_sub(s.failures),
                        policy.max_interruptions
                    );
                    let update = StepUpdate::Failed { attempt: s.attempts, error: error.clone() };
                    if let Err(e) = self.store().update_step(fence, position, update).await {
                        return self.exec().abort(e.into()).await;
                    }
                    return Err(failure(error, s.attempts));
                }
                _ => failures = s.failures,
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
            Err(e) if e.retryable && failures < policy.max_retries => {
                let retry_at = now_ms().saturating_add(duration_ms(policy.backoff(failures + 1)));
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
        match self.find_payload(position, index).await {
            Some(p) => Ok(p.value),
            None => {
                drop(inflight);
                self.exec().block(None).await
            }
        }
    }

    /// Payload `index` of the hook at `position`, from the history or the store, if it arrived.
    async fn find_payload(&self, position: u32, index: u64) -> Option<crate::store::HookPayload> {
        let recorded = match self.inner.history.ops.get(&position) {
            Some(OpRecord::Hook(h)) => usize::try_from(index).ok().and_then(|i| h.payloads.get(i)),
            _ => None,
        };
        if let Some(p) = recorded {
            return Some(p.clone());
        }
        match self.store().hook_payload(&self.inner.run_id, position, index).await {
            Ok(found) => found,
            Err(e) => self.exec().abort(e.into()).await,
        }
    }

    /// Payload `index` of the hook at `position` raced against a durable timer at the next
    /// position: `Some` when the payload was received before the timer was due, `None` when the
    /// timer won. The winner is recorded (the timer is cancelled or fired), so a replay decides
    /// the same way.
    pub(crate) async fn hook_payload_before(
        &self,
        position: u32,
        index: u64,
        due: impl FnOnce() -> Millis,
    ) -> Result<Option<Value>, WorkflowError> {
        let timer = self.exec().next_position();
        let inflight = self.exec().enter();
        let record = self.timer(timer, due).await;
        match record.state {
            WaitState::Fired => return Ok(None),
            WaitState::Cancelled => {
                return match self.find_payload(position, index).await {
                    Some(p) => Ok(Some(p.value)),
                    None => {
                        let message =
                            format!("timer {timer} was won by payload {index} of hook {position}, which is missing");
                        self.exec().abort(Abort::Store(crate::StoreError::Corrupt(message))).await
                    }
                };
            }
            WaitState::Pending => {}
        }
        let now = now_ms();
        let resolution = match self.find_payload(position, index).await {
            // Clocks of different processes may disagree: a payload is late only once the timer is due here.
            Some(p) if p.received_at <= record.due_at || record.due_at > now => {
                Some((WaitResolution::Cancelled, Some(p.value)))
            }
            _ if record.due_at <= now => Some((WaitResolution::Fired, None)),
            _ => None,
        };
        let Some((resolution, payload)) = resolution else {
            drop(inflight);
            return self.exec().block(Some(record.due_at)).await;
        };
        if let Err(e) = self.store().resolve_wait(&self.inner.fence, timer, resolution).await {
            return self.exec().abort(e.into()).await;
        }
        Ok(payload)
    }

    /// Records a value at the next position the first time this point is reached (as a step
    /// named `name` that completed at once) and returns the recorded value on every replay.
    async fn recorded(&self, name: &str, compute: impl FnOnce() -> Value) -> Value {
        let position = self.exec().next_position();
        let _inflight = self.exec().enter();
        match self.inner.history.ops.get(&position) {
            Some(OpRecord::Step(s)) if s.name == name => {
                if let StepState::Completed(v) = &s.state {
                    return v.clone();
                }
            }
            Some(other) => return self.nondeterministic(position, other, format!("{name:?}")).await,
            None => {}
        }
        let value = compute();
        match self.store().record_step(&self.inner.fence, position, name, &value).await {
            Ok(()) => value,
            Err(e) => self.exec().abort(e.into()).await,
        }
    }

    /// The current time, made deterministic: the first execution that reaches this call records
    /// the wall clock, and every replay returns that same time. Each call is a recorded operation
    /// (one small write the first time), so call it where the workflow needs a timestamp, not in
    /// a loop.
    pub async fn now(&self) -> SystemTime {
        let value = self.recorded(NOW_STEP, || json!(now_ms())).await;
        from_ms(value.as_i64().unwrap_or_default())
    }

    /// A pseudo-random number in `[0, 1)`, deterministic for the run: the n-th call of every
    /// execution of this run returns the same value, so a replay takes the same branches. It is
    /// seeded from the run id and is **not** suitable for secrets; generate those inside a step.
    pub fn random(&self) -> f64 {
        self.inner.rng.lock().unwrap_or_else(|p| p.into_inner()).next_unit()
    }

    /// Starts the registered workflow `workflow` as a child of this run, exactly once: the start
    /// is a step (retried on store errors) whose recorded result is the child's id, and the child
    /// is created under an idempotency key derived from the step, so a crash between creating the
    /// child and recording the step cannot start it twice. Await its result with
    /// [`ChildRun::result`]; cancelling this run cancels the child too.
    pub async fn start_child(&self, workflow: &str, input: Value) -> Result<ChildRun, WorkflowError> {
        let registered = self.inner.shared.registry.get(workflow).is_some();
        let store = Arc::clone(&self.inner.shared.store);
        let parent = self.inner.run_id.clone();
        let id: RunId = self
            .step(START_CHILD_STEP, |s: StepContext| async move {
                if !registered {
                    return Err(StepError::fatal(format!("no workflow named {workflow:?} is registered")));
                }
                let run = NewRun {
                    workflow: workflow.to_owned(),
                    input,
                    idempotency_key: Some(format!("child:{}", s.step_id)),
                    parent_run_id: Some(parent),
                    feed: None,
                };
                match store.create_run(run).await {
                    Ok(created) => Ok(created.run_id),
                    Err(crate::StoreError::LeaseLost { .. }) => Err(StepError::fatal("this run has ended")),
                    Err(e) => Err(StepError::retryable(format!("could not start the child run: {e}"))),
                }
            })
            .await?;
        self.inner.shared.wake.notify_one();
        Ok(ChildRun::new(self.clone(), id))
    }

    /// Waits durably until the child run `child` has ended and returns its output, or
    /// [`WorkflowError::ChildFailed`] when it failed or was cancelled. How it ended is recorded,
    /// so a replay returns the same without reading the child again.
    pub(crate) async fn child_result(&self, child: &RunId) -> Result<Value, WorkflowError> {
        let position = self.exec().next_position();
        let inflight = self.exec().enter();
        let outcome = match self.inner.history.ops.get(&position) {
            Some(OpRecord::Step(s)) if s.name == CHILD_RESULT_STEP => match &s.state {
                StepState::Completed(v) => v.clone(),
                _ => Value::Null,
            },
            Some(other) => {
                return self.nondeterministic(position, other, format!("{CHILD_RESULT_STEP:?}")).await;
            }
            None => {
                let run = match self.store().get_run(child).await {
                    Ok(Some(run)) => run,
                    Ok(None) => return Err(WorkflowError::msg(format!("child run {child} does not exist"))),
                    Err(e) => return self.exec().abort(e.into()).await,
                };
                if !run.status.is_terminal() {
                    // The child's end wakes this run.
                    drop(inflight);
                    return self.exec().block(None).await;
                }
                let outcome = child_outcome(&run);
                if let Err(e) = self.store().record_step(&self.inner.fence, position, CHILD_RESULT_STEP, &outcome).await
                {
                    return self.exec().abort(e.into()).await;
                }
                outcome
            }
        };
        if outcome["status"] == json!("completed") {
            return Ok(outcome["output"].clone());
        }
        let status = outcome["status"].as_str().unwrap_or("failed").to_owned();
        let error = outcome["error"].as_str().unwrap_or_default().to_owned();
        Err(WorkflowError::ChildFailed { run_id: child.clone(), status, error })
    }

    /// Appends `event` to the run's stream and returns its index (0, 1, 2, ...).
    ///
    /// Readers ([`Engine::read_stream`](crate::Engine::read_stream), and those of the run's feed)
    /// receive it at once and can read it again from any index later. An emit is a recorded operation at its position, like
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
                self.inner.shared.changes.notify_appended(&self.inner.fence.run_id);
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

    /// The durable timer at `position`: the recorded one, or a new one due at `due()`.
    async fn timer(&self, position: u32, due: impl FnOnce() -> Millis) -> WaitRecord {
        match self.inner.history.ops.get(&position) {
            Some(OpRecord::Wait(w)) => w.clone(),
            Some(other) => self.nondeterministic(position, other, "sleep".to_owned()).await,
            None => {
                let due_at = due();
                if let Err(e) = self.store().create_wait(&self.inner.fence, position, due_at).await {
                    return self.exec().abort(e.into()).await;
                }
                WaitRecord { due_at, state: WaitState::Pending }
            }
        }
    }

    /// The durable timer at the next position; `due` is computed only on first execution.
    async fn wait(&self, due: impl FnOnce() -> Millis) {
        let position = self.exec().next_position();
        let inflight = self.exec().enter();
        let record = self.timer(position, due).await;
        match record.state {
            WaitState::Fired | WaitState::Cancelled => {}
            WaitState::Pending if record.due_at <= now_ms() => {
                let fired = self.store().resolve_wait(&self.inner.fence, position, WaitResolution::Fired).await;
                if let Err(e) = fired {
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
