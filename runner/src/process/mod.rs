//! Process isolation: scripts run in worker processes the runner can kill.
//!
//! In thread mode a script that spins inside one long native operation (a
//! huge `JSON.stringify`, say) cannot be interrupted before the operation
//! returns. In process mode each script runs in a child process of a worker
//! program, talking to the runner over framed pipes; the runner kills a child
//! at its deadline plus a grace period and starts a fresh one, and a child
//! that crashes fails only its own run. Host functions still run in the
//! runner's process: a child asks for each call and gets the result back.
//!
//! A worker program is any executable whose `main` calls [`serve_worker`]
//! when it is started as a worker; the `resumable` CLI is one
//! (`resumable __worker`), and this crate ships `resumable-worker`.

mod child;
mod confine;
mod frame;
mod input;
mod parent;
mod pipes;
pub(crate) mod protocol;
mod session;
mod spawner;
mod spin;

pub use child::{WORKER_ARGUMENT, serve_worker};
pub use confine::{Confinement, ConfinementError, confine_worker};
pub(crate) use parent::{ProcessJob, ProcessPool};

use std::ffi::OsString;
use std::path::PathBuf;
use std::time::Duration;

/// The signal that tells a worker to abort its run.
const ABORT_SIGNAL: libc::c_int = libc::SIGUSR1;

/// How worker processes are started and confined.
#[derive(Debug, Clone)]
pub struct ProcessConfig {
    pub(crate) program: PathBuf,
    pub(crate) args: Vec<OsString>,
    pub(crate) grace: Duration,
    pub(crate) address_space_bytes: u64,
    pub(crate) cpu_seconds: u64,
    pub(crate) allow_unconfined: bool,
    pub(crate) max_idle: usize,
    pub(crate) reuse: bool,
}

impl ProcessConfig {
    /// Workers are `program args…`; the program must call [`serve_worker`].
    pub fn new(program: impl Into<PathBuf>) -> Self {
        ProcessConfig {
            program: program.into(),
            args: Vec::new(),
            grace: Duration::from_millis(30),
            address_space_bytes: 16 * 1024 * 1024 * 1024,
            cpu_seconds: 3600,
            allow_unconfined: false,
            max_idle: 64,
            reuse: true,
        }
    }

    /// This executable, started with `__worker` (for programs that route that
    /// argument to [`serve_worker`], as the `resumable` CLI does).
    pub fn current_exe() -> std::io::Result<Self> {
        Ok(ProcessConfig::new(std::env::current_exe()?).arg(WORKER_ARGUMENT))
    }

    /// Adds an argument to the worker's command line.
    pub fn arg(mut self, arg: impl Into<OsString>) -> Self {
        self.args.push(arg.into());
        self
    }

    /// Time a child gets past its run's deadline before it is killed (default 30 ms).
    pub fn grace(mut self, grace: Duration) -> Self {
        self.grace = grace;
        self
    }

    /// The child's address-space limit (`RLIMIT_AS`, default 16 GiB: the
    /// allocator reserves address space generously; the heap limit of each run
    /// is enforced separately).
    pub fn address_space_bytes(mut self, bytes: u64) -> Self {
        self.address_space_bytes = bytes;
        self
    }

    /// The child's total CPU-time limit (`RLIMIT_CPU`, default one hour); a
    /// child is replaced before it gets near it.
    pub fn cpu_seconds(mut self, seconds: u64) -> Self {
        self.cpu_seconds = seconds;
        self
    }

    /// How many idle workers are kept, across all isolation keys (default 64); past it, the one
    /// idle longest is stopped. See [`RunRequest::isolation`](crate::RunRequest::isolation).
    pub fn max_idle(mut self, workers: usize) -> Self {
        self.max_idle = workers;
        self
    }

    /// Whether a worker serves more than one run (default yes). With `false` every run gets a
    /// fresh process, which costs a process start per run.
    pub fn reuse(mut self, reuse: bool) -> Self {
        self.reuse = reuse;
        self
    }

    /// Lets workers run when they cannot confine themselves (no seccomp on this kernel, say);
    /// off by default, when such a worker exits and its run fails with
    /// `RUN_CONFIGURATION_ERROR`. See [`confine_worker`] for what confinement is.
    pub fn allow_unconfined(mut self, allow: bool) -> Self {
        self.allow_unconfined = allow;
        self
    }
}
