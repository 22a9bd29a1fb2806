//! The built-in automation workflow: rounds of the script, each a step; between rounds a hook
//! waits for the decision batch on the round's pending requests.

use std::sync::Arc;

use resumable_runner::{Limit, LimitOverrides, Outcome, Resolution, RunError, RunRequest, Runner};
use resumable_workflow::{StepContext, StepError, WorkflowContext, WorkflowError};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use tracing::Instrument as _;

use super::approval_index::ApprovalIndex;
use super::decision::{Decision, DecisionBatch};
use super::event::{AutomationEvent, HookMetadata};
use super::expiry::{self, Alarm, Deadline, EXPIRED_REASON, ExpiryPolicies, OnExpiry, Reminded, SYSTEM_ACTOR};
use super::host_calls::{CallLog, CallOutcome, HostCall};
use super::interruption_id::InterruptionId;
use super::round::RoundProgress;
use super::token::HookTokens;
use crate::audit::{Actor, Audit, AuditEntry};
use crate::connector::{CallScope, Connectors};
use crate::continuations::SqlContinuationStore;
use crate::fault::{self, FaultPoint};
use crate::session::SessionState;
use crate::webhook::{Publisher, Subscribed};
use resumable_host::HostFunctions;

/// The name the automation workflow is registered under.
pub const WORKFLOW: &str = "resumable.automation";

/// The audience of automation continuations.
pub(crate) const AUDIENCE: &str = "resumable-automation";

/// Builds the host functions a tenant's scripts may call.
pub type HostProvider = Arc<dyn Fn(&str) -> HostFunctions + Send + Sync>;

/// What an automation is started with (the workflow's input).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AutomationInput {
    /// The tenant whose data the script acts on.
    pub tenant: String,
    /// The script: a function body.
    pub source: String,
    /// JSON the script can read as `context`... bound into the continuation's scope.
    #[serde(default)]
    pub context: Value,
    /// The policy version the automation runs under (part of the continuation's scope).
    pub policy_version: String,
    /// Who submitted it.
    #[serde(default)]
    pub submitted_by: String,
    /// The session this automation is a command of: its script gets `session.*` functions on
    /// that session's state.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session: Option<String>,
    /// The time cap of each round's run in milliseconds (the runner's limit when absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
    /// The tenant's webhook subscriptions when it was submitted: they receive its events.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub webhooks: Vec<Subscribed>,
}

/// A pending request of a round, as approvers see it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PendingRequest {
    /// The interruption to decide.
    pub interruption_id: InterruptionId,
    /// The host function that asked.
    pub function: String,
    /// What it asked for (for a refund: `{kind, orderId, amount}`).
    pub request: Value,
    /// When it expires and how often its approvers are reminded (absent when never).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deadline: Option<Deadline>,
}

/// The name of the step that runs a round of the script.
pub(crate) const ROUND_STEP: &str = "round";

/// How one round of the script ended, as recorded by its step.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "status", rename_all = "snake_case")]
enum RoundResult {
    Completed {
        value: Value,
        console: Vec<Value>,
        /// The host calls the round made (rounds of earlier releases recorded none).
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        calls: Vec<HostCall>,
    },
    /// Rounds recorded by earlier releases also name the connectors they ran with
    /// (`connectors`), which later rounds were limited to; that field is ignored now: a
    /// continuation is bound to the functions its ledger called, each checked on resume.
    Interrupted {
        continuation: String,
        pending: Vec<PendingRequest>,
        console: Vec<Value>,
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        calls: Vec<HostCall>,
    },
    Failed {
        code: String,
        message: String,
        console: Vec<Value>,
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        calls: Vec<HostCall>,
    },
}

/// What the next round resumes from: the continuation and the decisions.
struct Resume {
    continuation: String,
    resolutions: Vec<Resolution>,
}

/// What the automation workflow needs.
pub(crate) struct Deps {
    pub(crate) runner: Runner,
    pub(crate) continuations: SqlContinuationStore,
    pub(crate) approvals: ApprovalIndex,
    pub(crate) host: HostProvider,
    pub(crate) connectors: Connectors,
    pub(crate) tokens: HookTokens,
    pub(crate) max_rounds: u32,
    pub(crate) sessions: SessionState,
    pub(crate) expiry: ExpiryPolicies,
    /// The engine the workflow runs on, set once it is built: the system delivers its own
    /// decisions on expiry to a round's hook through it.
    pub(crate) engine: EngineSlot,
    /// The tenants' audit log: the connectors record their requests in it, and the workflow may
    /// record the system's own acts ([`Audit::record`]).
    pub(crate) audit: Audit,
}

