//! Approval-gated automations: scripts that act on a tenant's data through host functions and
//! stop for a human decision before any effect that needs one, durably.
//!
//! An automation is a run of the built-in workflow [`WORKFLOW`]. Each *round* runs the script
//! (first from the top, then resumed from the previous round's continuation with the decisions)
//! as a memoized step. When a round is interrupted, the automation emits `approval_requested`,
//! creates a hook whose metadata names the tenant, the automation, the round and the pending
//! requests, and waits, holding no memory, for a [`DecisionBatch`] that decides every pending
//! request exactly once. Continuations use the runner's stored codec on the application
//! database, so each is resumed once; effects in host functions use the call's idempotency key.
//!
//! The automation's stream carries `approval_requested`, `decided`, `completed` and `failed`
//! events (each a JSON object with a `type`).

mod approval_index;
mod decision;
mod event;
mod expiry;
mod gauges;
mod history;
mod host_calls;
mod interruption_id;
mod quotas;
mod readiness;
mod round;
mod tenant_feed;
mod token;
mod view;
mod workflow;

use std::sync::Arc;

use resumable_runner::{Runner, RunnerConfig, StoredCodec};
use resumable_workflow::{
    Engine, EngineBuilder, EngineError, EventKind, RunId, RunInfo, RunStatus, StartOptions, Store, StreamReader,
};
use serde_json::Value;

pub use decision::{Decision, DecisionBatch, InvalidDecisions, MAX_REASON_CHARS};
pub use event::{AutomationEvent, HookMetadata};
pub use expiry::{APPROVAL_EXPIRED, Deadline, EXPIRED_REASON, ExpiryPolicies, ExpiryPolicy, OnExpiry, SYSTEM_ACTOR};
pub use history::{AutomationSummary, MAX_PAGE as MAX_HISTORY_PAGE, Page};
pub use host_calls::{CallOutcome, HostCall, MAX_RECORDED_BYTES, MAX_RECORDED_CALLS, RoundCall};
pub use interruption_id::InterruptionId;
pub(crate) use quotas::below as quotas_below;
pub use quotas::{Quotas, TenantQuota};
pub use readiness::Readiness;
pub use round::RequestProgress;
pub use tenant_feed::{Source, TenantEvent, TenantFeed};
pub use token::HookTokens;
pub use view::{AutomationError, AutomationView, PendingApproval, RoundRecord};
pub use workflow::{AutomationInput, HostProvider, PendingRequest, WORKFLOW};

use crate::audit::{Actor, Audit, AuditEntry};
use crate::connector::{APPROVAL_KIND, Connectors};
use crate::continuations::SqlContinuationStore;
use crate::db::AppDb;
use crate::session::{SessionState, Sessions, WORKFLOW as SESSION_WORKFLOW, run_session};
use crate::webhook::{
    DeliveryAttempt, DeliveryDeps, DeliveryLog, WORKFLOW as WEBHOOK_WORKFLOW, Webhooks, run_delivery,
};
use approval_index::ApprovalIndex;
use round::{Refusal, RoundProgress};
use view::EventLog;
use workflow::{Deps, run_automation};
pub(crate) use workflow::{EngineSlot, engine_of};

/// How long an automation's stored continuation stays resumable: as long as its request may
/// wait, which is for ever (about a century, as a time the database can hold).
pub const CONTINUATION_LIFETIME: std::time::Duration = std::time::Duration::from_secs(100 * 365 * 24 * 3600);

/// The default policy version bound into continuations.
pub const DEFAULT_POLICY_VERSION: &str = "1";

/// Automations that execute at once unless [`AutomationsBuilder::concurrency`] says otherwise.
/// Executions mostly wait on the database (their own steps, and their scripts' host calls), so
/// this is well above the number of cores; a runner worker that waits costs no CPU.
pub const DEFAULT_CONCURRENCY: usize = 64;

