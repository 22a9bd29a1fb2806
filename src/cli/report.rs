//! The one JSON line a run prints on stdout, and the exit status that goes with it.

use resumable::{ConsoleLine, ErrorCode, Interruption, Outcome, RunError};
use serde::Serialize;
use serde_json::Value;
use std::io::Write;
use std::process::ExitCode;

/// Exit status when the script completed.
const EXIT_COMPLETED: u8 = 0;
/// Exit status when the run failed (script error or limit).
const EXIT_FAILED: u8 = 1;
/// Exit status when a host function asked for approval (only `run --demo` offers one).
const EXIT_INTERRUPTED: u8 = 3;

/// What a run printed: `{"status":"completed",…}` or `{"status":"failed",…}`.
#[derive(Debug, Serialize)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum Report<'a> {
    /// The script returned `value`.
    Completed {
        /// The returned value (`undefined` is `null`).
        value: &'a Value,
        /// Console output of the run.
        console: &'a [ConsoleLine],
    },
    /// A host function asked for a decision; the run stopped there.
    Interrupted {
        /// What is waiting for a decision.
        interruptions: &'a [Interruption],
        /// Console output of the run.
        console: &'a [ConsoleLine],
        /// The token that resumes the run (`resumable resume`), when it was made with a secret
        /// the caller holds.
        #[serde(skip_serializing_if = "Option::is_none")]
        continuation: Option<&'a str>,
    },
    /// The run ended with an error.
    Failed {
        /// Code, message and retry advice.
        error: ErrorReport<'a>,
        /// Console output captured before the failure.
        console: &'a [ConsoleLine],
    },
}

/// The `error` object of a failed run.
#[derive(Debug, Serialize)]
pub struct ErrorReport<'a> {
    /// Stable code such as `RUN_TIMEOUT`.
    code: ErrorCode,
    /// Human-readable explanation.
    message: &'a str,
    /// Whether running the same input again can succeed.
    retryable: bool,
}

impl<'a> Report<'a> {
    /// The report of a failed run.
    pub fn failed(error: &'a RunError) -> Self {
        Report::Failed {
            error: ErrorReport { code: error.code, message: &error.message, retryable: error.retryable },
            console: &error.console,
        }
    }

    /// Writes the report as one line on stdout and returns the matching exit status.
    pub fn print(&self) -> ExitCode {
        let status = match self {
            Report::Completed { .. } => EXIT_COMPLETED,
            Report::Interrupted { .. } => EXIT_INTERRUPTED,
            Report::Failed { .. } => EXIT_FAILED,
        };
        let line = serde_json::to_string(self).expect("a report always serializes");
        let mut stdout = std::io::stdout().lock();
        if let Err(err) = writeln!(stdout, "{line}").and_then(|()| stdout.flush()) {
            eprintln!("error: cannot write the result to stdout: {err}");
            return ExitCode::from(EXIT_FAILED);
        }
        ExitCode::from(status)
    }
}

/// Prints the result of a run, with the continuation of an interrupted one when `with_token`.
pub fn print_outcome(result: &Result<Outcome, RunError>, with_token: bool) -> ExitCode {
    match result {
        Ok(Outcome::Completed(done)) => Report::Completed { value: &done.value, console: &done.console }.print(),
        Ok(Outcome::Interrupted(stop)) => {
            let continuation = with_token.then_some(stop.continuation.as_str());
            Report::Interrupted { interruptions: &stop.interruptions, console: &stop.console, continuation }.print()
        }
        Err(error) => Report::failed(error).print(),
    }
}
