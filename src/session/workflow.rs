//! The session workflow: between commands it waits on its hook raced against the idle timer
//! (holding no memory), records `hibernated` when the timer wins, and runs each command it
//! receives as a child automation, in order.

use std::sync::Arc;
use std::time::Duration;

use resumable_workflow::{RunId, StepError, Store, WorkflowContext, WorkflowError};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::event::SessionEvent;
use super::state::SessionState;
use crate::automation::{AutomationInput, HookTokens, WORKFLOW as AUTOMATION_WORKFLOW};

/// The name the session workflow is registered under.
pub const WORKFLOW: &str = "resumable.session";

/// The most events of a command's automation read for its console.
const MAX_OUTPUT_EVENTS: u32 = 10_000;
/// The most bytes of console text of one command copied into the session's `command_output`.
const MAX_OUTPUT_BYTES: usize = 8 * 1024;

/// What a session is started with (the workflow's input).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SessionInput {
    /// The tenant whose data the commands act on.
    pub tenant: String,
    /// Who started it.
    pub created_by: String,
    /// How long the session waits for a command before it records `hibernated`.
    pub idle_ms: u64,
    /// The time cap of each command's run.
    pub command_timeout_ms: u64,
    /// The policy version the commands run under.
    pub policy_version: String,
}

/// What the session's hook receives.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
#[non_exhaustive]
pub enum SessionMessage {
    /// Run a script.
    Command {
        /// The script: a function body.
        source: String,
        /// Who queued it.
        submitted_by: String,
    },
    /// End the session.
    Destroy {
        /// Who ended it.
        by: String,
    },
}

/// What the session workflow needs.
pub(crate) struct Deps {
    pub(crate) state: SessionState,
    pub(crate) tokens: HookTokens,
    /// The engine's store, where the commands' events are read.
    pub(crate) store: Arc<dyn Store>,
}

/// The session workflow.
pub(crate) async fn run_session(deps: Arc<Deps>, ctx: WorkflowContext, input: Value) -> Result<Value, WorkflowError> {
    let input: SessionInput = serde_json::from_value(input)?;
    let id = ctx.run_id().to_string();
    let created = SessionEvent::Created {
        session: id.clone(),
        tenant: input.tenant.clone(),
        created_by: input.created_by.clone(),
        idle_ms: input.idle_ms,
        command_timeout_ms: input.command_timeout_ms,
    };
    ctx.emit(&created.to_value()).await?;
    ctx.emit(&status("active")).await?;
    let hook = ctx.hook(&deps.tokens.for_session(&id), json!({ "tenant": input.tenant, "session": id })).await?;
    let idle = Duration::from_millis(input.idle_ms);
    let (mut hibernated, mut command) = (false, 0u64);
    loop {
        let message = if hibernated { Some(hook.next().await?) } else { hook.next_within(idle).await? };
        let Some(message) = message else {
            ctx.emit(&status("hibernated")).await?;
            hibernated = true;
            continue;
        };
        if hibernated {
            ctx.emit(&status("resuming")).await?;
            ctx.emit(&status("active")).await?;
            hibernated = false;
        }
        // The server validates messages before delivering them; anything else is skipped.
        match serde_json::from_value::<SessionMessage>(message) {
            Ok(SessionMessage::Command { source, submitted_by }) => {
                command += 1;
                run_command(&deps, &ctx, &input, command, source, submitted_by).await?;
            }
            Ok(SessionMessage::Destroy { by }) => {
                let (state, session) = (deps.state.clone(), id.clone());
                ctx.step("clear_state", move |_| async move {
                    state.clear(&session).await.map_err(|e| StepError::retryable(e.to_string()))
                })
                .await?;
                ctx.emit(&SessionEvent::Status { status: "destroyed".into(), by: Some(by) }.to_value()).await?;
                return Ok(json!({ "commands": command }));
            }
            Err(_) => continue,
        }
    }
}

fn status(status: &str) -> Value {
    SessionEvent::Status { status: status.to_owned(), by: None }.to_value()
}

