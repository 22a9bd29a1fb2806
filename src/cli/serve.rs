//! `resumable serve` and `resumable migrate`: the HTTP approval service and its database.

use super::usage_error;
use clap::Args;
use resumable::RunnerConfig;
use resumable::runner::process::ProcessConfig;
use resumable::server::{ServerConfig, load_keys, migrate, serve, shutdown_signal};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

/// The database used when `--db` is not given.
const DEFAULT_DB: &str = "sqlite://resumable.db";

const SERVE_AFTER_HELP: &str = "\
API keys come from --keys FILE, or else from the RESUMABLE_API_KEYS environment variable, as
  {\"keys\": [{\"key\": \"…\", \"actor\": \"alice\", \"tenant\": \"acme\", \"roles\": [\"submitter\", \"approver\"]}]}
With --demo the server also seeds demo orders for tenants acme and globex and accepts the keys
demo-acme (submitter and approver in acme) and demo-globex (approver in globex).

The secret that hook tokens derive from is read from --secret-file (default: resumable.secret),
or generated there with mode 0600 on first start. SIGTERM or Ctrl-C stops the server gracefully.

The approval inbox is at http://ADDR/: sign in with an API key to see and decide pending approvals.";

/// Arguments of `resumable serve`.
#[derive(Debug, Args)]
#[command(after_help = SERVE_AFTER_HELP)]
pub struct ServeArgs {
    /// The database: sqlite://FILE or postgres://USER:PASSWORD@HOST/DB.
    #[arg(long, value_name = "URL", default_value = DEFAULT_DB)]
    db: String,

    /// The address to listen on.
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:8080")]
    listen: SocketAddr,

    /// Seed demo orders and accept the demo API keys.
    #[arg(long)]
    demo: bool,

    /// A JSON file of API keys.
    #[arg(long, value_name = "PATH")]
    keys: Option<PathBuf>,

    /// The file holding the server's secret (created with mode 0600 if missing).
    #[arg(long, value_name = "PATH", default_value = "resumable.secret")]
    secret_file: PathBuf,

    /// Automations executing at once (each may run one script, in its own worker process,
    /// started when first needed).
    #[arg(long, value_name = "N", default_value_t = resumable::automation::DEFAULT_CONCURRENCY)]
    workers: usize,

    /// Seconds a crashed server's automations stay claimed before another server (or this one,
    /// restarted) takes them over; running automations renew their claim a few times per lease.
    #[arg(long, value_name = "SECONDS", default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..=3600))]
    lease_secs: u64,

    /// Run scripts even where worker processes cannot be confined (no seccomp, say). Without
    /// it the server refuses to start there.
    #[arg(long)]
    allow_unconfined: bool,

    /// Mark the inbox's session cookie Secure (browsers reach the server over HTTPS, e.g. through a
    /// TLS proxy); leave off for plain http://localhost.
    #[arg(long)]
    secure_cookies: bool,
}

/// Arguments of `resumable migrate`.
#[derive(Debug, Args)]
pub struct MigrateArgs {
    /// The database: sqlite://FILE or postgres://USER:PASSWORD@HOST/DB.
    #[arg(long, value_name = "URL", default_value = DEFAULT_DB)]
    db: String,
}

fn runtime() -> Result<tokio::runtime::Runtime, ExitCode> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| usage_error(format!("cannot start the async runtime: {e}")))
}

/// Runs the approval server until SIGTERM or Ctrl-C.
pub fn execute_serve(args: ServeArgs) -> ExitCode {
    use std::io::IsTerminal as _;
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .with_target(false)
        .init();
    let keys = match load_keys(args.keys.as_deref()) {
        Ok(keys) => keys,
        Err(message) => return usage_error(message),
    };
    // Untrusted scripts run in killable worker processes: this same program, as `resumable __worker`.
    let processes = match ProcessConfig::current_exe() {
        Ok(p) => p.allow_unconfined(args.allow_unconfined),
        Err(e) => return usage_error(format!("cannot find this program to start workers: {e}")),
    };
    let config = ServerConfig {
        db_url: args.db.clone(),
        listen: args.listen,
        demo: args.demo,
        keys,
        secret_file: args.secret_file,
        workers: args.workers.max(1),
        runner: RunnerConfig::new().processes(processes),
        lease: std::time::Duration::from_secs(args.lease_secs),
        secure_cookies: args.secure_cookies,
    };
    let rt = match runtime() {
        Ok(rt) => rt,
        Err(code) => return code,
    };
    match rt.block_on(serve(config, shutdown_signal())) {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("error: {message}");
            ExitCode::FAILURE
        }
    }
}

/// Applies the database migrations and exits.
pub fn execute_migrate(args: MigrateArgs) -> ExitCode {
    let rt = match runtime() {
        Ok(rt) => rt,
        Err(code) => return code,
    };
    match rt.block_on(migrate(&args.db.clone())) {
        Ok(()) => {
            println!("{}", serde_json::json!({ "migrated": true }));
            ExitCode::SUCCESS
        }
        Err(message) => {
            eprintln!("error: {message}");
            ExitCode::FAILURE
        }
    }
}
