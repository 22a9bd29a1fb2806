//! The worker-process side: read jobs from stdin, run them, answer on stdout.

use super::frame::{read_frame, write_frame};
use super::protocol::{Answer, JobSpec, Settlement, ToChild, ToParent};
use crate::error::RunError;
use crate::event::{EventSink, RunEvent};
use crate::job::{Job, RawOutcome, WorkerMessage};
use crate::limits::MAX_STACK_BYTES;
use crate::link::{CallRequest, HostLink, RemoteHost};
use crate::sandbox::Engine;
use std::io::{BufReader, BufWriter, Stdout, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, mpsc};

/// The argument that makes the `resumable` CLI (or any program following the
/// same convention) act as a worker process.
pub const WORKER_ARGUMENT: &str = "__worker";

/// Serves runs on stdin/stdout until stdin closes, then exits the process at once, even in the
/// middle of a run. Call it from `main` of a worker program; it never returns.
pub fn serve_worker() -> ! {
    let served = std::thread::Builder::new()
        .name("resumable-worker".into())
        .stack_size(4 * MAX_STACK_BYTES + 1024 * 1024)
        .spawn(serve)
        .map(|thread| thread.join().is_ok());
    std::process::exit(if matches!(served, Ok(true)) { 0 } else { 70 })
}

type Output = Arc<Mutex<BufWriter<Stdout>>>;

/// Where frames for the run in progress go.
#[derive(Default)]
struct Current {
    inbox: Option<mpsc::Sender<WorkerMessage>>,
    abort: Option<Arc<AtomicBool>>,
}

fn send(output: &Output, message: &ToParent) -> Result<(), RunError> {
    let mut out = output.lock().unwrap_or_else(|p| p.into_inner());
    write_frame(&mut *out, message).map_err(|e| RunError::internal(format!("cannot reach the runner: {e}")))
}

fn serve() {
    let output: Output = Arc::new(Mutex::new(BufWriter::new(std::io::stdout())));
    let current = Arc::new(Mutex::new(Current::default()));
    let (jobs, incoming) = mpsc::channel::<Box<JobSpec>>();
    let reader_current = current.clone();
    let (started, reader_started) = mpsc::sync_channel::<()>(1);
    std::thread::spawn(move || {
        // Every system call of a thread's start has been made by now: the worker may be
        // confined (a thread still starting would be killed by the seccomp filter).
        let _ = started.send(());
        let mut input = BufReader::new(std::io::stdin());
        while let Ok(Some(message)) = read_frame::<_, ToChild>(&mut input) {
            let current = reader_current.lock().unwrap_or_else(|p| p.into_inner());
            let deliver = |message| {
                if let Some(inbox) = &current.inbox {
                    let _ = inbox.send(message);
                }
            };
            match message {
                ToChild::Run(spec) => {
                    if jobs.send(spec).is_err() {
                        return;
                    }
                }
                ToChild::Settled { index, outcome } => deliver(WorkerMessage::Settled(index, outcome.into())),
                ToChild::Abort => {
                    if let Some(abort) = &current.abort {
                        abort.store(true, Ordering::SeqCst);
                    }
                    deliver(WorkerMessage::Abort);
                }
            }
        }
        // The runner closed the pipe or died: nobody can use what this process computes, so it
        // ends now, even in the middle of a run (a worker never outlives its runner).
        // SAFETY: _exit ends the process at once, without running atexit handlers or destructors
        // while another thread may be inside QuickJS; it touches no memory of this process.
        unsafe { libc::_exit(0) };
    });

    let mut engine = Engine::new();
    let _ = reader_started.recv();
    // From here on, guest code may run: nothing but computing and the pipes is left.
    if let Err(error) = super::confine::confine_worker() {
        let allowed = std::env::args().any(|a| a == super::confine::ALLOW_UNCONFINED_ARGUMENT);
        eprintln!("{error}{}", if allowed { "; running unconfined, as allowed" } else { "" });
        if !allowed {
            std::process::exit(super::confine::UNCONFINED_EXIT);
        }
    }
    while let Ok(spec) = incoming.recv() {
        let (inbox_sender, inbox) = mpsc::channel();
        let abort = Arc::new(AtomicBool::new(false));
        *current.lock().unwrap_or_else(|p| p.into_inner()) =
            Current { inbox: Some(inbox_sender), abort: Some(abort.clone()) };
        let sent = Arc::new(Mutex::new(Vec::new()));
        let link = HostLink::Remote(Box::new(PipeHost { output: output.clone(), sent: sent.clone() }));
        let events = spec.events.then(|| Box::new(PipeEvents { output: output.clone() }) as Box<dyn EventSink>);
        let mut job = Job {
            source: spec.source,
            source_hash: spec.source_hash,
            functions: spec.functions,
            limits: spec.limits,
            replay: spec.replay,
            inbox,
            abort,
            can_interrupt: spec.can_interrupt,
            link: Some(link),
            events,
            cache: spec.cache,
            lookup: None,
        };
        let result = match engine.as_mut() {
            Ok(engine) => engine.execute(&mut job),
            Err(error) => Err(error.clone()),
        };
        *current.lock().unwrap_or_else(|p| p.into_inner()) = Current::default();
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
    let _ = output.lock().map(|mut out| out.flush());
}

/// The answer to send for `raw`: for an interrupted run, when each call in `sent` settled.
fn answer(raw: RawOutcome, sent: &[u32]) -> Answer {
    match raw {
        RawOutcome::Completed { value, console } => Answer::Completed { value, console },
        RawOutcome::Interrupted { ledger, console, .. } => {
            let settled = sent
                .iter()
                .filter_map(|&index| {
                    let entry = ledger.get(usize::try_from(index).ok()?.checked_sub(1)?)?;
                    Some(Settlement { index, settle_order: entry.settle_order, clock: entry.clock })
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
