//! The parent's half of one run in a worker process, which it treats as hostile.
//!
//! A worker process runs QuickJS, native code a script may take over through a memory-safety
//! bug. So this side decides everything that matters: a resumed call gets its decision only if
//! it names the recorded function with byte-identical arguments; new calls must continue the
//! ledger exactly; the call-count, in-flight and argument-size limits are enforced here; and an
//! interrupted run's ledger and interruptions are built here, from the prior ledger and the calls
//! this side served, never taken from the worker. Every write to the worker happens under the
//! run's deadline, and any breach of the protocol kills the worker.

use super::frame::encode_frame;
use super::parent::Worker;
use super::pipes::PipeError;
use super::protocol::{Answer, CallOutcomeFrame, JobSpec, Settlement, ToChild, ToParent};
use super::spin::Cores;
use crate::bytecode_cache::CacheLookup;
use crate::continuation::{Claim, StateStream};
use crate::determinism::wall_clock_ms;
use crate::error::{ErrorCode, RunError};
use crate::event::{EVENT_VALUE_BYTES, RunEvent};
use crate::event_queue::EventQueue;
use crate::job::{RawOutcome, Replay};
use crate::limits::{Limit, Limits};
use crate::link::{Begun, HostCall};
use crate::sandbox::MAX_DEPTH;
use crate::state::{
    CallOutcome, ContinuationState, LedgerEntry, StateHead, check_head, json_depth_exceeds, output_too_large,
    pending_interruptions, unknown_interruption,
};
use resumable_host::{CancelSignal, HostFunctions, HostResult, Resume};
use serde_json::Value;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use tokio::sync::mpsc;
use tokio::time::Instant;

/// How a run in a worker ended, as far as the parent is concerned.
pub(super) enum Ending {
    /// The worker answered within the protocol and can serve again.
    Answered(Result<RawOutcome, RunError>, Option<CacheLookup>),
    /// The worker was killed, died or broke the protocol; it must not be reused.
    Lost(RunError),
}

/// An interrupted call of the prior ledger that this run resumes with a decision.
pub(super) struct DecidedCall {
    pub(super) function: String,
    /// The recorded arguments, as canonical JSON text.
    pub(super) arguments: String,
    pub(super) resume: Resume,
}

/// The resumes of the calls that `spec` resumes with a decision, by call index: built from the
/// ledger and the resolutions the parent holds.
pub(super) fn decided_calls(spec: &JobSpec) -> HashMap<u32, DecidedCall> {
    let replay = &spec.run.replay;
    let mut decided = HashMap::new();
    for (&index, resolution) in &replay.resolutions {
        let Some(entry) = index.checked_sub(1).and_then(|i| replay.ledger.get(i as usize)) else { continue };
        if let Some(resume) = entry.resume_with(index, resolution.clone()) {
            let call = DecidedCall { function: entry.function.clone(), arguments: entry.arguments.clone(), resume };
            decided.insert(index, call);
        }
    }
    decided
}

/// A call this side served: what was asked and, once it settled, what the worker was sent
/// (turned into a ledger outcome only if the run ends interrupted).
struct Served {
    function: String,
    arguments: String,
    outcome: Option<CallOutcomeFrame>,
    /// The logical time of its settle, as the worker was told.
    clock: f64,
    /// A new call rather than a resumed one.
    live: bool,
}

/// Host calls started and not settled yet: all of them, and the live (not resumed) ones.
#[derive(Default)]
struct InFlight {
    all: usize,
    live: usize,
}

impl InFlight {
    fn start(&mut self, live: bool) {
        self.all += 1;
        self.live += usize::from(live);
    }

    fn end(&mut self, live: bool) {
        self.all -= 1;
        self.live -= usize::from(live);
    }
}

/// What the run's limits allow a worker to ask.
struct Allowance {
    calls: u64,
    in_flight: usize,
    argument_bytes: usize,
    output_bytes: usize,
}

