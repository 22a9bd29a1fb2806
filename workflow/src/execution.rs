//! Driving one execution of a workflow function until it finishes or is blocked.
//!
//! Context operations that must wait for something not yet available (a hook payload, a due
//! timer, a step retry) *block*: they return a future that never completes. The driver polls the
//! workflow future; when it is pending while no operation is in flight (every branch of the
//! workflow is parked on a blocked operation), the execution is over and the run suspends. The
//! workflow runs again from the top on its next wake-up.

use std::future::{Future, poll_fn};
use std::pin::pin;
use std::sync::{Mutex, MutexGuard};
use std::task::{Poll, Waker};

use serde_json::Value;

use crate::error::{StoreError, WorkflowError};
use crate::time::Millis;

/// Why an execution stopped early.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Abort {
    /// Another execution owns the run now, or the run ended (cancelled): write nothing more.
    LeaseLost,
    /// The store failed; the run is retried later.
    Store(StoreError),
    /// The workflow asked for different operations than its history recorded.
    Nondeterminism(String),
}

impl From<StoreError> for Abort {
    fn from(e: StoreError) -> Abort {
        match e {
            StoreError::LeaseLost { .. } => Abort::LeaseLost,
            other => Abort::Store(other),
        }
    }
}

/// How an execution ended.
#[derive(Debug)]
pub(crate) enum Outcome {
    /// The workflow function returned.
    Finished(Result<Value, WorkflowError>),
    /// Every branch is blocked; wake at this time (or only on a hook payload).
    Suspended(Option<Millis>),
    /// Stopped early.
    Aborted(Abort),
}

#[derive(Default)]
struct State {
    next_position: u32,
    inflight: usize,
    blocked: usize,
    wake_at: Option<Millis>,
    abort: Option<Abort>,
    driver: Option<Waker>,
}

/// Shared bookkeeping of one execution.
#[derive(Default)]
pub(crate) struct Execution {
    state: Mutex<State>,
}

impl std::fmt::Debug for Execution {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Execution")
    }
}

/// Counts an operation as in flight until dropped.
pub(crate) struct InFlight<'a>(&'a Execution);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.lock().inflight -= 1;
    }
}

struct Blocked<'a>(&'a Execution);

impl Drop for Blocked<'_> {
    fn drop(&mut self) {
        self.0.lock().blocked -= 1;
    }
}

impl Execution {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Takes the next operation position.
    pub(crate) fn next_position(&self) -> u32 {
        let mut s = self.lock();
        let p = s.next_position;
        s.next_position += 1;
        p
    }

    /// Marks an operation in flight until the guard drops.
    pub(crate) fn enter(&self) -> InFlight<'_> {
        self.lock().inflight += 1;
        InFlight(self)
    }

    /// Blocks the calling operation for the rest of this execution; the run wakes at `wake_at`
    /// (if any) or on a hook payload.
    pub(crate) async fn block<T>(&self, wake_at: Option<Millis>) -> T {
        let _blocked = {
            let mut s = self.lock();
            s.blocked += 1;
            if let Some(t) = wake_at {
                s.wake_at = Some(s.wake_at.map_or(t, |w| w.min(t)));
            }
            Blocked(self)
        };
        std::future::pending().await
    }

    /// Stops the execution (the first abort wins) and never returns.
    pub(crate) async fn abort<T>(&self, abort: Abort) -> T {
        self.abort_now(abort);
        std::future::pending().await
    }

    /// Stops the execution from anywhere (for example a failed heartbeat or a cancel).
    pub(crate) fn abort_now(&self, abort: Abort) {
        let waker = {
            let mut s = self.lock();
            s.abort.get_or_insert(abort);
            s.driver.take()
        };
        if let Some(w) = waker {
            w.wake();
        }
    }

    /// Polls the workflow future until it finishes, blocks or is aborted.
    pub(crate) async fn drive<F>(&self, fut: F) -> Outcome
    where
        F: Future<Output = Result<Value, WorkflowError>>,
    {
        let mut fut = pin!(fut);
        poll_fn(|cx| {
            if let Some(a) = self.lock().abort.take() {
                return Poll::Ready(Outcome::Aborted(a));
            }
            self.lock().driver = Some(cx.waker().clone());
            let polled = fut.as_mut().poll(cx);
            let mut s = self.lock();
            if let Some(a) = s.abort.take() {
                return Poll::Ready(Outcome::Aborted(a));
            }
            if let Poll::Ready(result) = polled {
                return Poll::Ready(Outcome::Finished(result));
            }
            if s.inflight == 0 && s.blocked > 0 {
                return Poll::Ready(Outcome::Suspended(s.wake_at));
            }
            Poll::Pending
        })
        .await
    }
}
