//! How a worker's host calls reach the host functions.
//!
//! In thread mode the functions run in this process on the caller's tokio
//! runtime ([`LocalHost`]); in process mode they run in the parent, and calls
//! travel as frames over a pipe ([`RemoteHost`]). Either way a call that does
//! not finish at once reports back through the run's inbox.

use crate::continuation::Claim;
use crate::error::RunError;
use crate::job::WorkerMessage;
use resumable_host::{CancelSignal, HostCallContext, HostError, HostFunctions, HostFuture, HostResult, Resume};
use serde_json::Value;
use std::cell::RefCell;
use std::future::Future;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::pin::Pin;
use std::sync::Arc;
use std::sync::mpsc;
use std::task::{Context, Poll, Waker};

/// One host call as the worker asks for it.
pub(crate) struct CallRequest<'a> {
    pub logical_run_id: &'a Arc<str>,
    pub index: u32,
    pub function: &'a str,
    /// The arguments as the canonical JSON array text the runner produced.
    pub arguments: &'a str,
    pub resume: Option<Resume>,
}

/// Where host calls go.
pub(crate) enum HostLink {
    Local(LocalHost),
    Remote(Box<dyn RemoteHost + Send>),
}

/// Host functions in this process.
pub(crate) struct LocalHost {
    pub functions: HostFunctions,
    pub tokio: tokio::runtime::Handle,
    pub inbox: mpsc::Sender<WorkerMessage>,
    pub cancel: CancelSignal,
    pub claim: Option<Arc<Claim>>,
    pub tasks: RefCell<Vec<tokio::task::JoinHandle<()>>>,
}

/// Host functions in another process, reached by messages. The other process consumed a stored
/// continuation before the run started, so nothing is consumed from here.
pub(crate) trait RemoteHost {
    /// Asks the other side to run a call; its result arrives in the inbox.
    fn call(&self, request: &CallRequest<'_>) -> Result<(), RunError>;
}

impl HostLink {
    /// Starts a call: `Some` when it finished at once, `None` when its result will
    /// arrive in the inbox.
    pub(crate) fn start(&self, request: CallRequest<'_>) -> Option<HostResult> {
        match self {
            HostLink::Local(local) => local.start(request),
            HostLink::Remote(remote) => match remote.call(&request) {
                Ok(()) => None,
                Err(error) => Some(Err(HostError::internal(error))),
            },
        }
    }

    /// Uses up the stored continuation this run resumed from, if any (in process mode the
    /// parent did before the run started).
    pub(crate) fn consume(&self) -> Result<(), RunError> {
        match self {
            HostLink::Local(LocalHost { claim: Some(claim), tokio, .. }) => claim.consume(tokio),
            HostLink::Local(_) | HostLink::Remote(_) => Ok(()),
        }
    }

    /// Tells running host calls the run is over and stops waiting for them.
    pub(crate) fn finish(&self, calls_in_flight: bool) {
        if let HostLink::Local(local) = self {
            let tasks = std::mem::take(&mut *local.tasks.borrow_mut());
            if calls_in_flight || !tasks.is_empty() {
                local.cancel.cancel();
            }
            for task in tasks {
                task.abort();
            }
        }
    }
}

impl LocalHost {
    fn start(&self, request: CallRequest<'_>) -> Option<HostResult> {
        let arguments: Vec<Value> = match serde_json::from_str(request.arguments) {
            Ok(arguments) => arguments,
            Err(e) => {
                return Some(Err(HostError::new(format!(
                    "the arguments of {} could not be read: {e}",
                    request.function
                ))));
            }
        };
        let _runtime = self.tokio.enter();
        let call = HostCall {
            run_id: request.logical_run_id,
            function: request.function,
            index: request.index,
            resume: request.resume,
            cancel: &self.cancel,
        };
        match call.begin(&self.functions, arguments) {
            Begun::Finished(result) => Some(result),
            Begun::Running(future) => {
                let inbox = self.inbox.clone();
                let index = request.index;
                self.tasks.borrow_mut().push(self.tokio.spawn(async move {
                    let result = future.await;
                    let _ = inbox.send(WorkerMessage::Settled { index, result, clock: None });
                }));
                None
            }
        }
    }
}

/// One host call, as both modes dispatch it: in this process for thread mode, in the parent for
/// process mode.
pub(crate) struct HostCall<'a> {
    pub run_id: &'a Arc<str>,
    pub function: &'a str,
    pub index: u32,
    pub resume: Option<Resume>,
    pub cancel: &'a CancelSignal,
}

/// A host call after its first poll.
pub(crate) enum Begun {
    /// It answered without waiting (most do).
    Finished(HostResult),
    /// It waits: the rest runs on the runtime.
    Running(CatchUnwind),
}

impl HostCall<'_> {
    /// Calls the host function with `arguments` and polls it once (a panic is a failed call), so a
    /// call that does not wait costs no hand-off to the runtime. Call it inside a tokio runtime.
    pub(crate) fn begin(self, host: &HostFunctions, arguments: Vec<Value>) -> Begun {
        let context =
            HostCallContext::new(self.run_id.clone(), self.function, self.index, self.resume, self.cancel.clone());
        let mut future = CatchUnwind(host.call(self.function, context, arguments));
        match Pin::new(&mut future).poll(&mut Context::from_waker(Waker::noop())) {
            Poll::Ready(result) => Begun::Finished(result),
            Poll::Pending => Begun::Running(future),
        }
    }
}

fn panicked() -> HostError {
    HostError::internal("host function panicked")
}

/// Polls a host future, turning a panic into a failed call.
pub(crate) struct CatchUnwind(pub HostFuture);

impl Future for CatchUnwind {
    type Output = HostResult;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<HostResult> {
        match catch_unwind(AssertUnwindSafe(|| self.0.as_mut().poll(cx))) {
            Ok(poll) => poll,
            Err(_) => Poll::Ready(Err(panicked())),
        }
    }
}