impl Allowance {
    fn of(limits: &Limits) -> Allowance {
        Allowance {
            calls: limits.get(Limit::HostCalls),
            in_flight: limits.usize(Limit::HostCallsInFlight),
            argument_bytes: limits.usize(Limit::HostCallArguments),
            output_bytes: limits.usize(Limit::HostCallOutput),
        }
    }
}

/// The largest frame a run with `limits` may send: a call's arguments (a JSON text inside a JSON
/// string: at most twice as long escaped), the result, the console (control characters escape to
/// six bytes, and each line, counted as one byte more than its text, is wrapped in about 32 bytes
/// of JSON), 80 bytes per host call, and 64 KiB for the JSON around them.
fn frame_limit(limits: &Limits) -> usize {
    let part = |limit: Limit, factor: usize| limits.usize(limit).saturating_mul(factor);
    part(Limit::HostCallArguments, 2)
        .saturating_add(part(Limit::Result, 1))
        .saturating_add(part(Limit::Console, 6 + 32))
        .saturating_add(part(Limit::HostCalls, 80))
        .saturating_add(64 * 1024)
}

/// What the live events of an honest run can add up to, in bytes: its console (escaped, each line
/// in an event of about 48 bytes), and two events per host call, each holding at most
/// [`EVENT_VALUE_BYTES`] of value or message (escaped: up to six times as long).
fn event_budget(limits: &Limits) -> usize {
    let per_call = 2 * (6 * EVENT_VALUE_BYTES + 512);
    limits
        .usize(Limit::Console)
        .saturating_mul(6 + 48)
        .saturating_add(limits.usize(Limit::HostCalls).saturating_mul(per_call))
        .saturating_add(64 * 1024)
}

/// A breach of the protocol by the worker: the run fails and the worker is killed.
fn violation(what: impl std::fmt::Display) -> Ending {
    Ending::Lost(RunError::protocol(format!("the worker process broke the protocol: {what}")))
}

fn lost(message: &str) -> Ending {
    Ending::Lost(RunError::internal(format!("the worker process {message}")).retryable(true))
}

fn timed_out() -> Ending {
    Ending::Lost(
        RunError::new(ErrorCode::Timeout, "the script ran past its time limit and its worker process was killed")
            .retryable(false),
    )
}

fn aborted() -> Ending {
    Ending::Lost(RunError::new(ErrorCode::Aborted, "the run was cancelled by its caller"))
}

/// Writes `message` unless `stop_at` passes, or `cancel` fires, first.
async fn write(
    worker: &mut Worker,
    message: &ToChild,
    read_cap: usize,
    stop_at: Instant,
    cancel: Option<&CancelSignal>,
) -> Result<(), Ending> {
    let frame = encode_frame(message).map_err(|e| lost(&format!("could not be sent a frame: {e}")))?;
    write_bytes(worker, &[&frame], Writing { spin: false, read_cap }, stop_at, cancel).await
}

/// How to write to a worker: whether to poll for room in the pipe before waiting, and how much
/// of what the worker sends meanwhile may be read ahead (see [`Pipes::write_all`]).
///
/// [`Pipes::write_all`]: super::pipes::Pipes::write_all
#[derive(Clone, Copy)]
struct Writing {
    spin: bool,
    read_cap: usize,
}

impl Writing {
    /// For a run with `limits`: what an honest worker may send while this side writes is at
    /// most one frame and the run's events.
    fn of(limits: &Limits, spin: bool) -> Writing {
        Writing { spin, read_cap: frame_limit(limits).saturating_add(event_budget(limits)) }
    }
}

