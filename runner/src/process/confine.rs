//! OS confinement of worker processes (Linux).
//!
//! A worker runs QuickJS, native code that a script may take over through a memory-safety bug,
//! so a worker is confined as if it were hostile. It keeps only what computing needs: its pipes,
//! its memory and CPU time.
//!
//! - **At spawn**, between fork and exec ([`at_spawn`]): `PR_SET_NO_NEW_PRIVS`; every inherited
//!   descriptor but stdin, stdout and stderr (all three pipes to the parent) is closed at exec;
//!   new user, network, IPC and mount namespaces where the kernel allows them (a container
//!   runtime may not). The parent also gives the worker a private, empty working directory and
//!   an empty environment.
//! - **In the worker**, once its engine has started and before the first byte of guest code
//!   ([`confine_worker`]): a seccomp filter, on every thread, that allows only the system calls
//!   that the engine, the allocator and the pipes need. Calls that open or look at files
//!   (`open`, `openat`, `stat`, …) fail with `EACCES`; any other call (`socket`, `connect`,
//!   `execve`, `ptrace`, `clone`, …) kills the worker at once. So it cannot open the server's
//!   files, read the parent's `/proc` entries, reach the network or start programs.
//!
//! A worker never makes a thread or a process after it is confined. No PID namespace is made:
//! it would apply only to children, and a confined worker cannot have any.

use std::collections::BTreeMap;
use std::fmt;

use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter, SeccompRule, TargetArch,
};

/// `prctl(PR_SET_VMA, …)` (Linux 5.17), which names memory mappings.
const PR_SET_VMA: u64 = 0x5356_4d41;

/// The exit status of a worker that could not confine itself and was not allowed to run
/// unconfined (`EX_CONFIG`).
pub(crate) const UNCONFINED_EXIT: i32 = 78;

/// The argument that lets a worker run when it cannot confine itself.
pub(crate) const ALLOW_UNCONFINED_ARGUMENT: &str = "--allow-unconfined";

/// What a confined worker may still call.
const ALLOWED: &[libc::c_long] = &[
    // The pipes to the parent, and the stderr it forwards.
    libc::SYS_read,
    libc::SYS_write,
    libc::SYS_readv,
    libc::SYS_writev,
    libc::SYS_close,
    #[cfg(target_arch = "x86_64")]
    libc::SYS_poll,
    libc::SYS_ppoll,
    // Memory: the allocator and the engine's heap.
    libc::SYS_mmap,
    libc::SYS_munmap,
    libc::SYS_mremap,
    libc::SYS_mprotect,
    libc::SYS_madvise,
    libc::SYS_brk,
    // Threads that exist already, waiting on each other, and time.
    libc::SYS_futex,
    libc::SYS_sched_yield,
    libc::SYS_clock_gettime,
    libc::SYS_clock_nanosleep,
    libc::SYS_nanosleep,
    libc::SYS_gettimeofday,
    libc::SYS_getrandom,
    libc::SYS_gettid,
    libc::SYS_getpid,
    libc::SYS_sched_getaffinity,
    libc::SYS_rseq,
    // Signals: stack overflow reporting, and the ends of threads and of the process.
    libc::SYS_rt_sigreturn,
    libc::SYS_rt_sigprocmask,
    libc::SYS_rt_sigaction,
    libc::SYS_sigaltstack,
    libc::SYS_restart_syscall,
    libc::SYS_exit,
    libc::SYS_exit_group,
];

unsafe extern "C" {
    /// The C library's time-zone initialisation (not bound by the `libc` crate).
    fn tzset();
}

