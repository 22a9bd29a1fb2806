//! Polling for the other end of a pipe for a moment before sleeping.
//!
//! Waking a sleeping process costs tens of microseconds on a virtual machine, more than most
//! host calls take, so while a core is free each end of a worker's pipes polls for the other's
//! next frame for up to [`SPIN`] before it sleeps. Now and then it yields its core, in case the
//! other end waits to run on that same core.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// How long one end polls before it sleeps.
pub(super) const SPIN: Duration = Duration::from_micros(100);

/// Polls between which the core is yielded (about 25 µs of polling): seldom enough not to cost
/// when the other end runs on another core, often enough when it waits for this one.
const POLLS_PER_YIELD: u32 = 64;

/// One stretch of polling, started when it is made.
pub(super) struct Spin {
    started: Instant,
    budget: Duration,
    polls: u32,
}

impl Spin {
    /// A stretch of at most `budget`, or [`SPIN`], whichever is shorter; `enabled: false` makes
    /// one that never polls.
    pub(super) fn new(enabled: bool, budget: Duration) -> Spin {
        let budget = if enabled { budget.min(SPIN) } else { Duration::ZERO };
        Spin { started: Instant::now(), budget, polls: 0 }
    }

    /// Whether to poll once more (after a short pause, or a yield of the core); `false` once the
    /// stretch is over, when the caller should sleep until it is woken.
    pub(super) fn again(&mut self) -> bool {
        if self.started.elapsed() >= self.budget {
            return false;
        }
        self.polls += 1;
        if self.polls % POLLS_PER_YIELD == 0 {
            std::thread::yield_now();
        } else {
            std::hint::spin_loop();
        }
        true
    }
}

/// Runs in worker processes right now, against the cores this process may use: the two ends of
/// a run poll only while every busy run can have two cores.
pub(super) struct Cores {
    busy: AtomicUsize,
    count: usize,
}

impl Cores {
    /// No run busy yet, on the cores this process may use.
    pub(super) fn new() -> Cores {
        Cores { busy: AtomicUsize::new(0), count: std::thread::available_parallelism().map_or(1, usize::from) }
    }

    /// Counts a run as busy until the answer is dropped.
    pub(super) fn busy(&self) -> Busy<'_> {
        self.busy.fetch_add(1, Ordering::Relaxed);
        Busy(&self.busy)
    }

    /// Whether polling takes no core from another run.
    pub(super) fn spare(&self) -> bool {
        self.busy.load(Ordering::Relaxed) * 2 <= self.count
    }
}

/// A run counted as busy while it lives.
pub(super) struct Busy<'a>(&'a AtomicUsize);

impl Drop for Busy<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}