/// Writes `parts`, one after the other, unless `stop_at` passes, or `cancel` fires, first: a
/// worker that stops reading cannot hold the parent. What fits the pipe is written at once, with
/// no timer.
async fn write_bytes(
    worker: &mut Worker,
    parts: &[&[u8]],
    how: Writing,
    stop_at: Instant,
    cancel: Option<&CancelSignal>,
) -> Result<(), Ending> {
    let written = worker.pipes.write_all(parts, how.spin, how.read_cap);
    let cancelled = async {
        match cancel {
            Some(cancel) => cancel.cancelled().await,
            None => std::future::pending().await,
        }
    };
    tokio::select! {
        biased;
        result = tokio::time::timeout_at(stop_at, written) => match result {
            Ok(Ok(())) => Ok(()),
            Ok(Err(why)) => Err(violation(why)),
            Err(_) => Err(timed_out()),
        },
        _ = cancelled => Err(aborted()),
    }
}

/// What the parent's half of a run waits for.
enum Event {
    Frame(Result<Option<ToParent>, PipeError>),
    /// A host call that waited has finished.
    Settled(u32, HostResult),
    Cancelled,
    Deadline,
}

/// The parent's half of one run.
pub(super) struct Session {
    pub(super) host: HostFunctions,
    /// The stored token the run resumes from, consumed right before the first host function
    /// runs (or when the run ends without any).
    pub(super) claim: Option<Arc<Claim>>,
    pub(super) host_cancel: CancelSignal,
    pub(super) events: Option<Arc<EventQueue>>,
    /// Time a worker gets past the deadline, or after an abort, before it is killed.
    pub(super) grace: std::time::Duration,
}

impl Session {
    /// Uses the stored token up, once, if the run resumes from one.
    async fn use_token(&self, consumed: &mut bool, stop_at: Instant) -> Result<(), RunError> {
        if !*consumed {
            if let Some(claim) = &self.claim {
                consume(claim, stop_at).await?;
            }
            *consumed = true;
        }
        Ok(())
    }

    /// Sends `spec` to `worker` and serves the run until it ends; `rest` is the state of a
    /// streamed continuation, decoded here while the worker replays it. Also answers that
    /// state's head.
    pub(super) async fn drive(
        &self,
        worker: &mut Worker,
        spec: JobSpec,
        rest: Option<StateStream>,
        deadline: Instant,
        cancel: &CancelSignal,
        cores: &Cores,
    ) -> (Ending, Option<StateHead>) {
        let (spec, head) = match send_run(worker, spec, rest, deadline, cancel).await {
            Ok(sent) => sent,
            Err(ending) => return (ending, None),
        };
        (self.serve(worker, &spec, deadline, cancel, cores).await, head)
    }

