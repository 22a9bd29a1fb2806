//! A run to consume one of three ways: its outcome, its live events, or its
//! events written to a writer as NDJSON.

use crate::error::{ErrorCode, RunError};
use crate::event::RunEvent;
use crate::event_queue::{EVENT_QUEUE_CAPACITY, EventQueue};
use crate::outcome::Outcome;
use crate::runner::{RunRequest, Runner};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use tokio::io::{AsyncWrite, AsyncWriteExt};
use tokio::task::JoinHandle;

/// A run that has not started yet, from [`Runner::start`]. Nothing runs until
/// one of its methods is called; each consumes the handle.
///
/// Events cost nothing unless asked for: [`outcome`](RunHandle::outcome) runs
/// exactly as [`Runner::run`] does.
#[derive(Debug)]
#[must_use = "a run handle does nothing until it is awaited, streamed or piped"]
pub struct RunHandle {
    runner: Runner,
    request: RunRequest,
}

impl RunHandle {
    pub(crate) fn new(runner: Runner, request: RunRequest) -> RunHandle {
        RunHandle { runner, request }
    }

    /// Runs to the end without collecting events.
    pub async fn outcome(self) -> Result<Outcome, RunError> {
        self.runner.execute_request(&self.request, None).await
    }

    /// Starts the run on the current tokio runtime and streams its events as
    /// they happen, ending with one terminal event. Dropping the returned
    /// [`RunEvents`] before the end cancels the run.
    pub fn events(self) -> RunEvents {
        let queue = EventQueue::new(EVENT_QUEUE_CAPACITY);
        let Ok(tokio) = tokio::runtime::Handle::try_current() else {
            let error = RunError::new(ErrorCode::ConfigurationError, "a live run must start inside a tokio runtime");
            let result = Err(error);
            queue.end(RunEvent::ending(&result));
            return RunEvents { queue, task: None, early: Some(result) };
        };
        let ending = EndOnDrop(queue.clone());
        let task = tokio.spawn(async move {
            let queue = ending.0.clone();
            let result = self.runner.execute_request(&self.request, Some(queue.clone())).await;
            queue.end(RunEvent::ending(&result));
            result
        });
        RunEvents { queue, task: Some(task), early: None }
    }

    /// Runs while writing each event to `writer` as one JSON line (flushed per
    /// line), the terminal event last, and returns the outcome. If writing
    /// fails the run is cancelled and the answer is `RUN_ABORTED`.
    pub async fn pipe<W: AsyncWrite + Unpin>(self, mut writer: W) -> Result<Outcome, RunError> {
        let mut events = self.events();
        while let Some(event) = events.next().await {
            let mut line = serde_json::to_vec(&event).map_err(|e| RunError::internal(format!("event: {e}")))?;
            line.push(b'\n');
            let written = async {
                writer.write_all(&line).await?;
                writer.flush().await
            };
            if let Err(error) = written.await {
                return Err(RunError::new(ErrorCode::Aborted, format!("the event writer failed: {error}")));
            }
        }
        events.outcome().await
    }
}

/// The events of a started run, from [`RunHandle::events`]; also a
/// [`Stream`](futures_core::Stream).
///
/// Events arrive in the order they happened. The worker never waits for the
/// reader: at most [`EVENT_QUEUE_CAPACITY`] unread events are kept, further
/// live events are dropped and reported by one [`RunEvent::Lagged`].
#[derive(Debug)]
pub struct RunEvents {
    queue: Arc<EventQueue>,
    task: Option<JoinHandle<Result<Outcome, RunError>>>,
    /// The result of a run that could not start.
    early: Option<Result<Outcome, RunError>>,
}

impl RunEvents {
    /// The next event; `None` once the terminal event has been read.
    pub async fn next(&mut self) -> Option<RunEvent> {
        std::future::poll_fn(|cx| self.queue.poll_next(cx)).await
    }

    /// Waits for the run to end and returns its outcome; unread events are discarded.
    pub async fn outcome(mut self) -> Result<Outcome, RunError> {
        if let Some(result) = self.early.take() {
            return result;
        }
        let Some(task) = self.task.take() else {
            return Err(RunError::internal("the run's outcome was already taken"));
        };
        self.queue.close();
        task.await.unwrap_or_else(|_| Err(RunError::internal("the run's task stopped")))
    }
}

impl futures_core::Stream for RunEvents {
    type Item = RunEvent;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<RunEvent>> {
        self.queue.poll_next(cx)
    }
}

impl Drop for RunEvents {
    fn drop(&mut self) {
        self.queue.close();
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

/// Ends the events with a failure if the run's task stops without an answer.
struct EndOnDrop(Arc<EventQueue>);

impl Drop for EndOnDrop {
    fn drop(&mut self) {
        self.0.end(RunEvent::ending(&Err(RunError::internal("the run stopped without an answer"))));
    }
}
