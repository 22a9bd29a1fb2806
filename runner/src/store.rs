//! Where stored (single-use) continuations live.
//!
//! With the stored codec a token is only a random key; the state stays in a
//! [`ContinuationStore`]. A resume *acquires* the key (a claim that expires,
//! so a crashed resumer does not lock it forever), validates everything,
//! *consumes* it before the first host function runs, and *releases* the
//! claim on any failure before that point, so a failed or aborted resume does
//! not burn the token and a used token never resumes twice.

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Mutex;
use std::time::{Duration, SystemTime};

use crate::clock::Clock;

/// The future every store operation returns.
pub type StoreFuture<'a, T> = Pin<Box<dyn Future<Output = Result<T, ContinuationStoreError>> + Send + 'a>>;

/// Identifies one claim, so only its holder can consume or release it.
pub type ClaimId = u128;

/// A continuation as a store keeps it.
#[derive(Clone, PartialEq, Eq)]
pub struct StoredContinuation {
    /// Who may resume it.
    pub audience: String,
    /// After this instant it can no longer be acquired.
    pub expires_at: SystemTime,
    /// The encoded (and compressed) state.
    pub state: Vec<u8>,
}

impl fmt::Debug for StoredContinuation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StoredContinuation")
            .field("audience", &self.audience)
            .field("expires_at", &self.expires_at)
            .field("state_bytes", &self.state.len())
            .finish()
    }
}

/// Why a store operation failed.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ContinuationStoreError {
    /// No continuation under this key.
    NotFound,
    /// Someone else holds an unexpired claim on it.
    Claimed,
    /// It was used already.
    Consumed,
    /// It expired.
    Expired,
    /// The claim given is not the current one (it expired and was taken over).
    ClaimLost,
    /// The key exists already (`set` never overwrites).
    Duplicate,
    /// The backend failed; the message is for operators.
    Backend(String),
}

impl fmt::Display for ContinuationStoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ContinuationStoreError::NotFound => f.write_str("no such continuation"),
            ContinuationStoreError::Claimed => f.write_str("the continuation is being resumed by someone else"),
            ContinuationStoreError::Consumed => f.write_str("the continuation was used already"),
            ContinuationStoreError::Expired => f.write_str("the continuation has expired"),
            ContinuationStoreError::ClaimLost => f.write_str("the claim on the continuation expired and was lost"),
            ContinuationStoreError::Duplicate => f.write_str("a continuation with this key exists already"),
            ContinuationStoreError::Backend(message) => write!(f, "continuation store failed: {message}"),
        }
    }
}

impl std::error::Error for ContinuationStoreError {}

/// Atomic storage for single-use continuations. Implementations must make
/// `acquire` exclusive: of any number of concurrent calls for one key, at most
/// one succeeds while its claim is valid.
pub trait ContinuationStore: Send + Sync + 'static {
    /// Saves a new continuation; never overwrites (`Duplicate`).
    fn set(&self, key: [u8; 32], record: StoredContinuation) -> StoreFuture<'_, ()>;
    /// Claims the continuation for `lease` and returns it.
    fn acquire(&self, key: [u8; 32], claim: ClaimId, lease: Duration) -> StoreFuture<'_, StoredContinuation>;
    /// Marks it used; only the current claim may.
    fn consume(&self, key: [u8; 32], claim: ClaimId) -> StoreFuture<'_, ()>;
    /// Gives the claim up; the continuation can be acquired again.
    fn release(&self, key: [u8; 32], claim: ClaimId) -> StoreFuture<'_, ()>;
    /// Reads it without claiming (for inspection).
    fn peek(&self, key: [u8; 32]) -> StoreFuture<'_, StoredContinuation>;
}

enum Status {
    Available,
    Claimed { claim: ClaimId, until: SystemTime },
    Consumed,
}

struct Entry {
    record: StoredContinuation,
    status: Status,
}

/// A process-local [`ContinuationStore`], for tests and single-process embedding.
/// Entries are dropped lazily once expired.
#[derive(Default)]
pub struct MemoryContinuationStore {
    entries: Mutex<HashMap<[u8; 32], Entry>>,
    clock: Clock,
}

impl MemoryContinuationStore {
    /// An empty store on the system clock.
    pub fn new() -> Self {
        Self::default()
    }

    /// An empty store that tells expired records and claims by `clock`.
    pub fn with_clock(clock: Clock) -> Self {
        MemoryContinuationStore { entries: Mutex::default(), clock }
    }

    fn with<T>(
        &self,
        f: impl FnOnce(&mut HashMap<[u8; 32], Entry>) -> Result<T, ContinuationStoreError>,
    ) -> Result<T, ContinuationStoreError> {
        let mut entries = self.entries.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        f(&mut entries)
    }
}

impl fmt::Debug for MemoryContinuationStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let count = self.with(|e| Ok(e.len())).unwrap_or(0);
        f.debug_struct("MemoryContinuationStore").field("entries", &count).finish()
    }
}

