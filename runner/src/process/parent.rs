//! The runner side: a pool of worker processes, killed at deadlines.

use super::ProcessConfig;
use super::frame::encode_frame;
use super::protocol::{CallOutcomeFrame, JobSpec, ToChild, ToParent};
use super::spawner::{self, Spawned};
use crate::bytecode_cache::StatsCounters;
use crate::continuation::Claim;
use crate::error::{ErrorCode, RunError};
use crate::event::RunEvent;
use crate::event_queue::EventQueue;
use crate::job::RawOutcome;
use crate::link::CatchUnwind;
use resumable_host::{CancelSignal, HostCallContext, HostFunctions, HostResult, Resume};
use serde_json::Value;
use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::process::{Child, ChildStdin, Command};
use tokio::sync::{Semaphore, mpsc};
use tokio::time::Instant;

/// Worker processes shared by the runs of one runner.
pub(crate) struct ProcessPool {
    config: ProcessConfig,
    idle: Mutex<Vec<Worker>>,
    slots: Semaphore,
    waiting: AtomicUsize,
    capacity: usize,
    stats: Arc<StatsCounters>,
}

/// One child process and the frames it sends.
struct Worker {
    child: Child,
    stdin: ChildStdin,
    frames: mpsc::UnboundedReceiver<ToParent>,
}

/// How a run in a child ended, as far as the child is concerned.
enum Ending {
    /// The child answered and can serve again.
    Answered(Result<RawOutcome, RunError>),
    /// The child was killed or died; it must not be reused.
    Lost(RunError),
}

impl ProcessPool {
    pub(crate) fn new(config: ProcessConfig, workers: usize, queue_capacity: usize, stats: Arc<StatsCounters>) -> Self {
        ProcessPool {
            config,
            idle: Mutex::new(Vec::new()),
            slots: Semaphore::new(workers),
            waiting: AtomicUsize::new(0),
            capacity: workers + queue_capacity,
            stats,
        }
    }

    /// Runs `spec` in a worker process; host calls run here, on the caller's runtime.
    pub(crate) async fn run(
        &self,
        spec: JobSpec,
        host: HostFunctions,
        claim: Option<Arc<Claim>>,
        cancel: CancelSignal,
        events: Option<Arc<EventQueue>>,
    ) -> Result<RawOutcome, RunError> {
        if self.waiting.fetch_add(1, Ordering::SeqCst) >= self.capacity {
            self.waiting.fetch_sub(1, Ordering::SeqCst);
            return Err(RunError::new(
                ErrorCode::ConcurrencyLimit,
                "every worker process is busy and the run queue is full; retry later",
            ));
        }
        let _waiting = Decrement(&self.waiting);
        let _slot = self.slots.acquire().await.map_err(|_| RunError::internal("the process pool has stopped"))?;
        let idle = self.idle.lock().unwrap_or_else(|p| p.into_inner()).pop();
        let mut worker = match idle {
            Some(worker) => worker,
            None => self.spawn()?,
        };
        let deadline = Instant::now() + spec.limits.timeout() + self.config.grace;
        let host_cancel = CancelSignal::new();
        let session = Session {
            host,
            claim,
            host_cancel: host_cancel.clone(),
            run_id: spec.replay.logical_run_id.clone(),
            events,
            stats: self.stats.clone(),
        };
        let ending = session.drive(&mut worker, spec, deadline, &cancel, self.config.grace).await;
        host_cancel.cancel();
        match ending {
            Ending::Answered(result) => {
                // Replaced well before its CPU-time limit (RLIMIT_CPU) would kill it mid-run.
                if cpu_seconds_used(&worker.child).is_some_and(|used| used * 2 >= self.config.cpu_seconds) {
                    let _ = worker.child.start_kill();
                    let _ = worker.child.wait().await;
                } else {
                    self.idle.lock().unwrap_or_else(|p| p.into_inner()).push(worker);
                }
                result
            }
            Ending::Lost(error) => {
                let _ = worker.child.start_kill();
                let _ = worker.child.wait().await;
                Err(error)
            }
        }
    }

