//! Named crash points for fault-injection tests.
//!
//! With `RESUMABLE_FAULT=POINT` (or `POINT:N`) in its environment, the process SIGKILLs itself the
//! first (or `N`-th) time it reaches `POINT`, exactly as if an operator or the kernel killed it
//! there. The crash tests use it to hit windows that random kills reach only by luck; anything
//! else leaves the variable unset, and then a point costs one atomic load.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};

/// A place where a fault-injection test can make the process die.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum FaultPoint {
    /// A resume just claimed its stored continuation (`continuation-claimed`).
    ContinuationClaimed,
    /// A resume is about to consume its claimed continuation (`before-consume`).
    BeforeConsume,
    /// A host function that was resumed with a decision returned (`after-host-call`).
    AfterHostCall,
    /// A round of an automation ended and its step has not recorded that yet (`before-round-recorded`).
    BeforeRoundRecorded,
    /// A decision was committed and its `202` not sent yet (`decision-committed`).
    DecisionCommitted,
}

impl FaultPoint {
    /// Every point, for tests that go through them all.
    pub const ALL: [FaultPoint; 5] = [
        FaultPoint::ContinuationClaimed,
        FaultPoint::BeforeConsume,
        FaultPoint::AfterHostCall,
        FaultPoint::BeforeRoundRecorded,
        FaultPoint::DecisionCommitted,
    ];

    /// The name `RESUMABLE_FAULT` gives it.
    pub fn name(self) -> &'static str {
        match self {
            FaultPoint::ContinuationClaimed => "continuation-claimed",
            FaultPoint::BeforeConsume => "before-consume",
            FaultPoint::AfterHostCall => "after-host-call",
            FaultPoint::BeforeRoundRecorded => "before-round-recorded",
            FaultPoint::DecisionCommitted => "decision-committed",
        }
    }
}

/// The armed point and after how many hits it fires, read once from the environment.
fn armed() -> Option<(FaultPoint, u64)> {
    static ARMED: OnceLock<Option<(FaultPoint, u64)>> = OnceLock::new();
    *ARMED.get_or_init(|| {
        let value = std::env::var("RESUMABLE_FAULT").ok()?;
        let (name, nth) = value.split_once(':').unwrap_or((value.as_str(), "1"));
        let point = FaultPoint::ALL.into_iter().find(|p| p.name() == name)?;
        Some((point, nth.parse().ok().filter(|n| *n > 0)?))
    })
}

/// Kills the process if `point` is armed and this is its hit that fires.
pub fn reached(point: FaultPoint) {
    static HITS: AtomicU64 = AtomicU64::new(0);
    let Some((armed, nth)) = armed() else { return };
    if armed == point && HITS.fetch_add(1, Ordering::SeqCst) + 1 == nth {
        tracing::warn!(point = point.name(), "RESUMABLE_FAULT: killing this process");
        // SAFETY: kill(2) with our own pid and a valid signal number has no memory effects.
        unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
    }
}
