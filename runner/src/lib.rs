//! The QuickJS sandbox of Resumable: limits, host-call bridge, replay ledger
//! and continuations.

pub mod codec;
mod continuation;
mod determinism;
mod error;
mod job;
mod limits;
mod link;
mod outcome;
mod sandbox;
mod state;
mod store;
mod text;

pub use error::{ErrorCode, RunError};
pub use limits::{Limit, LimitError, LimitOverrides, Limits};
pub use outcome::{Completion, ConsoleLevel, ConsoleLine, Interruption, Outcome, Resolution, Suspension};
mod pool;
pub mod process;
mod runner;

pub use continuation::{ContinuationCodec, Inspection, StoredCodec};
pub use resumable_host as host;
pub use runner::{ConfigError, DEFAULT_AUDIENCE, RunRequest, Runner, RunnerConfig};
pub use store::{ClaimId, ContinuationStore, MemoryContinuationStore, StoreError, StoreFuture, StoredContinuation};