    /// Serves the run of `spec`, sent to `worker`, until it ends.
    async fn serve(
        &self,
        worker: &mut Worker,
        spec: &JobSpec,
        deadline: Instant,
        cancel: &CancelSignal,
        cores: &Cores,
    ) -> Ending {
        let grace = self.grace;
        let decided = decided_calls(spec);
        let run_id = spec.run.replay.logical_run_id.clone();
        let mut run = Progress::new(&spec.run.limits, &spec.run.replay, decided);
        let frame_limit = frame_limit(&spec.run.limits);
        let (results, mut settled) = mpsc::unbounded_channel::<(u32, HostResult)>();
        let mut tasks: Vec<tokio::task::JoinHandle<()>> = Vec::new();
        let mut waiting = 0usize;
        let mut abort_deadline: Option<Instant> = None;
        let writing = Writing::of(&spec.run.limits, false);
        let ending = loop {
            let stop_at = abort_deadline.map_or(deadline, |a| a.min(deadline));
            // Checked at every frame, so a worker that keeps the pipe full cannot keep the run
            // past its time: its frames would always be ready first.
            if Instant::now() >= stop_at {
                break if abort_deadline.is_some() { aborted() } else { timed_out() };
            }
            // Once the worker was told to abort, a settle may still reach it within the grace.
            let watch = abort_deadline.is_none().then_some(cancel);
            // Polling is for answers that come at once, not while a host call waits on the runtime.
            let spin_now = waiting == 0 && cores.spare();
            let event = tokio::select! {
                biased;
                _ = cancel.cancelled(), if abort_deadline.is_none() => Event::Cancelled,
                frame = worker.pipes.frame(frame_limit, spin_now) => Event::Frame(frame),
                Some((index, result)) = settled.recv() => Event::Settled(index, result),
                _ = tokio::time::sleep_until(stop_at) => Event::Deadline,
            };
            // Frames that are always ready would otherwise keep this task on its thread.
            tokio::task::consume_budget().await;
            let call = match event {
                Event::Frame(Ok(Some(ToParent::Call { index, function, arguments, resumed }))) => {
                    (index, function, arguments, resumed)
                }
                Event::Frame(Ok(Some(ToParent::Done(answer, lookup)))) => {
                    break self.finish(&mut run, answer, lookup, stop_at).await;
                }
                Event::Frame(Ok(Some(ToParent::Event(event)))) => {
                    self.forward(&mut run, event);
                    continue;
                }
                // A worker told to abort may end at once.
                Event::Frame(Ok(None)) if abort_deadline.is_some() => break aborted(),
                Event::Frame(Ok(None)) => break lost("exited unexpectedly (crashed or was killed)"),
                Event::Frame(Err(why)) => break violation(why),
                Event::Settled(index, result) => {
                    waiting -= 1;
                    if let Err(ending) = settle(worker, &mut run, index, result, writing, stop_at, watch).await {
                        break ending;
                    }
                    continue;
                }
                Event::Cancelled => {
                    worker.abort();
                    abort_deadline = Some((Instant::now() + grace).min(stop_at));
                    continue;
                }
                Event::Deadline => break if abort_deadline.is_some() { aborted() } else { timed_out() },
            };
            let (index, function, arguments, resumed) = call;
            // Once the caller gave up, no host function starts: only settles reach the worker.
            if abort_deadline.is_some() || cancel.is_cancelled() {
                break aborted();
            }
            let (resume, parsed) = match run.admit(index, &function, &arguments, resumed) {
                Ok(admitted) => admitted,
                Err(ending) => break ending,
            };
            // The stored token is used up right before the first host function runs.
            if let Err(error) = self.use_token(&mut run.consumed, stop_at).await {
                break Ending::Lost(error);
            }
            let call =
                HostCall { run_id: &run_id, function: function.as_str(), index, resume, cancel: &self.host_cancel };
            let begun = call.begin(&self.host, parsed);
            run.in_flight.start(!resumed);
            run.served.insert(index, Served { function, arguments, outcome: None, clock: 0.0, live: !resumed });
            match begun {
                Begun::Finished(result) => {
                    if let Err(ending) = settle(worker, &mut run, index, result, writing, stop_at, watch).await {
                        break ending;
                    }
                }
                Begun::Running(future) => {
                    let results = results.clone();
                    waiting += 1;
                    // In the caller's span, so that what the host function logs is in it too.
                    tasks.push(tokio::spawn(tracing::Instrument::in_current_span(async move {
                        let _ = results.send((index, future.await));
                    })));
                }
            }
        };
        for task in tasks {
            task.abort();
        }
        ending
    }

    /// The run's ending, from the worker's answer.
    async fn finish(
        &self,
        run: &mut Progress<'_>,
        answer: Result<Answer, RunError>,
        lookup: Option<CacheLookup>,
        stop_at: Instant,
    ) -> Ending {
        if run.in_flight.all > 0 && answer.is_ok() {
            return violation("it reported an answer while host calls were in flight");
        }
        if !run.decided.is_empty() && matches!(answer, Ok(Answer::Completed { .. })) {
            return violation("it completed without resuming every decided call");
        }
        let raw = match answer.map(|a| outcome(a, run.prior, &run.served, run.limits)) {
            Ok(Ok(raw)) => raw,
            Ok(Err(why)) => return violation(why),
            Err(error) => return Ending::Answered(Err(error), lookup),
        };
        // A resume that ends without any host call still uses its token up.
        if let Err(error) = self.use_token(&mut run.consumed, stop_at).await {
            return Ending::Answered(Err(error), lookup);
        }
        Ending::Answered(Ok(raw), lookup)
    }

