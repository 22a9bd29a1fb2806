//! Worker threads that own the engines, fed by a bounded queue.

use crate::bytecode_cache::StatsCounters;
use crate::error::{ConfigError, ErrorCode, RunError};
use crate::job::{Job, RawOutcome};
use crate::limits::MAX_STACK_BYTES;
use crate::sandbox::Engine;
use crate::turn::Turn;
use crossbeam_channel::{Receiver, Sender, TrySendError, bounded};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::sync::atomic::AtomicUsize;
use std::sync::atomic::Ordering;
use std::thread;
use std::time::{Duration, Instant};

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
        let Some(Task { mut job, reply }) = next_task(&jobs, spinners) else { return };
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

/// The next task; the first idle worker polls for a moment before sleeping, the others sleep
/// at once (more pollers only take the cores from the workers that have work).
fn next_task(jobs: &Receiver<Task>, spinners: &AtomicUsize) -> Option<Task> {
    let started = Instant::now();
    let spinning = Turn::take(spinners);
    while spinning.is_some() && started.elapsed() < SPIN_BEFORE_SLEEP {
        match jobs.try_recv() {
            Ok(task) => return Some(task),
            Err(crossbeam_channel::TryRecvError::Disconnected) => return None,
            Err(crossbeam_channel::TryRecvError::Empty) => thread::yield_now(),
        }
    }
    jobs.recv().ok()
}

/// How long a caller polls for its answer, letting other tasks run between
/// polls, before it waits to be woken.
const POLL_FOR_ANSWER: Duration = Duration::from_micros(100);

/// How long a caller polls for its answer while a core is left over by the busy workers: a
/// resume that replays a long ledger runs for about a millisecond after its caller is done
/// decoding, and waking the caller then costs some 70 µs on a virtual machine.
const POLL_WITH_SPARE_CORE: Duration = Duration::from_millis(2);

/// Spin-loop hints between two polls for an answer on a spare core (about a microsecond).
const SPIN_BETWEEN_POLLS: usize = 64;

/// Waits for a worker's answer, polling for a moment first: most runs finish
/// in less time than it takes to wake a sleeping executor thread.
/// One caller of the pool polls at a time; the others wait to be woken at once.
/// The poller only goes on polling past [`POLL_FOR_ANSWER`] while the workers leave a core
/// free, so that it never takes a core from a run.
/// `None` when the worker dropped the task without answering.
pub(crate) async fn answer_soon<T>(pool: &Pool, answer: &mut tokio::sync::oneshot::Receiver<T>) -> Option<T> {
    let started = Instant::now();
    let polling = Turn::take(&pool.pollers);
    while polling.is_some() {
        let elapsed = started.elapsed();
        let spare_core = pool.busy.load(Ordering::Relaxed) < pool.cores;
        if elapsed >= POLL_FOR_ANSWER && !(elapsed < POLL_WITH_SPARE_CORE && spare_core) {
            break;
        }
        match answer.try_recv() {
            Ok(value) => return Some(value),
            Err(tokio::sync::oneshot::error::TryRecvError::Empty) => {
                if elapsed < POLL_FOR_ANSWER {
                    // Lets other threads of this core run (the worker may be one).
                    thread::yield_now();
                } else {
                    // On a core of its own: wait without system calls, lightly for a core
                    // that shares its execution units with the worker's.
                    for _ in 0..SPIN_BETWEEN_POLLS {
                        std::hint::spin_loop();
                    }
                }
                tokio::task::yield_now().await;
            }
            // A closed receiver may not be awaited again (tokio panics): answer here.
            Err(tokio::sync::oneshot::error::TryRecvError::Closed) => return None,
        }
    }
    answer.await.ok()
}
