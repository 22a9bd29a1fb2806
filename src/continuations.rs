//! Single-use continuations kept in the application database (SQLite or PostgreSQL), for the
//! runner's stored codec: a token is a random key and resumes at most once.

use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use resumable_runner::{ClaimId, ContinuationStore, ContinuationStoreError, StoreFuture, StoredContinuation};

use crate::db::{AppDb, DbError, Row, duration_ms, from_ms, now_ms, to_ms};
use crate::fault::{self, FaultPoint};

/// A [`ContinuationStore`] on the application database. Every operation is one atomic statement
/// whose conditions decide (a claim is exclusive while unexpired; only the current claim consumes
/// or releases); nothing is checked first and written after.
#[derive(Clone, Debug)]
pub struct SqlContinuationStore {
    db: AppDb,
}

fn backend(e: DbError) -> ContinuationStoreError {
    ContinuationStoreError::Backend(e.to_string())
}

fn claim_text(claim: ClaimId) -> String {
    format!("{claim:032x}")
}

fn record(row: &Row) -> Result<StoredContinuation, ContinuationStoreError> {
    Ok(StoredContinuation {
        audience: row.get("audience").map_err(backend)?,
        expires_at: from_ms(row.get("expires_at").map_err(backend)?),
        state: row.get("state").map_err(backend)?,
    })
}

impl SqlContinuationStore {
    /// A store on `db` (whose migrations created the table).
    pub fn new(db: AppDb) -> SqlContinuationStore {
        SqlContinuationStore { db }
    }

    /// Makes a continuation that an earlier attempt claimed or consumed resumable again, at once,
    /// whatever that claim's lease: for the server-side owner of a token whose resume a crash
    /// interrupted before its outcome was recorded. Only a later attempt of the durable step that
    /// resumes the token may call this: the token never leaves the server, so nobody else holds
    /// it, and the engine fences the earlier attempt (only one attempt records the round's
    /// outcome; host functions see the same idempotency keys in both). Returns whether there was
    /// a claim or a use to undo.
    pub async fn take_over(&self, token: &str) -> Result<bool, ContinuationStoreError> {
        let Some(key) = URL_SAFE_NO_PAD.decode(token).ok().filter(|k| k.len() == 32) else {
            return Err(ContinuationStoreError::NotFound);
        };
        let reopened = self
            .db
            .execute(
                "UPDATE continuations SET status = 'available', claim = NULL, claim_until = NULL
                 WHERE key = $1 AND status IN ('claimed', 'consumed') AND expires_at > $2",
                vec![key.into(), now_ms().into()],
            )
            .await
            .map_err(backend)?;
        Ok(reopened == 1)
    }

    /// Deletes continuations that expired before `now - grace`; returns how many.
    pub async fn purge_expired(&self, grace: Duration) -> Result<u64, ContinuationStoreError> {
        let cutoff = now_ms().saturating_sub(duration_ms(grace));
        self.db.execute("DELETE FROM continuations WHERE expires_at < $1", vec![cutoff.into()]).await.map_err(backend)
    }

    /// Why `key` could not be acquired, consumed or released: the row's current state.
    async fn diagnose(&self, key: &[u8; 32], claim: Option<ClaimId>) -> ContinuationStoreError {
        let row = self
            .db
            .fetch_optional(
                "SELECT status, claim, claim_until, expires_at FROM continuations WHERE key = $1",
                vec![key.to_vec().into()],
            )
            .await;
        let row = match row {
            Ok(Some(row)) => row,
            Ok(None) => return ContinuationStoreError::NotFound,
            Err(e) => return backend(e),
        };
        let status: String = row.get("status").unwrap_or_default();
        let holder: Option<String> = row.get("claim").unwrap_or_default();
        let until: Option<i64> = row.get("claim_until").unwrap_or_default();
        let expires_at: i64 = row.get("expires_at").unwrap_or_default();
        let now = now_ms();
        match (status.as_str(), claim) {
            ("consumed", _) => ContinuationStoreError::Consumed,
            (_, None) if expires_at <= now => ContinuationStoreError::Expired,
            ("claimed", None) if until.is_some_and(|u| u > now) => ContinuationStoreError::Claimed,
            (_, Some(c)) if holder != Some(claim_text(c)) => ContinuationStoreError::ClaimLost,
            _ => ContinuationStoreError::Backend(format!("continuation in unexpected state {status:?}")),
        }
    }
}

