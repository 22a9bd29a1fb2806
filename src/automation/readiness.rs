//! Whether the service can do its work now, for `/readyz`: the database answers, its schema is
//! this build's, and a script worker starts and runs.

use std::time::Duration;

use resumable_runner::{Limit, LimitOverrides, RunRequest};
use serde::Serialize;

use super::Automations;

/// How long the database check may take.
const DATABASE_CHECK: Duration = Duration::from_secs(3);

/// How long the worker check may take.
const WORKER_CHECK: Duration = Duration::from_secs(5);

/// The isolation key of the worker check's runs: no tenant's worker process runs them.
const CHECK_ISOLATION: &str = "resumable.readiness";

/// Each check: `None` when it passed, or why it did not.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Readiness {
    /// The database answered.
    pub database: Option<String>,
    /// The schema is this build's.
    pub migrations: Option<String>,
    /// A script ran in a worker.
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
        match tokio::time::timeout(DATABASE_CHECK, self.db.schema_is_current()).await {
            Ok(Ok(Ok(()))) => {}
            Ok(Ok(Err(why))) => readiness.migrations = Some(why),
            Ok(Err(e)) => {
                readiness.database = Some(format!("the database does not answer: {e}"));
                readiness.migrations = unknown();
            }
            Err(_) => {
                readiness.database = Some(format!("the database did not answer within {DATABASE_CHECK:?}"));
                readiness.migrations = unknown();
            }
        }
        readiness.worker = self.worker_check().await.err();
        readiness
    }

    /// Runs a trivial script the way automations run theirs (in a worker process, when the
    /// service uses them).
    async fn worker_check(&self) -> Result<(), String> {
        let limits = LimitOverrides::new()
            .with(Limit::Timeout, WORKER_CHECK.as_millis() as i128)
            .map_err(|e| format!("the check's limits: {e}"))?;
        let request = RunRequest::new("return 1 + 1").limits(limits).isolation(CHECK_ISOLATION);
        match tokio::time::timeout(WORKER_CHECK * 2, self.runner.run(request)).await {
            Ok(Ok(outcome)) if outcome.completed().is_some_and(|c| c.value == serde_json::json!(2)) => Ok(()),
            Ok(Ok(_)) => Err("the check's script did not complete".to_owned()),
            Ok(Err(e)) => Err(format!("a worker could not run a script: {} ({})", e.message, e.code.as_str())),
            Err(_) => Err(format!("no worker ran a script within {:?}", WORKER_CHECK * 2)),
        }
    }
}
