//! Per-tenant quotas: how many automations of a tenant may be running or queued at once, and how
//! many of its sessions live, so that one tenant cannot fill every worker and the queue. A
//! submission past its tenant's quota is refused (`QUOTA_EXCEEDED`) and nothing starts.
//!
//! A quota is checked when a submission arrives, against the automations that have not ended:
//! submissions that arrive at the same moment may together pass it by their number.

use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};

use resumable_workflow::{Engine, EngineError, RunFilter, RunStatus};

/// One tenant's quotas (none by default).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TenantQuota {
    /// Automations not ended yet (queued, running, or waiting for a decision) at once.
    pub max_automations: Option<usize>,
    /// Sessions live at once.
    pub max_sessions: Option<usize>,
}

/// Every tenant's quotas; clones share one table, which a reload replaces.
#[derive(Clone, Debug, Default)]
pub struct Quotas {
    table: Arc<RwLock<Arc<BTreeMap<String, TenantQuota>>>>,
}

impl Quotas {
    /// The quotas of these tenants (others have none).
    pub fn new(tenants: BTreeMap<String, TenantQuota>) -> Quotas {
        Quotas { table: Arc::new(RwLock::new(Arc::new(tenants))) }
    }

    /// Makes `other`'s table this one's (and every clone's) from now on.
    pub fn replace_with(&self, other: &Quotas) {
        let table = Arc::clone(&other.table.read().unwrap_or_else(|e| e.into_inner()));
        *self.table.write().unwrap_or_else(|e| e.into_inner()) = table;
    }

    /// `tenant`'s quotas.
    pub fn of(&self, tenant: &str) -> TenantQuota {
        self.table.read().unwrap_or_else(|e| e.into_inner()).get(tenant).copied().unwrap_or_default()
    }
}

/// Whether `tenant` has fewer than `max` runs of `workflow` that have not ended: `Err` with
/// their count (at least `max`) when it has not.
pub(crate) async fn below(
    engine: &Engine,
    tenant: &str,
    workflow: &str,
    max: usize,
) -> Result<Result<(), usize>, EngineError> {
    let mut live = 0;
    let mut cursor = None;
    loop {
        let filter = RunFilter {
            statuses: vec![RunStatus::Pending, RunStatus::Running, RunStatus::Waiting],
            cursor,
            limit: Some(u32::try_from(max - live).unwrap_or(u32::MAX).min(RunFilter::MAX_LIMIT)),
            ..RunFilter::default().feed(tenant).workflow(workflow)
        };
        let page = engine.list_runs(&filter).await?;
        live += page.runs.len();
        if live >= max {
            return Ok(Err(live));
        }
        match page.next_cursor {
            Some(next) => cursor = Some(next),
            None => return Ok(Ok(())),
        }
    }
}
