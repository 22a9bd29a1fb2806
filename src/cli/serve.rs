//! `resumable serve` and `resumable migrate`: the HTTP approval service and its database.

use super::logging::LogArgs;
use super::{EXIT_USAGE, usage_error};
use clap::Args;
use resumable::RunnerConfig;
use resumable::config::{ConfigFile, ServeConfig};
use resumable::runner::process::ProcessConfig;
use resumable::server::{
    ApiKeys, ConnectionLimits, ServerConfig, StreamLimits, load_keys, migrate, serve, shutdown_signal,
};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

/// The database used when `--db` is not given.
const DEFAULT_DB: &str = "sqlite://resumable.db";
/// The address listened on when none is given.
const DEFAULT_LISTEN: SocketAddr = SocketAddr::V4(std::net::SocketAddrV4::new(std::net::Ipv4Addr::LOCALHOST, 8080));
/// The secret file used when none is given.
const DEFAULT_SECRET_FILE: &str = "resumable.secret";
/// The lease of a running automation when none is given.
const DEFAULT_LEASE: std::time::Duration = std::time::Duration::from_secs(30);

const SERVE_AFTER_HELP: &str = "\
API keys come from --keys FILE, or else from the RESUMABLE_API_KEYS environment variable, as
  {\"keys\": [{\"key\": \"…\", \"actor\": \"alice\", \"tenant\": \"acme\", \"roles\": [\"submitter\", \"approver\"]}]}
With --demo the server also seeds demo orders for tenants acme and globex and accepts the keys
demo-acme (submitter and approver in acme) and demo-globex (approver in globex).

The secret that hook tokens derive from is read from --secret-file (default: resumable.secret),
or generated there with mode 0600 on first start. SIGTERM or Ctrl-C stops the server gracefully.

The approval inbox is at http://ADDR/: sign in with an API key to see and decide pending approvals.";

/// Arguments of `resumable serve`. A flag wins over its `RESUMABLE_*` environment variable,
/// which wins over the `--config` file, which wins over the default.
#[derive(Debug, Args)]
#[command(after_help = SERVE_AFTER_HELP)]
pub struct ServeArgs {
    /// A TOML configuration file: keys, HTTP connector functions and their approval policies,
    /// and any of the settings below (see docs/configuration.md).
    #[arg(long, value_name = "FILE", env = "RESUMABLE_CONFIG")]
    config: Option<PathBuf>,

    /// The database: sqlite://FILE or postgres://USER:PASSWORD@HOST/DB [default: sqlite://resumable.db].
    #[arg(long, value_name = "URL", env = "RESUMABLE_DB")]
    db: Option<String>,

    /// The address to listen on [default: 127.0.0.1:8080].
    #[arg(long, value_name = "ADDR", env = "RESUMABLE_LISTEN")]
    listen: Option<SocketAddr>,

    /// Seed demo orders and accept the demo API keys.
    #[arg(long, env = "RESUMABLE_DEMO")]
    demo: bool,

    /// A JSON file of API keys (added to the configuration file's).
    #[arg(long, value_name = "PATH")]
    keys: Option<PathBuf>,

    /// The file holding the server's secret (created with mode 0600 if missing) [default: resumable.secret].
    #[arg(long, value_name = "PATH", env = "RESUMABLE_SECRET_FILE")]
    secret_file: Option<PathBuf>,

    /// Automations executing at once (each may run one script, in its own worker process,
    /// started when first needed) [default: 64].
    #[arg(long, value_name = "N", env = "RESUMABLE_WORKERS")]
    workers: Option<usize>,

    /// Seconds a crashed server's automations stay claimed before another server (or this one,
    /// restarted) takes them over; running automations renew their claim a few times per lease
    /// [default: 30].
    #[arg(long, value_name = "SECONDS", env = "RESUMABLE_LEASE_SECS", value_parser = clap::value_parser!(u64).range(1..=3600))]
    lease_secs: Option<u64>,

    /// Run scripts even where worker processes cannot be confined (no seccomp, say). Without
    /// it the server refuses to start there.
    #[arg(long, env = "RESUMABLE_ALLOW_UNCONFINED")]
    allow_unconfined: bool,

    /// Mark the inbox's session cookie Secure (browsers reach the server over HTTPS, e.g. through a
    /// TLS proxy); leave off for plain http://localhost.
    #[arg(long, env = "RESUMABLE_SECURE_COOKIES")]
    secure_cookies: bool,

    /// HTTP connections open at once; past it, new ones wait to be accepted [default: 1024].
    #[arg(long, value_name = "N", env = "RESUMABLE_MAX_CONNECTIONS", value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    max_connections: Option<u32>,

    /// Seconds a connection may take to send a request's headers before it is closed [default: 10].
    #[arg(long, value_name = "SECONDS", env = "RESUMABLE_HEADER_TIMEOUT_SECS", value_parser = clap::value_parser!(u64).range(1..=3600))]
    header_timeout_secs: Option<u64>,

    /// Live event streams (NDJSON responses that stay open) the server holds at once [default: 500].
    #[arg(long, value_name = "N", env = "RESUMABLE_MAX_STREAMS", value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    max_streams: Option<u32>,

    /// Live event streams one API key holds at once [default: 20].
    #[arg(long, value_name = "N", env = "RESUMABLE_MAX_STREAMS_PER_KEY", value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    max_streams_per_key: Option<u32>,

    #[command(flatten)]
    log: LogArgs,
}

/// The stream caps the flags or the file set, the defaults elsewhere.
fn stream_limits(total: Option<usize>, per_key: Option<usize>) -> StreamLimits {
    let defaults = StreamLimits::default();
    StreamLimits {
        total: total.unwrap_or(defaults.total).clamp(1, 1_000_000),
        per_key: per_key.unwrap_or(defaults.per_key).clamp(1, 1_000_000),
    }
}

/// The connection limits the flags or the file set, the defaults elsewhere.
fn connection_limits(max_connections: Option<usize>, header_timeout: Option<std::time::Duration>) -> ConnectionLimits {
    let defaults = ConnectionLimits::default();
    ConnectionLimits {
        max_connections: max_connections.unwrap_or(defaults.max_connections).clamp(1, 1_000_000),
        header_read_timeout: header_timeout
            .unwrap_or(defaults.header_read_timeout)
            .clamp(std::time::Duration::from_secs(1), std::time::Duration::from_secs(3600)),
    }
}

/// Arguments of `resumable config check`.
#[derive(Debug, Args)]
pub struct ConfigCheckArgs {
    /// The configuration file.
    #[arg(value_name = "FILE")]
    file: PathBuf,
}

/// Arguments of `resumable functions`.
#[derive(Debug, Args)]
pub struct FunctionsArgs {
    /// The configuration file.
    #[arg(long, value_name = "FILE", env = "RESUMABLE_CONFIG")]
    config: PathBuf,

    /// Print the TypeScript declaration instead of the JSON catalog.
    #[arg(long)]
    dts: bool,

    /// Only the functions this tenant's scripts may call.
    #[arg(long, value_name = "TENANT")]
    tenant: Option<String>,
}

/// Prints the function catalog of a configuration file (what `GET /v1/functions` serves).
pub fn execute_functions(args: FunctionsArgs) -> ExitCode {
    let config = match ServeConfig::load(&args.config) {
        Ok(config) => config,
        Err(e) => return usage_error(e),
    };
    let connectors = match resumable::connector::Connectors::new(config.functions) {
        Ok(connectors) => connectors,
        Err(e) => return usage_error(e),
    };
    if args.dts {
        print!("{}", connectors.typescript(args.tenant.as_deref()));
    } else {
        println!("{}", connectors.catalog(args.tenant.as_deref()));
    }
    ExitCode::SUCCESS
}

/// Validates a configuration file without serving: prints a summary as JSON, or the error.
pub fn execute_config_check(args: ConfigCheckArgs) -> ExitCode {
    match ServeConfig::load(&args.file) {
        Ok(config) => {
            let functions: Vec<&str> = config.functions.iter().map(|(name, _, _)| name.as_str()).collect();
            println!("{}", serde_json::json!({ "valid": true, "keys": config.keys.len(), "functions": functions }));
            ExitCode::SUCCESS
        }
        Err(e) => usage_error(e),
    }
}

/// Arguments of `resumable migrate`.
#[derive(Debug, Args)]
pub struct MigrateArgs {
    /// The database: sqlite://FILE or postgres://USER:PASSWORD@HOST/DB.
    #[arg(long, value_name = "URL", default_value = DEFAULT_DB)]
    db: String,

    #[command(flatten)]
    log: LogArgs,
}

fn runtime() -> Result<tokio::runtime::Runtime, String> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the async runtime: {e}"))
}

