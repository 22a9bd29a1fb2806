//! The runner side: a pool of worker processes, killed at deadlines.

use super::ABORT_SIGNAL;
use super::ProcessConfig;
use super::confine::{self, Confinement, UNCONFINED_EXIT};
use super::pipes::Pipes;
use super::protocol::JobSpec;
use super::session::{Ending, Session};
use super::spawner::{self, Spawned};
use super::spin::Cores;
use crate::bytecode_cache::StatsCounters;
use crate::continuation::{Claim, StateStream};
use crate::error::{ErrorCode, RunError};
use crate::event_queue::EventQueue;
use crate::job::{PreparedRun, RawOutcome};
use crate::state::StateHead;
use resumable_host::{CancelSignal, HostFunctions};
use std::collections::{HashMap, VecDeque};
use std::os::unix::fs::DirBuilderExt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use tokio::process::{Child, Command};
use tokio::sync::Semaphore;
use tokio::time::Instant;

/// Worker processes shared by the runs of one runner.
pub(crate) struct ProcessPool {
    config: ProcessConfig,
    /// Idle workers by isolation key, each list oldest first.
    idle: Mutex<Idle>,
    slots: Semaphore,
    waiting: AtomicUsize,
    capacity: usize,
    cores: Cores,
    stats: Arc<StatsCounters>,
    /// How the last worker that answered was confined.
    confinement: Mutex<Option<Confinement>>,
}

/// One run for a worker process.
pub(crate) struct ProcessJob {
    pub run: PreparedRun,
    /// The continuation's state, still to be authenticated and decoded while the worker replays
    /// it.
    pub rest: Option<StateStream>,
    /// The isolation key: a worker serves runs of one key only.
    pub key: Arc<str>,
    pub host: HostFunctions,
    /// The stored continuation the run resumes from, if any.
    pub claim: Option<Arc<Claim>>,
    pub cancel: CancelSignal,
    pub events: Option<Arc<EventQueue>>,
}

/// A worker taken for a run, with the pool's slot it holds.
struct WorkerSlot<'a> {
    worker: Worker,
    _slot: tokio::sync::SemaphorePermit<'a>,
    _waiting: Decrement<'a>,
}

impl std::ops::Deref for WorkerSlot<'_> {
    type Target = Worker;

    fn deref(&self) -> &Worker {
        &self.worker
    }
}

impl std::ops::DerefMut for WorkerSlot<'_> {
    fn deref_mut(&mut self) -> &mut Worker {
        &mut self.worker
    }
}

/// One child process and its pipes.
pub(super) struct Worker {
    child: Child,
    pub(super) pipes: Pipes,
    /// Whether its confinement was read from `/proc` already.
    confinement_read: bool,
    started: std::time::Instant,
}

impl ProcessPool {
    pub(crate) fn new(config: ProcessConfig, workers: usize, queue_capacity: usize, stats: Arc<StatsCounters>) -> Self {
        ProcessPool {
            config,
            idle: Mutex::new(Idle::default()),
            slots: Semaphore::new(workers),
            waiting: AtomicUsize::new(0),
            capacity: workers + queue_capacity,
            cores: Cores::new(),
            stats,
            confinement: Mutex::new(None),
        }
    }

    /// How the last worker process that answered a run was confined (`None` before any did).
    pub(crate) fn confinement(&self) -> Option<Confinement> {
        self.confinement.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Runs `job` in a worker process; host calls run here, on the caller's runtime. A stored
    /// continuation (`claim`) is consumed by this side, right before the first host function
    /// runs, so that a worker cannot resume it twice or skip using it. Also answers the head of
    /// a streamed continuation, as this side decoded it.
    pub(crate) async fn run(&self, job: ProcessJob) -> (Result<RawOutcome, RunError>, Option<StateHead>) {
        let ProcessJob { run, rest, key, host, claim, cancel, events } = job;
        let mut worker = match self.worker(&key).await {
            Ok(worker) => worker,
            // A forged state is refused as such.
            Err(error) => return (Err(rest.and_then(|rest| rest.authenticate().err()).unwrap_or(error)), None),
        };
        let deadline = Instant::now() + run.limits.timeout() + self.config.grace;
        let busy = self.cores.busy();
        self.stats.processes_busy.fetch_add(1, Ordering::SeqCst);
        let _counted = Decrement(&self.stats.processes_busy);
        let host_cancel = CancelSignal::new();
        let session = Session { host, claim, host_cancel: host_cancel.clone(), events, grace: self.config.grace };
        let spec = JobSpec { run, events: session.events.is_some(), spin: self.cores.spare() };
        let (ending, head) = session.drive(&mut worker, spec, rest, deadline, &cancel, &self.cores).await;
        drop(busy);
        host_cancel.cancel();
        (self.end(worker, key, ending).await, head)
    }

    /// A worker for a run of `key`: an idle one, or a new one.
    async fn worker(&self, key: &str) -> Result<WorkerSlot<'_>, RunError> {
        if self.waiting.fetch_add(1, Ordering::SeqCst) >= self.capacity {
            self.waiting.fetch_sub(1, Ordering::SeqCst);
            return Err(RunError::new(
                ErrorCode::ConcurrencyLimit,
                "every worker process is busy and the run queue is full; retry later",
            ));
        }
        let waiting = Decrement(&self.waiting);
        let slot = self.slots.acquire().await.map_err(|_| RunError::internal("the process pool has stopped"))?;
        let idle = {
            let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
            let worker = idle.take(key);
            self.stats.processes_idle.store(idle.count as u64, Ordering::Relaxed);
            worker
        };
        let worker = match idle {
            Some(mut worker) => {
                if worker.pipes.quiet() {
                    worker
                } else {
                    self.retire(worker).await;
                    self.spawn().await?
                }
            }
            None => self.spawn().await?,
        };
        Ok(WorkerSlot { worker, _slot: slot, _waiting: waiting })
    }