fn console_json(outcome_console: &[resumable_runner::ConsoleLine]) -> Vec<Value> {
    outcome_console.iter().map(|l| json!({ "level": l.level, "text": l.text })).collect()
}

/// The tenant's host functions plus `automation.context()`, which returns the JSON the automation
/// was submitted with (part of the continuation's scope, so every round sees the same value), and
/// for a session's command the `session.*` functions on its state.
fn with_context(
    hosts: &[HostFunctions],
    context: &Value,
    session: Option<(&SessionState, &str)>,
    calls: &CallLog,
) -> Result<HostFunctions, StepError> {
    let mut builder = HostFunctions::builder();
    if let Some((state, session)) = session {
        builder = state.register(builder, session);
    }
    for (host, (name, signature)) in hosts.iter().flat_map(|host| host.signatures().map(move |f| (host, f))) {
        let (host, name_owned, calls) = (host.clone(), name.to_owned(), calls.clone());
        builder = builder.function_with_signature(name, signature.clone(), move |ctx, args| {
            let resumed = ctx.resume().is_some();
            let arguments = args.clone();
            let call = host.call(&name_owned, ctx, args);
            let (name, calls) = (name_owned.clone(), calls.clone());
            async move {
                let (started_at, started) = (std::time::SystemTime::now(), std::time::Instant::now());
                let result = call.await;
                let took = started.elapsed();
                calls.record(&name, &arguments, &result, started_at, took);
                let outcome = match &result {
                    Ok(_) => CallOutcome::Ok,
                    Err(e) if e.is_interrupt() => CallOutcome::Interrupted,
                    Err(_) => CallOutcome::Error,
                };
                crate::metrics::host_call(&name, outcome.as_str(), took);
                if resumed {
                    fault::reached(FaultPoint::AfterHostCall);
                }
                result
            }
        });
    }
    let context = context.clone();
    builder = builder.function(CONTEXT_FUNCTION, move |_ctx, _args| {
        let context = context.clone();
        async move { Ok(context) }
    });
    builder.build().map_err(|e| StepError::fatal(format!("host functions: {e}")))
}

/// The engine the workflows run on, set once it is built; weak, so that dropping the last
/// [`Engine`](resumable_workflow::Engine) handle still stops it.
pub(crate) type EngineSlot = Arc<std::sync::OnceLock<resumable_workflow::WeakEngine>>;

/// The engine of `slot`, for a step (retried while it starts; fatal once it has stopped).
pub(crate) fn engine_of(slot: &EngineSlot) -> Result<resumable_workflow::Engine, StepError> {
    let weak = slot.get().ok_or_else(|| StepError::retryable("the engine is starting"))?;
    weak.upgrade().ok_or_else(|| StepError::fatal("the engine has stopped"))
}

/// The host function through which a script reads its automation's context.
pub const CONTEXT_FUNCTION: &str = "automation.context";

/// `CODE: message`, the error text of a failed automation (the API splits it again).
pub(crate) fn error_text(code: &str, message: &str) -> String {
    format!("{code}: {message}")
}

impl Deps {
    /// Runs one round: the first run of the script, or its resumption with the decisions.
    async fn round(
        &self,
        input: &AutomationInput,
        automation_id: &str,
        round: u32,
        resume: Option<Resume>,
        step: StepContext,
    ) -> Result<RoundResult, StepError> {
        let result = self.run_round(input, automation_id, resume, step).await?;
        // The approvals list finds this automation while, and only while, a round waits.
        let index_error = |e: crate::db::DbError| StepError::retryable(e.to_string());
        if round > 1 {
            self.approvals.remove(automation_id).await.map_err(index_error)?;
        }
        if let RoundResult::Interrupted { .. } = &result {
            self.approvals.add(&input.tenant, automation_id, round).await.map_err(index_error)?;
        }
        Ok(result)
    }