impl ContinuationStore for SqlContinuationStore {
    fn set(&self, key: [u8; 32], record: StoredContinuation) -> StoreFuture<'_, ()> {
        Box::pin(async move {
            let inserted = self
                .db
                .execute(
                    "INSERT INTO continuations (key, audience, expires_at, state, status, created_at)
                     VALUES ($1, $2, $3, $4, 'available', $5) ON CONFLICT (key) DO NOTHING",
                    vec![
                        key.to_vec().into(),
                        record.audience.into(),
                        to_ms(record.expires_at).into(),
                        record.state.into(),
                        now_ms().into(),
                    ],
                )
                .await
                .map_err(backend)?;
            if inserted == 1 { Ok(()) } else { Err(ContinuationStoreError::Duplicate) }
        })
    }

    fn acquire(&self, key: [u8; 32], claim: ClaimId, lease: Duration) -> StoreFuture<'_, StoredContinuation> {
        Box::pin(async move {
            let now = now_ms();
            let until = now.saturating_add(duration_ms(lease));
            let row = self
                .db
                .fetch_optional(
                    "UPDATE continuations SET status = 'claimed', claim = $1, claim_until = $2
                     WHERE key = $3 AND expires_at > $4
                       AND (status = 'available' OR (status = 'claimed' AND claim_until <= $4))
                     RETURNING audience, expires_at, state",
                    vec![claim_text(claim).into(), until.into(), key.to_vec().into(), now.into()],
                )
                .await
                .map_err(backend)?;
            match row {
                Some(row) => {
                    let record = record(&row);
                    fault::reached(FaultPoint::ContinuationClaimed);
                    record
                }
                None => Err(self.diagnose(&key, None).await),
            }
        })
    }

    fn consume(&self, key: [u8; 32], claim: ClaimId) -> StoreFuture<'_, ()> {
        Box::pin(async move {
            fault::reached(FaultPoint::BeforeConsume);
            let consumed = self
                .db
                .execute(
                    "UPDATE continuations SET status = 'consumed', claim_until = NULL
                     WHERE key = $1 AND status = 'claimed' AND claim = $2",
                    vec![key.to_vec().into(), claim_text(claim).into()],
                )
                .await
                .map_err(backend)?;
            if consumed == 1 { Ok(()) } else { Err(self.diagnose(&key, Some(claim)).await) }
        })
    }

    fn release(&self, key: [u8; 32], claim: ClaimId) -> StoreFuture<'_, ()> {
        Box::pin(async move {
            let released = self
                .db
                .execute(
                    "UPDATE continuations SET status = 'available', claim = NULL, claim_until = NULL
                     WHERE key = $1 AND status = 'claimed' AND claim = $2",
                    vec![key.to_vec().into(), claim_text(claim).into()],
                )
                .await
                .map_err(backend)?;
            if released == 1 { Ok(()) } else { Err(self.diagnose(&key, Some(claim)).await) }
        })
    }

    fn peek(&self, key: [u8; 32]) -> StoreFuture<'_, StoredContinuation> {
        Box::pin(async move {
            let row = self
                .db
                .fetch_optional(
                    "SELECT audience, expires_at, state FROM continuations
                     WHERE key = $1 AND status <> 'consumed' AND expires_at > $2",
                    vec![key.to_vec().into(), now_ms().into()],
                )
                .await
                .map_err(backend)?;
            match row {
                Some(row) => record(&row),
                None => Err(self.diagnose(&key, None).await),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::TempDb;

    #[tokio::test]
    async fn behaves_like_every_continuation_store() {
        let db = TempDb::sqlite().await;
        resumable_runner::check_continuation_store(&SqlContinuationStore::new(db.open().await)).await;
        if let Some(db) = TempDb::postgres().await {
            resumable_runner::check_continuation_store(&SqlContinuationStore::new(db.open().await)).await;
        }
    }

    #[tokio::test]
    async fn a_later_attempt_takes_over_a_claim_or_a_use_at_once() {
        let db = TempDb::sqlite().await;
        let store = SqlContinuationStore::new(db.open().await);
        let key = [5u8; 32];
        let token = URL_SAFE_NO_PAD.encode(key);
        let record = StoredContinuation {
            audience: "a".into(),
            expires_at: std::time::SystemTime::now() + Duration::from_secs(60),
            state: vec![9],
        };
        let lease = Duration::from_secs(600);
        store.set(key, record).await.unwrap();
        assert!(!store.take_over(&token).await.unwrap(), "an unused token has nothing to take over");
        // Attempt 1 claims for ten minutes and is never heard from again.
        store.acquire(key, 1, lease).await.unwrap();
        assert_eq!(
            store.acquire(key, 2, lease).await,
            Err(ContinuationStoreError::Claimed),
            "another resumer is refused"
        );
        // Attempt 2 takes the claim over at once and proceeds; attempt 1 can no longer use it.
        assert!(store.take_over(&token).await.unwrap());
        assert_eq!(store.acquire(key, 3, lease).await.unwrap().state, vec![9]);
        assert_eq!(store.consume(key, 1).await, Err(ContinuationStoreError::ClaimLost));
        assert_eq!(store.acquire(key, 4, lease).await, Err(ContinuationStoreError::Claimed));
        store.consume(key, 3).await.unwrap();
        assert_eq!(store.acquire(key, 4, lease).await, Err(ContinuationStoreError::Consumed));
        // Attempt 3, after attempt 2 consumed it and died before recording its outcome.
        assert!(store.take_over(&token).await.unwrap());
        store.acquire(key, 5, lease).await.unwrap();
        store.consume(key, 5).await.unwrap();
        assert_eq!(store.take_over("not-a-token").await, Err(ContinuationStoreError::NotFound));
    }
}
