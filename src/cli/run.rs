//! `resumable run FILE`: run one script and print its outcome.

use super::report::print_outcome;
use super::usage_error;
use clap::Args;
use resumable::db::AppDb;
use resumable::orders::OrderBook;
use resumable::runner::ContinuationCodec;
use resumable::runner::LimitError;
use resumable::runner::codec::SealedCodec;
use resumable::runner::process::ProcessConfig;
use resumable::{
    ErrorCode, HostFunctions, Limit, LimitOverrides, Outcome, Resolution, RunError, RunRequest, Runner, RunnerConfig,
    SignedCodec, SignedCodecConfig,
};
use serde_json::{Value, json};
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

    /// Sign the continuation of an interrupted run with the secret in this file (its whole
    /// content, a trailing newline removed) and print it, so that `resumable resume` can
    /// continue the run.
    #[arg(long, value_name = "PATH")]
    secret_file: Option<PathBuf>,

    /// Seal the continuation (encrypted and signed) instead of signing it.
    #[arg(long, requires = "secret_file")]
    seal: bool,
}

/// Arguments of `resumable resume`.
#[derive(Debug, Args)]
#[command(after_help = RESUME_AFTER_HELP)]
pub struct ResumeArgs {
    /// The continuation token an interrupted `resumable run` printed; `-` reads it from stdin
    /// (keeping it out of the process list).
    #[arg(value_name = "TOKEN")]
    token: String,

    /// The script file the run ran (`-` reads it from stdin): a continuation resumes only its own
    /// source.
    #[arg(value_name = "FILE")]
    file: PathBuf,

    /// `INTERRUPTION_ID=true` to approve, `=false` to reject (repeat for each request).
    #[arg(long = "decision", value_name = "ID=BOOL", required = true, value_parser = super::admin::parse_decision)]
    decisions: Vec<(String, bool)>,

    /// Why (given to the resumed calls with each decision).
    #[arg(long, value_name = "TEXT")]
    reason: Option<String>,

    /// Who decides (given to the resumed calls as `decidedBy`).
    #[arg(long, value_name = "NAME", default_value = "cli")]
    by: String,

    /// The demo order system, as `run --demo` gave it (a fresh copy: the resumed refund happens
    /// there).
    #[arg(long)]
    demo: bool,

    /// The file of the secret the token was made with (or RESUMABLE_SECRET).
    #[arg(long, value_name = "PATH")]
    secret_file: Option<PathBuf>,

    /// Print the run's events as NDJSON while it runs, before the final status line.
    #[arg(long)]
    events: bool,
}

const RESUME_AFTER_HELP: &str = "\
Resumes a run that `resumable run --secret-file PATH` left interrupted: the calls it made come
from the continuation's ledger, and each interrupted call runs again with its decision,
{\"approved\", \"reason\", \"decidedBy\": [NAME]}. Prints the same JSON line as `run` (with the
next token, if the resumed run asks again). A signed token proves it came from a holder of the
secret; a sealed one also hides what it holds. Neither is single-use: whoever holds the token and
the secret can resume it again, so keep both private (TOKEN `-` reads it from stdin).

Example:
  resumable run --demo --secret-file s refund.js          # exit 3, prints \"continuation\":\"…\"
  resumable resume TOKEN refund.js --demo --secret-file s --decision interrupt-2=true

Exit status: as for run; 2 also for a token made with another secret or for another source.";

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
    let codec = match &args.secret_file {
        None => None,
        Some(path) => match codec_from(Some(path), args.seal) {
            Ok(codec) => Some(codec),
            Err(message) => return usage_error(message),
        },
    };
    let request = RunRequest::new(source).limits(overrides).context(args.context.unwrap_or(Value::Null));
    let with_token = codec.is_some();
    print_outcome(&run_once(request, args.events, args.demo, codec), with_token)
}

/// Resumes a continuation with decisions and prints the report; see [`ResumeArgs`].
pub fn resume(args: ResumeArgs) -> ExitCode {
    if args.file == Path::new("-") && args.token == "-" {
        return usage_error("the token and the script cannot both come from stdin");
    }
    let source = match read_script(&args.file) {
        Ok(source) => source,
        Err(err) => return usage_error(format_args!("cannot read the script {}: {err}", args.file.display())),
    };
    let token = if args.token == "-" {
        let mut token = String::new();
        if let Err(err) = std::io::stdin().read_to_string(&mut token) {
            return usage_error(format_args!("cannot read the token from stdin: {err}"));
        }
        token.trim().to_owned()
    } else {
        args.token.trim().to_owned()
    };

    // A signed token has three parts (header.state.mac), a sealed one two (header.sealed).
    let codec = match codec_from(args.secret_file.as_deref(), token.split('.').count() == 2) {
        Ok(codec) => codec,
        Err(message) => return usage_error(message),
    };
    let resolutions = args.decisions.iter().map(|(id, approved)| {
        Resolution::new(id.clone(), json!({ "approved": approved, "reason": args.reason, "decidedBy": [args.by] }))
    });
    let request = RunRequest::new(source).resume(token, resolutions);
    let result = run_once(request, args.events, args.demo, Some(codec));
    match &result {
        // A token that is not this secret's, or not this source's, is the caller's mistake.
        Err(e) if e.code == ErrorCode::ProtocolError => {
            print_outcome(&result, true);
            ExitCode::from(super::EXIT_USAGE)
        }
        _ => print_outcome(&result, true),
    }
}

/// The codec of a secret file (or `RESUMABLE_SECRET`): sealed or signed.
fn codec_from(secret_file: Option<&Path>, sealed: bool) -> Result<ContinuationCodec, String> {
    let secret = super::inspect::read_secret(secret_file)?;
    let config = SignedCodecConfig::new(secret);
    if sealed {
        SealedCodec::new(config).map(ContinuationCodec::from).map_err(|e| e.to_string())
    } else {
        SignedCodec::new(config).map(ContinuationCodec::from).map_err(|e| e.to_string())
    }
}

/// Runs one request on a one-worker runner inside a fresh tokio runtime,
/// writing its events to stdout as they happen when `events` is set, with the
/// demo order system's host functions when `demo` is set, and continuations made (or read) by
/// `codec` when given.
fn run_once(
    request: RunRequest,
    events: bool,
    demo: bool,
    codec: Option<ContinuationCodec>,
) -> Result<Outcome, RunError> {
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
        request = request.host(host);
        Some(db)
    } else {
        None
    };
    config = match codec {
        Some(codec) => config.codec(codec),
        // Without a secret the continuation of an interrupted run cannot be resumed: a random
        // secret will do, and the token is not printed.
        None if demo => config.codec(random_signed_codec()?),
        None => config,
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