    /// Passes a live event on to the run's consumer, within what an honest worker can send.
    fn forward(&self, run: &mut Progress<'_>, event: RunEvent) {
        // The run's end is announced here, from the answer, never by the worker.
        let live = !event.is_terminal() && !matches!(event, RunEvent::Lagged { .. });
        if let (Some(events), true) = (&self.events, live) {
            // Past the budget events are dropped, so a consumer that lags holds a bounded amount.
            let size = serde_json::to_vec(&event).map_or(usize::MAX, |bytes| bytes.len());
            if size <= run.event_budget {
                run.event_budget -= size;
                events.push(event);
            }
        }
    }
}

/// Sends the run's frame and its prior ledger, which follows it in the state encoding (of a long
/// ledger, JSON would cost more to write and read than the rest of the resume). A streamed
/// continuation's state goes to the worker as it is decoded here, and its head, ledger and
/// decisions are checked here once all of it is decoded: the worker may replay what is not
/// authenticated yet, but nothing it asks is served before. Answers the spec with the whole
/// prior ledger, and the streamed state's head.
async fn send_run(
    worker: &mut Worker,
    mut spec: JobSpec,
    rest: Option<StateStream>,
    deadline: Instant,
    cancel: &CancelSignal,
) -> Result<(JobSpec, Option<StateHead>), Ending> {
    let feed = spec.run.replay.streamed.take();
    let ledger = std::mem::take(&mut spec.run.replay.ledger);
    let message = ToChild::Run(Box::new(spec));
    let frame = encode_frame(&message).map_err(|e| lost(&format!("could not be sent its run: {e}")));
    let ToChild::Run(spec) = message else { unreachable!("the message was built as a run just above") };
    let mut spec = *spec;
    let frame = frame?;
    let (Some(rest), Some(mut feed)) = (rest, feed) else {
        let replay = &spec.run.replay;
        // The prior ledger passed the runner's checks: the functions it calls are the run's.
        let functions = spec.run.scope.used_by(&ledger).map_err(Ending::Lost)?;
        let state = ContinuationState {
            source_hash: spec.run.source_hash,
            scope_hash: spec.run.scope.hash(&functions),
            logical_run_id: replay.logical_run_id.to_string(),
            seed: replay.seed,
            start_clock: replay.start_clock,
            functions: Some(functions),
            ledger,
        };
        let bytes = state.encode();
        spec.run.replay.ledger = state.ledger;
        let length = u32::try_from(bytes.len()).map_err(|_| lost("could not be sent a ledger this long"))?;
        let writing = Writing::of(&spec.run.limits, spec.spin);
        write_bytes(worker, &[&frame, &length.to_le_bytes(), &bytes], writing, deadline, Some(cancel)).await?;
        return Ok((spec, None));
    };
    let writing = Writing::of(&spec.run.limits, spec.spin);
    if let Err(ending) = write_bytes(worker, &[&frame], writing, deadline, Some(cancel)).await {
        // A forged state is refused as such.
        return Err(match rest.authenticate() {
            Err(error) => Ending::Lost(error),
            Ok(()) => ending,
        });
    }
    // What the pipe has no room for now is written once the state is decoded.
    let mut backlog: Vec<u8> = Vec::new();
    let mut too_long = false;
    let mut push = |bytes: &[u8]| {
        if backlog.is_empty() {
            let written = worker.pipes.try_write(bytes).unwrap_or(0);
            backlog.extend_from_slice(&bytes[written..]);
        } else {
            backlog.extend_from_slice(bytes);
        }
    };
    let mut announced = false;
    let (_, authentic) = rest.finish_forwarding(|total, more| {
        if !announced {
            announced = true;
            match u32::try_from(total) {
                Ok(total) => push(&total.to_le_bytes()),
                Err(_) => too_long = true,
            }
        }
        if !too_long {
            push(more);
        }
    });
    // Every entry is in the feed now, and the verdict on the state.
    let checked = || -> Result<(StateHead, Vec<LedgerEntry>), RunError> {
        authentic?;
        let head = feed.feed.head(deadline.into_std())?;
        let mut ledger = Vec::with_capacity(head.count);
        while let Some(entries) = feed.feed.next(deadline.into_std())? {
            ledger.extend(entries);
        }
        check_head(&head, &spec.run.source_hash, &spec.run.scope, &spec.run.limits)?;
        let resolutions = &spec.run.replay.resolutions;
        let interrupted = |index: u32| {
            ledger.get(index as usize - 1).is_some_and(|entry| matches!(entry.outcome, CallOutcome::Interrupted(_)))
        };
        if let Some(index) = resolutions.keys().copied().filter(|&index| !interrupted(index)).min() {
            return Err(unknown_interruption(&format!("interrupt-{index}")));
        }
        Ok((head, ledger))
    };
    let (head, ledger) = match checked() {
        Ok(checked) if !too_long => checked,
        Ok(_) => return Err(lost("could not be sent a ledger this long")),
        // The worker may be replaying a state that is not authentic: it is not used again.
        Err(error) => return Err(Ending::Lost(error)),
    };
    if !backlog.is_empty() {
        write_bytes(worker, &[&backlog], writing, deadline, Some(cancel)).await?;
    }
    let replay = &mut spec.run.replay;
    replay.ledger = ledger;
    replay.logical_run_id = Arc::from(head.logical_run_id.as_str());
    replay.seed = head.seed;
    replay.start_clock = head.start_clock;
    Ok((spec, Some(head)))
}