impl ContinuationStore for MemoryContinuationStore {
    fn set(&self, key: [u8; 32], record: StoredContinuation) -> StoreFuture<'_, ()> {
        let result = self.with(|entries| {
            let now = self.clock.now();
            entries.retain(|_, e| e.record.expires_at > now);
            if entries.contains_key(&key) {
                return Err(ContinuationStoreError::Duplicate);
            }
            entries.insert(key, Entry { record, status: Status::Available });
            Ok(())
        });
        Box::pin(async move { result })
    }

    fn acquire(&self, key: [u8; 32], claim: ClaimId, lease: Duration) -> StoreFuture<'_, StoredContinuation> {
        let result = self.with(|entries| {
            let entry = entries.get_mut(&key).ok_or(ContinuationStoreError::NotFound)?;
            let now = self.clock.now();
            if entry.record.expires_at <= now {
                return Err(ContinuationStoreError::Expired);
            }
            match entry.status {
                Status::Consumed => return Err(ContinuationStoreError::Consumed),
                Status::Claimed { until, .. } if until > now => return Err(ContinuationStoreError::Claimed),
                Status::Claimed { .. } | Status::Available => {}
            }
            entry.status = Status::Claimed { claim, until: now + lease };
            Ok(entry.record.clone())
        });
        Box::pin(async move { result })
    }

    fn consume(&self, key: [u8; 32], claim: ClaimId) -> StoreFuture<'_, ()> {
        let result = self.with(|entries| {
            let entry = entries.get_mut(&key).ok_or(ContinuationStoreError::NotFound)?;
            match entry.status {
                Status::Claimed { claim: current, .. } if current == claim => {
                    entry.status = Status::Consumed;
                    Ok(())
                }
                Status::Consumed => Err(ContinuationStoreError::Consumed),
                _ => Err(ContinuationStoreError::ClaimLost),
            }
        });
        Box::pin(async move { result })
    }

    fn release(&self, key: [u8; 32], claim: ClaimId) -> StoreFuture<'_, ()> {
        let result = self.with(|entries| {
            let entry = entries.get_mut(&key).ok_or(ContinuationStoreError::NotFound)?;
            match entry.status {
                Status::Claimed { claim: current, .. } if current == claim => {
                    entry.status = Status::Available;
                    Ok(())
                }
                Status::Consumed => Err(ContinuationStoreError::Consumed),
                _ => Err(ContinuationStoreError::ClaimLost),
            }
        });
        Box::pin(async move { result })
    }

    fn peek(&self, key: [u8; 32]) -> StoreFuture<'_, StoredContinuation> {
        let result = self.with(|entries| {
            let entry = entries.get(&key).ok_or(ContinuationStoreError::NotFound)?;
            match entry.status {
                Status::Consumed => Err(ContinuationStoreError::Consumed),
                _ if entry.record.expires_at <= self.clock.now() => Err(ContinuationStoreError::Expired),
                _ => Ok(entry.record.clone()),
            }
        });
        Box::pin(async move { result })
    }
}

/// Checks the behaviour every [`ContinuationStore`] must have, panicking on the first
/// difference: exclusive claims, consume and release only by the current claim, single use,
/// expired claims taken over, expired records refused. For implementations' tests; it writes the
/// keys `[7; 32]`, `[8; 32]` and `[9; 32]`.
#[doc(hidden)]
pub async fn check_continuation_store(store: &dyn ContinuationStore) {
    let record = |ttl: Duration| StoredContinuation {
        audience: "a".into(),
        expires_at: SystemTime::now() + ttl,
        state: vec![1, 2, 3],
    };
    let lease = Duration::from_secs(5);
    let key = [7u8; 32];
    store.set(key, record(Duration::from_secs(60))).await.unwrap();
    assert_eq!(store.set(key, record(Duration::from_secs(60))).await, Err(ContinuationStoreError::Duplicate));
    assert_eq!(store.peek(key).await.unwrap().state, vec![1, 2, 3]);
    assert_eq!(store.acquire(key, 1, lease).await.unwrap().state, vec![1, 2, 3]);
    assert_eq!(store.acquire(key, 2, lease).await, Err(ContinuationStoreError::Claimed));
    assert_eq!(store.consume(key, 2).await, Err(ContinuationStoreError::ClaimLost));
    store.release(key, 1).await.unwrap();
    store.acquire(key, 3, lease).await.unwrap();
    store.consume(key, 3).await.unwrap();
    assert_eq!(store.acquire(key, 4, lease).await, Err(ContinuationStoreError::Consumed));
    assert_eq!(store.peek(key).await, Err(ContinuationStoreError::Consumed));
    assert_eq!(store.acquire([0; 32], 5, lease).await, Err(ContinuationStoreError::NotFound));

    let key = [9u8; 32];
    store.set(key, record(Duration::from_secs(60))).await.unwrap();
    store.acquire(key, 1, Duration::ZERO).await.unwrap();
    store.acquire(key, 2, lease).await.unwrap();
    assert_eq!(store.consume(key, 1).await, Err(ContinuationStoreError::ClaimLost), "the old claimant lost it");
    let old = [8u8; 32];
    store.set(old, record(Duration::ZERO)).await.unwrap();
    assert_eq!(store.acquire(old, 1, lease).await, Err(ContinuationStoreError::Expired));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn memory_store_behaves_like_every_store() {
        check_continuation_store(&MemoryContinuationStore::new()).await;
    }

    #[tokio::test]
    async fn a_memory_store_tells_expiry_by_its_clock() {
        let long_ago = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        let record =
            StoredContinuation { audience: "a".into(), expires_at: long_ago + Duration::from_secs(60), state: vec![1] };
        let then = MemoryContinuationStore::with_clock(Clock::fixed(long_ago));
        then.set([1; 32], record.clone()).await.unwrap();
        assert_eq!(then.peek([1; 32]).await.unwrap(), record);
        assert_eq!(then.acquire([1; 32], 1, Duration::from_secs(5)).await.unwrap(), record);
        let now = MemoryContinuationStore::new();
        now.set([1; 32], record).await.unwrap();
        assert_eq!(now.peek([1; 32]).await, Err(ContinuationStoreError::Expired));
    }
}