    /// Keeps or stops `worker` after its run, and answers the run's result.
    async fn end(&self, slot: WorkerSlot<'_>, key: Arc<str>, ending: Ending) -> Result<RawOutcome, RunError> {
        let mut worker = slot.worker;
        match ending {
            Ending::Answered(result, lookup) => {
                self.stats.record(lookup);
                // Read once per worker: confined before its first run, it stays so.
                if !worker.confinement_read
                    && let Some(pid) = worker.child.id()
                {
                    worker.confinement_read = true;
                    *self.confinement.lock().unwrap_or_else(|p| p.into_inner()) = Some(Confinement::of(pid));
                }
                // Replaced well before its CPU-time limit (RLIMIT_CPU) would kill it mid-run. Its one
                // thread that works cannot have used more CPU time than its age.
                let old = worker.started.elapsed().as_secs().saturating_mul(2) >= self.config.cpu_seconds;
                if old && cpu_seconds_used(&worker.child).is_some_and(|used| used * 2 >= self.config.cpu_seconds) {
                    self.retire(worker).await;
                } else if self.config.reuse {
                    self.keep(key, worker).await;
                } else {
                    self.retire(worker).await;
                }
                result
            }
            Ending::Lost(error) => {
                self.stats.processes_killed.fetch_add(1, Ordering::Relaxed);
                let _ = worker.child.start_kill();
                match worker.child.wait().await {
                    Ok(status) if status.code() == Some(UNCONFINED_EXIT) => Err(RunError::new(
                        ErrorCode::ConfigurationError,
                        "worker processes cannot be confined here (the log says why); allow unconfined workers \
                         explicitly to run them anyway",
                    )),
                    _ => Err(error),
                }
            }
        }
    }

    /// Keeps `worker` idle for later runs of `key`; past the idle cap, the worker idle longest
    /// (of any key) is stopped.
    async fn keep(&self, key: Arc<str>, worker: Worker) {
        let evicted = {
            let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
            idle.put(key, worker);
            let evicted = (idle.count > self.config.max_idle).then(|| idle.oldest()).flatten();
            self.stats.processes_idle.store(idle.count as u64, Ordering::Relaxed);
            evicted
        };
        if let Some(old) = evicted {
            self.retire(old).await;
        }
    }

    /// Stops `worker` between runs.
    async fn retire(&self, mut worker: Worker) {
        self.stats.processes_retired.fetch_add(1, Ordering::Relaxed);
        let _ = worker.child.start_kill();
        let _ = worker.child.wait().await;
    }

    async fn spawn(&self) -> Result<Worker, RunError> {
        let mut command = Command::new(&self.config.program);
        command
            .args(&self.config.args)
            .args(self.config.allow_unconfined.then_some(confine::ALLOW_UNCONFINED_ARGUMENT))
            .env_clear()
            // Set, so that the C library reads the time zone once, before the worker is
            // confined, instead of looking at /etc/localtime again at every local-time call.
            .env("TZ", ":/etc/localtime")
            .current_dir(empty_dir()?)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .kill_on_drop(true);
        let limits = [
            (libc::RLIMIT_AS, self.config.address_space_bytes),
            (libc::RLIMIT_CPU, self.config.cpu_seconds),
            (libc::RLIMIT_CORE, 0),
        ];
        let parent = std::process::id();
        // SAFETY: only async-signal-safe calls (setrlimit, prctl, getppid, and those of
        // `confine::at_spawn`) run between fork and exec.
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
                    // The runner exited while the worker started. (No allocation after fork.)
                    return Err(std::io::Error::from_raw_os_error(libc::ESRCH));
                }
                confine::at_spawn()
            });
        }
        let mut child = match spawner::spawn(command).await {
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
        let stdout = child.stdout.take().ok_or_else(|| RunError::internal("worker process without stdout"))?;
        if let Some(stderr) = child.stderr.take() {
            tokio::spawn(forward_stderr(stderr, child.id().unwrap_or(0)));
        }
        let pipes = Pipes::new(stdin, stdout)
            .map_err(|e| RunError::internal(format!("cannot use a worker's pipes: {e}")).retryable(true))?;
        self.stats.processes_started.fetch_add(1, Ordering::Relaxed);
        Ok(Worker { child, pipes, confinement_read: false, started: std::time::Instant::now() })
    }
}

