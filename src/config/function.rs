//! A `[functions."namespace.function"]` entry: an HTTP connector and its approval policy.

use std::fmt;
use std::num::NonZeroU32;

use resumable_host::Signature;
use serde::de::{self, Deserializer, MapAccess, Visitor};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::summary::placeholders_in;
use super::values::{Endpoint, Seconds, WebhookSecret};
use crate::automation::{ExpiryPolicy, OnExpiry};

/// Namespaces the server defines itself (`orders` is its compiled-in order system); a
/// configured function may not use them.
const SERVER_NAMESPACES: &[&str] = &["automation", "session", "policy", "orders"];

/// The most retries a function may ask for.
const MAX_RETRIES: u32 = 10;

/// A function's full name, `namespace.function`, checked as the script will see it.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Deserialize, Serialize)]
#[serde(try_from = "String")]
pub struct FunctionName(String);

impl FunctionName {
    /// The name.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for FunctionName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl TryFrom<String> for FunctionName {
    type Error = String;

    fn try_from(name: String) -> Result<FunctionName, String> {
        resumable_host::validate_function_name(&name).map_err(|e| e.to_string())?;
        let namespace = name.split('.').next().unwrap_or_default();
        if SERVER_NAMESPACES.contains(&namespace) {
            return Err(format!("function {name:?}: the namespace {namespace:?} is reserved for the server's own"));
        }
        Ok(FunctionName(name))
    }
}

/// One positional parameter: its name in the request's `arguments` and its JSON Schema.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ParamConfig {
    /// The name.
    pub name: String,
    /// A JSON Schema type name (`"string"`) or a whole schema (`{ type = "integer", minimum = 1 }`).
    #[serde(rename = "type")]
    pub schema: ParamType,
}

/// A parameter's JSON Schema, known to compile.
#[derive(Clone, Debug, Deserialize)]
#[serde(try_from = "toml::Value")]
pub struct ParamType(pub Value);

impl TryFrom<toml::Value> for ParamType {
    type Error = String;

    fn try_from(value: toml::Value) -> Result<ParamType, String> {
        let schema = match value {
            toml::Value::String(name) => serde_json::json!({ "type": name }),
            toml::Value::Table(table) => serde_json::to_value(table).map_err(|e| e.to_string())?,
            other => return Err(format!("expected a type name or a JSON Schema table, got a {}", other.type_str())),
        };
        jsonschema::meta::validate(&schema).map_err(|e| format!("invalid JSON Schema {schema}: {e}"))?;
        jsonschema::validator_for(&schema).map_err(|e| format!("invalid JSON Schema {schema}: {e}"))?;
        Ok(ParamType(schema))
    }
}

/// When a call needs a person's approval before its request is sent.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Approval {
    /// Never: the request is sent at once.
    Never,
    /// Always.
    Always,
    /// When this JavaScript expression over `args` is true (or throws, or runs too long).
    When(String),
}

impl<'de> Deserialize<'de> for Approval {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Approval, D::Error> {
        struct ApprovalVisitor;

        impl<'de> Visitor<'de> for ApprovalVisitor {
            type Value = Approval;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(r#""never", "always" or { when = "<JavaScript expression over args>" }"#)
            }

            fn visit_str<E: de::Error>(self, word: &str) -> Result<Approval, E> {
                match word {
                    "never" => Ok(Approval::Never),
                    "always" => Ok(Approval::Always),
                    _ => Err(E::invalid_value(de::Unexpected::Str(word), &self)),
                }
            }

            fn visit_map<M: MapAccess<'de>>(self, mut map: M) -> Result<Approval, M::Error> {
                let mut when = None;
                while let Some(key) = map.next_key::<String>()? {
                    match key.as_str() {
                        "when" => when = Some(map.next_value::<String>()?),
                        other => return Err(de::Error::unknown_field(other, &["when"])),
                    }
                }
                match when {
                    Some(expression) if !expression.trim().is_empty() => Ok(Approval::When(expression)),
                    _ => Err(de::Error::missing_field("when")),
                }
            }
        }

        deserializer.deserialize_any(ApprovalVisitor)
    }
}

