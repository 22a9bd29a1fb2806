//! How each worker keeps the bytecode of scripts it compiled, and what the cache did.

use crate::error::ConfigError;
use serde::{Deserialize, Serialize};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

const MIB: usize = 1024 * 1024;
const MAX_AGE_LIMIT: Duration = Duration::from_secs(24 * 60 * 60);

/// Bounds of the per-worker bytecode cache ([`RunnerConfig::bytecode_cache`](crate::RunnerConfig::bytecode_cache)).
///
/// Every worker (thread or process) keeps the bytecode it compiled, keyed by
/// the SHA-256 of the source and the engine version (QuickJS and rquickjs
/// builds, the hardening script, the intrinsics), so a run of a source the
/// worker has seen skips the compiler. Entries are evicted oldest first past
/// `max_entries` or `max_bytes`, and an entry older than `max_age` is compiled
/// again. Bytecode only ever comes from the worker's own compiler: neither
/// requests nor continuations can carry any.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct BytecodeCacheConfig {
    pub(crate) max_entries: usize,
    pub(crate) max_bytes: usize,
    pub(crate) max_age: Duration,
}

impl Default for BytecodeCacheConfig {
    fn default() -> Self {
        BytecodeCacheConfig { max_entries: 64, max_bytes: 16 * MIB, max_age: Duration::from_secs(600) }
    }
}

impl BytecodeCacheConfig {
    /// Defaults: 64 entries, 16 MiB, 10 minutes.
    pub fn new() -> Self {
        Self::default()
    }

    /// Scripts kept per worker (1 to 100,000).
    pub fn max_entries(mut self, entries: usize) -> Self {
        self.max_entries = entries;
        self
    }

    /// Bytecode bytes kept per worker (64 KiB to 1 GiB); one script larger than
    /// a quarter of it is not kept.
    pub fn max_bytes(mut self, bytes: usize) -> Self {
        self.max_bytes = bytes;
        self
    }

    /// Age after which an entry is compiled again (1 ms to 24 h).
    pub fn max_age(mut self, age: Duration) -> Self {
        self.max_age = age;
        self
    }

    /// Checks every bound; the message names the setting and its range.
    pub(crate) fn validate(&self) -> Result<(), ConfigError> {
        if !(1..=100_000).contains(&self.max_entries) {
            return Err(ConfigError(format!(
                "bytecode cache max_entries must be from 1 to 100000, got {}",
                self.max_entries
            )));
        }
        if !(64 * 1024..=1024 * MIB).contains(&self.max_bytes) {
            return Err(ConfigError(format!(
                "bytecode cache max_bytes must be from 65536 to {}, got {}",
                1024 * MIB,
                self.max_bytes
            )));
        }
        if self.max_age < Duration::from_millis(1) || self.max_age > MAX_AGE_LIMIT {
            return Err(ConfigError(format!(
                "bytecode cache max_age must be from 1 ms to 24 h, got {} ms",
                self.max_age.as_millis()
            )));
        }
        Ok(())
    }
}

/// Counters of a [`Runner`](crate::Runner) since it started, and its worker processes now, from
/// [`Runner::stats`](crate::Runner::stats). The process figures stay 0 in thread mode.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RunnerStats {
    /// Runs whose bytecode came from their worker's cache.
    pub bytecode_hits: u64,
    /// Runs whose source was compiled (first seen by the worker, evicted, expired,
    /// or compiled by another engine version).
    pub bytecode_misses: u64,
    /// Worker processes started.
    pub processes_started: u64,
    /// Worker processes killed during a run: at its deadline, or because they died, broke the
    /// protocol or could not be confined.
    pub processes_killed: u64,
    /// Worker processes stopped between runs: replaced before their CPU-time limit, not reused,
    /// or idle longest when too many were idle.
    pub processes_retired: u64,
    /// Worker processes running a script now.
    pub processes_busy: u64,
    /// Worker processes idle now, kept for later runs.
    pub processes_idle: u64,
}

/// Whether a run found its bytecode in the cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum CacheLookup {
    Hit,
    Miss,
}

/// The live counters behind [`RunnerStats`], shared with the workers.
#[derive(Debug, Default)]
pub(crate) struct StatsCounters {
    bytecode_hits: AtomicU64,
    bytecode_misses: AtomicU64,
    pub(crate) processes_started: AtomicU64,
    pub(crate) processes_killed: AtomicU64,
    pub(crate) processes_retired: AtomicU64,
    pub(crate) processes_busy: AtomicUsize,
    pub(crate) processes_idle: AtomicU64,
}

impl StatsCounters {
    pub(crate) fn record(&self, lookup: Option<CacheLookup>) {
        match lookup {
            Some(CacheLookup::Hit) => self.bytecode_hits.fetch_add(1, Ordering::Relaxed),
            Some(CacheLookup::Miss) => self.bytecode_misses.fetch_add(1, Ordering::Relaxed),
            None => return,
        };
    }

    pub(crate) fn snapshot(&self) -> RunnerStats {
        RunnerStats {
            bytecode_hits: self.bytecode_hits.load(Ordering::Relaxed),
            bytecode_misses: self.bytecode_misses.load(Ordering::Relaxed),
            processes_started: self.processes_started.load(Ordering::Relaxed),
            processes_killed: self.processes_killed.load(Ordering::Relaxed),
            processes_retired: self.processes_retired.load(Ordering::Relaxed),
            processes_busy: self.processes_busy.load(Ordering::Relaxed) as u64,
            processes_idle: self.processes_idle.load(Ordering::Relaxed),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zero_and_out_of_range_settings_are_refused_by_name() {
        assert!(BytecodeCacheConfig::new().validate().is_ok());
        for (config, name) in [
            (BytecodeCacheConfig::new().max_entries(0), "max_entries"),
            (BytecodeCacheConfig::new().max_entries(100_001), "max_entries"),
            (BytecodeCacheConfig::new().max_bytes(0), "max_bytes"),
            (BytecodeCacheConfig::new().max_bytes(2048 * MIB), "max_bytes"),
            (BytecodeCacheConfig::new().max_age(Duration::ZERO), "max_age"),
            (BytecodeCacheConfig::new().max_age(Duration::from_micros(999)), "max_age"),
            (BytecodeCacheConfig::new().max_age(MAX_AGE_LIMIT + Duration::from_secs(1)), "max_age"),
        ] {
            let error = config.validate().unwrap_err();
            assert!(error.0.contains(name), "{error}");
        }
    }
}