/// Builds [`Automations`].
pub struct AutomationsBuilder {
    store: Arc<dyn Store>,
    db: AppDb,
    secret: Vec<u8>,
    host: HostProvider,
    connectors: Option<Connectors>,
    runner: RunnerConfig,
    concurrency: usize,
    engine: Option<Box<dyn FnOnce(EngineBuilder) -> EngineBuilder + Send>>,
    max_rounds: u32,
    policy_version: String,
    expiry: ExpiryPolicies,
    quotas: Quotas,
    webhooks: Option<Webhooks>,
}

impl AutomationsBuilder {
    /// The host functions of each tenant's scripts (none by default).
    pub fn host(mut self, host: impl Fn(&str) -> resumable_host::HostFunctions + Send + Sync + 'static) -> Self {
        self.host = Arc::new(host);
        self
    }

    /// HTTP connectors the scripts may call beside the [`host`](Self::host) functions, each with
    /// its approval policy (see [`crate::connector`]).
    pub fn connectors(mut self, connectors: Connectors) -> Self {
        self.connectors = Some(connectors);
        self
    }

    /// Each tenant's quotas (none by default). Keep a clone to change them later with
    /// [`Quotas::replace_with`].
    pub fn quotas(mut self, quotas: Quotas) -> Self {
        self.quotas = quotas;
        self
    }

    /// When requests expire and their approvers are reminded (never by default). Keep a clone
    /// to change them later with [`ExpiryPolicies::replace_with`].
    pub fn expiry(mut self, policies: ExpiryPolicies) -> Self {
        self.expiry = policies;
        self
    }

    /// Where the tenants' automation events are delivered (nowhere by default). Keep a clone to
    /// change them later with [`Webhooks::replace_with`].
    pub fn webhooks(mut self, webhooks: Webhooks) -> Self {
        self.webhooks = Some(webhooks);
        self
    }

    /// The runner's configuration. Its codec is replaced by the stored codec on the database,
    /// and its worker count by the service's [`concurrency`](Self::concurrency).
    pub fn runner(mut self, config: RunnerConfig) -> Self {
        self.runner = config;
        self
    }

    /// How many automations execute at once ([`DEFAULT_CONCURRENCY`] by default): the engine's
    /// workers and the runner's workers both. An execution runs one script at a time, and a
    /// script keeps its runner worker while its host calls wait on the database, so a runner
    /// with fewer workers than the engine would make executions queue for it.
    pub fn concurrency(mut self, executions: usize) -> Self {
        self.concurrency = executions.max(1);
        self
    }

    /// Adjusts the workflow engine (lease, poll interval, more workflows; its workers are the
    /// service's [`concurrency`](Self::concurrency) unless set here).
    pub fn engine(mut self, configure: impl FnOnce(EngineBuilder) -> EngineBuilder + Send + 'static) -> Self {
        self.engine = Some(Box::new(configure));
        self
    }

    /// How many rounds of approvals one automation may ask for (100 by default).
    pub fn max_rounds(mut self, rounds: u32) -> Self {
        self.max_rounds = rounds.max(1);
        self
    }

    /// The policy version bound into the continuations' scope.
    pub fn policy_version(mut self, version: impl Into<String>) -> Self {
        self.policy_version = version.into();
        self
    }

