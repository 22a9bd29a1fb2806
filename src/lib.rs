//! Resumable: run untrusted JavaScript in a QuickJS sandbox that can pause
//! for a human decision and continue later without repeating any effect.
//!
//! This crate is the facade over the workspace:
//! * [`host`] — the trusted boundary: namespaced async host functions;
//! * [`runner`] — the sandbox, limits, replay and continuation codecs.
//!
//! The most used names are re-exported at the top level.

pub use resumable_host as host;
pub use resumable_runner as runner;

pub use resumable_host::{CancelSignal, HostCallContext, HostError, HostFunctions, Resume};
pub use resumable_runner::codec::{SignedCodec, SignedCodecConfig};
pub use resumable_runner::{
    Completion, ConsoleLevel, ConsoleLine, ErrorCode, Interruption, Limit, LimitOverrides, Limits, Outcome, Resolution,
    RunError, RunRequest, Runner, RunnerConfig, Suspension,
};
