//! The service's figures at one moment, for `/metrics`: automations not ended yet by status,
//! pending approvals and the webhook backlog, read from the database, and the script runner's
//! counters.

use super::{AutomationError, Automations, WORKFLOW};
use crate::metrics::Gauges;
use crate::webhook::WORKFLOW as WEBHOOK_WORKFLOW;

/// Automations not ended yet, by status (every tenant's), from the index on status.
const BY_STATUS: &str = "SELECT status, COUNT(*) AS n FROM runs
    WHERE status IN ('pending', 'running', 'waiting') AND workflow = $1 GROUP BY status";

/// Rounds that wait for a decision.
const PENDING: &str = "SELECT COUNT(*) AS n FROM approval_index";

/// Deliveries that have not started, or wait to retry an attempt that failed.
const BACKLOG: &str = "SELECT COUNT(*) AS n FROM runs r
    WHERE r.workflow = $1 AND r.status IN ('pending', 'running', 'waiting')
      AND (r.status = 'pending'
           OR EXISTS (SELECT 1 FROM steps s WHERE s.run_id = r.id AND s.status = 'retrying'))";

impl Automations {
    /// The figures `/metrics` publishes, read now.
    pub async fn gauges(&self) -> Result<Gauges, AutomationError> {
        let internal = |e: crate::db::DbError| AutomationError::Internal(e.to_string());
        let count = |n: i64| u64::try_from(n).unwrap_or_default();
        let mut automations = Vec::new();
        for row in self.db.fetch_all(BY_STATUS, vec![WORKFLOW.into()]).await.map_err(internal)? {
            automations.push((row.get::<String>("status").map_err(internal)?, count(row.get("n").map_err(internal)?)));
        }
        let pending = self.db.fetch_one(PENDING, vec![]).await.map_err(internal)?;
        let backlog = self.db.fetch_one(BACKLOG, vec![WEBHOOK_WORKFLOW.into()]).await.map_err(internal)?;
        Ok(Gauges {
            automations,
            pending_approvals: count(pending.get("n").map_err(internal)?),
            webhook_backlog: count(backlog.get("n").map_err(internal)?),
        })
    }

    /// The script runner's counters and worker processes now.
    pub fn runner_stats(&self) -> resumable_runner::RunnerStats {
        self.runner.stats()
    }
}