    /// Starts the engine (on the current Tokio runtime) with the automation workflow registered.
    pub fn build(self) -> Result<Automations, AutomationError> {
        if self.secret.len() < 32 {
            return Err(AutomationError::Config("the secret must have at least 32 bytes".into()));
        }
        let connectors = match self.connectors {
            Some(connectors) => connectors,
            None => Connectors::none().map_err(|e| AutomationError::Config(e.to_string()))?,
        };
        let continuations = SqlContinuationStore::new(self.db.clone());
        let approvals = ApprovalIndex::new(self.db.clone());
        // A request may wait for ever, so its continuation must not expire before it does.
        let codec = StoredCodec::new(Arc::new(continuations.clone())).ttl(CONTINUATION_LIFETIME);
        let runner = Runner::new(self.runner.workers(self.concurrency).codec(codec))
            .map_err(|e| AutomationError::Config(e.to_string()))?;
        let tokens = HookTokens::new(&self.secret);
        let state = SessionState::new(self.db.clone());
        let audit = Audit::new(self.db.clone());
        let deps = Arc::new(Deps {
            runner: runner.clone(),
            continuations,
            host: self.host,
            connectors: connectors.clone(),
            approvals: approvals.clone(),
            tokens: tokens.clone(),
            max_rounds: self.max_rounds,
            sessions: state.clone(),
            expiry: self.expiry,
            engine: Arc::new(std::sync::OnceLock::new()),
            audit: audit.clone(),
        });
        let webhooks = match self.webhooks {
            Some(webhooks) => webhooks,
            None => Webhooks::none().map_err(|e| AutomationError::Config(e.to_string()))?,
        };
        let deliveries = DeliveryLog::new(self.db.clone());
        let delivery_deps = Arc::new(DeliveryDeps {
            webhooks: webhooks.clone(),
            log: deliveries.clone(),
            tokens: tokens.clone(),
            engine: Arc::clone(&deps.engine),
        });
        let workflow_deps = Arc::clone(&deps);
        let session_deps = Sessions::deps(state.clone(), tokens.clone(), Arc::clone(&self.store));
        let mut builder = Engine::builder(self.store)
            .register(WORKFLOW, move |ctx, input| {
                let deps = Arc::clone(&deps);
                async move { run_automation(deps, ctx, input).await }
            })
            .register(SESSION_WORKFLOW, move |ctx, input| {
                let deps = Arc::clone(&session_deps);
                async move { run_session(deps, ctx, input).await }
            })
            .register(WEBHOOK_WORKFLOW, move |ctx, input| {
                let deps = Arc::clone(&delivery_deps);
                async move { run_delivery(deps, ctx, input).await }
            });
        builder = builder.workers(self.concurrency);
        if let Some(configure) = self.engine {
            builder = configure(builder);
        }
        let engine = builder.build();
        let _ = workflow_deps.engine.set(engine.downgrade());
        let sessions = Sessions::new(
            engine.clone(),
            tokens.clone(),
            state,
            self.policy_version.clone(),
            audit.clone(),
            self.quotas.clone(),
        );
        Ok(Automations {
            engine,
            tokens,
            policy_version: self.policy_version,
            sessions,
            connectors,
            approvals,
            webhooks,
            deliveries,
            audit,
            runner,
            db: self.db,
            quotas: self.quotas,
        })
    }
}

/// The automation service: submit scripts, list and decide approvals, follow events.
#[derive(Clone, Debug)]
pub struct Automations {
    engine: Engine,
    tokens: HookTokens,
    policy_version: String,
    sessions: Sessions,
    connectors: Connectors,
    approvals: ApprovalIndex,
    webhooks: Webhooks,
    deliveries: DeliveryLog,
    audit: Audit,
    runner: Runner,
    db: AppDb,
    quotas: Quotas,
}

impl Automations {
    /// Starts building the service on a workflow `store` and the application database `db`
    /// (usually the same database), with the `secret` that hook tokens derive from.
    pub fn builder(store: Arc<dyn Store>, db: AppDb, secret: &[u8]) -> AutomationsBuilder {
        AutomationsBuilder {
            store,
            db,
            secret: secret.to_vec(),
            host: Arc::new(|_| resumable_host::HostFunctions::empty()),
            connectors: None,
            runner: RunnerConfig::new(),
            concurrency: DEFAULT_CONCURRENCY,
            engine: None,
            max_rounds: 100,
            policy_version: DEFAULT_POLICY_VERSION.to_owned(),
            expiry: ExpiryPolicies::default(),
            quotas: Quotas::default(),
            webhooks: None,
        }
    }