    fn spawn(&self) -> Result<Worker, RunError> {
        let mut command = Command::new(&self.config.program);
        command
            .args(&self.config.args)
            .env_clear()
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::inherit())
            .kill_on_drop(true);
        let limits = [
            (libc::RLIMIT_AS, self.config.address_space_bytes),
            (libc::RLIMIT_CPU, self.config.cpu_seconds),
            (libc::RLIMIT_CORE, 0),
        ];
        let parent = std::process::id();
        // SAFETY: only async-signal-safe calls (setrlimit, prctl, getppid) run between fork and exec.
        unsafe {
            command.pre_exec(move || {
                for (resource, value) in limits {
                    let limit = libc::rlimit { rlim_cur: value as libc::rlim_t, rlim_max: value as libc::rlim_t };
                    if libc::setrlimit(resource, &limit) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                }
                // The worker dies with the thread that forks it, a thread that lives as long as
                // this process (see `spawner`). A parent that died before the signal was armed
                // is seen here: the worker was reparented already.
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong, 0, 0, 0) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                if libc::getppid() as u32 != parent {
                    return Err(std::io::Error::other("the runner exited while the worker started"));
                }
                Ok(())
            });
        }
        let mut child = match spawner::spawn(command) {
            Spawned::Started(child) => child,
            Spawned::Failed(e) => {
                return Err(RunError::internal(format!("cannot start a worker process: {e}")).retryable(true));
            }
            // tokio panics when its runtime was built without the I/O driver: say so instead.
            Spawned::NoRuntimeSupport => {
                return Err(RunError::new(
                    ErrorCode::ConfigurationError,
                    "process mode needs a tokio runtime with I/O enabled (Builder::enable_all)",
                ));
            }
        };
        let stdin = child.stdin.take().ok_or_else(|| RunError::internal("worker process without stdin"))?;
        let mut stdout = child.stdout.take().ok_or_else(|| RunError::internal("worker process without stdout"))?;
        let (sender, frames) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            while let Ok(Some(frame)) = read_frame(&mut stdout).await {
                if sender.send(frame).is_err() {
                    return;
                }
            }
        });
        Ok(Worker { child, stdin, frames })
    }
}

/// CPU seconds (user + system) a child has used, from `/proc`.
fn cpu_seconds_used(child: &Child) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{}/stat", child.id()?)).ok()?;
    let fields: Vec<&str> = stat.rsplit_once(") ")?.1.split_whitespace().collect();
    // After the command name: state is field 3, utime and stime are fields 14 and 15.
    let ticks: u64 = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    // SAFETY: sysconf has no preconditions.
    let per_second = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
    Some(ticks / per_second)
}

struct Decrement<'a>(&'a AtomicUsize);

impl Drop for Decrement<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

async fn read_frame(input: &mut tokio::process::ChildStdout) -> std::io::Result<Option<ToParent>> {
    let mut length = [0u8; 4];
    match input.read_exact(&mut length).await {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e),
    }
    let length = u32::from_le_bytes(length) as usize;
    if length > super::frame::MAX_FRAME_BYTES {
        return Err(std::io::Error::other("frame too large"));
    }
    let mut body = vec![0u8; length];
    input.read_exact(&mut body).await?;
    serde_json::from_slice(&body).map(Some).map_err(std::io::Error::other)
}

/// The resumes of the calls that `spec` resumes with a decision, by call index, with the function
/// each belongs to: built from the ledger and the resolutions the parent holds.
fn decided_calls(spec: &JobSpec) -> HashMap<u32, (String, Resume)> {
    let replay = &spec.replay;
    let mut decided = HashMap::new();
    for (&index, resolution) in &replay.resolutions {
        let Some(entry) = index.checked_sub(1).and_then(|i| replay.ledger.get(i as usize)) else { continue };
        if let Some(resume) = entry.resume_with(index, resolution.clone()) {
            decided.insert(index, (entry.function.clone(), resume));
        }
    }
    decided
}

/// The parent's half of one run.
struct Session {
    host: HostFunctions,
    claim: Option<Arc<Claim>>,
    host_cancel: CancelSignal,
    run_id: Arc<str>,
    events: Option<Arc<EventQueue>>,
    stats: Arc<StatsCounters>,
}

fn lost(message: &str) -> Ending {
    Ending::Lost(RunError::internal(format!("the worker process {message}")).retryable(true))
}

async fn write(stdin: &mut ChildStdin, message: &ToChild) -> std::io::Result<()> {
    stdin.write_all(&encode_frame(message)?).await?;
    stdin.flush().await
}