/// What the parent knows of a run in progress.
struct Progress<'a> {
    limits: &'a Limits,
    /// The ledger the run resumes from (empty for a first run).
    prior: &'a [LedgerEntry],
    /// The decided calls not resumed yet.
    decided: HashMap<u32, DecidedCall>,
    allowance: Allowance,
    served: BTreeMap<u32, Served>,
    /// The index the next new call must have.
    next_live: u64,
    in_flight: InFlight,
    /// What the worker's live events may still add up to.
    event_budget: usize,
    /// Whether the stored token (if any) is used up.
    consumed: bool,
    /// The run's logical clock: the time of its latest settle.
    clock: f64,
}

impl<'a> Progress<'a> {
    /// A run with `limits` that resumes from `replay` with the `decided` calls.
    fn new(limits: &'a Limits, replay: &'a Replay, decided: HashMap<u32, DecidedCall>) -> Progress<'a> {
        let clock = replay.ledger.iter().map(|entry| entry.clock).fold(replay.start_clock, f64::max);
        Progress {
            limits,
            prior: &replay.ledger,
            decided,
            allowance: Allowance::of(limits),
            served: BTreeMap::new(),
            next_live: replay.ledger.len() as u64 + 1,
            in_flight: InFlight::default(),
            event_budget: event_budget(limits),
            consumed: false,
            clock,
        }
    }

    /// Checks a call the worker asks for against the limits and the ledger: its resume (a
    /// decision, for a resumed call) and its arguments.
    fn admit(
        &mut self,
        index: u32,
        function: &str,
        arguments: &str,
        resumed: bool,
    ) -> Result<(Option<Resume>, Vec<Value>), Ending> {
        let allowance = &self.allowance;
        if u64::from(index) > allowance.calls {
            return Err(violation(format!("call {index} is over the limit of {} host calls", allowance.calls)));
        }
        if arguments.len() > allowance.argument_bytes {
            return Err(violation(format!(
                "the arguments of call {index} are over the limit of {} bytes",
                allowance.argument_bytes
            )));
        }
        // Resumed calls all start when the replay ends; they are bounded by the decisions, so
        // only live calls count against the in-flight limit.
        if !resumed && self.in_flight.live >= allowance.in_flight {
            return Err(violation(format!("more than {} host calls in flight", allowance.in_flight)));
        }
        let resume = if resumed {
            match self.decided.remove(&index) {
                Some(call) if call.function == function && call.arguments == arguments => Some(call.resume),
                Some(_) => {
                    return Err(violation(format!(
                        "call {index} was resumed with another function or other arguments than were recorded \
                         and decided"
                    )));
                }
                None => return Err(violation(format!("call {index} has no decision to resume with"))),
            }
        } else if u64::from(index) == self.next_live {
            self.next_live += 1;
            None
        } else {
            return Err(violation(format!("call {index} does not continue the ledger (next is {})", self.next_live)));
        };
        let Ok(parsed) = serde_json::from_str::<Vec<Value>>(arguments) else {
            return Err(violation(format!("the arguments of call {index} are not a JSON array")));
        };
        if parsed.iter().any(|value| json_depth_exceeds(value, MAX_DEPTH)) {
            return Err(violation(format!("the arguments of call {index} nest deeper than {MAX_DEPTH} levels")));
        }
        Ok((resume, parsed))
    }
}

