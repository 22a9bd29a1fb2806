//! Resumable: run untrusted JavaScript in a QuickJS sandbox that can pause
//! for a human decision and continue later without repeating any effect.
//!
//! This crate is the facade over the workspace:
//! * [`host`] — the trusted boundary: namespaced async host functions;
//! * [`runner`] — the sandbox, limits, replay and continuation codecs;
//! * [`workflow`] — the durable engine: runs, steps, hooks and their stores;
//!
//! and the application built on them: [`automation`] (approval-gated scripts), [`session`],
//! [`server`] (the HTTP approval service), [`audit`] (the tenants' hash-chained audit trail), [`db`]
//! and [`orders`] (the demo order system).
//!
//! The most used names are re-exported at the top level.
//!
//! ```
//! use resumable::{HostFunctions, Outcome, Resolution, RunRequest, Runner, RunnerConfig, SignedCodec, SignedCodecConfig};
//! use serde_json::json;
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let secret_32_bytes = vec![7u8; 32];
//! # tokio::runtime::Runtime::new()?.block_on(async {
//! let runner = Runner::new(RunnerConfig::new().codec(SignedCodec::new(SignedCodecConfig::new(secret_32_bytes))?))?;
//! let host = HostFunctions::builder()
//!     .typed("orders.refund", ["order_id", "amount"], |ctx, (id, amount): (String, u64)| async move {
//!         match ctx.resume() {
//!             None => Err(ctx.interrupt(json!({ "kind": "refund-approval", "orderId": id, "amount": amount }))),
//!             Some(r) if r.resolution == json!(true) => Ok(json!({ "refunded": amount })),
//!             Some(_) => Ok(json!({ "approved": false })),
//!         }
//!     })
//!     .build()?;
//! let source = "return await orders.refund('o-1', 40)";
//! let Outcome::Interrupted(paused) = runner.run(RunRequest::new(source).host(host.clone())).await? else {
//!     unreachable!()
//! };
//! let decision = [Resolution::new(paused.interruptions[0].id.clone(), json!(true))];
//! let done = runner.run(RunRequest::new(source).host(host).resume(paused.continuation, decision)).await?;
//! assert_eq!(done.completed().unwrap().value, json!({ "refunded": 40 }));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! # })
//! # }
//! ```

pub mod audit;
pub mod automation;
pub mod config;
pub mod connector;
pub mod continuations;
pub mod db;
pub mod fault;
pub mod metrics;
pub mod orders;
pub mod server;
pub mod session;
#[cfg(test)]
mod testing;
pub mod webhook;

pub use resumable_host as host;
pub use resumable_runner as runner;
pub use resumable_workflow as workflow;

pub use resumable_host::{CancelSignal, HostCallContext, HostError, HostFunctions, Resume};
pub use resumable_runner::codec::{SignedCodec, SignedCodecConfig};
pub use resumable_runner::{
    BytecodeCacheConfig, Completion, ConsoleLevel, ConsoleLine, ErrorCode, Interruption, Limit, LimitOverrides, Limits,
    Outcome, Resolution, RunError, RunEvent, RunEvents, RunHandle, RunRequest, Runner, RunnerConfig, RunnerStats,
    Suspension,
};