    /// The workflow engine underneath.
    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    /// The HTTP connectors the scripts may call (reload them to change them for new rounds).
    pub fn connectors(&self) -> &Connectors {
        &self.connectors
    }

    /// Where the tenants' events are delivered.
    pub fn webhooks(&self) -> &Webhooks {
        &self.webhooks
    }

    /// The newest `limit` webhook delivery attempts of `tenant`, newest first.
    pub async fn deliveries(&self, tenant: &str, limit: usize) -> Result<Vec<DeliveryAttempt>, AutomationError> {
        self.deliveries.recent(tenant, limit).await.map_err(|e| AutomationError::Internal(e.to_string()))
    }

    /// The session service on the same engine.
    pub fn sessions(&self) -> &Sessions {
        &self.sessions
    }

    /// The tenants' audit log, on the same database.
    pub fn audit(&self) -> &Audit {
        &self.audit
    }

    /// Submits a script for `tenant`; returns the automation's id at once (it runs in the
    /// background). With an idempotency key, a repeated submission returns the first one's id.
    ///
    /// The submission is recorded in the tenant's audit log, once per automation (a repeated
    /// submission adds nothing); if it cannot be, the answer is [`AutomationError::Audit`] (the
    /// automation was started: submitting again with the same idempotency key records it).
    pub async fn submit(
        &self,
        tenant: &str,
        source: &str,
        context: Value,
        submitted_by: impl Into<Actor>,
        idempotency_key: Option<String>,
    ) -> Result<RunId, AutomationError> {
        if let Some(max) = self.quotas.of(tenant).max_automations
            && let Err(live) = quotas::below(&self.engine, tenant, WORKFLOW, max).await?
        {
            return Err(AutomationError::QuotaExceeded(format!(
                "tenant {tenant} has {live} automations under way, its quota is {max}: retry when some have ended"
            )));
        }
        let by = submitted_by.into();
        let input = AutomationInput {
            tenant: tenant.to_owned(),
            source: source.to_owned(),
            context,
            policy_version: self.policy_version.clone(),
            submitted_by: by.name.clone(),
            session: None,
            timeout_ms: None,
            webhooks: self.webhooks.subscribed(tenant),
        };
        let input = serde_json::to_value(&input).map_err(|e| AutomationError::Internal(e.to_string()))?;
        // As the store gives it back, so that a repeated submission compares equal to it.
        let input = resumable_workflow::store::stored_form(&input);
        let keyed = idempotency_key.is_some();
        let entry_key = idempotency_key.clone();
        let options = StartOptions {
            idempotency_key: idempotency_key.map(|k| format!("{tenant}:{k}")),
            feed: Some(tenant.into()),
        };
        let id = self.engine.start(WORKFLOW, input.clone(), options).await?;
        if keyed {
            // A key reused for a different script is a client error, not the same submission.
            let existing = self.engine.get_run(&id).await?;
            let same = |field: &str| existing.input.get(field) == input.get(field);
            if !(same("source") && same("context") && same("tenant")) {
                return Err(AutomationError::IdempotencyConflict);
            }
        }
        let entry = AuditEntry::submission(by, id.as_str(), source, entry_key.as_deref());
        self.record(tenant, entry).await?;
        Ok(id)
    }

    /// Appends `entry` to the audit log of `tenant`, after the act it records succeeded.
    async fn record(&self, tenant: &str, entry: AuditEntry) -> Result<(), AutomationError> {
        match self.audit.record(tenant, entry).await {
            Ok(_) => Ok(()),
            Err(e) => {
                tracing::error!(tenant, error = %e, "an act was done but its audit entry could not be written");
                Err(AutomationError::Audit(e.to_string()))
            }
        }
    }

    /// The automation `id` of `tenant`; [`AutomationError::WrongTenant`] for another tenant's.
    pub async fn get(&self, tenant: &str, id: &RunId) -> Result<AutomationView, AutomationError> {
        self.view(tenant, id, true).await
    }

