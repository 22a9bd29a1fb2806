//! Why the server could not start, or stopped serving.

use std::net::SocketAddr;

use super::auth::KeysError;
use super::secret::SecretError;
use crate::automation::AutomationError;
use crate::db::DbError;

/// Why [`serve`](super::serve), [`migrate`](super::migrate) or
/// [`open_service`](super::open_service) failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ServerError {
    /// The secret file cannot be used.
    #[error(transparent)]
    Secret(#[from] SecretError),
    /// The API keys are invalid.
    #[error(transparent)]
    Keys(#[from] KeysError),
    /// No API key is configured.
    #[error(
        "no API keys are configured: list them in the --config file, pass --keys FILE, set RESUMABLE_API_KEYS, or use --demo"
    )]
    NoKeys,
    /// The configuration file defines a function that `--demo` defines too.
    #[error("the configuration file defines {0}, which --demo defines too: rename it, or serve without --demo")]
    DemoFunction(String),
    /// The configured HTTP connectors cannot be set up.
    #[error(transparent)]
    Connectors(#[from] crate::connector::ConnectorError),
    /// The webhooks' HTTP client could not be built.
    #[error("the webhooks' HTTP client: {0}")]
    HttpClient(#[source] reqwest::Error),
    /// The database cannot be opened, migrated or seeded.
    #[error(transparent)]
    Database(#[from] DbError),
    /// The automation service cannot be built with this configuration.
    #[error("the automation service cannot start: {0}")]
    Automations(#[source] AutomationError),
    /// Scripts cannot run here the way automations run them.
    #[error("{message}")]
    Workers {
        /// What is wrong, and what to do.
        message: String,
        /// The error of the probe run.
        #[source]
        source: resumable_runner::RunError,
    },
    /// The runner cannot be built with this configuration.
    #[error("the script runner cannot start: {0}")]
    Runner(#[source] resumable_runner::ConfigError),
    /// The address cannot be listened on.
    #[error("cannot listen on {address}: {source}")]
    Listen {
        /// The address.
        address: SocketAddr,
        /// Why.
        source: std::io::Error,
    },
    /// Serving failed.
    #[error("server failed: {0}")]
    Serve(#[source] std::io::Error),
}
