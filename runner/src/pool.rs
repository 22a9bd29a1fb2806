//! Worker threads that own the engines, fed by a bounded queue.

use crate::bytecode_cache::StatsCounters;
use crate::error::{ConfigError, ErrorCode, RunError};
use crate::job::{Job, RawOutcome};
use crate::limits::MAX_STACK_BYTES;
use crate::sandbox::Engine;
use crossbeam_channel::{Receiver, Sender, TrySendError, bounded};
use resumable_handoff::{AnswerPolling, next_job};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::sync::atomic::AtomicUsize;
use std::sync::atomic::Ordering;
use std::thread;
use std::time::Duration;

/// How long an idle worker polls the queue before it sleeps. Waking a sleeping
/// thread costs tens of microseconds on virtual machines, more than a short run.
const SPIN_BEFORE_SLEEP: Duration = Duration::from_micros(100);

/// A job and where its answer goes.
pub(crate) struct Task {
    pub job: Job,
    pub reply: tokio::sync::oneshot::Sender<Result<RawOutcome, RunError>>,
}

/// A fixed set of worker threads.
pub(crate) struct Pool {
    queue: Sender<Task>,
    /// Callers polling for their answer right now (see [`answer_soon`]).
    pollers: Arc<AtomicUsize>,
    /// Workers running a task right now.
    busy: Arc<AtomicUsize>,
    /// The cores this process may use.
    cores: usize,
}

impl Pool {
    pub(crate) fn new(workers: usize, queue_capacity: usize, stats: Arc<StatsCounters>) -> Result<Pool, ConfigError> {
        let (queue, jobs) = bounded::<Task>(queue_capacity);
        let spinners = Arc::new(AtomicUsize::new(0));
        let busy = Arc::new(AtomicUsize::new(0));
        for index in 0..workers {
            let jobs = jobs.clone();
            let spinners = Arc::clone(&spinners);
            let busy = Arc::clone(&busy);
            let stats = Arc::clone(&stats);
            thread::Builder::new()
                .name(format!("resumable-worker-{index}"))
                .stack_size(4 * MAX_STACK_BYTES + 1024 * 1024)
                .spawn(move || work(jobs, &spinners, &busy, &stats))
                .map_err(|e| ConfigError(format!("cannot start worker thread: {e}")))?;
        }
        let cores = thread::available_parallelism().map_or(1, usize::from);
        Ok(Pool { queue, pollers: Arc::new(AtomicUsize::new(0)), busy, cores })
    }

    /// Queues a job; a full queue is `RUN_CONCURRENCY_LIMIT`.
    pub(crate) fn submit(&self, task: Task) -> Result<(), RunError> {
        match self.queue.try_send(task) {
            Ok(()) => Ok(()),
            Err(TrySendError::Full(_)) => Err(RunError::new(
                ErrorCode::ConcurrencyLimit,
                "every worker is busy and the run queue is full; retry later",
            )),
            Err(TrySendError::Disconnected(_)) => Err(RunError::internal("the worker pool has stopped")),
        }
    }
}

/// Serves tasks on one worker thread. Its engine is built for the first task (a runner sized
/// for many concurrent runs costs nothing for workers it never needs), and rebuilt at once
/// after a run broke it. An engine that cannot start fails each task with the reason, and
/// the next task tries again.
fn work(jobs: Receiver<Task>, spinners: &AtomicUsize, busy: &AtomicUsize, stats: &StatsCounters) {
    let mut engine: Option<Result<Engine, RunError>> = None;
    let mut used = false;
    loop {
        if used && !matches!(engine, Some(Ok(_))) {
            engine = Some(Engine::new());
        }
        let Some(Task { mut job, reply }) = next_job(&jobs, spinners, SPIN_BEFORE_SLEEP) else { return };
        busy.fetch_add(1, Ordering::Relaxed);
        if !matches!(engine, Some(Ok(_))) {
            engine = Some(Engine::new());
        }
        used = true;
        let result = match &mut engine {
            _ if job.abort.load(Ordering::SeqCst) => {
                Err(RunError::new(ErrorCode::Aborted, "the run was cancelled by its caller"))
            }
            Some(Ok(current)) => catch_unwind(AssertUnwindSafe(|| current.execute(&mut job))).unwrap_or_else(|_| {
                current.poisoned = true;
                Err(RunError::internal("the worker failed while running the script"))
            }),
            Some(Err(error)) => Err(error.clone()),
            None => Err(RunError::internal("the JavaScript engine could not start")),
        };
        stats.record(job.lookup);
        let _ = reply.send(result);
        busy.fetch_sub(1, Ordering::Relaxed);
        // The realm goes back to its image after the caller has its answer.
        match &mut engine {
            Some(Ok(current)) if current.poisoned => engine = None,
            Some(Ok(current)) => current.reset(),
            _ => {}
        }
    }
}

/// How long a caller polls for its answer, letting other tasks run between
/// polls, before it waits to be woken.
const POLL_FOR_ANSWER: Duration = Duration::from_micros(100);

/// How long a caller polls for its answer while a core is left over by the busy workers: a
/// resume that replays a long ledger runs for about a millisecond after its caller is done
/// decoding, and waking the caller then costs some 70 µs on a virtual machine.
const POLL_WITH_SPARE_CORE: Duration = Duration::from_millis(2);

/// Waits for a worker's answer, polling for a moment first (see [`resumable_handoff`]); the
/// poller goes on polling past [`POLL_FOR_ANSWER`] only while the workers leave a core free, so
/// that it never takes a core from a run. `None` when the worker dropped the task unanswered.
pub(crate) async fn answer_soon<T>(pool: &Pool, answer: &mut tokio::sync::oneshot::Receiver<T>) -> Option<T> {
    let spare_core = || pool.busy.load(Ordering::Relaxed) < pool.cores;
    let polling = AnswerPolling {
        pollers: &pool.pollers,
        poll: POLL_FOR_ANSWER,
        with_spare_core: Some((POLL_WITH_SPARE_CORE, &spare_core)),
    };
    resumable_handoff::answer_soon(answer, polling).await
}