    /// The automation's view, with the host calls its rounds made when `with_calls` (which reads
    /// the engine's whole log of the run).
    async fn view(&self, tenant: &str, id: &RunId, with_calls: bool) -> Result<AutomationView, AutomationError> {
        let (run, input) = self.owned_run(tenant, id).await?;
        let log = EventLog::read(&self.engine, id).await?;
        let pending = match log.open_round() {
            Some((round, requests)) if !run.status.is_terminal() => {
                match self.engine.get_hook(&self.tokens.for_round(id.as_str(), round)).await? {
                    Some(hook) => {
                        let payloads = self.engine.hook_payloads(id, hook.position, hook.received).await?;
                        let progress = RoundProgress::replay(&requests, &payloads);
                        (!progress.is_decided()).then(|| PendingApproval {
                            automation_id: id.clone(),
                            round,
                            requests,
                            progress: progress.requests,
                            requested_at: hook.created_at,
                            submitted_by: input.submitted_by.clone(),
                        })
                    }
                    None => None,
                }
            }
            _ => None,
        };
        let calls = if with_calls { host_calls::recorded_calls(&self.engine.events(id).await?) } else { Vec::new() };
        Ok(AutomationView::new(run, input, pending, &log, calls))
    }

    /// The automation run `id` and its input, when it belongs to `tenant`.
    async fn owned_run(&self, tenant: &str, id: &RunId) -> Result<(RunInfo, AutomationInput), AutomationError> {
        let run = self.engine.get_run(id).await.map_err(not_found)?;
        let input: AutomationInput = match (run.workflow.as_str(), serde_json::from_value(run.input.clone())) {
            (WORKFLOW, Ok(input)) => input,
            _ => return Err(AutomationError::NotFound),
        };
        if input.tenant != tenant {
            return Err(AutomationError::WrongTenant);
        }
        Ok((run, input))
    }

    /// The pending approvals of `tenant`, oldest first (at most `limit`), read from the tenant's
    /// rows of the approval index; a row whose automation no longer waits is dropped.
    pub async fn pending_approvals(&self, tenant: &str, limit: usize) -> Result<Vec<PendingApproval>, AutomationError> {
        let internal = |e: crate::db::DbError| AutomationError::Internal(e.to_string());
        let mut approvals = Vec::new();
        // An automation may have two rows for a moment (a round's and a stale one): each once.
        let mut seen = std::collections::BTreeSet::new();
        let mut ended = Vec::new();
        let (mut offset, page) = (0, limit.clamp(1, 200));
        loop {
            let ids = self.approvals.waiting(tenant, page, offset).await.map_err(internal)?;
            offset += ids.len();
            for id in ids.iter().filter(|id| seen.insert((*id).clone())) {
                let id = RunId::from(id.clone());
                match self.view(tenant, &id, false).await {
                    Ok(view) if view.pending.is_some() => approvals.extend(view.pending),
                    // Ended while it waited (cancelled, say): its rows stay behind until now.
                    Ok(view) if view.status.is_terminal() => ended.push(id),
                    // Decided and moving on, or not suspended yet: not pending right now.
                    Ok(_) | Err(AutomationError::NotFound | AutomationError::WrongTenant) => {}
                    Err(e) => return Err(e),
                }
            }
            if ids.len() < page || approvals.len() >= limit {
                break;
            }
        }
        for id in ended {
            self.approvals.remove(id.as_str()).await.map_err(internal)?;
        }
        approvals.sort_by_key(|a| a.requested_at);
        approvals.truncate(limit);
        Ok(approvals)
    }

