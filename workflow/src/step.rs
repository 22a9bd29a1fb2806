//! Step options and what a step function can see about itself.

use std::time::Duration;

use crate::ids::{RunId, random_unit};

/// How a step is retried after a retryable error: exponential backoff with jitter.
///
/// After the `n`-th failure of a step with a retryable error, with `n <= max_retries`, the next
/// attempt is due after `min(initial_backoff * multiplier^(n-1), max_backoff)`, scaled by a random factor in
/// `[0.5, 1.0)` so that many runs failing together do not retry in lockstep.
#[derive(Clone, Debug, PartialEq)]
pub struct RetryPolicy {
    /// Retries after the first attempt (3 by default; 0 disables retries).
    pub max_retries: u32,
    /// The delay before the first retry, before jitter.
    pub initial_backoff: Duration,
    /// The cap on any delay.
    pub max_backoff: Duration,
    /// The factor applied to the delay after each failed attempt.
    pub multiplier: f64,
    /// Attempts that may be interrupted (by a crash or a lost lease, before they record an end)
    /// before the step fails; 100 by default. Interruptions do not use up `max_retries`: a server
    /// killed a few times during one step must not fail it, while a step that kills its process
    /// every time still ends.
    pub max_interruptions: u32,
}

impl Default for RetryPolicy {
    fn default() -> RetryPolicy {
        RetryPolicy {
            max_retries: 3,
            initial_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(60),
            multiplier: 2.0,
            max_interruptions: 100,
        }
    }
}

impl RetryPolicy {
    /// The default policy with a different number of retries.
    pub fn with_max_retries(max_retries: u32) -> RetryPolicy {
        RetryPolicy { max_retries, ..RetryPolicy::default() }
    }

    /// A policy that never retries.
    pub fn no_retry() -> RetryPolicy {
        RetryPolicy::with_max_retries(0)
    }

    /// The same policy with a different budget of interrupted attempts.
    pub fn max_interruptions(mut self, interruptions: u32) -> RetryPolicy {
        self.max_interruptions = interruptions;
        self
    }

    /// The same policy with a different initial backoff.
    pub fn initial_backoff(mut self, d: Duration) -> RetryPolicy {
        self.initial_backoff = d;
        self
    }

    /// The delay before the attempt that follows failed attempt `attempt` (1-based), with jitter.
    pub(crate) fn backoff(&self, attempt: u32) -> Duration {
        let exp = i32::try_from(attempt.saturating_sub(1)).unwrap_or(i32::MAX);
        let base = self.initial_backoff.as_secs_f64() * self.multiplier.max(1.0).powi(exp);
        let capped = base.min(self.max_backoff.as_secs_f64());
        Duration::from_secs_f64(capped * (0.5 + 0.5 * random_unit()))
    }
}

/// What a step function knows about the attempt it is running.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StepContext {
    /// The run the step belongs to.
    pub run_id: RunId,
    /// The step's name.
    pub name: String,
    /// The step's position in the workflow.
    pub position: u32,
    /// The attempt number, starting at 1.
    pub attempt: u32,
    /// A stable id of the step, the same on every attempt and replay: use it as an idempotency key
    /// for the step's side effects.
    pub step_id: String,
}

impl StepContext {
    pub(crate) fn new(run_id: &RunId, name: &str, position: u32, attempt: u32) -> StepContext {
        StepContext {
            run_id: run_id.clone(),
            name: name.to_owned(),
            position,
            attempt,
            step_id: format!("{run_id}:{position}"),
        }
    }
}
