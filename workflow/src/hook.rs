//! Hooks: durable suspension points that an outside caller resumes with payloads.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::SystemTime;

use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::context::WorkflowContext;
use crate::error::WorkflowError;
use crate::ids::RunId;

/// What the outside world may know about an active hook, looked up by token.
#[derive(Clone, Debug, PartialEq)]
pub struct HookInfo {
    /// The token.
    pub token: String,
    /// The run that owns it.
    pub run_id: RunId,
    /// The metadata the workflow attached (for authorizing a caller before resuming).
    pub metadata: Value,
    /// How many payloads it has received.
    pub received: u64,
    /// When it was created.
    pub created_at: SystemTime,
}

/// The receipt of a delivered hook payload.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ResumeReceipt {
    /// The run that owns the hook.
    pub run_id: RunId,
    /// The payload's index among the hook's payloads (0-based).
    pub index: u64,
}

/// A hook owned by the current run, returned by [`WorkflowContext::hook`].
///
/// Each call to [`Hook::next`] yields the next payload, in the order they were received. When the
/// payload has not arrived, the run suspends until it does.
#[derive(Debug)]
pub struct Hook {
    ctx: WorkflowContext,
    position: u32,
    token: String,
    cursor: AtomicU64,
}

impl Hook {
    pub(crate) fn new(ctx: WorkflowContext, position: u32, token: String) -> Hook {
        Hook { ctx, position, token, cursor: AtomicU64::new(0) }
    }

    /// The hook's token.
    pub fn token(&self) -> &str {
        &self.token
    }

    /// Waits for the next payload (durably: the run suspends until it arrives).
    pub async fn next(&self) -> Result<Value, WorkflowError> {
        let index = self.cursor.fetch_add(1, Ordering::SeqCst);
        self.ctx.hook_payload(self.position, index).await
    }

    /// Waits for the next payload and decodes it.
    pub async fn next_as<T: DeserializeOwned>(&self) -> Result<T, WorkflowError> {
        Ok(serde_json::from_value(self.next().await?)?)
    }
}
