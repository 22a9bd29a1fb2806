//! Which automations of a tenant wait for a decision: an indexed table, so that listing a
//! tenant's approvals reads that tenant's rows, not every run.
//!
//! A round that asks for approval adds its row inside its own step (idempotently, so a retried
//! step adds nothing twice); the next round of the same automation removes it. An automation
//! cancelled while it waits leaves its row, and the list drops it the first time it reads it.
//! The server also adds every waiting automation when it starts
//! ([`Automations::index_waiting`](super::Automations::index_waiting)), which lists those that
//! waited before the table existed.

use crate::db::{AppDb, DbError, now_ms};

/// The index, on the application database.
#[derive(Clone, Debug)]
pub(crate) struct ApprovalIndex {
    db: AppDb,
}

impl ApprovalIndex {
    pub(crate) fn new(db: AppDb) -> ApprovalIndex {
        ApprovalIndex { db }
    }

    /// Round `round` of `automation` (of `tenant`) asks for approval.
    pub(crate) async fn add(&self, tenant: &str, automation: &str, round: u32) -> Result<(), DbError> {
        self.db
            .execute(
                "INSERT INTO approval_index (automation_id, round, tenant, requested_at) VALUES ($1, $2, $3, $4)
                 ON CONFLICT (automation_id, round) DO NOTHING",
                vec![automation.into(), i64::from(round).into(), tenant.into(), now_ms().into()],
            )
            .await?;
        Ok(())
    }

    /// `automation` waits for nothing any more (its rounds so far were decided).
    pub(crate) async fn remove(&self, automation: &str) -> Result<(), DbError> {
        self.db.execute("DELETE FROM approval_index WHERE automation_id = $1", vec![automation.into()]).await?;
        Ok(())
    }

    /// The automations of `tenant` that asked for approval, oldest request first (at most `limit`,
    /// after skipping `offset`).
    pub(crate) async fn waiting(&self, tenant: &str, limit: usize, offset: usize) -> Result<Vec<String>, DbError> {
        let rows = self
            .db
            .fetch_all(
                "SELECT automation_id FROM approval_index WHERE tenant = $1
                 ORDER BY requested_at, automation_id LIMIT $2 OFFSET $3",
                vec![
                    tenant.into(),
                    i64::try_from(limit).unwrap_or(i64::MAX).into(),
                    i64::try_from(offset).unwrap_or(i64::MAX).into(),
                ],
            )
            .await?;
        rows.iter().map(|row| row.get::<String>("automation_id")).collect()
    }
}