    /// Runs the script of one round.
    async fn run_round(
        &self,
        input: &AutomationInput,
        automation_id: &str,
        resume: Option<Resume>,
        step: StepContext,
    ) -> Result<RoundResult, StepError> {
        let scope = CallScope {
            tenant: input.tenant.clone(),
            actor: input.submitted_by.clone(),
            audit: Some(self.audit.clone()),
        };
        let connectors = self.connectors.host_functions(&scope);
        let calls = CallLog::default();
        let mut request = RunRequest::new(input.source.as_str())
            .host(with_context(
                &[(self.host)(&input.tenant), connectors],
                &input.context,
                input.session.as_deref().map(|s| (&self.sessions, s)),
                &calls,
            )?)
            .context(json!({ "tenant": input.tenant, "policyVersion": input.policy_version, "context": input.context }))
            .audience(AUDIENCE)
            .logical_run_id(automation_id)
            // A worker process that ran one tenant's script never gets another tenant's.
            .isolation(input.tenant.as_str());
        if let Some(timeout) = input.timeout_ms {
            let limits = LimitOverrides::new()
                .with(Limit::Timeout, i128::from(timeout))
                .map_err(|e| StepError::fatal(format!("the command's time cap: {e}")))?;
            request = request.limits(limits);
        }
        if let Some(session) = &input.session {
            // A command that starts (or resumes after its approval) once its session's end was
            // requested does not run.
            let ended =
                self.sessions.end_requested_by(session).await.map_err(|e| StepError::retryable(e.to_string()))?;
            if ended.is_some() {
                let message = "the session was destroyed".to_owned();
                let console = Vec::new();
                return Ok(RoundResult::Failed { code: "RUN_ABORTED".to_owned(), message, console, calls: Vec::new() });
            }
        }
        if let Some(Resume { continuation: token, resolutions }) = resume {
            if step.attempt > 1 {
                // An earlier attempt may have claimed or consumed the token and died before it
                // recorded the round's outcome: this attempt takes the token over.
                self.continuations.take_over(&token).await.map_err(|e| StepError::retryable(e.to_string()))?;
            }
            request = request.resume(token, resolutions);
        }
        let started = std::time::Instant::now();
        let outcome = self.runner.run(request).await;
        let ended_as = match &outcome {
            Ok(Outcome::Completed(_)) => "completed",
            Ok(Outcome::Interrupted(_)) => "interrupted",
            Err(e) if e.retryable => "error",
            Err(_) => "failed",
        };
        crate::metrics::script_run(ended_as, started.elapsed());
        let calls = calls.take();
        // A request's deadlines count from the end of the round that asked.
        let asked_at = crate::db::to_ms(std::time::SystemTime::now());
        match outcome {
            Ok(Outcome::Completed(c)) => {
                Ok(RoundResult::Completed { console: console_json(&c.console), value: c.value, calls })
            }
            Ok(Outcome::Interrupted(s)) => Ok(RoundResult::Interrupted {
                pending: s
                    .interruptions
                    .iter()
                    .map(|i| PendingRequest {
                        interruption_id: i.id.clone().into(),
                        function: i.function.clone(),
                        request: i.payload.clone(),
                        deadline: self.expiry.for_request(&input.tenant, &i.function).deadline(asked_at),
                    })
                    .collect(),
                console: console_json(&s.console),
                continuation: s.continuation,
                calls,
            }),
            Err(e) if e.retryable => Err(StepError::retryable(error_text(e.code.as_str(), &e.message))),
            Err(RunError { code, message, console, .. }) => {
                let console = console_json(&console);
                Ok(RoundResult::Failed { code: code.as_str().to_owned(), message, console, calls })
            }
        }
    }
}

