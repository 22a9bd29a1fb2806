//! The record of delivery attempts: one row per attempt, read back newest first.

use serde::Serialize;

use crate::db::{AppDb, DbError, now_ms};

/// One attempt to deliver an event.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct DeliveryAttempt {
    /// The subscription.
    pub subscription: String,
    /// The delivery's `webhook-id`, the same on every attempt.
    pub webhook_id: String,
    /// The automation whose event it is.
    pub automation_id: String,
    /// The event's `type`.
    pub event: String,
    /// The attempt (1 for the first).
    pub attempt: u32,
    /// `delivered`, `failed` (retried later), `rejected` (the receiver refused it for good) or
    /// `dropped` (the subscription is no longer configured).
    pub outcome: String,
    /// The receiver's HTTP status, when it answered.
    pub http_status: Option<u16>,
    /// What went wrong, when something did.
    pub error: Option<String>,
    /// How long the attempt took.
    pub duration_ms: i64,
    /// When it was made (ms since the epoch).
    pub at: i64,
}

/// The attempts, on the application database.
#[derive(Clone, Debug)]
pub struct DeliveryLog {
    db: AppDb,
}

impl DeliveryLog {
    /// The log on `db`.
    pub fn new(db: AppDb) -> DeliveryLog {
        DeliveryLog { db }
    }

    /// Records `attempt` of `tenant`.
    pub async fn record(&self, tenant: &str, attempt: &DeliveryAttempt) -> Result<(), DbError> {
        self.db
            .execute(
                "INSERT INTO webhook_attempts (tenant, subscription, webhook_id, automation_id, event_type, attempt,
                 outcome, http_status, error, duration_ms, at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)",
                vec![
                    tenant.into(),
                    attempt.subscription.as_str().into(),
                    attempt.webhook_id.as_str().into(),
                    attempt.automation_id.as_str().into(),
                    attempt.event.as_str().into(),
                    i64::from(attempt.attempt).into(),
                    attempt.outcome.as_str().into(),
                    attempt.http_status.map(i64::from).into(),
                    attempt.error.clone().into(),
                    attempt.duration_ms.into(),
                    now_ms().into(),
                ],
            )
            .await?;
        Ok(())
    }

    /// The newest `limit` attempts of `tenant`, newest first.
    pub async fn recent(&self, tenant: &str, limit: usize) -> Result<Vec<DeliveryAttempt>, DbError> {
        let rows = self
            .db
            .fetch_all(
                "SELECT subscription, webhook_id, automation_id, event_type, attempt, outcome, http_status, error,
                 duration_ms, at FROM webhook_attempts WHERE tenant = $1 ORDER BY id DESC LIMIT $2",
                vec![tenant.into(), i64::try_from(limit).unwrap_or(i64::MAX).into()],
            )
            .await?;
        rows.iter()
            .map(|row| {
                Ok(DeliveryAttempt {
                    subscription: row.get("subscription")?,
                    webhook_id: row.get("webhook_id")?,
                    automation_id: row.get("automation_id")?,
                    event: row.get("event_type")?,
                    attempt: u32::try_from(row.get::<i64>("attempt")?).unwrap_or(u32::MAX),
                    outcome: row.get("outcome")?,
                    http_status: row.get::<Option<i64>>("http_status")?.and_then(|s| u16::try_from(s).ok()),
                    error: row.get("error")?,
                    duration_ms: row.get("duration_ms")?,
                    at: row.get("at")?,
                })
            })
            .collect()
    }
}
