//! The delivery run of one (subscription, automation): each event in turn, each a step retried
//! with exponential backoff for at least a day.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use reqwest::StatusCode;
use reqwest::header::CONTENT_TYPE;
use resumable_workflow::{RetryPolicy, StepError, WorkflowContext, WorkflowError};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::attempts::{DeliveryAttempt, DeliveryLog};
use super::body::{Envelope, json_body, slack_body, webhook_id};
use super::subscriptions::Webhooks;
use crate::automation::{EngineSlot, HookTokens, engine_of};
use crate::config::WebhookFormat;
use crate::connector::sign;

/// The name the delivery workflow is registered under.
pub(crate) const WORKFLOW: &str = "resumable.webhook";

/// How a delivery is retried: 1 s, doubling up to an hour, 35 times: a little over 24 hours.
fn retry_policy() -> RetryPolicy {
    RetryPolicy {
        max_retries: 35,
        initial_backoff: Duration::from_secs(1),
        max_backoff: Duration::from_secs(3600),
        ..RetryPolicy::default()
    }
}

/// One event for a delivery run, as the automation hands it over.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub(crate) struct Notice {
    /// The event's index in the automation's stream.
    pub(crate) index: u64,
    /// When it happened (ms since the epoch).
    pub(crate) at: i64,
    /// The event.
    pub(crate) event: Value,
    /// Whether the subscription wants it; the automation's last event comes either way, and
    /// ends the run.
    pub(crate) deliver: bool,
}

/// What a delivery run starts with.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub(crate) struct DeliveryInput {
    /// The subscription.
    pub(crate) subscription: String,
    /// Its tenant.
    pub(crate) tenant: String,
    /// The automation whose events it delivers.
    pub(crate) automation: String,
    /// The first event.
    pub(crate) first: Notice,
}

/// What delivery runs need.
pub(crate) struct DeliveryDeps {
    pub(crate) webhooks: Webhooks,
    pub(crate) log: DeliveryLog,
    pub(crate) tokens: HookTokens,
    pub(crate) engine: EngineSlot,
}

/// How long a delivery run waits for the next event before it looks whether its automation
/// ended without a last event (it failed in a way that published none, or was cancelled).
const IDLE_CHECK: Duration = Duration::from_secs(3600);

/// Whether `event` is an automation's last.
pub(crate) fn is_last(event: &Value) -> bool {
    matches!(event["type"].as_str(), Some("completed" | "failed"))
}

/// The delivery workflow: the hook first (the automation hands over later events through it),
/// then each event in the order received, skipping any it saw already.
pub(crate) async fn run_delivery(
    deps: std::sync::Arc<DeliveryDeps>,
    ctx: WorkflowContext,
    input: Value,
) -> Result<Value, WorkflowError> {
    let input: DeliveryInput = serde_json::from_value(input)?;
    let token = deps.tokens.for_webhook(&input.subscription, &input.automation);
    let metadata = json!({ "webhook": input.subscription, "automation": input.automation });
    let hook = ctx.hook(&token, metadata).await?;
    let (mut notice, mut next, mut delivered) = (input.first.clone(), 0, 0u64);
    loop {
        if notice.index >= next {
            next = notice.index + 1;
            if notice.deliver {
                let (deps, input, notice) = (std::sync::Arc::clone(&deps), input.clone(), notice.clone());
                let sent = ctx
                    .step_with("deliver", retry_policy(), move |step| async move {
                        deliver(&deps, &input, &notice, step.attempt).await
                    })
                    .await;
                // One given up on is in the attempts' record; the next event goes on.
                delivered += u64::from(sent.is_ok());
            }
            if is_last(&notice.event) {
                return Ok(json!({ "delivered": delivered }));
            }
        }
        notice = loop {
            match hook.next_within(IDLE_CHECK).await? {
                Some(payload) => {
                    if let Ok(notice) = serde_json::from_value(payload) {
                        break notice;
                    }
                }
                None => {
                    let (engine, automation) = (deps.engine.clone(), input.automation.clone());
                    let ended = ctx
                        .step("automation-ended", move |_| async move {
                            let engine = engine_of(&engine)?;
                            let run = engine.get_run(&automation.as_str().into()).await;
                            run.map(|r| r.status.is_terminal()).map_err(|e| StepError::retryable(e.to_string()))
                        })
                        .await
                        .unwrap_or(true);
                    if ended {
                        return Ok(json!({ "delivered": delivered }));
                    }
                }
            }
        };
    }
}