    /// Adds every automation that waits for a decision to the approval index (those of a
    /// database made before the index were never added; the others are there already, and stay
    /// as they are). Reads the waiting automations once; returns how many wait.
    pub async fn index_waiting(&self) -> Result<usize, AutomationError> {
        let internal = |e: crate::db::DbError| AutomationError::Internal(e.to_string());
        let mut filter = resumable_workflow::RunFilter::default()
            .workflow(WORKFLOW)
            .status(RunStatus::Waiting)
            .limit(resumable_workflow::RunFilter::MAX_LIMIT);
        let mut added = 0;
        loop {
            let page = self.engine.list_runs(&filter).await?;
            for run in &page.runs {
                let Some(tenant) = run.input.get("tenant").and_then(Value::as_str) else { continue };
                if let Some(pending) = self.view(tenant, &run.id, false).await?.pending {
                    self.approvals.add(tenant, run.id.as_str(), pending.round).await.map_err(internal)?;
                    added += 1;
                }
            }
            match page.next_cursor {
                Some(cursor) => filter.cursor = Some(cursor),
                None => return Ok(added),
            }
        }
    }

    /// Delivers a decision batch for the open round of automation `id`, after checking that the
    /// hook's metadata names `tenant` and this automation, and that the batch decides some of
    /// the round's pending requests, each at most once (see [`RoundProgress`]).
    ///
    /// The answer depends only on what was decided, never on timing: a batch that names a
    /// request decided already (or decided by its actor already), in this round or an earlier
    /// one, is [`AutomationError::AlreadyDecided`], whether it repeats or contradicts that
    /// decision, arrives concurrently or after a retry, and even after the automation ended.
    /// [`AutomationError::Ended`] is only for ids that were never decided in an automation that
    /// has ended.
    ///
    /// The decider (`batch.actor`, holding `roles`) must hold a role that may decide each request:
    /// one of a connector's `approvers`, or [`APPROVER_ROLE`] for any other request; and a
    /// connector with `four_eyes` refuses its submitter ([`AutomationError::FourEyes`]).
    ///
    /// A batch that counted is recorded in the tenant's audit log with the decider and the id of
    /// the API key they decided with (`key_id`), and nothing else is; if it cannot be, the answer
    /// is [`AutomationError::Audit`] (the batch counted).
    pub async fn decide(
        &self,
        tenant: &str,
        id: &RunId,
        batch: DecisionBatch,
        roles: &[&str],
        key_id: Option<&str>,
    ) -> Result<u32, AutomationError> {
        let (run, input) = self.owned_run(tenant, id).await?;
        if self.all_decided(id, &batch).await? {
            return Err(AutomationError::AlreadyDecided);
        }
        if run.status.is_terminal() {
            return Err(AutomationError::Ended(run.status));
        }
        match self.deliver(tenant, id, &batch, |pending| authorize(pending, &batch, roles, &input.submitted_by)).await {
            Ok((round, received)) => {
                let by = Actor { name: batch.actor.clone(), key_id: key_id.map(str::to_owned) };
                let entry = AuditEntry::decision(by, id.as_str(), round, &batch.decisions)
                    .dedup_key(format!("decision:{id}:{round}:{received}"));
                self.record(tenant, entry).await?;
                Ok(round)
            }
            // The round may have moved on, or the automation ended, since the first look: what
            // was decided meanwhile decides the answer.
            Err(AutomationError::Invalid(_) | AutomationError::NotWaiting | AutomationError::AlreadyDecided)
                if self.all_decided(id, &batch).await? =>
            {
                Err(AutomationError::AlreadyDecided)
            }
            // The round's hook is gone: the automation ended, or has not asked yet.
            Err(AutomationError::NotWaiting) => match self.engine.get_run(id).await?.status {
                status if status.is_terminal() => Err(AutomationError::Ended(status)),
                _ => Err(AutomationError::NotWaiting),
            },
            // The batches before this one decided a request it names (or its actor decided it).
            Err(e) => Err(e),
        }
    }

