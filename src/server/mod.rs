//! The HTTP approval service: submit scripts, list and decide approvals, follow events.
//!
//! The API is under `/v1` and speaks JSON; callers authenticate with bearer API keys that map to
//! an actor with a tenant and roles. See `docs/api.md` for the endpoints and status codes. Next to it,
//! [`inbox`] serves HTML pages at `/` where people sign in with their key and decide approvals.

mod audit;
mod auth;
mod body;
mod connections;
mod demo_app;
mod error;
mod feed;
mod history;
pub mod inbox;
mod metrics;
mod request_log;
mod routes;
mod secret;
mod sessions;
mod start_error;
mod stream_slots;
mod throttle;

use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::routing::{get, post};
use resumable_runner::RunnerConfig;
use tokio::sync::watch;

pub use auth::{ApiKeyConfig, ApiKeyEntry, ApiKeys, ApiKeysConfig, Caller, KEY_ID_HEX_DIGITS, KeysError, Role, key_id};
pub use connections::ConnectionLimits;
pub use demo_app::DemoApp;
pub use error::ApiError;
pub use inbox::InboxSettings;
pub use metrics::install_metrics;
pub use routes::MAX_SOURCE_BYTES;
pub use secret::{SecretError, load_or_create as load_or_create_secret};
pub use start_error::ServerError;
pub use stream_slots::{StreamLimits, StreamSlot, StreamSlots};
pub use throttle::AuthThrottle;

use crate::automation::{Automations, ExpiryPolicies, Quotas};
use crate::config::{FunctionName, ServeConfig, WebhookSpec};
use crate::connector::{Connectors, FunctionSpec};
use crate::db::AppDb;
use crate::orders::OrderBook;
use crate::webhook::Webhooks;

/// What the handlers share.
#[derive(Clone, Debug)]
pub struct AppState {
    /// The automation service.
    pub automations: Automations,
    /// Who may call.
    pub keys: ApiKeys,
    /// Becomes `true` when the server shuts down; live event streams end then.
    pub shutting_down: watch::Receiver<bool>,
    /// The inbox pages' CSRF key and cookie settings.
    pub inbox: InboxSettings,
    /// Failed authentications by client address.
    pub throttle: AuthThrottle,
    /// The demo order system's HTTP application (`--demo`), under `/demo`.
    pub demo: Option<DemoApp>,
    /// The live event streams open now, within their caps.
    pub streams: StreamSlots,
}

impl AppState {
    /// State for a server that is never shut down (tests, embedding without graceful shutdown),
    /// with [`InboxSettings::ephemeral`] inbox settings.
    pub fn new(automations: Automations, keys: ApiKeys) -> AppState {
        AppState {
            automations,
            keys,
            shutting_down: watch::channel(false).1,
            inbox: InboxSettings::ephemeral(),
            throttle: AuthThrottle::default(),
            demo: None,
            streams: StreamSlots::default(),
        }
    }
}

/// The `/v1` API, `/healthz` and the inbox pages over `state`.
pub fn router(state: AppState) -> Router {
    Router::new()
        .merge(inbox::routes())
        .merge(demo_app::routes())
        .route("/healthz", get(routes::health))
        .route("/readyz", get(metrics::readiness))
        .route("/metrics", get(metrics::metrics))
        .route("/v1/automations", post(routes::submit).get(history::automations))
        .route("/v1/automations/{id}", get(routes::get))
        .route("/v1/automations/{id}/events", get(routes::events))
        .route("/v1/automations/{id}/decisions", post(routes::decide))
        .route("/v1/automations/{id}/cancel", post(routes::cancel))
        .route("/v1/approvals", get(routes::approvals))
        .route("/v1/events", get(feed::feed))
        .route("/v1/audit", get(audit::audit))
        .route("/v1/functions", get(routes::functions))
        .route("/v1/functions.d.ts", get(routes::functions_typescript))
        .route("/v1/webhooks/deliveries", get(routes::webhook_deliveries))
        .route("/v1/sessions", post(sessions::start).get(history::sessions))
        .route("/v1/sessions/{id}", get(sessions::get).delete(sessions::destroy))
        .route("/v1/sessions/{id}/commands", post(sessions::command))
        .route("/v1/sessions/{id}/cancel", post(sessions::cancel))
        .route("/v1/sessions/{id}/events", get(sessions::events))
        .fallback(routes::fallback)
        .method_not_allowed_fallback(routes::method_not_allowed)
        .layer(DefaultBodyLimit::max(body::MAX_BODY_BYTES))
        .layer(axum::middleware::map_response(api_headers))
        // Outermost last: drop a malformed incoming id, set one, then the span that logs it.
        .layer(request_log::propagate_id())
        .layer(request_log::trace())
        .layer(request_log::set_id())
        .layer(axum::middleware::map_request(request_log::drop_malformed_id))
        .with_state(state)
}