/// One attempt to send `notice`, recorded whatever its outcome.
async fn deliver(deps: &DeliveryDeps, input: &DeliveryInput, notice: &Notice, attempt: u32) -> Result<(), StepError> {
    let id = webhook_id(&input.subscription, &input.automation, notice.index);
    let event_type = notice.event["type"].as_str().unwrap_or_default().to_owned();
    let mut record = DeliveryAttempt {
        subscription: input.subscription.clone(),
        webhook_id: id.clone(),
        automation_id: input.automation.clone(),
        event: event_type,
        attempt,
        outcome: String::new(),
        http_status: None,
        error: None,
        duration_ms: 0,
        at: 0,
    };
    let started = Instant::now();
    let result = match deps.webhooks.get(&input.tenant, &input.subscription) {
        None => {
            record.outcome = "dropped".into();
            record.error = Some("the subscription is no longer configured".into());
            Ok(())
        }
        Some((spec, public_url)) => {
            let link = public_url.and_then(|mut url| {
                if !url.path().ends_with('/') {
                    url.set_path(&format!("{}/", url.path()));
                }
                url.join(&format!("automations/{}", input.automation)).ok()
            });
            let envelope = Envelope {
                tenant: &input.tenant,
                automation: &input.automation,
                at: notice.at,
                link: link.map(String::from),
            };
            let body = match spec.config.format {
                WebhookFormat::Json => json_body(&envelope, &notice.event),
                WebhookFormat::Slack => slack_body(&envelope, &notice.event),
            };
            let body = serde_json::to_vec(&body).map_err(|e| StepError::fatal(e.to_string()))?;
            let timestamp = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
            let mut request = deps
                .webhooks
                .client()
                .post(spec.config.url.0.clone())
                .header(CONTENT_TYPE, "application/json")
                .header("webhook-id", &id)
                .header("webhook-timestamp", timestamp.to_string());
            if let Some(secret) = &spec.secret {
                request = request.header("webhook-signature", sign(secret, &id, timestamp, &body));
            }
            match request.body(body).send().await {
                Ok(response) => {
                    let status = response.status();
                    record.http_status = Some(status.as_u16());
                    if status.is_success() {
                        record.outcome = "delivered".into();
                        Ok(())
                    } else if gives_up_on(status) {
                        record.outcome = "rejected".into();
                        Err(StepError::fatal(format!("the receiver refused the delivery with {status}")))
                    } else {
                        record.outcome = "failed".into();
                        Err(StepError::retryable(format!("the receiver answered {status}")))
                    }
                }
                Err(e) => {
                    record.outcome = "failed".into();
                    let why = crate::connector::describe_send_error(e);
                    record.error = Some(why.clone());
                    Err(StepError::retryable(format!("the delivery failed: {why}")))
                }
            }
        }
    };
    record.duration_ms = i64::try_from(started.elapsed().as_millis()).unwrap_or(i64::MAX);
    crate::metrics::webhook_attempt(&record.outcome);
    if let Err(e) = deps.log.record(&input.tenant, &record).await {
        tracing::warn!(error = %e, webhook_id = id, "cannot record a webhook delivery attempt");
    }
    if let Err(e) = &result {
        tracing::info!(subscription = input.subscription, webhook_id = id, attempt, error = %e, "webhook delivery failed");
    }
    result
}

/// Whether the receiver refused for good: a 4xx other than 408 (timeout), 409 (conflict) and
/// 429 (slow down), which may pass.
fn gives_up_on(status: StatusCode) -> bool {
    status.is_client_error()
        && !matches!(status, StatusCode::REQUEST_TIMEOUT | StatusCode::CONFLICT | StatusCode::TOO_MANY_REQUESTS)
}
