//! The error taxonomy of a run: stable codes, messages, retry advice.

use crate::outcome::ConsoleLine;
use serde::Serialize;
use std::fmt;

/// Stable error codes. The string form (`RUN_TIMEOUT`, …) is part of the API.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, serde::Deserialize)]
#[serde(into = "&'static str", try_from = "String")]
#[non_exhaustive]
pub enum ErrorCode {
    /// Uncaught guest error or syntax error (or an internal failure, then retryable).
    Error,
    /// The caller cancelled the run.
    Aborted,
    /// The wall-clock limit was reached (also while waiting on host calls).
    Timeout,
    /// The script used more CPU time than its limit.
    CpuTimeout,
    /// The memory limit was reached.
    MemoryLimit,
    /// The stack limit was reached.
    StackOverflow,
    /// Every worker is busy and the queue is full.
    ConcurrencyLimit,
    /// The source is larger than the source limit.
    SourceTooLarge,
    /// A host-call limit was reached: call count, calls in flight, argument or output bytes.
    BridgeLimit,
    /// A host function failed and the script did not catch it, or the script called an unknown one.
    HostFunctionError,
    /// The script finished while a host call it started was still running.
    DetachedBridgeRequest,
    /// A value could not cross the boundary, or the result is too large.
    SerializationError,
    /// The continuation or resolutions do not fit this run: tampered, expired, other scope, diverged.
    ProtocolError,
    /// The continuation's ledger called a host function that the run no longer has.
    FunctionRemoved,
    /// The continuation's ledger called a host function whose parameters changed since.
    FunctionChanged,
    /// The runner is not configured for what the run needs (e.g. an interrupt without a secret).
    ConfigurationError,
}

impl ErrorCode {
    /// Every code, for documentation and tests.
    pub const ALL: [ErrorCode; 16] = [
        ErrorCode::Error,
        ErrorCode::Aborted,
        ErrorCode::Timeout,
        ErrorCode::CpuTimeout,
        ErrorCode::MemoryLimit,
        ErrorCode::StackOverflow,
        ErrorCode::ConcurrencyLimit,
        ErrorCode::SourceTooLarge,
        ErrorCode::BridgeLimit,
        ErrorCode::HostFunctionError,
        ErrorCode::DetachedBridgeRequest,
        ErrorCode::SerializationError,
        ErrorCode::ProtocolError,
        ErrorCode::FunctionRemoved,
        ErrorCode::FunctionChanged,
        ErrorCode::ConfigurationError,
    ];

    /// The stable string form.
    pub const fn as_str(self) -> &'static str {
        match self {
            ErrorCode::Error => "RUN_ERROR",
            ErrorCode::Aborted => "RUN_ABORTED",
            ErrorCode::Timeout => "RUN_TIMEOUT",
            ErrorCode::CpuTimeout => "RUN_CPU_TIMEOUT",
            ErrorCode::MemoryLimit => "RUN_MEMORY_LIMIT",
            ErrorCode::StackOverflow => "RUN_STACK_OVERFLOW",
            ErrorCode::ConcurrencyLimit => "RUN_CONCURRENCY_LIMIT",
            ErrorCode::SourceTooLarge => "RUN_SOURCE_TOO_LARGE",
            ErrorCode::BridgeLimit => "RUN_BRIDGE_LIMIT",
            ErrorCode::HostFunctionError => "RUN_HOST_FUNCTION_ERROR",
            ErrorCode::DetachedBridgeRequest => "RUN_DETACHED_BRIDGE_REQUEST",
            ErrorCode::SerializationError => "RUN_SERIALIZATION_ERROR",
            ErrorCode::ProtocolError => "RUN_PROTOCOL_ERROR",
            ErrorCode::FunctionRemoved => "RUN_FUNCTION_REMOVED",
            ErrorCode::FunctionChanged => "RUN_FUNCTION_CHANGED",
            ErrorCode::ConfigurationError => "RUN_CONFIGURATION_ERROR",
        }
    }

    /// Whether running the same input again can succeed, absent other knowledge.
    pub const fn default_retryable(self) -> bool {
        matches!(self, ErrorCode::Aborted | ErrorCode::Timeout | ErrorCode::ConcurrencyLimit)
    }

    /// Parses the string form.
    pub fn parse(code: &str) -> Option<ErrorCode> {
        ErrorCode::ALL.into_iter().find(|c| c.as_str() == code)
    }
}

/// A string that names no [`ErrorCode`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnknownErrorCode(pub String);

impl fmt::Display for UnknownErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "unknown error code {:?}", self.0)
    }
}

impl std::error::Error for UnknownErrorCode {}

impl TryFrom<String> for ErrorCode {
    type Error = UnknownErrorCode;

    fn try_from(code: String) -> Result<Self, UnknownErrorCode> {
        ErrorCode::parse(&code).ok_or(UnknownErrorCode(code))
    }
}

impl From<ErrorCode> for &'static str {
    fn from(code: ErrorCode) -> Self {
        code.as_str()
    }
}

impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A failed run.
#[derive(Debug, Clone, PartialEq, Serialize, serde::Deserialize)]
pub struct RunError {
    /// Stable code.
    pub code: ErrorCode,
    /// Human-readable explanation; never contains secrets or host internals.
    pub message: String,
    /// Whether running the same input again can succeed.
    pub retryable: bool,
    /// Console output captured before the failure.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub console: Vec<ConsoleLine>,
}

impl RunError {
    /// An error with the code's default retry advice.
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        RunError { code, message: message.into(), retryable: code.default_retryable(), console: Vec::new() }
    }

    /// Overrides the retry advice.
    pub fn retryable(mut self, retryable: bool) -> Self {
        self.retryable = retryable;
        self
    }

    /// A failure of the runner itself (worker lost, engine could not start); retryable.
    pub fn internal(message: impl Into<String>) -> Self {
        RunError::new(ErrorCode::Error, format!("internal error: {}", message.into())).retryable(true)
    }

    pub(crate) fn protocol(message: impl Into<String>) -> Self {
        RunError::new(ErrorCode::ProtocolError, message)
    }
}

impl fmt::Display for RunError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.code, self.message)
    }
}

impl std::error::Error for RunError {}

/// A configuration value out of range.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError(pub String);

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ConfigError {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_round_trip_and_are_unique() {
        let mut seen = std::collections::HashSet::new();
        for code in ErrorCode::ALL {
            assert!(seen.insert(code.as_str()));
            assert_eq!(ErrorCode::parse(code.as_str()), Some(code));
            assert!(code.as_str().starts_with("RUN_"));
        }
        assert_eq!(serde_json::to_string(&ErrorCode::Timeout).unwrap(), "\"RUN_TIMEOUT\"");
    }
}