/// The automation workflow.
pub(crate) async fn run_automation(
    deps: Arc<Deps>,
    ctx: WorkflowContext,
    input: Value,
) -> Result<Value, WorkflowError> {
    let input: AutomationInput = serde_json::from_value(input)?;
    let id = ctx.run_id().to_string();
    let mut resume: Option<Resume> = None;
    let mut publisher = Publisher::new(&ctx, &deps.engine, &deps.tokens, &input.tenant, &input.webhooks);
    for round in 1..=deps.max_rounds {
        let result = {
            let (deps, input, id, resume) = (Arc::clone(&deps), input.clone(), id.clone(), resume.take());
            let span = tracing::info_span!("round", tenant = %input.tenant, automation = %id, round);
            ctx.step(ROUND_STEP, move |s| async move {
                let result = deps.round(&input, &id, round, resume, s).instrument(span).await;
                fault::reached(FaultPoint::BeforeRoundRecorded);
                result
            })
            .await?
        };
        match result {
            RoundResult::Completed { value, console, .. } => {
                publisher
                    .publish(AutomationEvent::Completed { round, value: value.clone(), console }.to_value())
                    .await?;
                return Ok(json!({ "value": value, "rounds": round }));
            }
            RoundResult::Failed { code, message, console, .. } => {
                let text = error_text(&code, &message);
                publisher
                    .publish(AutomationEvent::Failed { round: Some(round), code, message, console }.to_value())
                    .await?;
                return Err(WorkflowError::msg(text));
            }
            RoundResult::Interrupted { continuation, pending, console, .. } => {
                let metadata = HookMetadata {
                    tenant: input.tenant.clone(),
                    automation: id.clone(),
                    round,
                    pending: pending.clone(),
                };
                // The hook exists before anyone can learn of the request from the stream.
                let hook = ctx.hook(&deps.tokens.for_round(&id, round), metadata.to_value()).await?;
                let event = AutomationEvent::ApprovalRequested { round, pending: pending.clone(), console };
                publisher.publish(event.to_value()).await?;
                let Some(progress) =
                    wait_for_decisions(&deps, &ctx, &mut publisher, &hook, &input.tenant, round, &pending).await?
                else {
                    let message = format!("a request of round {round} expired before anyone decided it");
                    let text = error_text(expiry::APPROVAL_EXPIRED, &message);
                    let code = expiry::APPROVAL_EXPIRED.to_owned();
                    let event = AutomationEvent::Failed { round: Some(round), code, message, console: Vec::new() };
                    publisher.publish(event.to_value()).await?;
                    return Err(WorkflowError::msg(text));
                };
                let batch = progress.as_batch();
                let event = AutomationEvent::Decided { round, actor: batch.actor, decisions: batch.decisions };
                publisher.publish(event.to_value()).await?;
                resume = Some(Resume { continuation, resolutions: progress.resolutions() });
            }
        }
    }
    let message = format!("the automation asked for approval more than {} times", deps.max_rounds);
    let text = error_text("AUTOMATION_TOO_MANY_ROUNDS", &message);
    let code = "AUTOMATION_TOO_MANY_ROUNDS".to_owned();
    publisher.publish(AutomationEvent::Failed { round: None, code, message, console: Vec::new() }.to_value()).await?;
    Err(WorkflowError::msg(text))
}

/// What tells one expiry batch of a round from another: the requests it decides.
fn expired_ids(batch: &DecisionBatch) -> String {
    batch.decisions.iter().map(|d| d.interruption_id.to_string()).collect::<Vec<_>>().join(",")
}

/// Delivering the system's expiry decision is retried for about an hour before the automation
/// fails.
fn expire_policy() -> resumable_workflow::RetryPolicy {
    resumable_workflow::RetryPolicy {
        max_retries: 30,
        max_backoff: std::time::Duration::from_secs(300),
        ..resumable_workflow::RetryPolicy::default()
    }
}

