//! A worker: claims runnable runs, executes them under a heartbeated lease, records the outcome.

use std::pin::pin;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use crate::context::WorkflowContext;
use crate::engine::Shared;
use crate::error::StoreError;
use crate::execution::{Abort, Execution, Outcome};
use crate::store::{ClaimRequest, ClaimedRun, Fence, RunOutcome, Store};
use crate::time::{duration_ms, now_ms};

/// How long a worker waits before retrying after a store error.
const ERROR_BACKOFF: Duration = Duration::from_millis(500);

/// Runs one worker until shutdown.
pub(crate) async fn run_worker(shared: Arc<Shared>, mut shutdown: watch::Receiver<bool>) {
    let workflows = shared.registry.names();
    let request =
        ClaimRequest { owner: shared.owner.clone(), workflows: workflows.clone(), lease: shared.options.lease };
    loop {
        if *shutdown.borrow() {
            return;
        }
        // Register interest before looking for work, so a wake-up in between is not lost.
        let mut woken = pin!(shared.wake.notified());
        woken.as_mut().enable();
        let claimed = shared.store.claim(&request).await;
        match &claimed {
            Ok(_) => shared.claim_failures.succeeded(),
            Err(e) => shared.claim_failures.failed(e),
        }
        let delay = match claimed {
            Ok(Some(run)) => {
                // There may be more: let one more idle worker look (wake-ups chain while work lasts).
                shared.wake.notify_one();
                let fence = run.fence.clone();
                tokio::select! {
                    _ = execute(&shared, run) => {}
                    _ = shutdown.changed() => {
                        // Hand the run back for any engine to claim at once, instead of leaving it
                        // to lease expiry; its interrupted step is attempted again.
                        let _ = shared.store.suspend_run(&fence, Some(now_ms())).await;
                        shared.executing.lock().unwrap_or_else(|p| p.into_inner()).remove(&fence.run_id);
                        return;
                    }
                }
                continue;
            }
            Ok(None) => {
                let now = now_ms();
                let poll = duration_ms(shared.options.poll_interval);
                let next = shared.store.next_wake_at(&workflows).await.ok().flatten();
                let until = next.map_or(now + poll, |t| t.min(now + poll)).max(now + 1);
                Duration::from_millis((until - now).unsigned_abs())
            }
            Err(_) => ERROR_BACKOFF,
        };
        tokio::select! {
            _ = woken => {}
            _ = tokio::time::sleep(delay) => {}
            changed = shutdown.changed() => if changed.is_err() { return },
        }
    }
}

/// Executes one claimed run and records how the execution ended.
async fn execute(shared: &Arc<Shared>, run: ClaimedRun) {
    let fence = run.fence.clone();
    let Some(workflow) = shared.registry.get(&run.workflow) else {
        // Claims are filtered by registered workflows; let the lease lapse for another engine.
        return;
    };
    let exec = Arc::new(Execution::default());
    shared.executing.lock().unwrap_or_else(|p| p.into_inner()).insert(fence.run_id.clone(), Arc::clone(&exec));
    let ctx =
        WorkflowContext::new(run.workflow.clone(), fence.clone(), Arc::clone(shared), run.history, Arc::clone(&exec));
    let heartbeat =
        tokio::spawn(heartbeat(Arc::clone(&shared.store), fence.clone(), shared.options.lease, Arc::clone(&exec)));
    // The execution runs in its own task so that a panicking workflow fails its run, not the worker.
    let task_exec = Arc::clone(&exec);
    let mut task = AbortOnDrop(tokio::spawn(async move { task_exec.drive(workflow(ctx, run.input)).await }));
    let _heartbeat = AbortOnDrop(heartbeat);
    let outcome = match (&mut task.0).await {
        Ok(outcome) => outcome,
        Err(e) if e.is_panic() => Outcome::Finished(Err(crate::WorkflowError::msg(format!(
            "workflow panicked: {}",
            panic_message(e.into_panic())
        )))),
        Err(_) => Outcome::Aborted(Abort::LeaseLost),
    };
    drop(_heartbeat);
    shared.executing.lock().unwrap_or_else(|p| p.into_inner()).remove(&fence.run_id);
    record(&*shared.store, &fence, outcome).await;
    shared.changes.notify(&fence.run_id);
    shared.wake.notify_one();
}

/// Records the outcome of an execution. Failures to record are left to lease expiry: another
/// execution will replay the run.
async fn record(store: &dyn Store, fence: &Fence, outcome: Outcome) {
    let recorded = match outcome {
        Outcome::Finished(Ok(output)) => store.finish_run(fence, RunOutcome::Completed(output)).await,
        Outcome::Finished(Err(e)) => store.finish_run(fence, RunOutcome::Failed(e.to_string())).await,
        Outcome::Suspended(wake_at) => store.suspend_run(fence, wake_at).await.map(drop),
        Outcome::Aborted(Abort::Nondeterminism(message)) => store.finish_run(fence, RunOutcome::Failed(message)).await,
        Outcome::Aborted(Abort::Store(_)) => {
            // Release the run for a later retry rather than holding it until the lease expires.
            let retry_at = now_ms() + duration_ms(ERROR_BACKOFF);
            store.suspend_run(fence, Some(retry_at)).await.map(drop)
        }
        Outcome::Aborted(Abort::LeaseLost) => Ok(()),
    };
    match recorded {
        // Another execution owns the run, or it was cancelled: nothing to record any more.
        Ok(()) | Err(StoreError::LeaseLost { .. }) => {}
        Err(error) => tracing::warn!(
            run = %fence.run_id, %error,
            "could not record how an execution ended; the run is replayed once its lease expires"
        ),
    }
}

/// Renews the lease every third of its duration; aborts the execution once it is lost.
async fn heartbeat(store: Arc<dyn Store>, fence: Fence, lease: Duration, exec: Arc<Execution>) {
    let period = (lease / 3).max(Duration::from_millis(10));
    loop {
        tokio::time::sleep(period).await;
        match store.renew_lease(&fence, lease).await {
            Ok(()) => {}
            Err(crate::StoreError::LeaseLost { .. }) => {
                exec.abort_now(Abort::LeaseLost);
                return;
            }
            // A transient store error: try again next period; the lease may still be valid.
            Err(_) => {}
        }
    }
}

fn panic_message(payload: Box<dyn std::any::Any + Send>) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "non-string panic payload".to_owned()
    }
}

/// Aborts a spawned task when dropped (the worker stopping mid-execution must not leave it running).
struct AbortOnDrop<T>(tokio::task::JoinHandle<T>);

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}