impl Worker {
    /// Tells the worker to abort its run: a signal, which stops a script that only computes as
    /// well as one that waits (the worker's handler sets the run's abort flag).
    pub(super) fn abort(&self) {
        if let Some(pid) = self.child.id() {
            // SAFETY: kill with a plain signal number; the child is not reaped yet, so `pid` is
            // still this worker's.
            unsafe { libc::kill(pid as libc::pid_t, ABORT_SIGNAL) };
        }
    }
}

/// Idle workers by isolation key.
#[derive(Default)]
struct Idle {
    by_key: HashMap<Arc<str>, VecDeque<(u64, Worker)>>,
    /// Counts puts, so that the worker idle longest can be found.
    clock: u64,
    count: usize,
}

impl Idle {
    fn take(&mut self, key: &str) -> Option<Worker> {
        let workers = self.by_key.get_mut(key)?;
        let (_, worker) = workers.pop_back()?;
        if workers.is_empty() {
            self.by_key.remove(key);
        }
        self.count -= 1;
        Some(worker)
    }

    fn put(&mut self, key: Arc<str>, worker: Worker) {
        self.clock += 1;
        self.by_key.entry(key).or_default().push_back((self.clock, worker));
        self.count += 1;
    }

    /// Removes the worker that has been idle longest.
    fn oldest(&mut self) -> Option<Worker> {
        let key = self.by_key.iter().min_by_key(|(_, workers)| workers.front().map(|(at, _)| *at))?.0.clone();
        let workers = self.by_key.get_mut(&key)?;
        let (_, worker) = workers.pop_front()?;
        if workers.is_empty() {
            self.by_key.remove(&key);
        }
        self.count -= 1;
        Some(worker)
    }
}

/// A private, empty directory for the workers of this process to start in (mode 0700), made once.
/// Those that processes which are gone left behind are removed (only empty ones can be).
fn empty_dir() -> Result<std::path::PathBuf, RunError> {
    static DIR: std::sync::OnceLock<std::path::PathBuf> = std::sync::OnceLock::new();
    if let Some(dir) = DIR.get() {
        return Ok(dir.clone());
    }
    let temp = std::env::temp_dir();
    for entry in std::fs::read_dir(&temp).into_iter().flatten().flatten() {
        let name = entry.file_name();
        let Some(rest) = name.to_str().and_then(|n| n.strip_prefix("resumable-workers-")) else { continue };
        let pid = rest.split('-').next().unwrap_or_default();
        if !std::path::Path::new("/proc").join(pid).exists() {
            let _ = std::fs::remove_dir(entry.path());
        }
    }
    let mut suffix = [0u8; 6];
    getrandom::fill(&mut suffix).map_err(|e| RunError::internal(format!("no randomness: {e}")))?;
    let suffix: String = suffix.iter().map(|b| format!("{b:02x}")).collect();
    let dir = temp.join(format!("resumable-workers-{}-{suffix}", std::process::id()));
    // A new directory (never one that exists), private to this user.
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(&dir)
        .map_err(|e| RunError::internal(format!("cannot make the workers' directory: {e}")).retryable(true))?;
    Ok(DIR.get_or_init(|| dir).clone())
}

/// What a worker may write to the parent's stderr in its life; the rest is dropped, so a hostile
/// worker cannot flood the server's log.
const STDERR_BUDGET: usize = 64 * 1024;

/// Copies what worker `pid` writes to stderr onto this process's stderr, a line at a time, each
/// marked with the worker and cut to 1 KiB (the rest of a longer line is read and dropped), up to
/// [`STDERR_BUDGET`]. It never holds more than a small buffer, whatever the worker writes.
async fn forward_stderr(stderr: tokio::process::ChildStderr, pid: u32) {
    use tokio::io::AsyncBufReadExt;
    let mut input = tokio::io::BufReader::with_capacity(4096, stderr);
    let mut line: Vec<u8> = Vec::with_capacity(1024);
    let mut budget = STDERR_BUDGET;
    loop {
        let (ended, used) = match input.fill_buf().await {
            Ok([]) | Err(_) => return,
            Ok(bytes) => {
                let end = memchr::memchr(b'\n', bytes);
                let piece = &bytes[..end.unwrap_or(bytes.len())];
                let room = 1024usize.saturating_sub(line.len());
                line.extend_from_slice(&piece[..piece.len().min(room)]);
                (end.is_some(), end.map_or(bytes.len(), |e| e + 1))
            }
        };
        input.consume(used);
        if !ended {
            continue;
        }
        if budget > 0 {
            let text: String =
                String::from_utf8_lossy(&line).chars().map(|c| if c.is_control() { '?' } else { c }).collect();
            budget = budget.saturating_sub(text.len().max(1));
            let note = if budget == 0 { " (further output of this worker is dropped)" } else { "" };
            tracing::warn!(worker = pid, line = %text, "a worker process wrote to stderr{note}");
        }
        line.clear();
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
