//! The built-in automation workflow: rounds of the script, each a step; between rounds a hook
//! waits for the decision batch on the round's pending requests.

use std::sync::Arc;

use resumable_runner::{Limit, LimitOverrides, Outcome, Resolution, RunError, RunRequest, Runner};
use resumable_workflow::{StepContext, StepError, WorkflowContext, WorkflowError};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::approval_index::ApprovalIndex;
use super::decision::DecisionBatch;
use super::event::{AutomationEvent, HookMetadata};
use super::interruption_id::InterruptionId;
use super::round::RoundProgress;
use super::token::HookTokens;
use crate::audit::Audit;
use crate::connector::{CallScope, Connectors};
use crate::continuations::SqlContinuationStore;
use crate::fault::{self, FaultPoint};
use crate::session::SessionState;
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
}

/// How one round of the script ended, as recorded by its step.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "status", rename_all = "snake_case")]
enum RoundResult {
    Completed {
        value: Value,
        console: Vec<Value>,
    },
    Interrupted {
        continuation: String,
        pending: Vec<PendingRequest>,
        console: Vec<Value>,
        /// The connectors the script ran with: later rounds get these alone, so a reload that
        /// adds functions leaves a waiting automation's continuation valid (absent in rounds
        /// recorded before connectors existed: none).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        connectors: Option<Vec<String>>,
    },
    Failed {
        code: String,
        message: String,
        console: Vec<Value>,
    },
}

/// What the next round resumes from: the continuation, the decisions, and the connectors the
/// interrupted round ran with.
struct Resume {
    continuation: String,
    resolutions: Vec<Resolution>,
    connectors: Option<Vec<String>>,
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
) -> Result<HostFunctions, StepError> {
    let mut builder = HostFunctions::builder();
    if let Some((state, session)) = session {
        builder = state.register(builder, session);
    }
    for (host, name) in hosts.iter().flat_map(|host| host.names().map(move |name| (host, name))) {
        let (host, name_owned) = (host.clone(), name.to_owned());
        builder = builder.function(name, move |ctx, args| {
            let resumed = ctx.resume().is_some();
            let call = host.call(&name_owned, ctx, args);
            async move {
                let result = call.await;
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
        let connectors = self
            .connectors
            .host_functions(&scope, resume.as_ref().map(|r| r.connectors.as_deref().unwrap_or_default()));
        let connector_names: Vec<String> = connectors.names().map(str::to_owned).collect();
        let mut request = RunRequest::new(input.source.as_str())
            .host(with_context(
                &[(self.host)(&input.tenant), connectors],
                &input.context,
                input.session.as_deref().map(|s| (&self.sessions, s)),
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
                return Ok(RoundResult::Failed { code: "RUN_ABORTED".to_owned(), message, console: Vec::new() });
            }
        }
        if let Some(Resume { continuation: token, resolutions, .. }) = resume {
            if step.attempt > 1 {
                // An earlier attempt may have claimed or consumed the token and died before it
                // recorded the round's outcome: this attempt takes the token over.
                self.continuations.take_over(&token).await.map_err(|e| StepError::retryable(e.to_string()))?;
            }
            request = request.resume(token, resolutions);
        }
        match self.runner.run(request).await {
            Ok(Outcome::Completed(c)) => {
                Ok(RoundResult::Completed { console: console_json(&c.console), value: c.value })
            }
            Ok(Outcome::Interrupted(s)) => Ok(RoundResult::Interrupted {
                pending: s
                    .interruptions
                    .iter()
                    .map(|i| PendingRequest {
                        interruption_id: i.id.clone().into(),
                        function: i.function.clone(),
                        request: i.payload.clone(),
                    })
                    .collect(),
                console: console_json(&s.console),
                continuation: s.continuation,
                connectors: Some(connector_names),
            }),
            Err(e) if e.retryable => Err(StepError::retryable(error_text(e.code.as_str(), &e.message))),
            Err(RunError { code, message, console, .. }) => {
                Ok(RoundResult::Failed { code: code.as_str().to_owned(), message, console: console_json(&console) })
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
    for round in 1..=deps.max_rounds {
        let result = {
            let (deps, input, id, resume) = (Arc::clone(&deps), input.clone(), id.clone(), resume.take());
            ctx.step("round", move |s| async move {
                let result = deps.round(&input, &id, round, resume, s).await;
                fault::reached(FaultPoint::BeforeRoundRecorded);
                result
            })
            .await?
        };
        match result {
            RoundResult::Completed { value, console } => {
                ctx.emit(&AutomationEvent::Completed { round, value: value.clone(), console }.to_value()).await?;
                return Ok(json!({ "value": value, "rounds": round }));
            }
            RoundResult::Failed { code, message, console } => {
                let text = error_text(&code, &message);
                ctx.emit(&AutomationEvent::Failed { round: Some(round), code, message, console }.to_value()).await?;
                return Err(WorkflowError::msg(text));
            }
            RoundResult::Interrupted { continuation, pending, console, connectors } => {
                let metadata = HookMetadata {
                    tenant: input.tenant.clone(),
                    automation: id.clone(),
                    round,
                    pending: pending.clone(),
                };
                // The hook exists before anyone can learn of the request from the stream.
                let hook = ctx.hook(&deps.tokens.for_round(&id, round), metadata.to_value()).await?;
                let event = AutomationEvent::ApprovalRequested { round, pending: pending.clone(), console };
                ctx.emit(&event.to_value()).await?;
                // Batches arrive until every request is decided; the server checks each before it
                // delivers it, and one that counts for nothing here is skipped (as the server
                // told its sender).
                let mut progress = RoundProgress::new(&pending);
                while !progress.is_decided() {
                    if let Ok(batch) = serde_json::from_value::<DecisionBatch>(hook.next().await?) {
                        let _ = progress.apply(&batch);
                    }
                }
                let batch = progress.as_batch();
                let event = AutomationEvent::Decided { round, actor: batch.actor, decisions: batch.decisions };
                ctx.emit(&event.to_value()).await?;
                resume = Some(Resume { continuation, resolutions: progress.resolutions(), connectors });
            }
        }
    }
    let message = format!("the automation asked for approval more than {} times", deps.max_rounds);
    let text = error_text("AUTOMATION_TOO_MANY_ROUNDS", &message);
    let code = "AUTOMATION_TOO_MANY_ROUNDS".to_owned();
    ctx.emit(&AutomationEvent::Failed { round: None, code, message, console: Vec::new() }.to_value()).await?;
    Err(WorkflowError::msg(text))
}
