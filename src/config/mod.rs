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

mod file_mode;
mod function;
mod keys;
mod values;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

pub use function::{Approval, FunctionConfig, FunctionName, ParamConfig, ParamType, placeholders_in};
pub use keys::KeyConfig;
pub use values::{Endpoint, Seconds, WebhookSecret};

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
    /// The API keys.
    #[serde(default)]
    pub keys: Vec<toml::Spanned<KeyConfig>>,
    /// The host functions, by full name (`namespace.function`): HTTP connectors.
    #[serde(default)]
    pub functions: BTreeMap<FunctionName, toml::Spanned<FunctionConfig>>,
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
}

impl ServeConfig {
    /// Reads and checks the file at `path`.
    pub fn load(path: &Path) -> Result<ServeConfig, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read { path: path.into(), source })?;
        let config =
            ServeConfig::parse(&text).map_err(|message| ConfigError::Invalid { path: path.into(), message })?;
        if config.holds_clear_secrets() {
            file_mode::refuse_if_shared(path)?;
        }
        Ok(config)
    }

    /// Parses and checks the text of a file; the error says where and what.
    pub fn parse(text: &str) -> Result<ServeConfig, String> {
        let file: ConfigFile = toml::from_str(text).map_err(|e| e.to_string().trim_end().to_owned())?;
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
        Ok(ServeConfig { file, keys, functions })
    }

    /// Whether a key or a connector secret is written in the file itself.
    fn holds_clear_secrets(&self) -> bool {
        self.file.keys.iter().any(|k| k.get_ref().key.is_some())
            || self.file.functions.values().any(|f| f.get_ref().secret.is_some())
    }

    /// The lease, when the file sets one.
    pub fn lease(&self) -> Option<Duration> {
        self.file.lease.map(|s| s.0)
    }
}

/// The line (from 1) of byte `offset` in `text`.
fn line_of(text: &str, offset: usize) -> usize {
    text.as_bytes()[..offset.min(text.len())].iter().filter(|&&b| b == b'\n').count() + 1
}

#[cfg(test)]
mod tests;