/// One HTTP connector host function.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FunctionConfig {
    /// Where each call is sent (`POST`, JSON).
    pub url: Endpoint,
    /// The positional parameters, in order.
    #[serde(default)]
    pub params: Vec<ParamConfig>,
    /// The signing secret (`whsec_…`).
    pub secret: Option<WebhookSecret>,
    /// The environment variable that holds the signing secret.
    pub secret_env: Option<String>,
    /// How long one attempt may take (10 s unless set).
    pub timeout: Option<Seconds>,
    /// How many times a failed attempt is retried (connect errors, timeouts, 5xx, 429); 2 unless set.
    #[serde(default = "default_retries")]
    pub retries: u32,
    /// The largest response body accepted, in bytes (1 MiB unless set).
    #[serde(default = "default_max_response_bytes")]
    pub max_response_bytes: u64,
    /// When a call needs approval ("never" unless set).
    #[serde(default = "default_approval")]
    pub approval: Approval,
    /// The roles that may decide (`["approver"]` unless set).
    #[serde(default = "default_approvers")]
    pub approvers: Vec<String>,
    /// Whether the submitter may not decide their own request.
    #[serde(default)]
    pub four_eyes: bool,
    /// How many distinct approvers must approve (1 unless set).
    pub quorum: Option<NonZeroU32>,
    /// What the inbox shows for a request: `{param}` is replaced by the argument.
    pub summary: Option<String>,
    /// The tenants whose scripts have the function (every tenant unless set).
    pub tenants: Option<Vec<String>>,
    /// How long a request waits for its decision before it expires (the tenant's default, or for
    /// ever, unless set).
    pub expires_after: Option<Seconds>,
    /// What an expired request does: `"reject"` (the default) or `"fail"`.
    pub on_expiry: Option<OnExpiry>,
    /// How often the approvers are reminded while a request waits (the tenant's default, or
    /// never, unless set).
    pub remind_after: Option<Seconds>,
}

fn default_retries() -> u32 {
    2
}

fn default_max_response_bytes() -> u64 {
    1 << 20
}

fn default_approval() -> Approval {
    Approval::Never
}

fn default_approvers() -> Vec<String> {
    vec!["approver".to_owned()]
}

impl FunctionConfig {
    /// Its expiry and reminder settings (what it leaves out comes from the tenant's).
    pub fn expiry(&self) -> ExpiryPolicy {
        super::expiry::policy(self.expires_after, self.on_expiry, self.remind_after)
    }

    /// The function's signature: its parameters' names and JSON Schemas, in order. A paused run
    /// that called the function resumes only while these are unchanged; the URL, secret,
    /// timeout, retries, approval policy and summary may change under it.
    pub fn signature(&self) -> Signature {
        Signature::of(&Value::Array(
            self.params.iter().map(|p| json!({ "name": p.name, "schema": p.schema.0 })).collect(),
        ))
    }

    /// Checks what spans several fields and returns the signing secret.
    pub(super) fn check(&self) -> Result<Vec<u8>, String> {
        let secret = match (&self.secret, &self.secret_env) {
            (Some(secret), None) => secret.0.clone(),
            (None, Some(name)) => {
                let text = std::env::var(name).map_err(|_| format!("secret_env: {name} is not set"))?;
                WebhookSecret::try_from(text).map_err(|e| format!("secret_env {name}: {e}"))?.0
            }
            _ => return Err("give exactly one of secret and secret_env".to_owned()),
        };
        if self.retries > MAX_RETRIES {
            return Err(format!("retries: at most {MAX_RETRIES}"));
        }
        if !(1..=16 << 20).contains(&self.max_response_bytes) {
            return Err("max_response_bytes: between 1 and 16777216".to_owned());
        }
        let mut names = std::collections::BTreeSet::new();
        for param in &self.params {
            resumable_host::validate_identifier(&param.name).map_err(|e| format!("params: {:?}: {e}", param.name))?;
            if !names.insert(param.name.as_str()) {
                return Err(format!("params: {:?} is named twice", param.name));
            }
        }
        if self.approvers.is_empty() || self.approvers.iter().any(String::is_empty) {
            return Err("approvers: name at least one role, none empty".to_owned());
        }
        if let Some(summary) = &self.summary {
            for placeholder in placeholders_in(summary) {
                if !names.contains(placeholder) {
                    return Err(format!("summary: {{{placeholder}}} is not a parameter"));
                }
            }
        }
        if self.tenants.as_ref().is_some_and(|t| t.is_empty() || t.iter().any(String::is_empty)) {
            return Err("tenants: name at least one tenant, none empty".to_owned());
        }
        Ok(secret)
    }
}
