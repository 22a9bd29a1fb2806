//! `resumable run FILE`: run one script and print its outcome.

use super::report::print_outcome;
use super::usage_error;
use clap::Args;
use resumable::db::AppDb;
use resumable::orders::OrderBook;
use resumable::runner::LimitError;
use resumable::runner::process::ProcessConfig;
use resumable::{
    HostFunctions, Limit, LimitOverrides, Outcome, RunError, RunRequest, Runner, RunnerConfig, SignedCodec,
    SignedCodecConfig,
};
use serde_json::Value;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// Long description of `resumable run`, shown by `--help`.
pub const RUN_LONG_ABOUT: &str = "Run a script in the sandbox and print its outcome as one JSON line.

The script is the body of an async function: top-level `await` and `return` are allowed, and \
the returned JSON-compatible value is the result. No host functions are available, so the \
script cannot reach anything outside the sandbox, unless --demo gives it the demo order system.";

const RUN_AFTER_HELP: &str = "\
Output: exactly one JSON line on stdout, for example
  {\"status\":\"completed\",\"value\":42,\"console\":[{\"level\":\"log\",\"text\":\"hi\"}]}
  {\"status\":\"failed\",\"error\":{\"code\":\"RUN_ERROR\",\"message\":\"Error: boom …\",\"retryable\":false},\"console\":[]}

With --events, one JSON line per event comes first, written as it happens (NDJSON, tagged by
\"type\": console, call_started, call_replayed, call_completed, lagged), then the terminal event
(completed or failed), and last the same {\"status\":…} line as without --events:
  {\"type\":\"console\",\"level\":\"log\",\"text\":\"hi\"}
  {\"type\":\"completed\",\"value\":42}
  {\"status\":\"completed\",\"value\":42,\"console\":[{\"level\":\"log\",\"text\":\"hi\"}]}

With --demo the script sees orders.get(id), orders.list({status?, limit?}) and
orders.refund(id, amount) of tenant acme on a throwaway database seeded with the demo orders
(A-1001 to A-1003). A refund asks for approval, so the run ends interrupted:
  {\"status\":\"interrupted\",\"interruptions\":[{\"id\":\"interrupt-2\",\"function\":\"orders.refund\",…}],\"console\":[]}
(the approval service, `resumable serve`, is where such a run is decided and resumed).

Exit status: 0 completed, 1 failed (script error or limit), 2 usage error (nothing on stdout),
3 interrupted (only with --demo).

Example: echo 'console.log(\"hi\"); return 6 * 7' | resumable run -";

/// Arguments of `resumable run`.
#[derive(Debug, Args)]
#[command(after_help = RUN_AFTER_HELP)]
pub struct RunArgs {
    /// The script file; `-` reads it from stdin.
    #[arg(value_name = "FILE")]
    file: PathBuf,

    #[arg(
        long,
        value_name = "MS",
        allow_negative_numbers = true,
        value_parser = limit_value(Limit::Timeout),
        help = limit_help(Limit::Timeout, "Wall-clock limit of the run, in milliseconds"),
    )]
    timeout_ms: Option<i128>,

    #[arg(
        long,
        value_name = "BYTES",
        allow_negative_numbers = true,
        value_parser = limit_value(Limit::Memory),
        help = limit_help(Limit::Memory, "Memory limit of the JavaScript heap, in bytes"),
    )]
    memory_bytes: Option<i128>,

    /// JSON bound into the run's scope (for example a tenant); the script does not see it.
    #[arg(long, value_name = "JSON", value_parser = parse_json)]
    context: Option<Value>,

    /// Print the run's events as NDJSON while it runs, before the final status line.
    #[arg(long)]
    events: bool,

    /// Give the script the demo order system (orders.get, orders.list, orders.refund of tenant
    /// acme) on a throwaway database; a refund ends the run interrupted.
    #[arg(long)]
    demo: bool,
}

impl RunArgs {
    /// The per-run limit overrides given on the command line.
    fn overrides(&self) -> Result<LimitOverrides, LimitError> {
        let mut overrides = LimitOverrides::new();
        for (limit, value) in [(Limit::Timeout, self.timeout_ms), (Limit::Memory, self.memory_bytes)] {
            if let Some(value) = value {
                overrides.set(limit, value)?;
            }
        }
        Ok(overrides)
    }
}

/// Runs the script and prints the report; see [`RunArgs`].
pub fn execute(args: RunArgs) -> ExitCode {
    let overrides = match args.overrides() {
        Ok(overrides) => overrides,
        Err(err) => return usage_error(err),
    };
    let source = match read_script(&args.file) {
        Ok(source) => source,
        Err(err) => return usage_error(format_args!("cannot read the script {}: {err}", args.file.display())),
    };
    let request = RunRequest::new(source).limits(overrides).context(args.context.unwrap_or(Value::Null));
    print_outcome(&run_once(request, args.events, args.demo))
}

/// Runs one request on a one-worker runner inside a fresh tokio runtime,
/// writing its events to stdout as they happen when `events` is set, with the
/// demo order system's host functions when `demo` is set.
fn run_once(request: RunRequest, events: bool, demo: bool) -> Result<Outcome, RunError> {
    let tokio = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .map_err(|err| RunError::internal(format!("cannot start the async runtime: {err}")))?;
    // Scripts run in a killable worker process: this same program, as `resumable __worker`.
    let processes = ProcessConfig::current_exe()
        .map_err(|err| RunError::internal(format!("cannot find this program to start a worker: {err}")))?;
    let mut config = RunnerConfig::new().workers(1).processes(processes);
    let mut request = request;
    let demo_db = if demo {
        let (db, host) = tokio.block_on(DemoOrders::open())?;
        // The continuation of an interrupted demo run is never resumed: a random secret will do.
        config = config.codec(random_signed_codec()?);
        request = request.host(host);
        Some(db)
    } else {
        None
    };
    let runner = Runner::new(config).map_err(|err| RunError::internal(err.0))?;
    let run = runner.start(request);
    let result = if events { tokio.block_on(run.pipe(tokio::io::stdout())) } else { tokio.block_on(run.outcome()) };
    if let Some(db) = demo_db {
        db.remove();
    }
    result
}

/// The demo order system on a database in a directory of its own, removed after the run.
struct DemoOrders {
    dir: PathBuf,
    db: AppDb,
}

impl DemoOrders {
    async fn open() -> Result<(DemoOrders, HostFunctions), RunError> {
        let dir = std::env::temp_dir().join(format!("resumable-demo-{}", resumable_workflow::RunId::generate()));
        std::fs::create_dir_all(&dir)
            .map_err(|err| RunError::internal(format!("cannot create {}: {err}", dir.display())))?;
        let url = format!("sqlite://{}", dir.join("demo.db").display());
        let opened = async {
            let db = AppDb::open(&url).await?;
            let orders = OrderBook::new(db.clone());
            orders.seed_demo().await?;
            Ok::<_, resumable::db::DbError>((db, orders.host_functions(DEMO_TENANT)))
        };
        match opened.await {
            Ok((db, host)) => Ok((DemoOrders { dir, db }, host)),
            Err(err) => {
                let _ = std::fs::remove_dir_all(&dir);
                Err(RunError::internal(format!("cannot open the demo orders: {err}")))
            }
        }
    }

    fn remove(self) {
        drop(self.db);
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The tenant whose demo orders `--demo` offers.
const DEMO_TENANT: &str = "acme";

fn random_signed_codec() -> Result<SignedCodec, RunError> {
    let mut secret = [0u8; 32];
    getrandom::fill(&mut secret).map_err(|err| RunError::internal(format!("no randomness: {err}")))?;
    SignedCodec::new(SignedCodecConfig::new(secret.to_vec())).map_err(|err| RunError::internal(err.to_string()))
}

/// Reads the script from `path`, or from stdin when `path` is `-`.
fn read_script(path: &Path) -> std::io::Result<String> {
    if path == Path::new("-") {
        let mut source = String::new();
        std::io::stdin().read_to_string(&mut source)?;
        Ok(source)
    } else {
        std::fs::read_to_string(path)
    }
}

/// A value parser that accepts an integer within `limit`'s range.
fn limit_value(limit: Limit) -> impl Fn(&str) -> Result<i128, String> + Clone + Send + Sync + 'static {
    move |text| {
        let value: i128 = text.parse().map_err(|err| format!("not an integer: {err}"))?;
        LimitOverrides::new().with(limit, value).map_err(|err| err.to_string())?;
        Ok(value)
    }
}

/// Help text of a limit flag, with its accepted range and default taken from the library.
fn limit_help(limit: Limit, what: &str) -> String {
    format!("{what} ({} to {}; default {})", limit.min(), limit.max(), limit.default_value())
}

/// A value parser that accepts any JSON document.
fn parse_json(text: &str) -> Result<Value, String> {
    serde_json::from_str(text).map_err(|err| format!("not valid JSON: {err}"))
}
