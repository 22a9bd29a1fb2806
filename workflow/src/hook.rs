//! Hooks: durable suspension points that an outside caller resumes with payloads.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::context::WorkflowContext;
use crate::error::WorkflowError;
use crate::time::{duration_ms, now_ms, to_ms};

pub use crate::hook_data::{HookInfo, ResumeReceipt};

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

    /// Waits for the next payload, or gives up after `timeout`: a durable race between the hook
    /// and a timer. `Some(payload)` when a payload was received before the timer was due, `None`
    /// when the timer won (the payload, if one comes later, is left for the next call). The
    /// winner is recorded, so every replay decides the same way.
    ///
    /// Use this rather than racing [`next`](Hook::next) against
    /// [`sleep`](WorkflowContext::sleep) in a `select!`, whose choice a replay could not repeat.
    pub async fn next_within(&self, timeout: Duration) -> Result<Option<Value>, WorkflowError> {
        self.race(move || now_ms().saturating_add(duration_ms(timeout))).await
    }

    /// Like [`next_within`](Hook::next_within) with an absolute deadline.
    pub async fn next_before(&self, deadline: SystemTime) -> Result<Option<Value>, WorkflowError> {
        self.race(move || to_ms(deadline)).await
    }

    async fn race(&self, due: impl FnOnce() -> crate::time::Millis) -> Result<Option<Value>, WorkflowError> {
        let index = self.cursor.load(Ordering::SeqCst);
        let payload = self.ctx.hook_payload_before(self.position, index, due).await?;
        if payload.is_some() {
            self.cursor.fetch_add(1, Ordering::SeqCst);
        }
        Ok(payload)
    }

    /// Waits for the next payload and decodes it.
    pub async fn next_as<T: DeserializeOwned>(&self) -> Result<T, WorkflowError> {
        Ok(serde_json::from_value(self.next().await?)?)
    }
}