/// Calls that look at files: refused with `EACCES` instead of killing the worker, because the C
/// library probes files lazily and copes when it cannot (its allocator reads
/// `/proc/sys/vm/overcommit_memory` the first time it shrinks a thread's heap, for one). No
/// file is ever opened or looked at.
const REFUSED: &[libc::c_long] = &[
    #[cfg(target_arch = "x86_64")]
    libc::SYS_open,
    libc::SYS_openat,
    libc::SYS_openat2,
    #[cfg(target_arch = "x86_64")]
    libc::SYS_creat,
    #[cfg(target_arch = "x86_64")]
    libc::SYS_access,
    libc::SYS_faccessat,
    libc::SYS_faccessat2,
    #[cfg(target_arch = "x86_64")]
    libc::SYS_stat,
    #[cfg(target_arch = "x86_64")]
    libc::SYS_lstat,
    libc::SYS_newfstatat,
    libc::SYS_statx,
    #[cfg(target_arch = "x86_64")]
    libc::SYS_readlink,
    libc::SYS_readlinkat,
];

/// Why a worker could not be confined.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfinementError(String);

impl fmt::Display for ConfinementError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "the worker process could not be confined: {}", self.0)
    }
}

impl std::error::Error for ConfinementError {}

fn target_arch() -> Result<TargetArch, ConfinementError> {
    TargetArch::try_from(std::env::consts::ARCH).map_err(|e| ConfinementError(format!("seccomp: {e}")))
}

/// Installs the worker's seccomp filters on every thread of this process (`TSYNC`), for good:
/// from then on this process can compute, use the memory it has, and talk over the pipes it has,
/// and nothing else; a call outside the allow-list kills it. Called by [`serve_worker`](super::serve_worker)
/// once the engine has started, and by the tests that probe the confinement.
pub fn confine_worker() -> Result<(), ConfinementError> {
    let seccomp = |e: seccompiler::BackendError| ConfinementError(format!("seccomp: {e}"));
    let arch = target_arch()?;
    // mimalloc names each memory reservation with prctl(PR_SET_VMA, …) and ignores the answer:
    // that one prctl gets EACCES; any other prctl kills.
    let set_vma = || {
        SeccompCondition::new(0, SeccompCmpArgLen::Dword, SeccompCmpOp::Eq, PR_SET_VMA)
            .and_then(|condition| SeccompRule::new(vec![condition]))
            .map_err(seccomp)
    };
    // Everything outside the allow-list kills; of what it lets through, the file calls (and the
    // prctl above) then get EACCES from the second filter (the kernel takes the strictest answer
    // of all filters).
    let mut allowed = ALLOWED.iter().chain(REFUSED).map(|&call| (call, Vec::new())).collect::<BTreeMap<_, _>>();
    allowed.insert(libc::SYS_prctl, vec![set_vma()?]);
    let allow_list =
        SeccompFilter::new(allowed, SeccompAction::KillProcess, SeccompAction::Allow, arch).map_err(seccomp)?;
    let mut refused = REFUSED.iter().map(|&call| (call, Vec::new())).collect::<BTreeMap<_, _>>();
    refused.insert(libc::SYS_prctl, vec![set_vma()?]);
    let no_files = SeccompFilter::new(refused, SeccompAction::Allow, SeccompAction::Errno(libc::EACCES as u32), arch)
        .map_err(seccomp)?;
    // Installing a filter takes prctl and seccomp calls, which the allow-list does not allow:
    // it goes on last.
    let programs: Vec<BpfProgram> = [no_files, allow_list]
        .into_iter()
        .map(|filter| filter.try_into().map_err(seccomp))
        .collect::<Result<_, _>>()?;
    // The time zone is read now, while files can still be opened (the parent sets TZ, so the C
    // library does not look at the file again).
    // SAFETY: tzset has no preconditions.
    unsafe { tzset() };
    // The parent set NO_NEW_PRIVS at spawn; setting it again covers a worker started otherwise.
    // SAFETY: prctl with these arguments changes only a flag of this process.
    if unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) } != 0 {
        return Err(ConfinementError(format!("no_new_privs: {}", std::io::Error::last_os_error())));
    }
    for program in &programs {
        seccompiler::apply_filter_all_threads(program).map_err(|e| ConfinementError(format!("seccomp: {e}")))?;
    }
    Ok(())
}

