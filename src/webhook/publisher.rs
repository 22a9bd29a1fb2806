//! The automation's side: each event goes to its stream, then to the delivery run of every
//! subscription that wants it (started by the first such event).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use resumable_workflow::{EngineError, RetryPolicy, RunId, StepError, WorkflowContext, WorkflowError};
use serde_json::Value;

use super::delivery::{DeliveryInput, Notice, WORKFLOW, is_last};
use super::subscriptions::Subscribed;
use crate::automation::{EngineSlot, HookTokens, engine_of};

/// Publishes an automation's events, to its stream and to its subscriptions' delivery runs.
pub(crate) struct Publisher<'a> {
    ctx: &'a WorkflowContext,
    engine: &'a EngineSlot,
    tokens: &'a HookTokens,
    tenant: &'a str,
    subscribed: &'a [Subscribed],
    /// The delivery run of each subscription that wanted an event so far.
    runs: BTreeMap<String, RunId>,
}

impl<'a> Publisher<'a> {
    /// A publisher for the automation running in `ctx`, of `tenant`, subscribed by `subscribed`.
    pub(crate) fn new(
        ctx: &'a WorkflowContext,
        engine: &'a EngineSlot,
        tokens: &'a HookTokens,
        tenant: &'a str,
        subscribed: &'a [Subscribed],
    ) -> Publisher<'a> {
        Publisher { ctx, engine, tokens, tenant, subscribed, runs: BTreeMap::new() }
    }

    /// Appends `event` (a JSON object with a `type`) to the stream and hands it to the delivery
    /// runs that want it; returns its index. The automation's last event also ends every delivery
    /// run it started.
    pub(crate) async fn publish(&mut self, event: Value) -> Result<u64, WorkflowError> {
        let index = self.ctx.emit(&event).await?;
        if self.subscribed.is_empty() {
            return Ok(index);
        }
        let kind = event["type"].as_str().unwrap_or_default();
        let wanted = |s: &Subscribed| s.events.iter().any(|e| e == kind);
        let last = is_last(&event);
        let targets: Vec<(&Subscribed, bool)> = self
            .subscribed
            .iter()
            .map(|s| (s, wanted(s)))
            .filter(|(s, wanted)| *wanted || (last && self.runs.contains_key(&s.name)))
            .collect();
        if targets.is_empty() {
            return Ok(index);
        }
        let at = crate::db::to_ms(self.ctx.now().await);
        let automation = self.ctx.run_id().to_string();
        for (subscription, deliver) in targets {
            let notice = Notice { index, at, event: event.clone(), deliver };
            match self.runs.get(&subscription.name) {
                None => {
                    let input = DeliveryInput {
                        subscription: subscription.name.clone(),
                        tenant: self.tenant.to_owned(),
                        automation: automation.clone(),
                        first: notice,
                    };
                    // A delivery run that cannot start (its step failed for good) leaves this
                    // subscription out; the automation goes on regardless.
                    match self.ctx.start_child(WORKFLOW, serde_json::to_value(&input)?).await {
                        Ok(run) => {
                            self.runs.insert(subscription.name.clone(), run.run_id().clone());
                        }
                        Err(e) => tracing::warn!(subscription = subscription.name, error = %e, "no webhook delivery"),
                    }
                }
                Some(run) => {
                    let token = self.tokens.for_webhook(&subscription.name, &automation);
                    let (engine, run, payload) = (Arc::clone(self.engine), run.clone(), serde_json::to_value(&notice)?);
                    // Handing over failed for good (the delivery run was cancelled, say): the
                    // automation goes on regardless.
                    let _ = self
                        .ctx
                        .step_with("notify-webhook", hand_over_policy(), move |_| async move {
                            hand_over(&engine, &run, &token, payload).await
                        })
                        .await;
                }
            }
        }
        Ok(index)
    }
}

/// Retries while a delivery run that was just started has not made its hook yet: for about a
/// minute.
fn hand_over_policy() -> RetryPolicy {
    RetryPolicy {
        max_retries: 20,
        initial_backoff: Duration::from_millis(20),
        max_backoff: Duration::from_secs(5),
        ..RetryPolicy::default()
    }
}

/// Delivers `payload` to the hook of delivery run `run`; nothing to do once that run has ended.
async fn hand_over(engine: &EngineSlot, run: &RunId, token: &str, payload: Value) -> Result<(), StepError> {
    let engine = engine_of(engine)?;
    match engine.resume_hook(token, payload).await {
        Ok(_) => Ok(()),
        Err(EngineError::HookNotFound) => match engine.get_run(run).await {
            Ok(info) if info.status.is_terminal() => Ok(()),
            Ok(_) => Err(StepError::retryable("the delivery run has not made its hook yet")),
            Err(e) => Err(StepError::retryable(e.to_string())),
        },
        Err(e) => Err(StepError::retryable(e.to_string())),
    }
}
