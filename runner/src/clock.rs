//! The time continuations are issued and checked at.

use std::fmt;
use std::sync::Arc;
use std::time::SystemTime;

/// Where a runner (and a [`MemoryContinuationStore`](crate::MemoryContinuationStore)) reads the
/// time that its continuations are issued at and checked against: a token's issue time, expiry
/// and age, a stored token's lifetime. The system clock unless set; a fixed clock lets a test
/// resume tokens made long ago (the golden files of earlier releases) as if no time had passed.
///
/// A script's `Date.now()` reads the run's logical clock, not this one.
#[derive(Clone, Default)]
pub struct Clock(Option<Arc<dyn Fn() -> SystemTime + Send + Sync>>);

impl Clock {
    /// The system clock.
    pub fn system() -> Clock {
        Clock(None)
    }

    /// A clock that always reads `at`.
    pub fn fixed(at: SystemTime) -> Clock {
        Clock::from_fn(move || at)
    }

    /// A clock that reads `now`.
    pub fn from_fn(now: impl Fn() -> SystemTime + Send + Sync + 'static) -> Clock {
        Clock(Some(Arc::new(now)))
    }

    /// The time now.
    pub fn now(&self) -> SystemTime {
        match &self.0 {
            None => SystemTime::now(),
            Some(now) => now(),
        }
    }
}

impl fmt::Debug for Clock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(if self.0.is_none() { "Clock(system)" } else { "Clock(custom)" })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, UNIX_EPOCH};

    #[test]
    fn a_fixed_clock_stands_still_and_the_system_clock_moves() {
        let at = UNIX_EPOCH + Duration::from_secs(1_748_736_000);
        assert_eq!(Clock::fixed(at).now(), at);
        assert!(Clock::system().now() > at);
        assert!(Clock::default().now() > at);
    }
}