/// Runs the approval server until SIGTERM or Ctrl-C.
pub fn execute_serve(args: ServeArgs) -> ExitCode {
    let log = args.log;
    if let Err(e) = log.init() {
        return usage_error(e);
    }
    // Problems with the command line, once the log is set up: in the log's format.
    let refuse = |message: &dyn std::fmt::Display| {
        log.fatal(message);
        ExitCode::from(EXIT_USAGE)
    };
    let file = match args.config.as_deref().map(ServeConfig::load).transpose() {
        Ok(file) => file,
        Err(e) => return refuse(&e),
    };
    let keys = match load_keys(args.keys.as_deref()) {
        Ok(keys) => keys,
        Err(message) => return refuse(&message),
    };
    let expiry = file.as_ref().map(ServeConfig::expiry_policies).unwrap_or_default();
    let quotas = file.as_ref().map(ServeConfig::quotas).unwrap_or_default();
    let (settings, file_keys, functions, webhooks) = match file {
        Some(ServeConfig { file, keys, functions, webhooks }) => (file, keys, functions, webhooks),
        None => (ConfigFile::default(), ApiKeys::default(), Vec::new(), Vec::new()),
    };
    let reload_from = args.config.clone().map(|path| (path, keys.clone()));
    let keys = file_keys.merge(keys);
    let allow_unconfined = args.allow_unconfined || settings.allow_unconfined.unwrap_or(false);
    // Untrusted scripts run in killable worker processes: this same program, as `resumable __worker`.
    let processes = match ProcessConfig::current_exe() {
        Ok(p) => p.allow_unconfined(allow_unconfined),
        Err(e) => return refuse(&format!("cannot find this program to start workers: {e}")),
    };
    let lease = args.lease_secs.map(std::time::Duration::from_secs).or(settings.lease.map(|l| l.0));
    let config = ServerConfig {
        db_url: args.db.or(settings.database).unwrap_or_else(|| DEFAULT_DB.to_owned()),
        listen: args.listen.or(settings.listen).unwrap_or(DEFAULT_LISTEN),
        demo: args.demo,
        keys,
        secret_file: args.secret_file.or(settings.secret_file).unwrap_or_else(|| DEFAULT_SECRET_FILE.into()),
        workers: args.workers.or(settings.workers).unwrap_or(resumable::automation::DEFAULT_CONCURRENCY).max(1),
        runner: RunnerConfig::new().processes(processes),
        lease: lease.unwrap_or(DEFAULT_LEASE),
        secure_cookies: args.secure_cookies || settings.secure_cookies.unwrap_or(false),
        functions,
        expiry,
        quotas,
        webhooks,
        public_url: settings.public_url.map(|url| url.0),
        reload_from,
        connections: connection_limits(
            args.max_connections.map(|n| n as usize).or(settings.max_connections),
            args.header_timeout_secs.map(std::time::Duration::from_secs).or(settings.header_timeout.map(|t| t.0)),
        ),
        streams: stream_limits(
            args.max_streams.map(|n| n as usize).or(settings.max_streams),
            args.max_streams_per_key.map(|n| n as usize).or(settings.max_streams_per_key),
        ),
    };
    let rt = match runtime() {
        Ok(rt) => rt,
        Err(message) => return refuse(&message),
    };
    match rt.block_on(serve(config, shutdown_signal())) {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            log.fatal(message);
            ExitCode::FAILURE
        }
    }
}

/// Applies the database migrations and exits.
pub fn execute_migrate(args: MigrateArgs) -> ExitCode {
    let log = args.log;
    if let Err(e) = log.init() {
        return usage_error(e);
    }
    let rt = match runtime() {
        Ok(rt) => rt,
        Err(message) => {
            log.fatal(message);
            return ExitCode::from(EXIT_USAGE);
        }
    };
    match rt.block_on(migrate(&args.db.clone())) {
        Ok(()) => {
            println!("{}", serde_json::json!({ "migrated": true }));
            ExitCode::SUCCESS
        }
        Err(message) => {
            log.fatal(message);
            ExitCode::FAILURE
        }
    }
}