/// Uses the stored token up, unless `stop_at` passes first (a store that hangs cannot hold the
/// run past its deadline; the token is then left to its claim's expiry).
async fn consume(claim: &Claim, stop_at: Instant) -> Result<(), RunError> {
    match tokio::time::timeout_at(stop_at, claim.consume_async()).await {
        Ok(result) => result,
        Err(_) => Err(RunError::new(ErrorCode::Timeout, "the continuation store did not answer within the run's time")
            .retryable(true)),
    }
}

/// Records how call `index` ended, at what logical time, and tells the worker.
async fn settle(
    worker: &mut Worker,
    run: &mut Progress<'_>,
    index: u32,
    result: HostResult,
    writing: Writing,
    stop_at: Instant,
    cancel: Option<&CancelSignal>,
) -> Result<(), Ending> {
    let Some(call) = run.served.get(&index) else { return Err(violation(format!("call {index} was not served"))) };
    run.in_flight.end(call.live);
    // What the worker would refuse; checked here all the same, for the ledger this side builds.
    if CallOutcome::recorded(&result).size() > run.allowance.output_bytes {
        return Err(Ending::Lost(output_too_large(&call.function, run.allowance.output_bytes)));
    }
    run.clock = wall_clock_ms().max(run.clock);
    let message = ToChild::Settled { index, outcome: CallOutcomeFrame::from(result), clock: run.clock };
    write(worker, &message, writing.read_cap, stop_at, cancel).await?;
    if let (ToChild::Settled { outcome, clock, .. }, Some(call)) = (message, run.served.get_mut(&index)) {
        call.outcome = Some(outcome);
        call.clock = clock;
    }
    Ok(())
}

