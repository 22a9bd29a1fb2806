//! Error types: what a step returns, what a workflow sees, what the store and engine report.

use std::error::Error;
use std::fmt;
use std::sync::Arc;

use crate::ids::RunId;

/// The error a step function returns: retryable (the step is attempted again with backoff) or fatal.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StepError {
    /// A human-readable message, recorded in the run's log.
    pub message: String,
    /// Whether attempting the step again can succeed.
    pub retryable: bool,
}

impl StepError {
    /// A transient failure: the step is retried while its retry policy allows.
    pub fn retryable(message: impl Into<String>) -> StepError {
        StepError { message: message.into(), retryable: true }
    }

    /// A permanent failure: the step fails at once, without retry.
    pub fn fatal(message: impl Into<String>) -> StepError {
        StepError { message: message.into(), retryable: false }
    }
}

impl fmt::Display for StepError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for StepError {}

impl From<serde_json::Error> for StepError {
    fn from(e: serde_json::Error) -> StepError {
        StepError::fatal(format!("serialization error: {e}"))
    }
}

/// A step that failed for good: a fatal error, or a retryable one after its retries ran out.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StepFailure {
    /// The step's name.
    pub step: String,
    /// The step's position in the workflow (0-based, shared with hooks and timers).
    pub position: u32,
    /// The last attempt's error message.
    pub message: String,
    /// How many attempts were made.
    pub attempts: u32,
}

/// An error inside a workflow: returned by context operations and by the workflow function itself.
///
/// A workflow function that returns `Err` fails its run with the error's message.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum WorkflowError {
    /// A step failed for good.
    Step(StepFailure),
    /// The hook token is held by an active hook of another run.
    HookConflict {
        /// The token asked for.
        token: String,
        /// The run that owns it.
        owner_run_id: RunId,
    },
    /// A child run failed or was cancelled.
    ChildFailed {
        /// The child run.
        run_id: RunId,
        /// How it ended: `"failed"` or `"cancelled"`.
        status: String,
        /// Its error message (or cancellation reason).
        error: String,
    },
    /// A value could not be converted to or from JSON.
    Serialization(String),
    /// An error raised by workflow code.
    Failed(String),
}

impl WorkflowError {
    /// An error raised by workflow code, with a message.
    pub fn msg(message: impl Into<String>) -> WorkflowError {
        WorkflowError::Failed(message.into())
    }
}

impl fmt::Display for WorkflowError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WorkflowError::Step(s) => {
                write!(f, "step {:?} failed after {} attempt(s): {}", s.step, s.attempts, s.message)
            }
            WorkflowError::HookConflict { token, owner_run_id } => {
                write!(f, "hook token {token:?} is already used by an active hook of run {owner_run_id}")
            }
            WorkflowError::ChildFailed { run_id, status, error } => write!(f, "child run {run_id} {status}: {error}"),
            WorkflowError::Serialization(m) => write!(f, "serialization error: {m}"),
            WorkflowError::Failed(m) => f.write_str(m),
        }
    }
}

impl std::error::Error for WorkflowError {}

impl From<serde_json::Error> for WorkflowError {
    fn from(e: serde_json::Error) -> WorkflowError {
        WorkflowError::Serialization(e.to_string())
    }
}

/// A name that is not one of the values it should be (a run status or an event kind read back
/// from a database, say).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnknownName {
    /// What the name should have named.
    pub what: &'static str,
    /// The name.
    pub name: String,
}

impl fmt::Display for UnknownName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "unknown {} {:?}", self.what, self.name)
    }
}

impl std::error::Error for UnknownName {}

impl From<UnknownName> for StoreError {
    fn from(e: UnknownName) -> StoreError {
        StoreError::Corrupt(e.to_string())
    }
}

/// An error of a [`Store`](crate::Store) backend.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum StoreError {
    /// The execution's lease was taken over, or the run ended or was cancelled: the write was refused.
    LeaseLost {
        /// The run whose lease was lost.
        run_id: RunId,
    },
    /// No run has this id.
    RunNotFound(RunId),
    /// No active hook has this token (never created, or disposed when its run ended).
    HookNotFound(String),
    /// The database failed.
    Database(DatabaseError),
    /// Stored data could not be decoded.
    Corrupt(String),
}

impl fmt::Display for StoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StoreError::LeaseLost { run_id } => write!(f, "lease of run {run_id} was lost"),
            StoreError::RunNotFound(id) => write!(f, "run {id} not found"),
            StoreError::HookNotFound(_) => f.write_str("no active hook with this token (unknown or disposed)"),
            StoreError::Database(e) => write!(f, "database error: {e}"),
            StoreError::Corrupt(m) => write!(f, "corrupt stored data: {m}"),
        }
    }
}

impl Error for StoreError {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        match self {
            StoreError::Database(e) => e.source(),
            _ => None,
        }
    }
}

impl StoreError {
    /// A database failure described by `message`, with no driver error behind it.
    pub fn database(message: impl Into<String>) -> StoreError {
        StoreError::Database(DatabaseError { message: message.into(), cause: None })
    }

    /// A database failure caused by the driver's error `cause` (its [`source`](Error::source)).
    pub fn driver(cause: impl Error + Send + Sync + 'static) -> StoreError {
        StoreError::Database(DatabaseError { message: cause.to_string(), cause: Some(Arc::new(cause)) })
    }
}

/// What a database failure says, and the driver's error that caused it, when there is one
/// (`rusqlite::Error` or `sqlx::Error`: reach it with [`Error::source`] and downcast).
///
/// Two are equal when their messages are.
#[derive(Clone, Debug)]
pub struct DatabaseError {
    message: String,
    cause: Option<Arc<dyn Error + Send + Sync>>,
}

impl DatabaseError {
    /// The message, for operators (it includes the driver's, never a password).
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl fmt::Display for DatabaseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl Error for DatabaseError {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        self.cause.as_deref().map(|cause| cause as &(dyn Error + 'static))
    }
}

impl PartialEq for DatabaseError {
    fn eq(&self, other: &DatabaseError) -> bool {
        self.message == other.message
    }
}

impl Eq for DatabaseError {}

/// An error of the [`Engine`](crate::Engine) API.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum EngineError {
    /// No workflow of this name is registered with the engine.
    UnknownWorkflow(String),
    /// No run has this id.
    RunNotFound(RunId),
    /// No active hook has this token: it never existed, or its run ended and it was disposed.
    ///
    /// The token itself is not part of the message, so the error can be logged safely.
    HookNotFound,
    /// A wait for a run did not finish in time.
    Timeout(RunId),
    /// The store failed.
    Store(StoreError),
}

impl fmt::Display for EngineError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            EngineError::UnknownWorkflow(n) => write!(f, "no workflow named {n:?} is registered"),
            EngineError::RunNotFound(id) => write!(f, "run {id} not found"),
            EngineError::HookNotFound => f.write_str("hook not found: the token is unknown or was disposed"),
            EngineError::Timeout(id) => write!(f, "timed out waiting for run {id}"),
            EngineError::Store(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for EngineError {}

impl From<StoreError> for EngineError {
    fn from(e: StoreError) -> EngineError {
        match e {
            StoreError::RunNotFound(id) => EngineError::RunNotFound(id),
            StoreError::HookNotFound(_) => EngineError::HookNotFound,
            other => EngineError::Store(other),
        }
    }
}