    /// Delivers `batch` to the open round's hook, if it counts there: [`AutomationError::AlreadyDecided`]
    /// when the batches before it decided a request it names, [`AutomationError::NotWaiting`]
    /// when the round's hook is gone. Answers the round and the batch's index among the hook's.
    async fn deliver(
        &self,
        tenant: &str,
        id: &RunId,
        batch: &DecisionBatch,
        authorize: impl FnOnce(&[PendingRequest]) -> Result<(), AutomationError>,
    ) -> Result<(u32, u64), AutomationError> {
        let log = EventLog::read(&self.engine, id).await?;
        let Some((round, _)) = log.open_round() else { return Err(AutomationError::NotWaiting) };
        let token = self.tokens.for_round(id.as_str(), round);
        let Some(hook) = self.engine.get_hook(&token).await? else { return Err(AutomationError::NotWaiting) };
        let metadata = HookMetadata::of(&hook.metadata)
            .ok_or_else(|| AutomationError::Internal("the round's hook has no automation metadata".into()))?;
        if metadata.tenant != tenant || metadata.automation != id.as_str() || hook.run_id != *id {
            return Err(AutomationError::WrongTenant);
        }
        let pending = metadata.pending;
        let refused = |refusal| match refusal {
            Refusal::Invalid(e) => AutomationError::Invalid(e),
            Refusal::AlreadyDecided => AutomationError::AlreadyDecided,
        };
        let received = self.engine.hook_payloads(id, hook.position, hook.received).await?;
        RoundProgress::replay(&pending, &received).check(batch).map_err(refused)?;
        authorize(&pending)?;
        let receipt = match self.engine.resume_hook(&token, batch.to_value()).await {
            Ok(receipt) => receipt,
            // Disposed meanwhile: the automation ended.
            Err(EngineError::HookNotFound) => return Err(AutomationError::NotWaiting),
            Err(e) => return Err(e.into()),
        };
        // Whether the batch counts depends only on the batches the hook received before it,
        // which the workflow folds in the same order.
        let before = self.engine.hook_payloads(id, hook.position, receipt.index).await?;
        let mut progress = RoundProgress::replay(&pending, &before);
        progress.check(batch).map_err(refused)?;
        if progress.apply(batch).is_ok() && progress.is_decided() {
            crate::metrics::approval_settled(false, hook.created_at);
        }
        Ok((round, receipt.index))
    }

