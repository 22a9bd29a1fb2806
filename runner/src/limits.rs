//! Per-run resource limits: defaults, bounds and validation.

use std::fmt;
use std::time::Duration;

const KIB: u64 = 1024;
const MIB: u64 = 1024 * KIB;
const GIB: u64 = 1024 * MIB;

/// One configurable limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum Limit {
    /// Wall-clock time of the whole run, host calls included (milliseconds).
    Timeout,
    /// CPU time the script itself uses, waits on host calls excluded (milliseconds).
    CpuTime,
    /// Memory of the JavaScript heap (bytes).
    Memory,
    /// JavaScript stack (bytes).
    Stack,
    /// Source text (bytes).
    Source,
    /// Serialized result (bytes).
    Result,
    /// Captured console output (bytes); beyond it output is truncated, not failed.
    Console,
    /// Serialized arguments of one host call (bytes).
    HostCallArguments,
    /// Serialized output of one host call (bytes).
    HostCallOutput,
    /// Host calls in one run, replayed ones included.
    HostCalls,
    /// Host calls running at the same time.
    HostCallsInFlight,
    /// Encoded continuation token (bytes).
    Continuation,
}

impl Limit {
    /// Every limit, in table order.
    pub const ALL: [Limit; 12] = [
        Limit::Timeout,
        Limit::CpuTime,
        Limit::Memory,
        Limit::Stack,
        Limit::Source,
        Limit::Result,
        Limit::Console,
        Limit::HostCallArguments,
        Limit::HostCallOutput,
        Limit::HostCalls,
        Limit::HostCallsInFlight,
        Limit::Continuation,
    ];

    /// The configuration key (`timeout_ms`, `memory_bytes`, …).
    pub const fn key(self) -> &'static str {
        match self {
            Limit::Timeout => "timeout_ms",
            Limit::CpuTime => "cpu_time_ms",
            Limit::Memory => "memory_bytes",
            Limit::Stack => "stack_bytes",
            Limit::Source => "source_bytes",
            Limit::Result => "result_bytes",
            Limit::Console => "console_bytes",
            Limit::HostCallArguments => "host_call_argument_bytes",
            Limit::HostCallOutput => "host_call_output_bytes",
            Limit::HostCalls => "host_calls",
            Limit::HostCallsInFlight => "host_calls_in_flight",
            Limit::Continuation => "continuation_bytes",
        }
    }

    /// The value used when nothing is configured.
    pub const fn default_value(self) -> u64 {
        match self {
            Limit::Timeout => 30_000,
            Limit::CpuTime => 10_000,
            Limit::Memory => 64 * MIB,
            Limit::Stack => MIB,
            Limit::Source => 256 * KIB,
            Limit::Result => MIB,
            Limit::Console => 64 * KIB,
            Limit::HostCallArguments => MIB,
            Limit::HostCallOutput => 4 * MIB,
            Limit::HostCalls => 256,
            Limit::HostCallsInFlight => 32,
            Limit::Continuation => 32 * MIB,
        }
    }

    /// Smallest accepted value.
    pub const fn min(self) -> u64 {
        match self {
            Limit::Memory => MIB,
            Limit::Stack => 64 * KIB,
            _ => 1,
        }
    }

    /// Largest accepted value.
    pub const fn max(self) -> u64 {
        match self {
            Limit::Timeout | Limit::CpuTime => 24 * 60 * 60 * 1000,
            Limit::Memory => MAX_MEMORY_BYTES as u64,
            Limit::Stack => MAX_STACK_BYTES as u64,
            Limit::Source => 16 * MIB,
            Limit::Result | Limit::HostCallArguments | Limit::HostCallOutput => 64 * MIB,
            Limit::Console => 16 * MIB,
            Limit::HostCalls => 100_000,
            Limit::HostCallsInFlight => 1024,
            Limit::Continuation => 256 * MIB,
        }
    }

    /// Finds a limit by its configuration key.
    pub fn from_key(key: &str) -> Option<Limit> {
        Limit::ALL.into_iter().find(|l| l.key() == key)
    }

    fn check(self, value: i128) -> Result<u64, LimitError> {
        if value < self.min() as i128 || value > self.max() as i128 {
            return Err(LimitError { limit: self, value });
        }
        Ok(value as u64)
    }
}

