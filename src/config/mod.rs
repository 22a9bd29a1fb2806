//! The server's configuration file (`resumable serve --config FILE`): TOML read through serde.
//!
//! ```toml
//! listen = "127.0.0.1:8080"
//! database = "sqlite://resumable.db"
//!
//! [[keys]]
//! key_sha256 = "…"          # or key = "…", or key_env = "NAME"
//! actor = "alice"
//! tenant = "acme"
//! roles = ["submitter", "approver"]
//!
//! [functions."billing.refund"]
//! url = "https://billing.internal/refund"
//! params = [{ name = "order_id", type = "string" }, { name = "amount", type = "integer" }]
//! secret_env = "BILLING_WEBHOOK_SECRET"
//! approval = { when = "args.amount > 1000" }
//! ```
//!
//! Every field is checked while the file is read, so a bad file is refused with the line, the key
//! and what was expected ([`ConfigError::Invalid`]). A file that holds a secret in clear (a `key`
//! or a `secret`) must not be readable by other users ([`ConfigError::Exposed`]).

mod expiry;
mod file_mode;
mod function;
mod keys;
mod summary;
mod values;
mod webhook;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use serde::Deserialize;

pub use expiry::TenantConfig;
pub use function::{Approval, FunctionConfig, FunctionName, ParamConfig, ParamType};
pub use keys::KeyConfig;
pub use summary::{placeholders_in, render_summary};
pub use values::{Endpoint, Seconds, WebhookSecret};
pub use webhook::{WebhookConfig, WebhookEvent, WebhookFormat, WebhookSpec};

use crate::server::ApiKeys;

/// The whole file. Every field is optional: command-line flags and `RESUMABLE_*` environment
/// variables override what it says, and defaults fill in the rest.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConfigFile {
    /// Where to listen.
    pub listen: Option<SocketAddr>,
    /// The database URL: `sqlite://FILE` or `postgres://…`.
    pub database: Option<String>,
    /// The file holding the server's secret.
    pub secret_file: Option<PathBuf>,
    /// Automations executing at once.
    pub workers: Option<usize>,
    /// How long a crashed server's automations stay claimed (`"30s"`).
    pub lease: Option<Seconds>,
    /// Run scripts where worker processes cannot be confined.
    pub allow_unconfined: Option<bool>,
    /// Mark the inbox's session cookie `Secure`.
    pub secure_cookies: Option<bool>,
    /// HTTP connections open at once.
    pub max_connections: Option<usize>,
    /// How long a connection may take to send a request's headers (`"10s"`).
    pub header_timeout: Option<Seconds>,
    /// Live event streams the server holds at once.
    pub max_streams: Option<usize>,
    /// Live event streams one API key holds at once.
    pub max_streams_per_key: Option<usize>,
    /// The API keys.
    #[serde(default)]
    pub keys: Vec<toml::Spanned<KeyConfig>>,
    /// The host functions, by full name (`namespace.function`): HTTP connectors.
    #[serde(default)]
    pub functions: BTreeMap<FunctionName, toml::Spanned<FunctionConfig>>,
    /// Each tenant's defaults (`[tenants.acme] expires_after = "72h"`).
    #[serde(default)]
    pub tenants: BTreeMap<String, TenantConfig>,
    /// Where automation events are delivered.
    #[serde(default)]
    pub webhooks: Vec<toml::Spanned<WebhookConfig>>,
    /// The address people use to reach the inbox (`https://approvals.example.com`): the links of
    /// webhook deliveries point there.
    pub public_url: Option<Endpoint>,
}

/// Why a configuration file was refused.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// The file cannot be read.
    #[error("cannot read {path}: {source}", path = .path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The file is not valid: the message gives the line, the key and what was expected.
    #[error("{path}: {message}", path = .path.display())]
    Invalid {
        /// The file.
        path: PathBuf,
        /// What is wrong, and where.
        message: String,
    },
    /// Users other than its owner may change the file (and with it who may approve what), or its
    /// owner is neither this user nor root.
    #[error(
        "{path} may be changed by other users (mode {mode:03o}, or owned by another user): run `chmod go-w {path}` \
         and keep it owned by the server's user or root",
        path = .path.display()
    )]
    Writable {
        /// The file.
        path: PathBuf,
        /// Its permission bits.
        mode: u32,
    },
    /// The file holds a secret in clear and other users may read it.
    #[error(
        "{path} holds secrets and is readable by other users (mode {mode:03o}): run `chmod 600 {path}`, \
         or give the secrets as key_sha256 and *_env names instead",
        path = .path.display()
    )]
    Exposed {
        /// The file.
        path: PathBuf,
        /// Its permission bits.
        mode: u32,
    },
}

/// A configuration file, read and checked, with its secrets resolved.
#[derive(Clone, Debug)]
pub struct ServeConfig {
    /// What the file says.
    pub file: ConfigFile,
    /// Its API keys.
    pub keys: ApiKeys,
    /// Its host functions, in name order, with their secrets.
    pub functions: Vec<(FunctionName, FunctionConfig, Vec<u8>)>,
    /// Its webhook subscriptions, with their names and secrets.
    pub webhooks: Vec<WebhookSpec>,
}