    /// Whether every interruption `batch` names was decided already, or by `batch`'s actor
    /// already, in the latest round that asked for it (the engine's log records each round's hook
    /// and payloads). An interruption id recurs when a resumed call interrupts again; a batch
    /// naming it then decides the later round.
    async fn all_decided(&self, id: &RunId, batch: &DecisionBatch) -> Result<bool, AutomationError> {
        if batch.decisions.is_empty() {
            return Ok(false);
        }
        let events = self.engine.events(id).await?;
        let received = |position: u64| {
            let of_hook = |e: &&resumable_workflow::Event| e.payload["position"].as_u64() == Some(position);
            events.iter().filter(|e| e.kind == EventKind::HookReceived).filter(of_hook).count() as u64
        };
        // The rounds that asked, oldest first: their hook's position and requests.
        let rounds: Vec<(u32, Vec<PendingRequest>)> = events
            .iter()
            .filter(|e| e.kind == EventKind::HookCreated)
            .filter_map(|e| {
                let position = u32::try_from(e.payload["position"].as_u64()?).ok()?;
                let metadata = HookMetadata::of(&e.payload["metadata"])?;
                (metadata.automation == id.as_str()).then_some((position, metadata.pending))
            })
            .collect();
        // The payloads of a round are read only if the batch names one of its requests.
        let mut progress_of: std::collections::BTreeMap<u32, RoundProgress> = std::collections::BTreeMap::new();
        for d in &batch.decisions {
            let asked = |(_, pending): &&(u32, Vec<PendingRequest>)| {
                pending.iter().any(|r| r.interruption_id == d.interruption_id)
            };
            let Some((position, pending)) = rounds.iter().rev().find(asked) else { return Ok(false) };
            if !progress_of.contains_key(position) {
                let payloads = self.engine.hook_payloads(id, *position, received(u64::from(*position))).await?;
                progress_of.insert(*position, RoundProgress::replay(pending, &payloads));
            }
            let progress = &progress_of[position];
            if !progress.decides(&d.interruption_id) && !progress.decided_by(&d.interruption_id, &batch.actor) {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// Cancels automation `id` of `tenant` for `by`; returns its status afterwards. The cancel
    /// is recorded in the tenant's audit log with that status; if it cannot be, the answer is
    /// [`AutomationError::Audit`] (the automation was cancelled).
    pub async fn cancel(&self, tenant: &str, id: &RunId, by: impl Into<Actor>) -> Result<RunStatus, AutomationError> {
        let (run, _) = self.owned_run(tenant, id).await?;
        if run.status.is_terminal() {
            return Err(AutomationError::Ended(run.status));
        }
        let status = self.engine.cancel(id).await?;
        self.record(tenant, AuditEntry::cancel(by, id.as_str(), &status.to_string())).await?;
        Ok(status)
    }

    /// The events of every automation and session of `tenant`, from cursor `from` on (1, or 0, is
    /// the first), in the order they committed, then live.
    pub fn feed(&self, tenant: &str, from: u64) -> TenantFeed {
        TenantFeed::new(self.engine.read_feed(tenant, from))
    }

    /// The cursor of the last event of `tenant`'s feed (0 before its first).
    pub async fn feed_head(&self, tenant: &str) -> Result<u64, AutomationError> {
        Ok(self.engine.feed_head(tenant).await?)
    }

    /// The events of automation `id` of `tenant` from index `from`, live until it ends.
    pub async fn events(&self, tenant: &str, id: &RunId, from: u64) -> Result<StreamReader, AutomationError> {
        self.owned_run(tenant, id).await?;
        Ok(self.engine.read_stream(id, from).await?)
    }
}

/// The role that may decide any request but a connector's that names its own approvers.
pub const APPROVER_ROLE: &str = "approver";

/// Whether a decider holding `roles` may decide each request `batch` decides in `pending`.
fn authorize(
    pending: &[PendingRequest],
    batch: &DecisionBatch,
    roles: &[&str],
    submitted_by: &str,
) -> Result<(), AutomationError> {
    for decision in &batch.decisions {
        let Some(request) = pending.iter().find(|p| p.interruption_id == decision.interruption_id) else { continue };
        if let Some(refused) = refusal(request, roles, &batch.actor, submitted_by) {
            return Err(refused);
        }
    }
    Ok(())
}

/// Why `actor`, holding `roles`, may not decide `pending` of an automation `submitted_by`
/// submitted, if they may not: [`AutomationError::NotApprover`] without a role its function names
/// (`approver` for a function that names none), [`AutomationError::FourEyes`] for their own
/// submission of a function that needs four eyes.
fn refusal(pending: &PendingRequest, roles: &[&str], actor: &str, submitted_by: &str) -> Option<AutomationError> {
    let (id, request) = (&pending.interruption_id, &pending.request);
    let approvers: Vec<&str> = if request["kind"] == APPROVAL_KIND {
        request["approvers"].as_array().into_iter().flatten().filter_map(Value::as_str).collect()
    } else {
        vec![APPROVER_ROLE]
    };
    if !roles.iter().any(|role| approvers.contains(role)) {
        return Some(AutomationError::NotApprover(id.clone()));
    }
    if request["kind"] == APPROVAL_KIND && request["fourEyes"] == Value::Bool(true) && actor == submitted_by {
        return Some(AutomationError::FourEyes(id.clone()));
    }
    None
}

fn not_found(e: EngineError) -> AutomationError {
    match e {
        EngineError::RunNotFound(_) => AutomationError::NotFound,
        other => other.into(),
    }
}