/// Every API response: never sniffed as another content type, never cached.
async fn api_headers(mut response: axum::response::Response) -> axum::response::Response {
    use axum::http::HeaderValue;
    use axum::http::header::{CACHE_CONTROL, X_CONTENT_TYPE_OPTIONS};
    let headers = response.headers_mut();
    headers.insert(X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    headers.entry(CACHE_CONTROL).or_insert(HeaderValue::from_static("no-store"));
    response
}

/// How to run the service.
#[derive(Clone, Debug)]
pub struct ServerConfig {
    /// The database: `sqlite://FILE` or `postgres://…` (workflow runs, continuations, orders).
    pub db_url: String,
    /// Where to listen.
    pub listen: SocketAddr,
    /// Seed the demo orders and accept the demo keys.
    pub demo: bool,
    /// The API keys (the demo keys are added with `demo`).
    pub keys: ApiKeys,
    /// The file holding the secret hook tokens derive from (created if missing).
    pub secret_file: PathBuf,
    /// Automations executing at once: engine workers and script workers both
    /// ([`AutomationsBuilder::concurrency`](crate::automation::AutomationsBuilder::concurrency)).
    pub workers: usize,
    /// How scripts run (the CLI runs them in worker processes).
    pub runner: RunnerConfig,
    /// How long the engine's claim on a running automation lasts without a heartbeat: after a
    /// crash, another server (or this one, restarted) takes the automation over once it expires.
    pub lease: Duration,
    /// Mark the inbox's session cookie `Secure`: set it when browsers reach the server over HTTPS
    /// (e.g. behind a TLS-terminating proxy); off for plain `http://localhost`.
    pub secure_cookies: bool,
    /// The HTTP connector host functions (from the configuration file), with their secrets.
    pub functions: Vec<FunctionSpec>,
    /// When requests expire and their approvers are reminded.
    pub expiry: ExpiryPolicies,
    /// Each tenant's quotas.
    pub quotas: Quotas,
    /// The webhook subscriptions (from the configuration file).
    pub webhooks: Vec<WebhookSpec>,
    /// The address people reach the inbox at, for the links of webhook deliveries.
    pub public_url: Option<reqwest::Url>,
    /// How many connections the server keeps open at once, and how long a request's headers may
    /// take to arrive.
    pub connections: ConnectionLimits,
    /// How many live event streams the server, and one API key, may hold open at once.
    pub streams: StreamLimits,
    /// The configuration file to read again on SIGHUP, with the keys that do not come from it
    /// (`keys` holds both): a reload replaces the file's keys and every function.
    pub reload_from: Option<(PathBuf, ApiKeys)>,
}

/// The service's parts, opened on one database.
#[derive(Clone, Debug)]
pub struct Service {
    /// The automations.
    pub automations: Automations,
    /// The order system the scripts act on.
    pub orders: OrderBook,
}

/// What the automations reach beyond the database, each replaceable on reload.
#[derive(Clone, Debug)]
pub struct Integrations {
    /// The HTTP connectors.
    pub connectors: Connectors,
    /// When requests expire and their approvers are reminded.
    pub expiry: ExpiryPolicies,
    /// Where events are delivered.
    pub webhooks: Webhooks,
    /// Each tenant's quotas.
    pub quotas: Quotas,
}

/// Opens the database (migrating it), the order system and the automation service.
pub async fn open_service(
    db_url: &str,
    secret: &[u8],
    workers: usize,
    demo: bool,
    runner: RunnerConfig,
    lease: Duration,
    integrations: Integrations,
) -> Result<Service, ServerError> {
    let db = AppDb::open(db_url).await?;
    let store = db.store();
    let orders = OrderBook::new(db.clone());
    if demo {
        orders.seed_demo().await?;
    }
    let host = orders.clone();
    let automations = Automations::builder(store, db, secret)
        .host(move |tenant| host.host_functions(tenant))
        .connectors(integrations.connectors)
        .expiry(integrations.expiry)
        .quotas(integrations.quotas)
        .webhooks(integrations.webhooks)
        .runner(runner)
        .concurrency(workers)
        .engine(move |engine| engine.lease(lease))
        .build()
        .map_err(ServerError::Automations)?;
    Ok(Service { automations, orders })
}

/// Applies the migrations of every table to the database at `db_url` and returns.
pub async fn migrate(db_url: &str) -> Result<(), ServerError> {
    AppDb::open(db_url).await?;
    Ok(())
}

/// Runs the service until `shutdown` completes, then stops accepting requests, lets the ones in
/// flight finish, and hands running automations back to the database.
pub async fn serve(
    config: ServerConfig,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), ServerError> {
    let secret = secret::load_or_create(&config.secret_file)?;
    let keys = if config.demo { config.keys.merge(ApiKeys::demo()) } else { config.keys };
    if keys.is_empty() {
        return Err(ServerError::NoKeys);
    }
    check_workers(&config.runner).await?;
    // Bound first: the demo's connectors call this server's own address.
    let listen = |source| ServerError::Listen { address: config.listen, source };
    install_metrics();
    let listener = tokio::net::TcpListener::bind(config.listen).await.map_err(listen)?;
    let local = listener.local_addr().map_err(listen)?;
    let demo_functions = if config.demo { DemoApp::functions(&secret, local) } else { Vec::new() };
    if let Some(name) = defined_twice(&config.functions, &demo_functions) {
        return Err(ServerError::DemoFunction(name.to_string()));
    }
    let functions = config.functions.into_iter().chain(demo_functions.clone()).collect();
    let connectors = Connectors::with_predicate_runner(functions, config.runner.clone())?;
    let webhooks = Webhooks::new(config.webhooks, config.public_url).map_err(ServerError::HttpClient)?;
    let integrations = Integrations { connectors, expiry: config.expiry, webhooks, quotas: config.quotas };
    let service = open_service(
        &config.db_url,
        &secret,
        config.workers,
        config.demo,
        config.runner,
        config.lease,
        integrations.clone(),
    )
    .await?;
    let demo = config.demo.then(|| DemoApp::new(service.orders.clone(), &secret));
    let automations = service.automations.clone();
    tokio::spawn(async move {
        match automations.index_waiting().await {
            Ok(0) => {}
            Ok(waiting) => tracing::info!(waiting, "the approval index lists every automation that waits"),
            Err(e) => tracing::warn!(error = %e, "cannot list the automations that waited before the approval index"),
        }
    });
    tracing::info!(listen = %local, keys = keys.len(), demo = config.demo, "serving the approval API");
    // Scripts and tests read this line to find the port.
    println!("listening on http://{local}");
    // A SIGHUP never stops the server: without a configuration file it reloads nothing.
    let (path, other_keys) = match config.reload_from {
        Some((path, other_keys)) => (Some(path), other_keys),
        None => (None, ApiKeys::default()),
    };
    let other_keys = if config.demo { other_keys.merge(ApiKeys::demo()) } else { other_keys };
    let reload = Reload { path, other_keys, keys: keys.clone(), integrations, fixed_functions: demo_functions };
    tokio::spawn(reload.on_hangup());
    let (stop, shutting_down) = watch::channel(false);
    let inbox = InboxSettings::from_secret(&secret, config.secure_cookies);
    let state = AppState {
        automations: service.automations.clone(),
        keys,
        shutting_down,
        inbox,
        throttle: AuthThrottle::default(),
        demo,
        streams: StreamSlots::new(config.streams),
    };
    let shutdown = async move {
        shutdown.await;
        // Live event streams end now, so the requests in flight can finish.
        let _ = stop.send(true);
    };
    connections::serve(listener, router(state), config.connections, shutdown).await.map_err(ServerError::Serve)?;
    tracing::info!("shutting down: handing running automations back");
    service.automations.engine().shutdown().await;
    Ok(())
}

/// Runs a trivial script the way automations will run, to refuse to start (with what to do)
/// when worker processes cannot be confined and were not allowed to run unconfined, and to log
/// how they are confined.
async fn check_workers(runner: &RunnerConfig) -> Result<(), ServerError> {
    let probe = resumable_runner::Runner::new(runner.clone()).map_err(ServerError::Runner)?;
    match probe.run(resumable_runner::RunRequest::new("return 1")).await {
        Ok(_) => {}
        Err(e) if e.code == resumable_runner::ErrorCode::ConfigurationError => {
            let message = format!("{}; pass --allow-unconfined to run scripts without it", e.message);
            return Err(ServerError::Workers { message, source: e });
        }
        Err(e) => {
            return Err(ServerError::Workers { message: format!("a first script could not run: {e}"), source: e });
        }
    }
    match probe.worker_confinement() {
        Some(confinement) if confinement.is_minimal() => {
            tracing::info!(%confinement, "worker processes are confined");
        }
        Some(confinement) => {
            tracing::warn!(%confinement, "worker processes run without full confinement");
        }
        None => tracing::warn!("scripts run on threads of this process, not in confined worker processes"),
    }
    Ok(())
}

/// A function of `file` that `fixed` (the demo's) defines too.
fn defined_twice<'a>(file: &[FunctionSpec], fixed: &'a [FunctionSpec]) -> Option<&'a FunctionName> {
    fixed.iter().map(|(name, _, _)| name).find(|name| file.iter().any(|(n, _, _)| n == *name))
}