impl ServeConfig {
    /// Reads and checks the file at `path`.
    pub fn load(path: &Path) -> Result<ServeConfig, ConfigError> {
        let (text, mode) = file_mode::read_guarded(path)?;
        let config =
            ServeConfig::parse(&text).map_err(|message| ConfigError::Invalid { path: path.into(), message })?;
        if config.holds_clear_secrets() && mode & 0o077 != 0 {
            return Err(ConfigError::Exposed { path: path.into(), mode });
        }
        Ok(config)
    }

    /// Parses and checks the text of a file; the error says where and what.
    pub fn parse(text: &str) -> Result<ServeConfig, String> {
        let file: ConfigFile = toml::from_str(text).map_err(|e| parse_error(text, &e))?;
        let at = |span: std::ops::Range<usize>, what: String| format!("line {}: {what}", line_of(text, span.start));
        let mut keys = Vec::with_capacity(file.keys.len());
        for (i, key) in file.keys.iter().enumerate() {
            let resolved = key.get_ref().resolve().map_err(|e| at(key.span(), format!("keys[{i}]: {e}")))?;
            keys.push(resolved);
        }
        let keys = ApiKeys::from_entries(keys).map_err(|e| format!("keys: {e}"))?;
        let mut functions = Vec::with_capacity(file.functions.len());
        for (name, function) in &file.functions {
            let config = function.get_ref();
            let secret = config.check().map_err(|e| at(function.span(), format!("functions.\"{name}\": {e}")))?;
            functions.push((name.clone(), config.clone(), secret));
        }
        let mut webhooks: Vec<WebhookSpec> = Vec::with_capacity(file.webhooks.len());
        for (i, webhook) in file.webhooks.iter().enumerate() {
            let spec = webhook.get_ref().resolve().map_err(|e| at(webhook.span(), format!("webhooks[{i}]: {e}")))?;
            if webhooks.iter().any(|w| w.name == spec.name) {
                return Err(at(webhook.span(), format!("webhooks[{i}]: the name {:?} is used twice", spec.name)));
            }
            webhooks.push(spec);
        }
        Ok(ServeConfig { file, keys, functions, webhooks })
    }

    /// The expiry and reminder policies of its functions and the defaults of its tenants.
    pub fn expiry_policies(&self) -> crate::automation::ExpiryPolicies {
        let functions = self.functions.iter().map(|(name, config, _)| (name.to_string(), config.expiry())).collect();
        let tenants = self.file.tenants.iter().map(|(name, tenant)| (name.clone(), tenant.policy())).collect();
        crate::automation::ExpiryPolicies::new(functions, tenants)
    }

    /// Each tenant's quotas.
    pub fn quotas(&self) -> crate::automation::Quotas {
        crate::automation::Quotas::new(self.file.tenants.iter().map(|(name, t)| (name.clone(), t.quota())).collect())
    }

    /// Whether a key, a connector secret or a database password is written in the file itself.
    fn holds_clear_secrets(&self) -> bool {
        // A URL that does not parse, or names a password anywhere, counts as a secret.
        let database_secret = self.file.database.as_deref().is_some_and(|url| match reqwest::Url::parse(url) {
            Ok(url) => url.password().is_some() || url.query().is_some_and(|q| q.contains("password")),
            Err(_) => true,
        });
        database_secret
            || self.file.keys.iter().any(|k| k.get_ref().key.is_some())
            || self.file.functions.values().any(|f| f.get_ref().secret.is_some())
            // A webhook URL often holds its own secret (Slack's, or a token in the query).
            || self.webhooks.iter().any(|w| {
                w.config.secret.is_some() || w.config.format == WebhookFormat::Slack || w.config.url.0.query().is_some()
            })
    }
}

/// A parse error as `line L, column C: key: what was expected`. It never repeats a value: the
/// parser's own rendering quotes the offending line and its message may quote the value, either
/// of which may be a secret, so the value's text is cut out of the message, and the key (the
/// text before `=`) is named only when the value starts on its line.
fn parse_error(text: &str, e: &toml::de::Error) -> String {
    let Some(span) = e.span() else { return "invalid TOML".to_owned() };
    let (start, end) = (span.start.min(text.len()), span.end.min(text.len()));
    let line_start = text[..start].rfind('\n').map_or(0, |at| at + 1);
    let column = text[line_start..start].chars().count() + 1;
    let source_line = text[line_start..].lines().next().unwrap_or_default();
    let before_value = &text[line_start..start];
    let key = match before_value.split_once('=') {
        Some((key, _)) => key.trim(),
        // A table header (`[functions."x"]`) holds no value.
        None if source_line.trim_start().starts_with('[') => source_line.trim(),
        None => "",
    };
    // The span is a key (`listne = 1`, named by the message) or a value, whose text is cut out.
    let rest_of_line = text[end..].lines().next().unwrap_or_default();
    let span_is_key = rest_of_line.trim_start().trim_start_matches(['"', '\'']).trim_start().starts_with('=');
    let mut message = e.message().to_owned();
    let value = text.get(start..end).unwrap_or_default().trim().trim_matches(['"', '\'']);
    if !value.is_empty() && !span_is_key && !key.starts_with('[') {
        message = message.replace(value, "…");
    }
    let at = format!("line {}, column {column}", line_of(text, start));
    if key.is_empty() { format!("{at}: {message}") } else { format!("{at}: {key}: {message}") }
}

/// The line (from 1) of byte `offset` in `text`.
fn line_of(text: &str, offset: usize) -> usize {
    text.as_bytes()[..offset.min(text.len())].iter().filter(|&&b| b == b'\n').count() + 1
}

#[cfg(test)]
mod tests;