/// The run's outcome from the worker's `answer`: for an interruption, the ledger is the `prior`
/// one with the calls this side `served` (resumed ones in their places, new ones appended), and
/// only their settle order comes from the worker.
fn outcome(
    answer: Answer,
    prior: &[LedgerEntry],
    served: &BTreeMap<u32, Served>,
    limits: &Limits,
) -> Result<RawOutcome, String> {
    let (settled, console) = match answer {
        Answer::Completed { value, console } => {
            let size = serde_json::to_string(&value).map_or(usize::MAX, |text| text.len());
            if size > limits.usize(Limit::Result) {
                return Err(format!("it answered a result of {size} bytes, over the limit"));
            }
            return Ok(RawOutcome::Completed { value, console });
        }
        Answer::Interrupted { settled, console } => (settled, console),
    };
    let mut ledger = prior.to_vec();
    for (&index, call) in served {
        let sent = call.outcome.as_ref().ok_or_else(|| format!("call {index} never settled"))?;
        // What the worker recorded from the same frame.
        let outcome = CallOutcome::recorded(&HostResult::from(sent.clone()));
        let entry = LedgerEntry {
            function: call.function.clone(),
            arguments: call.arguments.clone(),
            outcome,
            settle_order: None,
            clock: call.clock,
        };
        match (index as usize).checked_sub(1) {
            Some(i) if i < ledger.len() => ledger[i] = entry,
            Some(i) if i == ledger.len() => ledger.push(entry),
            _ => return Err(format!("call {index} does not continue the ledger")),
        }
    }
    let mut timed = std::collections::BTreeSet::new();
    for Settlement { index, settle_order } in settled {
        if !served.contains_key(&index) || !timed.insert(index) {
            return Err(format!("it reported a settle time for call {index}, which it was not served once"));
        }
        let entry = &mut ledger[index as usize - 1];
        if settle_order.is_some() == matches!(entry.outcome, CallOutcome::Interrupted(_)) {
            return Err(format!("it reported call {index} as settled the wrong way"));
        }
        entry.settle_order = settle_order;
    }
    if timed.len() != served.len() {
        return Err("it did not report when every call it was served settled".into());
    }
    // What the state decoder will check of the next resume: settles numbered 0, 1, 2, … and
    // finite clocks.
    let mut orders: Vec<u32> = ledger.iter().filter_map(|e| e.settle_order).collect();
    orders.sort_unstable();
    if orders.iter().enumerate().any(|(i, &order)| order as usize != i) {
        return Err("it reported settle orders that do not number the settles".into());
    }
    let interruptions = pending_interruptions(&ledger)?;
    if interruptions.is_empty() {
        return Err("it reported an interruption, but no call is interrupted".into());
    }
    Ok(RawOutcome::Interrupted { ledger, interruptions, console })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bytecode_cache::BytecodeCacheConfig;
    use crate::job::PreparedRun;
    use crate::limits::Limits;
    use crate::state::{CallOutcome, LedgerEntry};
    use serde_json::json;

    fn entry(function: &str, outcome: CallOutcome) -> LedgerEntry {
        LedgerEntry { function: function.into(), arguments: "[]".into(), outcome, settle_order: None, clock: 0.0 }
    }

    #[test]
    fn decisions_come_from_the_ledger_and_resolutions_the_parent_holds() {
        let ledger = vec![
            entry("tools.effect", CallOutcome::Fulfilled("1".into())),
            entry("tools.approve", CallOutcome::Interrupted(r#"{"amount":5}"#.into())),
        ];
        let resolutions = HashMap::from([(1, json!(true)), (2, json!("yes")), (9, json!(true))]);
        let run = PreparedRun {
            source: "return 1".into(),
            source_hash: [0; 32],
            scope: crate::scope::Scope::new("a", &HostFunctions::empty(), &Value::Null, &[0; 32]),
            functions: Arc::from(Vec::<String>::new()),
            limits: Limits::default(),
            replay: Replay {
                logical_run_id: "run".into(),
                seed: 0,
                start_clock: 0.0,
                ledger,
                streamed: None,
                resolutions,
            },
            can_interrupt: true,
            cache: BytecodeCacheConfig::default(),
        };
        let spec = JobSpec { run, events: false, spin: false };
        let decided = decided_calls(&spec);
        assert_eq!(decided.len(), 1, "only an interrupted entry of the ledger takes a decision");
        let decided = &decided[&2];
        assert_eq!(decided.function, "tools.approve");
        assert_eq!(decided.arguments, "[]");
        let resume = &decided.resume;
        assert_eq!(resume.interruption_id, "interrupt-2");
        assert_eq!(resume.payload, json!({ "amount": 5 }));
        assert_eq!(resume.resolution, json!("yes"));
    }
}
