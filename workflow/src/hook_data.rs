//! What the store and the engine's API say about hooks: plain data, with no workflow behind it.

use std::time::SystemTime;

use serde_json::Value;

use crate::ids::RunId;

/// What the outside world may know about an active hook, looked up by token.
#[derive(Clone, Debug, PartialEq)]
pub struct HookInfo {
    /// The token.
    pub token: String,
    /// The run that owns it.
    pub run_id: RunId,
    /// Its position in the run (with the run id, where its payloads are read: [`Engine::hook_payloads`](crate::Engine::hook_payloads)).
    pub position: u32,
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
