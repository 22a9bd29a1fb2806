//! The latch that turns any limit into an uncatchable end of the run.

use super::alloc::HeapMeter;
use super::stack_guard::StackGuard;
use crate::error::{ErrorCode, RunError};
use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// Least wall time between two reads of the thread's CPU clock; a script can
/// overrun its CPU budget by at most this much.
const CPU_CHECK_INTERVAL: Duration = Duration::from_micros(500);

/// Shared by the engine's interrupt handler, the natives and the run loop.
///
/// Once `latched` holds an error, the interrupt handler stops every further
/// piece of script, so no `catch` can keep the run going.
pub(crate) struct RunGuard {
    pub meter: Rc<HeapMeter>,
    deadline: Cell<Option<Instant>>,
    /// Thread CPU time at which the script has used up its CPU budget.
    cpu_deadline: Cell<Option<Duration>>,
    /// When the thread's CPU time was last read (reading it is a system call).
    cpu_checked: Cell<Instant>,
    abort: RefCell<Option<Arc<AtomicBool>>>,
    stack: RefCell<Option<StackGuard>>,
    latched: RefCell<Option<RunError>>,
}

impl RunGuard {
    pub(crate) fn new(meter: Rc<HeapMeter>) -> Rc<Self> {
        Rc::new(RunGuard {
            meter,
            deadline: Cell::new(None),
            cpu_deadline: Cell::new(None),
            cpu_checked: Cell::new(Instant::now()),
            abort: RefCell::new(None),
            stack: RefCell::new(None),
            latched: RefCell::new(None),
        })
    }

    /// Arms the guard for one run.
    pub(crate) fn arm(&self, deadline: Instant, cpu_budget: Duration, abort: Arc<AtomicBool>, stack: StackGuard) {
        *self.latched.borrow_mut() = None;
        self.deadline.set(Some(deadline));
        self.cpu_deadline.set(Some(thread_cpu_time() + cpu_budget));
        self.cpu_checked.set(Instant::now());
        *self.abort.borrow_mut() = Some(abort);
        *self.stack.borrow_mut() = Some(stack);
    }

    /// Disarms it between runs.
    pub(crate) fn disarm(&self) {
        self.deadline.set(None);
        self.cpu_deadline.set(None);
        *self.abort.borrow_mut() = None;
        *self.stack.borrow_mut() = None;
        *self.latched.borrow_mut() = None;
    }

    /// Records a fatal error unless one is recorded already.
    pub(crate) fn latch(&self, error: RunError) {
        let mut slot = self.latched.borrow_mut();
        if slot.is_none() {
            *slot = Some(error);
        }
    }

    /// The recorded fatal error, after checking every limit once more.
    pub(crate) fn check(&self) -> Option<RunError> {
        self.should_stop_checking_stack();
        self.latched.borrow().clone()
    }

    /// Every limit, the stack band and CPU time included. Called by the engine
    /// every 10,000 ticks, before a host function starts, and when the run ends.
    pub(crate) fn should_stop_checking_stack(&self) -> bool {
        if self.should_stop() {
            return true;
        }
        if self.stack.borrow().as_ref().is_some_and(StackGuard::tripped) {
            self.latch(RunError::new(ErrorCode::StackOverflow, "the script exceeded its stack limit"));
            return true;
        }
        if self.cpu_budget_spent() {
            self.latch(RunError::new(ErrorCode::CpuTimeout, "the script used more CPU time than its limit"));
            return true;
        }
        false
    }

    /// Reads the CPU clock at most once per [`CPU_CHECK_INTERVAL`] of wall time.
    fn cpu_budget_spent(&self) -> bool {
        let Some(limit) = self.cpu_deadline.get() else { return false };
        let now = Instant::now();
        if now.duration_since(self.cpu_checked.get()) < CPU_CHECK_INTERVAL {
            return false;
        }
        self.cpu_checked.set(now);
        thread_cpu_time() >= limit
    }

    /// The cheap limits (latch, memory, abort, deadline), checked between jobs.
    pub(crate) fn should_stop(&self) -> bool {
        if self.latched.borrow().is_some() {
            return true;
        }
        if self.meter.exceeded() {
            self.latch(RunError::new(ErrorCode::MemoryLimit, "the script exceeded its memory limit"));
        } else if self.abort.borrow().as_ref().is_some_and(|a| a.load(Ordering::Relaxed)) {
            self.latch(RunError::new(ErrorCode::Aborted, "the run was cancelled by its caller"));
        } else if self.deadline.get().is_some_and(|d| Instant::now() >= d) {
            self.latch(RunError::new(ErrorCode::Timeout, "the script ran past its time limit").retryable(false));
        } else {
            return false;
        }
        true
    }
}

/// CPU time used by the calling thread (time blocked waiting is not counted).
pub(crate) fn thread_cpu_time() -> Duration {
    let mut now = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: a valid clock id and a valid out-pointer.
    if unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut now) } != 0 {
        return Duration::ZERO;
    }
    Duration::new(now.tv_sec as u64, now.tv_nsec as u32)
}