/// The largest JavaScript heap a run may ask for; each worker reserves this much address space.
pub(crate) const MAX_MEMORY_BYTES: usize = 4 * GIB as usize;

/// The largest JavaScript stack a run may ask for; worker threads get four times it.
pub(crate) const MAX_STACK_BYTES: usize = 8 * 1024 * 1024;

/// A limit value outside its accepted range.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LimitError {
    /// Which limit.
    pub limit: Limit,
    /// The refused value.
    pub value: i128,
}

impl fmt::Display for LimitError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "limit {} must be an integer from {} to {}, got {}",
            self.limit.key(),
            self.limit.min(),
            self.limit.max(),
            self.value
        )
    }
}

impl std::error::Error for LimitError {}

/// A complete, validated set of limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Limits {
    values: [u64; 12],
}

impl Default for Limits {
    fn default() -> Self {
        Limits { values: Limit::ALL.map(Limit::default_value) }
    }
}

impl Limits {
    /// The value of `limit`.
    pub fn get(&self, limit: Limit) -> u64 {
        self.values[limit as usize]
    }

    /// Sets `limit`, refusing values outside its range (0 and negatives included).
    pub fn set(&mut self, limit: Limit, value: i128) -> Result<(), LimitError> {
        self.values[limit as usize] = limit.check(value)?;
        Ok(())
    }

    /// Builder form of [`set`](Limits::set).
    pub fn with(mut self, limit: Limit, value: i128) -> Result<Self, LimitError> {
        self.set(limit, value)?;
        Ok(self)
    }

    /// The CPU-time limit as a duration.
    pub fn cpu_time(&self) -> Duration {
        Duration::from_millis(self.get(Limit::CpuTime))
    }

    /// The timeout as a duration.
    pub fn timeout(&self) -> Duration {
        Duration::from_millis(self.get(Limit::Timeout))
    }

    /// Applies per-run overrides on top of these limits.
    pub fn overridden_by(&self, overrides: &LimitOverrides) -> Limits {
        let mut out = *self;
        for limit in Limit::ALL {
            if let Some(v) = overrides.values[limit as usize] {
                out.values[limit as usize] = v;
            }
        }
        out
    }

    pub(crate) fn usize(&self, limit: Limit) -> usize {
        usize::try_from(self.get(limit)).unwrap_or(usize::MAX)
    }
}

/// Per-run changes to a runner's limits; each value validated when set.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LimitOverrides {
    values: [Option<u64>; 12],
}

impl LimitOverrides {
    /// No overrides.
    pub fn new() -> Self {
        Self::default()
    }

    /// Overrides `limit`, refusing values outside its range.
    pub fn set(&mut self, limit: Limit, value: i128) -> Result<(), LimitError> {
        self.values[limit as usize] = Some(limit.check(value)?);
        Ok(())
    }

    /// Builder form of [`set`](LimitOverrides::set).
    pub fn with(mut self, limit: Limit, value: i128) -> Result<Self, LimitError> {
        self.set(limit, value)?;
        Ok(self)
    }

    /// The override of `limit`, if any.
    pub fn get(&self, limit: Limit) -> Option<u64> {
        self.values[limit as usize]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_limit_rejects_zero_negative_and_too_large() {
        for limit in Limit::ALL {
            let mut limits = Limits::default();
            for bad in [0i128, -1, limit.max() as i128 + 1, i128::from(u64::MAX) + 1] {
                let err = limits.set(limit, bad).unwrap_err();
                assert_eq!(err.limit, limit);
                assert!(err.to_string().contains(limit.key()), "{err}");
                assert!(LimitOverrides::new().with(limit, bad).is_err());
            }
            assert_eq!(limits.get(limit), limit.default_value(), "a refused value leaves the old one");
            assert!(limit.min() <= limit.default_value() && limit.default_value() <= limit.max());
            limits.set(limit, limit.max() as i128).unwrap();
            assert_eq!(Limit::from_key(limit.key()), Some(limit));
        }
    }

    #[test]
    fn overrides_apply_on_top() {
        let base = Limits::default();
        let over = LimitOverrides::new().with(Limit::Timeout, 250).unwrap();
        let merged = base.overridden_by(&over);
        assert_eq!(merged.timeout(), Duration::from_millis(250));
        assert_eq!(merged.get(Limit::Memory), 64 * MIB);
    }
}
