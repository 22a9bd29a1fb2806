//! A `[[webhooks]]` entry: a tenant's subscription to automation events, delivered to a URL.

use serde::Deserialize;
use sha2::{Digest, Sha256};

use super::values::{Endpoint, WebhookSecret};

/// An event a subscription may receive: the `type` of an automation's event.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WebhookEvent {
    /// A round asked for approval.
    ApprovalRequested,
    /// A round still waits, and its approvers are reminded.
    Reminder,
    /// Every request of a round was decided.
    Decided,
    /// Requests expired undecided.
    Expired,
    /// The script returned.
    Completed,
    /// The automation failed.
    Failed,
}

impl WebhookEvent {
    /// The event's `type`.
    pub fn as_str(self) -> &'static str {
        match self {
            WebhookEvent::ApprovalRequested => "approval_requested",
            WebhookEvent::Reminder => "reminder",
            WebhookEvent::Decided => "decided",
            WebhookEvent::Expired => "expired",
            WebhookEvent::Completed => "completed",
            WebhookEvent::Failed => "failed",
        }
    }
}

/// How a delivery's body is shaped.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WebhookFormat {
    /// The event as JSON (`type`, `tenant`, `automation`, `at`, and the event's data).
    #[default]
    Json,
    /// A Slack incoming-webhook message (`text` and `blocks`).
    Slack,
}

/// One subscription.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WebhookConfig {
    /// Its name, unique in the file (derived from the tenant and the URL unless set). Deliveries
    /// in flight follow the subscription by name across reloads.
    pub name: Option<String>,
    /// The tenant whose automations' events it receives.
    pub tenant: String,
    /// Where each event is sent (`POST`). A Slack URL holds its own secret: such a file must be
    /// readable by its owner alone.
    pub url: Endpoint,
    /// The events it receives.
    pub events: Vec<WebhookEvent>,
    /// The signing secret (`whsec_…`); a JSON subscription needs it or `secret_env`.
    pub secret: Option<WebhookSecret>,
    /// The environment variable that holds the signing secret.
    pub secret_env: Option<String>,
    /// `"json"` (the default) or `"slack"`.
    #[serde(default)]
    pub format: WebhookFormat,
}

/// A subscription, checked, with its name and signing secret resolved.
#[derive(Clone, Debug)]
pub struct WebhookSpec {
    /// Its name.
    pub name: String,
    /// What the file says.
    pub config: WebhookConfig,
    /// The signing secret, when it has one (a Slack subscription may not).
    pub secret: Option<Vec<u8>>,
}

impl WebhookConfig {
    /// Checks the entry and resolves its name and secret.
    pub(super) fn resolve(&self) -> Result<WebhookSpec, String> {
        if self.tenant.is_empty() {
            return Err("tenant must not be empty".to_owned());
        }
        if self.events.is_empty() {
            return Err("events: name at least one event".to_owned());
        }
        let secret = match (&self.secret, &self.secret_env) {
            (Some(secret), None) => Some(secret.0.clone()),
            (None, Some(name)) => {
                let text = std::env::var(name).map_err(|_| format!("secret_env: {name} is not set"))?;
                Some(WebhookSecret::try_from(text).map_err(|e| format!("secret_env {name}: {e}"))?.0)
            }
            (None, None) if self.format == WebhookFormat::Slack => None,
            (None, None) => return Err("a JSON subscription is signed: give secret or secret_env".to_owned()),
            (Some(_), Some(_)) => return Err("give at most one of secret and secret_env".to_owned()),
        };
        let name = match &self.name {
            Some(name) => {
                let valid = !name.is_empty()
                    && name.len() <= 64
                    && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
                if !valid {
                    return Err("name: 1 to 64 letters, digits, '-' or '_'".to_owned());
                }
                name.clone()
            }
            None => {
                let digest = Sha256::digest(format!("{}\n{}", self.tenant, self.url.0).as_bytes());
                format!(
                    "{}-{}",
                    self.tenant.chars().take(32).collect::<String>(),
                    hex_simd::encode_to_string(&digest[..4], hex_simd::AsciiCase::Lower)
                )
            }
        };
        Ok(WebhookSpec { name, config: self.clone(), secret })
    }
}
