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
use super::protocol::{Answer, CallOutcomeFrame, JobSpec, Settlement, ToChild, ToParent};
use crate::bytecode_cache::CacheLookup;
use crate::continuation::Claim;
use crate::error::{ErrorCode, RunError};
use crate::event::{EVENT_VALUE_BYTES, RunEvent};
use crate::event_queue::EventQueue;
use crate::job::RawOutcome;
use crate::limits::{Limit, Limits};
use crate::link::{Begun, HostCall};
use crate::state::{CallOutcome, LedgerEntry, pending_interruptions};
use resumable_host::{CancelSignal, HostFunctions, HostResult, Resume};
use serde_json::Value;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use tokio::io::AsyncWriteExt;
use tokio::process::ChildStdin;
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
    let replay = &spec.replay;
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
}

impl Allowance {
    fn of(limits: &Limits) -> Allowance {
        Allowance {
            calls: limits.get(Limit::HostCalls),
            in_flight: limits.usize(Limit::HostCallsInFlight),
            argument_bytes: limits.usize(Limit::HostCallArguments),
        }
    }
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

/// Writes `message` unless `stop_at` passes, or `cancel` fires, first: a worker that stops
/// reading cannot hold the parent.
async fn write(
    stdin: &mut ChildStdin,
    message: &ToChild,
    stop_at: Instant,
    cancel: Option<&CancelSignal>,
) -> Result<(), Ending> {
    let frame = encode_frame(message).map_err(|e| lost(&format!("could not be sent a frame: {e}")))?;
    let written = async {
        stdin.write_all(&frame).await?;
        stdin.flush().await
    };
    let cancelled = async {
        match cancel {
            Some(cancel) => cancel.cancelled().await,
            None => std::future::pending().await,
        }
    };
    tokio::select! {
        result = tokio::time::timeout_at(stop_at, written) => match result {
            Ok(Ok(())) => Ok(()),
            Ok(Err(_)) => Err(lost("stopped reading")),
            Err(_) => Err(timed_out()),
        },
        _ = cancelled => Err(aborted()),
    }
}

/// The parent's half of one run.
pub(super) struct Session {
    host: HostFunctions,
    /// The stored token the run resumes from, consumed right before the first host function
    /// runs (or when the run ends without any).
    claim: Option<Arc<Claim>>,
    host_cancel: CancelSignal,
    run_id: Arc<str>,
    events: Option<Arc<EventQueue>>,
}

impl Session {
    pub(super) fn new(
        host: HostFunctions,
        claim: Option<Arc<Claim>>,
        host_cancel: CancelSignal,
        run_id: Arc<str>,
        events: Option<Arc<EventQueue>>,
    ) -> Session {
        Session { host, claim, host_cancel, run_id, events }
    }

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

