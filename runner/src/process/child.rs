//! The worker-process side: one thread reads a job from stdin, runs it and answers on stdout.
//! While the run replays its ledger or waits on host calls, that same thread reads the ledger and
//! the settles from stdin (see [`input`](super::input)), so nothing costs a hand-off between
//! threads.

use super::frame::write_frame;
use super::input::{Input, PipeInbox, PipedState, SharedState};
use super::protocol::{Answer, JobSpec, Settlement, ToChild, ToParent};
use crate::error::RunError;
use crate::event::{EventSink, RunEvent};
use crate::job::{Job, RawOutcome, Streamed};
use crate::ledger_feed::LedgerFeed;
use crate::limits::MAX_STACK_BYTES;
use crate::link::{CallRequest, HostLink, RemoteHost};
use crate::sandbox::Engine;
use std::fs::File;
use std::io::BufWriter;
use std::os::fd::FromRawFd;
use std::sync::{Arc, Mutex};

/// The argument that makes the `resumable` CLI (or any program following the
/// same convention) act as a worker process.
pub const WORKER_ARGUMENT: &str = "__worker";

/// Serves runs on stdin/stdout until stdin closes, then exits the process at once, even in the
/// middle of a run. Call it from `main` of a worker program; it never returns.
pub fn serve_worker() -> ! {
    super::input::block_abort_signal();
    let served = std::thread::Builder::new()
        .name("resumable-worker".into())
        .stack_size(4 * MAX_STACK_BYTES + 1024 * 1024)
        .spawn(serve)
        .map(|thread| thread.join().is_ok());
    std::process::exit(if matches!(served, Ok(true)) { 0 } else { 70 })
}

type Output = Arc<Mutex<BufWriter<File>>>;

fn send(output: &Output, message: &ToParent) -> Result<(), RunError> {
    let mut out = output.lock().unwrap_or_else(|p| p.into_inner());
    write_frame(&mut *out, message).map_err(|e| RunError::internal(format!("cannot reach the runner: {e}")))
}

fn serve() {
    // SAFETY: descriptors 0 and 1 are the pipes from and to the runner, open for the life of
    // the process; nothing else in this process reads 0 or writes 1 (panics and the log go to 2).
    let (input, output) = unsafe { (File::from_raw_fd(0), File::from_raw_fd(1)) };
    let abort = super::input::take_abort_signal();
    let input = Arc::new(Mutex::new(Input::new(input, abort.clone())));
    let output: Output = Arc::new(Mutex::new(BufWriter::with_capacity(64 * 1024, output)));

    let mut engine = Engine::new();
    // From here on, guest code may run: nothing but computing and the pipes is left.
    if let Err(error) = super::confine::confine_worker() {
        let allowed = std::env::args().any(|a| a == super::confine::ALLOW_UNCONFINED_ARGUMENT);
        eprintln!("{error}{}", if allowed { "; running unconfined, as allowed" } else { "" });
        if !allowed {
            std::process::exit(super::confine::UNCONFINED_EXIT);
        }
    }
    loop {
        let frame = input.lock().unwrap_or_else(|p| p.into_inner()).frame();
        let spec = match frame {
            ToChild::Run(spec) => spec,
            // What the runner sent for a run that has ended.
            ToChild::Settled { .. } => continue,
        };
        // An abort signal that came after the last run's answer was for that run.
        abort.store(false, std::sync::atomic::Ordering::SeqCst);
        let JobSpec { mut run, events, spin } = *spec;
        input.lock().unwrap_or_else(|p| p.into_inner()).spin = spin;
        // The prior ledger follows, and is parsed while the script replays it.
        let state = Arc::new(Mutex::new(PipedState::new(input.clone())));
        let feed = LedgerFeed::from_source(Box::new(SharedState(state.clone())));
        run.replay.streamed = Some(Streamed { feed, count: 0 });
        let sent = Arc::new(Mutex::new(Vec::new()));
        let link = HostLink::Remote(Box::new(PipeHost { output: output.clone(), sent: sent.clone() }));
        let events = events.then(|| Box::new(PipeEvents { output: output.clone() }) as Box<dyn EventSink>);
        let mut job = Job {
            run,
            inbox: Box::new(PipeInbox { input: input.clone(), state: state.clone() }),
            abort: abort.clone(),
            link: Some(link),
            events,
            lookup: None,
        };
        let result = match engine.as_mut() {
            Ok(engine) => engine.execute(&mut job),
            Err(error) => Err(error.clone()),
        };
        state.lock().unwrap_or_else(|p| p.into_inner()).finish_reading();
        let sent = std::mem::take(&mut *sent.lock().unwrap_or_else(|p| p.into_inner()));
        if send(&output, &ToParent::Done(result.map(|raw| answer(raw, &sent)), job.lookup)).is_err() {
            return;
        }
        match engine.as_mut() {
            Ok(current) if !current.poisoned => current.reset(),
            _ => {
                // The old engine (and its reserved heap) goes before the new one is built.
                drop(std::mem::replace(&mut engine, Err(RunError::internal("the engine is being replaced"))));
                engine = Engine::new();
            }
        }
    }
}

/// The answer to send for `raw`: for an interrupted run, how each call in `sent` settled.
fn answer(raw: RawOutcome, sent: &[u32]) -> Answer {
    match raw {
        RawOutcome::Completed { value, console } => Answer::Completed { value, console },
        RawOutcome::Interrupted { ledger, console, .. } => {
            let settled = sent
                .iter()
                .filter_map(|&index| {
                    let entry = ledger.get(usize::try_from(index).ok()?.checked_sub(1)?)?;
                    Some(Settlement { index, settle_order: entry.settle_order })
                })
                .collect();
            Answer::Interrupted { settled, console }
        }
    }
}

/// Live events of a run in a worker process: frames to the runner, which
/// bounds what it keeps for the consumer.
struct PipeEvents {
    output: Output,
}

impl EventSink for PipeEvents {
    fn emit(&self, event: RunEvent) {
        // A lost pipe ends the run through its next host call or its answer.
        let _ = send(&self.output, &ToParent::Event(event));
    }
}

/// Host calls of a run in a worker process: frames to the runner.
struct PipeHost {
    output: Output,
    /// The calls sent, in order.
    sent: Arc<Mutex<Vec<u32>>>,
}

impl RemoteHost for PipeHost {
    fn call(&self, request: &CallRequest<'_>) -> Result<(), RunError> {
        let message = ToParent::Call {
            index: request.index,
            function: request.function.to_string(),
            arguments: request.arguments.to_string(),
            resumed: request.resume.is_some(),
        };
        self.sent.lock().unwrap_or_else(|p| p.into_inner()).push(request.index);
        send(&self.output, &message)
    }
}