/// Waits until every request of the round is decided, and returns how; `None` when one expired
/// with `on_expiry = "fail"`.
///
/// Batches arrive until every request is decided; the server checks each before it delivers it,
/// and one that counts for nothing here is skipped (as the server told its sender). The wait
/// races the hook against the round's next alarm: a reminder is an event, and an expiry is
/// decided by the system with a batch delivered to the same hook, so it is folded in the order
/// the hook received it, as the server folds it, and a human decision that came first wins.
async fn wait_for_decisions(
    deps: &Arc<Deps>,
    ctx: &WorkflowContext,
    publisher: &mut Publisher<'_>,
    hook: &resumable_workflow::Hook,
    tenant: &str,
    round: u32,
    pending: &[PendingRequest],
) -> Result<Option<RoundProgress>, WorkflowError> {
    let mut progress = RoundProgress::new(pending);
    let (mut reminded, mut expiring) = (Reminded::default(), false);
    while !progress.is_decided() {
        let undecided: Vec<&PendingRequest> =
            pending.iter().filter(|r| !progress.decides(&r.interruption_id)).collect();
        let deadlines: Vec<Deadline> = undecided.iter().filter_map(|r| r.deadline).collect();
        let alarm = expiry::next_alarm(&deadlines, reminded, expiring);
        let payload = match alarm {
            None => Some(hook.next().await?),
            Some(alarm) => hook.next_before(crate::db::from_ms(alarm.at())).await?,
        };
        match (payload, alarm) {
            (Some(payload), _) => {
                let Ok(batch) = serde_json::from_value::<DecisionBatch>(payload) else { continue };
                if batch.actor != SYSTEM_ACTOR {
                    let _ = progress.apply(&batch);
                    continue;
                }
                // The system's batch counts, or a human decision made it moot: either way, what
                // is still undecided may expire again.
                expiring = false;
                if progress.apply(&batch).is_err() {
                    continue;
                }
                // The system's decision is in the tenant's audit log like anyone's.
                let (audit, tenant, automation) = (deps.audit.clone(), tenant.to_owned(), ctx.run_id().to_string());
                let entry = AuditEntry::decision(Actor::new(SYSTEM_ACTOR), &automation, round, &batch.decisions)
                    .dedup_key(format!("expiry:{automation}:{round}:{}", expired_ids(&batch)));
                let expired: Vec<&PendingRequest> = batch
                    .decisions
                    .iter()
                    .filter_map(|d| pending.iter().find(|r| r.interruption_id == d.interruption_id))
                    .collect();
                let fails = expired.iter().any(|r| r.deadline.is_some_and(|d| d.on_expiry == OnExpiry::Fail));
                // The round's wait ends here when this batch settles it (a partial expiry does not).
                let settled_at = (fails || progress.is_decided())
                    .then(|| pending.iter().filter_map(|r| r.deadline.map(|d| d.asked_at)).min())
                    .flatten();
                ctx.step("audit-expiry", move |_| async move {
                    audit.record(&tenant, entry).await.map_err(|e| StepError::retryable(e.to_string()))?;
                    if let Some(asked_at) = settled_at {
                        crate::metrics::approval_settled(true, crate::db::from_ms(asked_at));
                    }
                    Ok(())
                })
                .await?;
                let on_expiry = if fails { OnExpiry::Fail } else { OnExpiry::Reject };
                let interruptions = expired.iter().map(|r| r.interruption_id.clone()).collect();
                publisher.publish(AutomationEvent::Expired { round, interruptions, on_expiry }.to_value()).await?;
                if fails {
                    return Ok(None);
                }
            }
            (None, Some(Alarm::Remind(_))) => {
                reminded = Reminded { count: reminded.count + 1, last_at: Some(crate::db::to_ms(ctx.now().await)) };
                let pending = undecided.into_iter().cloned().collect();
                publisher.publish(AutomationEvent::Reminder { round, pending }.to_value()).await?;
            }
            (None, Some(Alarm::Expire(at))) => {
                // Decided through the hook, like a person's batch, whatever `on_expiry` says: a
                // decision the hook received first wins.
                let batch = DecisionBatch {
                    decisions: undecided
                        .into_iter()
                        .filter(|r| r.deadline.and_then(|d| d.expires_at).is_some_and(|e| e <= at))
                        .map(|r| Decision {
                            interruption_id: r.interruption_id.clone(),
                            approved: false,
                            reason: Some(EXPIRED_REASON.to_owned()),
                        })
                        .collect(),
                    actor: SYSTEM_ACTOR.to_owned(),
                };
                let (deps, token) = (Arc::clone(deps), hook.token().to_owned());
                ctx.step_with("expire", expire_policy(), move |_| async move {
                    let engine = engine_of(&deps.engine)?;
                    engine
                        .resume_hook(&token, batch.to_value())
                        .await
                        .map(|_| ())
                        .map_err(|e| StepError::retryable(format!("delivering the expiry decision: {e}")))
                })
                .await?;
                expiring = true;
            }
            (None, None) => {}
        }
    }
    Ok(Some(progress))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_round_recorded_with_the_connectors_it_ran_with_still_reads() {
        let old = json!({
            "status": "interrupted",
            "continuation": "token",
            "pending": [],
            "console": [],
            "connectors": ["billing.refund"],
        });
        let round: RoundResult = serde_json::from_value(old).unwrap();
        let expected =
            RoundResult::Interrupted { continuation: "token".into(), pending: vec![], console: vec![], calls: vec![] };
        assert_eq!(round, expected);
        assert!(serde_json::to_value(&expected).unwrap().get("connectors").is_none());
    }
}