/// The confinement a worker gets between fork and exec. Only async-signal-safe calls.
///
/// # Safety
/// Call only in a child between `fork` and `exec` (a `pre_exec` hook).
pub(crate) unsafe fn at_spawn() -> std::io::Result<()> {
    // SAFETY: plain system calls on this process (prctl, close_range or fcntl, unshare), which
    // touch no memory of it; the caller runs this between fork and exec.
    unsafe {
        if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        // Every descriptor above stderr closes at exec (the spawning machinery's own pipe is
        // close-on-exec already). Kernels before 5.11, or container profiles that refuse
        // close_range, get the same one descriptor at a time.
        if libc::syscall(libc::SYS_close_range, 3u32, u32::MAX, libc::CLOSE_RANGE_CLOEXEC) != 0 {
            let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
            if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            let highest = libc::c_int::try_from(limit.rlim_cur.min(1 << 20)).unwrap_or(1 << 20);
            for fd in 3..highest {
                libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC);
            }
        }
        // Namespaces where the kernel allows them: with a new user namespace when it may be
        // made, otherwise without; none at all inside a runtime that forbids them.
        let shared = libc::CLONE_NEWNET | libc::CLONE_NEWIPC | libc::CLONE_NEWNS;
        if libc::unshare(libc::CLONE_NEWUSER | shared) != 0 {
            let _ = libc::unshare(shared);
        }
    }
    Ok(())
}

/// What confines a worker process, read from `/proc` by its parent.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Confinement {
    /// `NoNewPrivs: 1` on every thread.
    pub no_new_privs: bool,
    /// A seccomp filter (`Seccomp: 2`) on every thread.
    pub seccomp: bool,
    /// The namespaces it does not share with its parent (`user`, `net`, `ipc`, `mnt`).
    pub namespaces: Vec<&'static str>,
    /// Its open descriptors (the three pipes when confined).
    pub descriptors: usize,
}

impl Confinement {
    /// Reads the confinement of process `pid`, a child of this process.
    pub fn of(pid: u32) -> Confinement {
        let threads: Vec<String> = std::fs::read_dir(format!("/proc/{pid}/task"))
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|t| std::fs::read_to_string(t.path().join("status")).ok())
            .collect();
        let every = |line: &str| !threads.is_empty() && threads.iter().all(|s| s.lines().any(|l| l == line));
        let namespace = |name: &str| {
            let mine = std::fs::read_link(format!("/proc/self/ns/{name}")).ok();
            let theirs = std::fs::read_link(format!("/proc/{pid}/ns/{name}")).ok();
            mine.is_some() && theirs.is_some() && mine != theirs
        };
        Confinement {
            no_new_privs: every("NoNewPrivs:\t1"),
            seccomp: every("Seccomp:\t2"),
            namespaces: ["user", "net", "ipc", "mnt"].into_iter().filter(|n| namespace(n)).collect(),
            descriptors: std::fs::read_dir(format!("/proc/{pid}/fd")).map(|d| d.count()).unwrap_or(0),
        }
    }

    /// Whether the layers that are always required are there: seccomp and no new privileges,
    /// with only the three pipes open.
    pub fn is_minimal(&self) -> bool {
        self.no_new_privs && self.seccomp && self.descriptors <= 3
    }
}

impl fmt::Display for Confinement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut layers = Vec::new();
        if self.seccomp {
            layers.push("seccomp allow-list".to_owned());
        }
        if self.no_new_privs {
            layers.push("no new privileges".to_owned());
        }
        layers.push(format!("{} open descriptors", self.descriptors));
        if self.namespaces.is_empty() {
            layers.push("no namespaces (the kernel or the container forbids them)".to_owned());
        } else {
            layers.push(format!("{} namespaces", self.namespaces.join("+")));
        }
        f.write_str(&layers.join(", "))
    }
}