impl Session {
    async fn drive(
        &self,
        worker: &mut Worker,
        spec: JobSpec,
        deadline: Instant,
        cancel: &CancelSignal,
        grace: std::time::Duration,
    ) -> Ending {
        // The decisions a resumed call receives come from this side: a worker process that a
        // script took over cannot forge an approval.
        let mut resumes = decided_calls(&spec);
        if write(&mut worker.stdin, &ToChild::Run(Box::new(spec))).await.is_err() {
            return lost("could not be given the run");
        }
        let (results, mut settled) = mpsc::unbounded_channel::<(u32, HostResult)>();
        let mut tasks: Vec<tokio::task::JoinHandle<()>> = Vec::new();
        let mut abort_deadline: Option<Instant> = None;
        let ending = loop {
            let stop_at = abort_deadline.map_or(deadline, |a| a.min(deadline));
            tokio::select! {
                frame = worker.frames.recv() => match frame {
                    None => break lost("exited unexpectedly (crashed or was killed)"),
                    Some(ToParent::Done(result, lookup)) => {
                        self.stats.record(lookup);
                        break Ending::Answered(result);
                    }
                    Some(ToParent::Event(event)) => {
                        // The run's end is announced here, from the answer, never by the worker.
                        let live = !event.is_terminal() && !matches!(event, RunEvent::Lagged { .. });
                        if let (Some(events), true) = (&self.events, live) {
                            events.push(event);
                        }
                    }
                    Some(ToParent::Call { index, function, arguments, resumed }) => {
                        let arguments: Vec<Value> = serde_json::from_str(&arguments).unwrap_or_default();
                        let resume = match resumes.get(&index) {
                            Some((recorded, _)) if resumed && *recorded == function => {
                                resumes.remove(&index).map(|(_, resume)| resume)
                            }
                            _ => None,
                        };
                        let context = HostCallContext::new(
                            self.run_id.clone(),
                            function.as_str(),
                            index,
                            resume,
                            self.host_cancel.clone(),
                        );
                        let mut future = CatchUnwind(self.host.call(&function, context, arguments));
                        // Answer at once when the host function does not wait.
                        let ready = std::future::poll_fn(|cx| {
                            std::task::Poll::Ready(std::pin::Pin::new(&mut future).poll(cx))
                        })
                        .await;
                        match ready {
                            std::task::Poll::Ready(result) => {
                                let outcome = CallOutcomeFrame::from(result);
                                if write(&mut worker.stdin, &ToChild::Settled { index, outcome }).await.is_err() {
                                    break lost("stopped reading");
                                }
                            }
                            std::task::Poll::Pending => {
                                let results = results.clone();
                                tasks.push(tokio::spawn(async move {
                                    let _ = results.send((index, future.await));
                                }));
                            }
                        }
                    }
                    Some(ToParent::Consume) => {
                        let answer = match &self.claim {
                            Some(claim) => claim.consume_async().await,
                            None => Ok(()),
                        };
                        if write(&mut worker.stdin, &ToChild::Consumed(answer)).await.is_err() {
                            break lost("stopped reading");
                        }
                    }
                },
                Some((index, result)) = settled.recv() => {
                    let outcome = CallOutcomeFrame::from(result);
                    if write(&mut worker.stdin, &ToChild::Settled { index, outcome }).await.is_err() {
                        break lost("stopped reading");
                    }
                }
                _ = cancel.cancelled(), if abort_deadline.is_none() => {
                    let _ = write(&mut worker.stdin, &ToChild::Abort).await;
                    abort_deadline = Some(Instant::now() + grace);
                }
                _ = tokio::time::sleep_until(stop_at) => {
                    break if abort_deadline.is_some() {
                        Ending::Lost(RunError::new(ErrorCode::Aborted, "the run was cancelled by its caller"))
                    } else {
                        Ending::Lost(
                            RunError::new(
                                ErrorCode::Timeout,
                                "the script ran past its time limit and its worker process was killed",
                            )
                            .retryable(false),
                        )
                    };
                }
            }
        };
        for task in tasks {
            task.abort();
        }
        ending
    }
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
            has_claim: false,
            events: false,
            cache: BytecodeCacheConfig::default(),
        };
        let decided = decided_calls(&spec);
        assert_eq!(decided.len(), 1, "only an interrupted entry of the ledger takes a decision");
        let (function, resume) = &decided[&2];
        assert_eq!(function, "tools.approve");
        assert_eq!(resume.interruption_id, "interrupt-2");
        assert_eq!(resume.payload, json!({ "amount": 5 }));
        assert_eq!(resume.resolution, json!("yes"));
    }
}