    pub(super) async fn drive(
        &self,
        worker: &mut Worker,
        spec: JobSpec,
        deadline: Instant,
        cancel: &CancelSignal,
        grace: std::time::Duration,
    ) -> Ending {
        let mut decided = decided_calls(&spec);
        let allowance = Allowance::of(&spec.limits);
        let message = ToChild::Run(Box::new(spec));
        if let Err(ending) = write(&mut worker.stdin, &message, deadline, Some(cancel)).await {
            return ending;
        }
        let ToChild::Run(spec) = message else { unreachable!("the message was built as a run just above") };
        let prior = &spec.replay.ledger;
        let mut served: BTreeMap<u32, Served> = BTreeMap::new();
        let mut next_live = prior.len() as u64 + 1;
        let mut in_flight = InFlight::default();
        let mut event_budget = event_budget(&spec.limits);
        let mut consumed = false;
        let (results, mut settled) = mpsc::unbounded_channel::<(u32, HostResult)>();
        let mut tasks: Vec<tokio::task::JoinHandle<()>> = Vec::new();
        let mut abort_deadline: Option<Instant> = None;
        let ending = loop {
            let stop_at = abort_deadline.map_or(deadline, |a| a.min(deadline));
            // Once the worker was told to abort, a settle may still reach it within the grace.
            let watch = abort_deadline.is_none().then_some(cancel);
            tokio::select! {
                frame = worker.frames.recv() => match frame {
                    None => break lost("exited unexpectedly (crashed or was killed)"),
                    Some(Err(why)) => break violation(why),
                    Some(Ok(ToParent::Done(answer, lookup))) => {
                        if in_flight.all > 0 && answer.is_ok() {
                            break violation("it reported an answer while host calls were in flight");
                        }
                        if !decided.is_empty() && matches!(answer, Ok(Answer::Completed { .. })) {
                            break violation("it completed without resuming every decided call");
                        }
                        let raw = match answer.map(|a| outcome(a, prior, &served, &spec.limits)) {
                            Ok(Ok(raw)) => raw,
                            Ok(Err(why)) => break violation(why),
                            Err(error) => break Ending::Answered(Err(error), lookup),
                        };
                        // A resume that ends without any host call still uses its token up.
                        if let Err(error) = self.use_token(&mut consumed, stop_at).await {
                            break Ending::Answered(Err(error), lookup);
                        }
                        break Ending::Answered(Ok(raw), lookup);
                    }
                    Some(Ok(ToParent::Event(event))) => {
                        // The run's end is announced here, from the answer, never by the worker.
                        let live = !event.is_terminal() && !matches!(event, RunEvent::Lagged { .. });
                        if let (Some(events), true) = (&self.events, live) {
                            // What an honest worker's events can add up to; past it they are
                            // dropped, so a consumer that lags holds a bounded amount.
                            let size = serde_json::to_vec(&event).map_or(usize::MAX, |bytes| bytes.len());
                            if size <= event_budget {
                                event_budget -= size;
                                events.push(event);
                            }
                        }
                    }
                    Some(Ok(ToParent::Call { index, function, arguments, resumed })) => {
                        if u64::from(index) > allowance.calls {
                            break violation(format!("call {index} is over the limit of {} host calls", allowance.calls));
                        }
                        if arguments.len() > allowance.argument_bytes {
                            break violation(format!(
                                "the arguments of call {index} are over the limit of {} bytes",
                                allowance.argument_bytes
                            ));
                        }
                        // Resumed calls all start when the replay ends; they are bounded by the
                        // decisions, so only live calls count against the in-flight limit.
                        if !resumed && in_flight.live >= allowance.in_flight {
                            break violation(format!("more than {} host calls in flight", allowance.in_flight));
                        }
                        // The stored token is used up right before the first host function runs.
                        if let Err(error) = self.use_token(&mut consumed, stop_at).await {
                            break Ending::Lost(error);
                        }
                        let resume = if resumed {
                            match decided.remove(&index) {
                                Some(call) if call.function == function && call.arguments == arguments => {
                                    Some(call.resume)
                                }
                                Some(_) => {
                                    break violation(format!(
                                        "call {index} was resumed with another function or other arguments than \
                                         were recorded and decided"
                                    ));
                                }
                                None => break violation(format!("call {index} has no decision to resume with")),
                            }
                        } else if u64::from(index) == next_live {
                            next_live += 1;
                            None
                        } else {
                            break violation(format!("call {index} does not continue the ledger (next is {next_live})"));
                        };
                        let Ok(parsed) = serde_json::from_str::<Vec<Value>>(&arguments) else {
                            break violation(format!("the arguments of call {index} are not a JSON array"));
                        };
                        let call = HostCall {
                            run_id: &self.run_id,
                            function: function.as_str(),
                            index,
                            resume,
                            cancel: &self.host_cancel,
                        };
                        let begun = call.begin(&self.host, parsed);
                        served.insert(index, Served { function, arguments, outcome: None, live: !resumed });
                        in_flight.start(!resumed);
                        match begun {
                            Begun::Finished(result) => {
                                let settled = settle(worker, &mut served, &mut in_flight, index, result, stop_at, watch);
                                if let Err(ending) = settled.await {
                                    break ending;
                                }
                            }
                            Begun::Running(future) => {
                                let results = results.clone();
                                tasks.push(tokio::spawn(async move {
                                    let _ = results.send((index, future.await));
                                }));
                            }
                        }
                    }
                },
                Some((index, result)) = settled.recv() => {
                    if let Err(ending) = settle(worker, &mut served, &mut in_flight, index, result, stop_at, watch).await {
                        break ending;
                    }
                }
                _ = cancel.cancelled(), if abort_deadline.is_none() => {
                    let grace_ends = (Instant::now() + grace).min(stop_at);
                    let _ = write(&mut worker.stdin, &ToChild::Abort, grace_ends, None).await;
                    abort_deadline = Some(grace_ends);
                }
                _ = tokio::time::sleep_until(stop_at) => {
                    break if abort_deadline.is_some() { aborted() } else { timed_out() };
                }
            }
        };
        for task in tasks {
            task.abort();
        }
        ending
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

/// Records how call `index` ended and tells the worker.
async fn settle(
    worker: &mut Worker,
    served: &mut BTreeMap<u32, Served>,
    in_flight: &mut InFlight,
    index: u32,
    result: HostResult,
    stop_at: Instant,
    cancel: Option<&CancelSignal>,
) -> Result<(), Ending> {
    in_flight.end(served.get(&index).is_some_and(|call| call.live));
    let message = ToChild::Settled { index, outcome: CallOutcomeFrame::from(result) };
    write(&mut worker.stdin, &message, stop_at, cancel).await?;
    if let (ToChild::Settled { outcome, .. }, Some(call)) = (message, served.get_mut(&index)) {
        call.outcome = Some(outcome);
    }
    Ok(())
}

/// The run's outcome from the worker's `answer`: for an interruption, the ledger is the `prior`
/// one with the calls this side `served` (resumed ones in their places, new ones appended), and
/// only their settle order and clock come from the worker.
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
            clock: 0.0,
        };
        match (index as usize).checked_sub(1) {
            Some(i) if i < ledger.len() => ledger[i] = entry,
            Some(i) if i == ledger.len() => ledger.push(entry),
            _ => return Err(format!("call {index} does not continue the ledger")),
        }
    }
    let mut timed = std::collections::BTreeSet::new();
    for Settlement { index, settle_order, clock } in settled {
        if !served.contains_key(&index) || !timed.insert(index) {
            return Err(format!("it reported a settle time for call {index}, which it was not served once"));
        }
        let entry = &mut ledger[index as usize - 1];
        if settle_order.is_some() == matches!(entry.outcome, CallOutcome::Interrupted(_)) {
            return Err(format!("it reported call {index} as settled the wrong way"));
        }
        entry.settle_order = settle_order;
        entry.clock = clock;
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
    if ledger.iter().any(|e| !e.clock.is_finite() || e.clock < 0.0) {
        return Err("it reported a clock that is not a time".into());
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
    use crate::job::Replay;
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
        let spec = JobSpec {
            source: "return 1".into(),
            source_hash: [0; 32],
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
            events: false,
            cache: BytecodeCacheConfig::default(),
        };
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