/// Runs command `command` as a child automation and records how it ended.
async fn run_command(
    deps: &Arc<Deps>,
    ctx: &WorkflowContext,
    input: &SessionInput,
    command: u64,
    source: String,
    submitted_by: String,
) -> Result<(), WorkflowError> {
    let session = ctx.run_id().to_string();
    let (state, id) = (deps.state.clone(), session.clone());
    let ended_by: Option<String> = ctx
        .step("end_requested", move |_| async move {
            state.end_requested_by(&id).await.map_err(|e| StepError::retryable(e.to_string()))
        })
        .await?;
    if ended_by.is_some() {
        let skipped =
            SessionEvent::CommandEnd { command, automation: None, status: "skipped".into(), value: None, error: None };
        ctx.emit(&skipped.to_value()).await?;
        return Ok(());
    }
    let child_input = AutomationInput {
        tenant: input.tenant.clone(),
        source,
        context: Value::Null,
        policy_version: input.policy_version.clone(),
        submitted_by: submitted_by.clone(),
        session: Some(session),
        timeout_ms: Some(input.command_timeout_ms),
        // A session's commands report through the session's stream, not through webhooks.
        webhooks: Vec::new(),
    };
    let child = ctx.start_child(AUTOMATION_WORKFLOW, serde_json::to_value(&child_input)?).await?;
    let automation = child.run_id().clone();
    let start =
        SessionEvent::CommandStart { command, automation: automation.to_string(), submitted_by: submitted_by.clone() };
    ctx.emit(&start.to_value()).await?;
    let result = child.result().await;
    let console = command_console(deps, ctx, &automation).await?;
    if !console.is_empty() {
        ctx.emit(&SessionEvent::CommandOutput { command, console }.to_value()).await?;
    }
    let (status, value, error) = match result {
        Ok(output) => ("completed", Some(output["value"].clone()), None),
        Err(WorkflowError::ChildFailed { status, error, .. }) if status == "cancelled" => {
            let message = if error.is_empty() { "the command was cancelled".to_owned() } else { error };
            ("cancelled", None, Some(json!({ "code": "RUN_ABORTED", "message": message })))
        }
        Err(WorkflowError::ChildFailed { error, .. }) => {
            let (code, message) = error.split_once(": ").unwrap_or(("RUN_ERROR", error.as_str()));
            ("failed", None, Some(json!({ "code": code, "message": message })))
        }
        Err(other) => return Err(other),
    };
    let automation = Some(automation.to_string());
    ctx.emit(&SessionEvent::CommandEnd { command, automation, status: status.into(), value, error }.to_value()).await?;
    Ok(())
}

/// The console lines of every round of the command's automation, read once and recorded.
async fn command_console(
    deps: &Arc<Deps>,
    ctx: &WorkflowContext,
    automation: &RunId,
) -> Result<Vec<Value>, WorkflowError> {
    let (store, automation) = (Arc::clone(&deps.store), automation.clone());
    ctx.step("command_console", move |_| async move {
        let events = store
            .read_stream(&automation, 0, MAX_OUTPUT_EVENTS)
            .await
            .map_err(|e| StepError::retryable(e.to_string()))?;
        let lines = events.into_iter().filter_map(|(_, mut event)| match event.get_mut("console").map(Value::take) {
            Some(Value::Array(lines)) => Some(lines),
            _ => None,
        });
        Ok(bounded_console(lines.flatten(), &automation))
    })
    .await
}

/// The lines that fit in [`MAX_OUTPUT_BYTES`] of text, then one line saying how many were left
/// out: the session's history is replayed at every wake-up, the command's automation keeps them all.
fn bounded_console(lines: impl Iterator<Item = Value>, automation: &RunId) -> Vec<Value> {
    let (mut kept, mut bytes, mut left_out) = (Vec::new(), 0usize, 0usize);
    for line in lines {
        let size = line["text"].as_str().map_or(0, str::len);
        if left_out > 0 || bytes + size > MAX_OUTPUT_BYTES {
            left_out += 1;
            continue;
        }
        bytes += size;
        kept.push(line);
    }
    if left_out > 0 {
        let text = format!("… {left_out} more console lines; automation {automation} has them all");
        kept.push(json!({ "level": "info", "text": text }));
    }
    kept
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_long_console_is_cut_with_a_line_that_says_so() {
        let line = |i: usize| json!({ "level": "log", "text": format!("{i:04}{}", "y".repeat(996)) });
        let automation = RunId::from("run_1");
        let kept = bounded_console((0..20).map(line), &automation);
        assert_eq!(kept.len(), 9, "eight lines of 1000 bytes fit in 8 KiB, then the note");
        assert_eq!(kept[7]["text"].as_str().map(|t| &t[..4]), Some("0007"));
        assert_eq!(kept[8]["text"], "… 12 more console lines; automation run_1 has them all");
        assert_eq!(bounded_console((0..3).map(line), &automation).len(), 3, "a short console is kept whole");
    }
}
