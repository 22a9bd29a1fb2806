//! Child runs: workflows started by a workflow, whose results the parent awaits durably.

use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::context::WorkflowContext;
use crate::error::WorkflowError;
use crate::ids::RunId;

/// A run started by [`WorkflowContext::start_child`].
///
/// The child runs on its own (any worker may execute it); the parent suspends in
/// [`result`](ChildRun::result), holding no worker, and is woken when the child ends.
#[derive(Debug, Clone)]
pub struct ChildRun {
    ctx: WorkflowContext,
    run_id: RunId,
}

impl ChildRun {
    pub(crate) fn new(ctx: WorkflowContext, run_id: RunId) -> ChildRun {
        ChildRun { ctx, run_id }
    }

    /// The child run's id.
    pub fn run_id(&self) -> &RunId {
        &self.run_id
    }

    /// Waits durably for the child to end: its output when it completed, or
    /// [`WorkflowError::ChildFailed`] when it failed or was cancelled. A recorded operation: call
    /// it once per child, at the same point on every replay.
    pub async fn result(&self) -> Result<Value, WorkflowError> {
        self.ctx.child_result(&self.run_id).await
    }

    /// Like [`result`](ChildRun::result), decoding the output.
    pub async fn result_as<T: DeserializeOwned>(&self) -> Result<T, WorkflowError> {
        Ok(serde_json::from_value(self.result().await?)?)
    }
}
