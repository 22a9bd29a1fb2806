//! What a successful run returns.

use serde::Serialize;
use serde_json::Value;

/// A run either completes or pauses on one or more interruptions. (Deliberately exhaustive: a
/// caller must handle both, and a third way for a run to end would rightly break its match.)
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum Outcome {
    /// The script returned.
    Completed(Completion),
    /// Host calls interrupted; resume with the continuation and resolutions.
    Interrupted(Suspension),
}

impl Outcome {
    /// The completion, if the script returned.
    pub fn completed(&self) -> Option<&Completion> {
        match self {
            Outcome::Completed(c) => Some(c),
            Outcome::Interrupted(_) => None,
        }
    }

    /// The suspension, if the run paused.
    pub fn interrupted(&self) -> Option<&Suspension> {
        match self {
            Outcome::Interrupted(s) => Some(s),
            Outcome::Completed(_) => None,
        }
    }

    /// Console output of the run.
    pub fn console(&self) -> &[ConsoleLine] {
        match self {
            Outcome::Completed(c) => &c.console,
            Outcome::Interrupted(s) => &s.console,
        }
    }
}

/// A returned script.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Completion {
    /// The returned value (`undefined` is `null`).
    pub value: Value,
    /// Captured console output.
    pub console: Vec<ConsoleLine>,
}

/// A paused script.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Suspension {
    /// Every pending interruption, by call index.
    pub interruptions: Vec<Interruption>,
    /// The token to resume with.
    pub continuation: String,
    /// Id of the logical run (stable across resumes).
    pub logical_run_id: String,
    /// Captured console output.
    pub console: Vec<ConsoleLine>,
}

/// A host call waiting for a decision.
#[derive(Debug, Clone, PartialEq, Serialize, serde::Deserialize)]
pub struct Interruption {
    /// `interrupt-<k>`, k being the 1-based call index; stable across resumes.
    pub id: String,
    /// Full function name.
    pub function: String,
    /// The call's arguments.
    pub arguments: Vec<Value>,
    /// The payload the host function interrupted with.
    pub payload: Value,
}

/// A decision for one interruption, supplied when resuming.
#[derive(Debug, Clone, PartialEq, Serialize, serde::Deserialize)]
pub struct Resolution {
    /// The interruption it answers.
    pub interruption_id: String,
    /// The value handed to the host function as `resume.resolution`.
    pub value: Value,
}

impl Resolution {
    /// Resolves `interruption_id` with `value`.
    pub fn new(interruption_id: impl Into<String>, value: Value) -> Self {
        Resolution { interruption_id: interruption_id.into(), value }
    }
}

/// Severity of a console line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum ConsoleLevel {
    /// `console.log` and `console.debug`.
    Log,
    /// `console.info`.
    Info,
    /// `console.warn`.
    Warn,
    /// `console.error`.
    Error,
    /// Marker: output beyond the console limit was dropped.
    Truncated,
}

/// One captured console call.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct ConsoleLine {
    /// Which method wrote it.
    pub level: ConsoleLevel,
    /// The arguments, formatted and joined by spaces.
    pub text: String,
}
