//! What a host function returns when it does not produce a value.

use serde_json::Value;
use std::fmt;

/// The code a script sees on every error raised by a host function.
pub const HOST_FUNCTION_ERROR_CODE: &str = "RUN_HOST_FUNCTION_ERROR";

/// Message shown to the script when the host keeps the real cause to itself.
const HIDDEN_MESSAGE: &str = "host function failed";

/// The non-value outcome of a host call.
///
/// * [`HostError::Interrupt`] pauses the run: the call becomes a pending
///   interruption and the run ends with a continuation (build it with
///   [`HostCallContext::interrupt`](crate::HostCallContext::interrupt)).
/// * [`HostError::Failed`] rejects the script's promise with a catchable error
///   whose `code` is [`HOST_FUNCTION_ERROR_CODE`]. Only the public message and
///   details reach the script; the internal cause stays with the embedder.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum HostError {
    /// Pause the run with this JSON payload (shown to whoever decides).
    Interrupt(Value),
    /// Reject the call.
    Failed(HostFailure),
}

/// A failed host call.
#[derive(Debug, Clone, PartialEq)]
pub struct HostFailure {
    /// Message the script sees.
    pub message: String,
    /// Optional JSON the script sees as `error.details`.
    pub details: Option<Value>,
    /// Cause kept for the embedder (logs, metrics); never shown to the script.
    pub internal: Option<String>,
}

impl HostError {
    /// A failure whose message the script may read.
    pub fn new(message: impl Into<String>) -> Self {
        HostError::Failed(HostFailure { message: message.into(), details: None, internal: None })
    }

    /// A failure whose cause is hidden from the script: it sees only
    /// "host function failed"; `cause` is kept in [`HostFailure::internal`].
    pub fn internal(cause: impl fmt::Display) -> Self {
        HostError::Failed(HostFailure {
            message: HIDDEN_MESSAGE.into(),
            details: None,
            internal: Some(cause.to_string()),
        })
    }

    /// Attaches JSON details the script can read as `error.details`.
    /// No effect on an interrupt.
    pub fn with_details(mut self, details: Value) -> Self {
        if let HostError::Failed(failure) = &mut self {
            failure.details = Some(details);
        }
        self
    }

    /// True for [`HostError::Interrupt`].
    pub fn is_interrupt(&self) -> bool {
        matches!(self, HostError::Interrupt(_))
    }
}

impl fmt::Display for HostError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HostError::Interrupt(_) => f.write_str("host function interrupted the run"),
            HostError::Failed(failure) => f.write_str(&failure.message),
        }
    }
}

impl std::error::Error for HostError {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn internal_cause_is_hidden() {
        let err = HostError::internal("connection refused to 10.0.0.5:5432");
        assert_eq!(err.to_string(), "host function failed");
        let HostError::Failed(failure) = err else { panic!() };
        assert_eq!(failure.internal.as_deref(), Some("connection refused to 10.0.0.5:5432"));
    }
}