/// What a SIGHUP reloads, and what stays.
struct Reload {
    /// The configuration file, if the server has one.
    path: Option<PathBuf>,
    /// The keys that do not come from the file (`--keys`, the environment, the demo's).
    other_keys: ApiKeys,
    /// The keys the server checks, replaced on each reload.
    keys: ApiKeys,
    /// The connectors, expiry policies and webhooks, replaced on each reload.
    integrations: Integrations,
    /// The functions that do not come from the file (the demo's).
    fixed_functions: Vec<FunctionSpec>,
}

impl Reload {
    /// On each SIGHUP, reads the file again and replaces the keys and every connector; a file
    /// that does not pass its checks changes nothing, and the log says why.
    async fn on_hangup(self) {
        let Ok(mut hangups) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()) else {
            tracing::warn!("cannot listen for SIGHUP: the configuration is not reloadable");
            return;
        };
        while hangups.recv().await.is_some() {
            let Some(file) = self.path.as_deref() else {
                tracing::warn!("SIGHUP: the server has no --config file, so there is nothing to reload");
                continue;
            };
            let path = file.display();
            match self.apply(file) {
                Ok(functions) => {
                    tracing::info!(%path, keys = self.keys.len(), functions, "configuration reloaded");
                }
                Err(why) => tracing::error!(%path, %why, "configuration not reloaded: keeping the current one"),
            }
        }
    }

    fn apply(&self, path: &std::path::Path) -> Result<usize, String> {
        let config = ServeConfig::load(path).map_err(|e| e.to_string())?;
        if let Some(name) = defined_twice(&config.functions, &self.fixed_functions) {
            return Err(format!("the file defines {name}, which --demo defines too"));
        }
        let expiry = config.expiry_policies();
        let quotas = config.quotas();
        let webhooks =
            Webhooks::new(config.webhooks, config.file.public_url.map(|u| u.0)).map_err(|e| e.to_string())?;
        let functions: Vec<FunctionSpec> =
            config.functions.into_iter().chain(self.fixed_functions.iter().cloned()).collect();
        let count = functions.len();
        let keys = config.keys.merge(self.other_keys.clone());
        if keys.is_empty() {
            return Err("it leaves no API key".to_owned());
        }
        // Built first, so a set that cannot be built changes nothing; the keys go in before the
        // functions, so a client that sees a new function can use a new key.
        let connectors = self.integrations.connectors.prepare(functions).map_err(|e| e.to_string())?;
        self.keys.replace_with(&keys);
        self.integrations.connectors.install(connectors);
        self.integrations.expiry.replace_with(&expiry);
        self.integrations.quotas.replace_with(&quotas);
        self.integrations.webhooks.replace_with(&webhooks);
        Ok(count)
    }
}

/// Completes on SIGTERM or Ctrl-C.
pub async fn shutdown_signal() {
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = terminate => {}
    }
}

/// Reads the API keys from `path`, or else the `RESUMABLE_API_KEYS` environment variable.
pub fn load_keys(path: Option<&std::path::Path>) -> Result<ApiKeys, KeysError> {
    let from_env = std::env::var("RESUMABLE_API_KEYS").ok();
    let within = |origin: String| move |e| KeysError::In { origin, source: Box::new(e) };
    match (path, from_env) {
        (Some(p), _) => {
            let text =
                std::fs::read_to_string(p).map_err(|source| KeysError::Read { path: p.to_path_buf(), source })?;
            ApiKeys::from_json(&text).map_err(within(p.display().to_string()))
        }
        (None, Some(json)) => ApiKeys::from_json(&json).map_err(within("RESUMABLE_API_KEYS".into())),
        (None, None) => Ok(ApiKeys::default()),
    }
}
