//! Whether the service can do its work now, for `/readyz`: the database answers, its schema is
//! this build's (or a later release's, during a rolling upgrade), and scripts run.
//!
//! A busy service is ready: when worker processes are running scripts, that is the proof, and a
//! check that finds every worker taken does not count against it. What went wrong is logged; the
//! answer says only which check failed, since `/readyz` needs no key.

use std::time::Duration;

use resumable_runner::{ErrorCode, Limit, LimitOverrides, RunRequest};
use serde::Serialize;

use super::Automations;
use crate::db::SchemaState;

/// How long the database check may take.
const DATABASE_CHECK: Duration = Duration::from_secs(3);

/// How long the worker check may take.
const WORKER_CHECK: Duration = Duration::from_secs(5);

/// The isolation key of the worker check's runs: no tenant's worker process runs them.
const CHECK_ISOLATION: &str = "resumable.readiness";

/// Each check: `None` when it passed, or what failed (without details, which are logged).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Readiness {
    /// The database answered.
    pub database: Option<String>,
    /// The schema is this build's or a later release's.
    pub migrations: Option<String>,
    /// A script ran in a worker, or workers are running scripts.
    pub worker: Option<String>,
}

impl Readiness {
    /// Whether every check passed.
    pub fn is_ready(&self) -> bool {
        self.database.is_none() && self.migrations.is_none() && self.worker.is_none()
    }
}

impl Automations {
    /// Runs the readiness checks.
    pub async fn readiness(&self) -> Readiness {
        let mut readiness = Readiness::default();
        let unknown = || Some("unknown: the database does not answer".to_owned());
        match tokio::time::timeout(DATABASE_CHECK, self.db.schema()).await {
            Ok(Ok(SchemaState::Current)) => {}
            Ok(Ok(SchemaState::Newer(what))) => {
                tracing::warn!(%what, "a later release migrated the database: upgrade this server");
            }
            Ok(Ok(SchemaState::Older(what))) => {
                tracing::warn!(%what, "not ready: the database is not migrated");
                readiness.migrations = Some("the database is not migrated to this build's schema".to_owned());
            }
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "not ready: the database does not answer");
                readiness.database = Some("the database does not answer".to_owned());
                readiness.migrations = unknown();
            }
            Err(_) => {
                tracing::warn!(within = ?DATABASE_CHECK, "not ready: the database did not answer in time");
                readiness.database = Some(format!("the database did not answer within {DATABASE_CHECK:?}"));
                readiness.migrations = unknown();
            }
        }
        if let Err(e) = self.worker_check().await {
            tracing::warn!(error = %e, "not ready: scripts do not run");
            readiness.worker = Some("a script could not run in a worker".to_owned());
        }
        readiness
    }

    /// Runs a trivial script the way automations run theirs (in a worker process, when the
    /// service uses them), unless workers are running scripts already.
    async fn worker_check(&self) -> Result<(), String> {
        if self.runner.stats().processes_busy > 0 {
            return Ok(());
        }
        let limits = LimitOverrides::new()
            .with(Limit::Timeout, WORKER_CHECK.as_millis() as i128)
            .map_err(|e| format!("the check's limits: {e}"))?;
        let request = RunRequest::new("return 1 + 1").limits(limits).isolation(CHECK_ISOLATION);
        match tokio::time::timeout(WORKER_CHECK * 2, self.runner.run(request)).await {
            Ok(Ok(outcome)) if outcome.completed().is_some_and(|c| c.value == serde_json::json!(2)) => Ok(()),
            Ok(Ok(_)) => Err("the check's script did not complete".to_owned()),
            // Every worker is taken and the queue is full: busy, not broken.
            Ok(Err(e)) if e.code == ErrorCode::ConcurrencyLimit => Ok(()),
            Ok(Err(e)) => Err(format!("{} ({})", e.message, e.code.as_str())),
            Err(_) => Err(format!("no worker ran the check's script within {:?}", WORKER_CHECK * 2)),
        }
    }
}
