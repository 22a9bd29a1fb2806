//! One worker's compiled scripts, by (source hash, engine version), bounded in
//! entries, bytes and age.

use super::js::Bytecode;
use crate::bytecode_cache::BytecodeCacheConfig;
use std::collections::{HashMap, VecDeque};
use std::time::Instant;

/// What a cached script is compiled from and by.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct CacheKey {
    /// SHA-256 of the source.
    pub source: [u8; 32],
    /// The engine build that compiled it (see `engine::engine_version`).
    pub engine: [u8; 32],
}

struct Entry {
    code: Bytecode,
    compiled_at: Instant,
}

/// Compiled scripts, evicted oldest first; an entry past its age is a miss.
pub(crate) struct BytecodeCache {
    config: BytecodeCacheConfig,
    entries: HashMap<CacheKey, Entry>,
    /// Insertions in order, with the time that identifies the entry they made.
    order: VecDeque<(CacheKey, Instant)>,
    bytes: usize,
}

impl BytecodeCache {
    pub(crate) fn new(config: BytecodeCacheConfig) -> Self {
        BytecodeCache { config, entries: HashMap::new(), order: VecDeque::new(), bytes: 0 }
    }

    /// Applies new bounds, evicting what no longer fits.
    pub(crate) fn configure(&mut self, config: BytecodeCacheConfig) {
        if self.config != config {
            self.config = config;
            self.evict();
        }
    }

    /// The bytecode of `key` compiled at most the maximum age before `now`.
    pub(crate) fn get(&mut self, key: &CacheKey, now: Instant) -> Option<Bytecode> {
        let entry = self.entries.get(key)?;
        if now.saturating_duration_since(entry.compiled_at) <= self.config.max_age {
            return Some(entry.code.clone());
        }
        if let Some(stale) = self.entries.remove(key) {
            self.bytes -= stale.code.len();
        }
        None
    }

    /// Keeps `code`, compiled at `now`, unless it alone is over a quarter of the byte bound.
    pub(crate) fn insert(&mut self, key: CacheKey, code: Bytecode, now: Instant) {
        if code.len() > self.config.max_bytes / 4 {
            return;
        }
        self.bytes += code.len();
        if let Some(old) = self.entries.insert(key, Entry { code, compiled_at: now }) {
            self.bytes -= old.code.len();
        }
        self.order.push_back((key, now));
        self.evict();
    }

    fn evict(&mut self) {
        while self.entries.len() > self.config.max_entries || self.bytes > self.config.max_bytes {
            let Some((key, at)) = self.order.pop_front() else { break };
            if self.entries.get(&key).is_some_and(|entry| entry.compiled_at == at) {
                if let Some(old) = self.entries.remove(&key) {
                    self.bytes -= old.code.len();
                }
            }
        }
        // Expired and replaced entries leave their old place in `order` behind.
        if self.order.len() > 2 * self.entries.len() + 16 {
            let entries = &self.entries;
            self.order.retain(|(key, at)| entries.get(key).is_some_and(|entry| entry.compiled_at == *at));
        }
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.entries.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sandbox::engine::Engine;
    use std::time::Duration;

    fn key(n: u8) -> CacheKey {
        CacheKey { source: [n; 32], engine: [0; 32] }
    }

    fn code(engine: &Engine, source: &str) -> Bytecode {
        engine.compile(source).unwrap()
    }

    #[test]
    fn entries_expire_at_their_age_on_a_controlled_clock() {
        let engine = Engine::new().unwrap();
        let mut cache = BytecodeCache::new(BytecodeCacheConfig::new().max_age(Duration::from_secs(60)));
        let start = Instant::now();
        cache.insert(key(1), code(&engine, "return 1"), start);
        assert!(cache.get(&key(1), start + Duration::from_secs(60)).is_some());
        assert!(cache.get(&key(1), start + Duration::from_secs(61)).is_none(), "older than the max age");
        assert!(cache.get(&key(1), start).is_none(), "an expired entry is gone");
        cache.insert(key(1), code(&engine, "return 1"), start + Duration::from_secs(61));
        assert!(cache.get(&key(1), start + Duration::from_secs(62)).is_some(), "recompiled, fresh again");
    }

    #[test]
    fn the_engine_version_is_part_of_the_key() {
        let engine = Engine::new().unwrap();
        let mut cache = BytecodeCache::new(BytecodeCacheConfig::new());
        let now = Instant::now();
        cache.insert(key(1), code(&engine, "return 1"), now);
        let other_engine = CacheKey { engine: [9; 32], ..key(1) };
        assert!(cache.get(&other_engine, now).is_none());
    }

    #[test]
    fn entries_and_bytes_are_bounded_oldest_first() {
        let engine = Engine::new().unwrap();
        let mut cache = BytecodeCache::new(BytecodeCacheConfig::new().max_entries(3));
        let now = Instant::now();
        for n in 0..10u8 {
            cache.insert(key(n), code(&engine, &format!("return {n}")), now + Duration::from_millis(n.into()));
        }
        assert_eq!(cache.len(), 3);
        assert!(cache.get(&key(6), now).is_none());
        assert!(cache.get(&key(9), now).is_some());

        let big = code(&engine, &format!("return '{}'", "x".repeat(3_000)));
        assert!(big.len() <= 16 * 1024, "{}", big.len());
        let mut cache = BytecodeCache::new(BytecodeCacheConfig::new().max_bytes(64 * 1024));
        for n in 0..20u8 {
            cache.insert(key(n), big.clone(), now);
        }
        assert!(cache.bytes <= 64 * 1024 && cache.len() == (64 * 1024) / big.len(), "{} bytes", cache.bytes);
        cache.configure(BytecodeCacheConfig::new().max_bytes(64 * 1024).max_entries(1));
        assert_eq!((cache.len(), cache.bytes), (1, big.len()));
    }

    #[test]
    fn expiring_entries_do_not_grow_the_order_list() {
        let engine = Engine::new().unwrap();
        let mut cache = BytecodeCache::new(BytecodeCacheConfig::new().max_age(Duration::from_millis(1)));
        let start = Instant::now();
        let source = code(&engine, "return 1");
        for i in 0..1000u64 {
            let now = start + Duration::from_millis(10 * i);
            assert!(cache.get(&key(1), now).is_none());
            cache.insert(key(1), source.clone(), now);
        }
        assert!(cache.order.len() <= 18, "{}", cache.order.len());
    }
}
