//! Multi-process tests: worker processes (this test binary, re-executed through its
//! `child_process_entry` test) share one database with the test process, which only starts,
//! inspects and resumes runs (an engine without workers). Every scenario runs on PostgreSQL (the
//! server at `RESUMABLE_TEST_PG_URL`, one fresh schema per test; skipped with a message when it is
//! not set, failing under CI) and on a SQLite file shared by all the processes.
//!
//! - 4 worker processes complete 1,000 runs of a 5-step workflow (created before the workers start,
//!   so that all four compete for them from the first claim): every step body ran exactly once, as
//!   attempt 1, as a side-effect counter keyed by the step id shows (a second execution would count
//!   twice), and every run was claimed once (no lease was lost under load).
//! - 12 processes ask for one hook token at about the same moment: exactly one run creates the
//!   hook, the 11 others get a conflict naming it.
//! - A worker process is SIGKILLed inside a step: another worker process takes the run over once
//!   the lease expires; the step's idempotent effect (keyed by its step id) exists once, and the
//!   step took 2 attempts.
//! - A timer falls due while every worker process is down: it fires once, after its due time, when
//!   a worker process comes back.
//! - A hook resumed from the test process wakes the run waiting in a worker process quickly: on
//!   PostgreSQL through `NOTIFY`, on SQLite (no cross-process wake-up) by the workers' short poll.
//!
//! Side effects live in tables of their own: in the test's schema on PostgreSQL, in a second SQLite
//! file on SQLite. Children print marker lines on stdout, exit when their stdin closes (and after
//! [`CHILD_LIFETIME`] in any case) and are killed when the test drops them. The tests of this file
//! run one at a time: several fleets of processes at once on a small machine would make the lease
//! timings of the crash scenario unreliable. Measured figures are printed on stderr (`--nocapture`).

use std::collections::{BTreeMap, HashSet};
use std::io::BufRead;
use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::process::Stdio;
use std::str::FromStr;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use resumable_workflow::store::sqlite::Synchronous;
use resumable_workflow::{
    Engine, EngineBuilder, Event, EventKind, PgStore, PgStoreOptions, RunFilter, RunId, RunInfo, RunStatus,
    SqliteStore, SqliteStoreOptions, StartOptions, StepContext, StepError, Store, WorkflowContext, WorkflowError,
};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{Connection, PgPool};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdin, Command};
use tokio::sync::{Mutex, MutexGuard, mpsc, watch};
use tokio::time::Instant;

mod effects;
use effects::SqliteEffects;

/// Set (to the child's [`ChildConfig`] as JSON) in a worker process.
const CHILD_ENV: &str = "RESUMABLE_MULTIPROCESS_CHILD";
/// A child never outlives this, even if its parent vanished without closing its stdin.
const CHILD_LIFETIME: Duration = Duration::from_secs(180);
/// Generous: the machine may be slow and busy.
const TIMEOUT: Duration = Duration::from_secs(60);
/// The fallback poll interval of SQLite workers: the only way they see work of other processes.
const SQLITE_POLL: Duration = Duration::from_millis(25);
/// The poll interval of PostgreSQL workers (wake-ups come through `NOTIFY`).
const PG_POLL: Duration = Duration::from_secs(1);

const READY: &str = "MP-READY";
const CLAIM_READY: &str = "MP-CLAIM-READY";
const IN_STEP: &str = "MP-IN-STEP";
const GOT: &str = "MP-GOT";

const FIVE_STEPS: &str = "five_steps";
const KILL_STEP: &str = "kill_step";
const SLEEPER: &str = "sleeper";
const RESUMED: &str = "resumed";
const CLAIM_PREFIX: &str = "claim_";

/// The tests of this file run one at a time (see the module documentation).
static SERIAL: Mutex<()> = Mutex::const_new(());

async fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().await
}

fn pid() -> i64 {
    i64::from(std::process::id())
}

fn unix_micros() -> i64 {
    i64::try_from(SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_micros()).unwrap()
}

fn now_ms() -> i64 {
    unix_micros() / 1000
}

fn ms_of(t: SystemTime) -> i64 {
    i64::try_from(t.duration_since(UNIX_EPOCH).unwrap().as_millis()).unwrap()
}

fn random_hex(bytes: usize) -> String {
    let mut buf = vec![0u8; bytes];
    getrandom::fill(&mut buf).expect("random source");
    buf.iter().map(|b| format!("{b:02x}")).collect()
}

/// Declares a scenario's two tests, on PostgreSQL and on SQLite; each runs alone among the tests
/// of this file (they start many processes).
macro_rules! on_both_backends {
    ($scenario:ident: $pg:ident, $sqlite:ident) => {
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $pg() {
            let _serial = serial().await;
            $scenario(Backend::Pg).await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $sqlite() {
            let _serial = serial().await;
            $scenario(Backend::Sqlite).await;
        }
    };
}

// ---------------------------------------------------------------------------------------------
// The shared database and the side-effect tables.
// ---------------------------------------------------------------------------------------------

/// The database every process of a test opens.
#[derive(Clone, Debug, Serialize, Deserialize)]
enum Db {
    /// A schema of the PostgreSQL server at `url`; the notification channel has the same name.
    Pg { url: String, schema: String },
    /// `runs.db` (the run store) and `effects.db` (the side effects) in `dir`. `relaxed` opens both
    /// with `synchronous = NORMAL`: in WAL mode a commit is then durable against a process crash
    /// (all these tests need), not against a power loss, and costs no fsync.
    Sqlite { dir: PathBuf, relaxed: bool },
}

impl Db {
    fn poll_interval(&self) -> Duration {
        match self {
            Db::Pg { .. } => PG_POLL,
            Db::Sqlite { .. } => SQLITE_POLL,
        }
    }

    /// The run store, with a pool of `connections` on PostgreSQL.
    async fn open_store(&self, connections: u32) -> Arc<dyn Store> {
        match self {
            Db::Pg { url, schema } => {
                let options = PgStoreOptions {
                    max_connections: connections,
                    min_connections: connections.min(2),
                    schema: Some(schema.clone()),
                    notify_channel: schema.clone(),
                    ..PgStoreOptions::default()
                };
                Arc::new(PgStore::open_with(url, options).await.expect("open PostgreSQL store"))
            }
            Db::Sqlite { dir, relaxed } => {
                let options = SqliteStoreOptions {
                    synchronous: if *relaxed { Synchronous::Normal } else { Synchronous::Full },
                    busy_timeout: TIMEOUT,
                    read_connections: 2,
                };
                let url = format!("sqlite://{}", dir.join("runs.db").display());
                Arc::new(SqliteStore::open_with(&url, options).await.expect("open SQLite store"))
            }
        }
    }

    /// The side-effect tables' database (created by [`Effects::create_tables`]): a pool of
    /// `connections` on PostgreSQL, one connection per process on SQLite.
    async fn effects(&self, connections: u32) -> Effects {
        match self {
            Db::Pg { url, schema } => {
                let options = PgConnectOptions::from_str(url).expect("PostgreSQL URL");
                let options = options.options([("search_path", schema.as_str())]);
                let pool = PgPoolOptions::new().max_connections(connections).connect_with(options).await;
                Effects::Pg(pool.expect("connect to the effects schema"))
            }
            Db::Sqlite { dir, relaxed } => Effects::Sqlite(SqliteEffects::open(dir, !*relaxed, TIMEOUT)),
        }
    }
}

/// The side-effect tables: `effects` (one row per step id) and `invocations` (one row per attempt
/// that ran a step body).
enum Effects {
    Pg(PgPool),
    Sqlite(SqliteEffects),
}

/// Why a statement on the side-effect tables failed, on either backend.
type EffectError = Box<dyn std::error::Error + Send + Sync>;

/// One row of `effects`: step id, count, attempt and process of the first execution.
type EffectRow = (String, i64, i64, i64);
/// One row of `invocations`: step id, attempt, process.
type InvocationRow = (String, i64, i64);

impl Effects {
    /// Executes `sql` (the same text on both backends) with a step's id, attempt and process.
    async fn execute_for_step(&self, sql: &'static str, s: &StepContext) -> Result<(), EffectError> {
        let (step_id, attempt) = (s.step_id.clone(), i64::from(s.attempt));
        match self {
            Effects::Pg(p) => {
                sqlx::query(sql).bind(step_id).bind(attempt).bind(pid()).execute(p).await?;
            }
            Effects::Sqlite(e) => e.execute(sql, (step_id, attempt, pid())).await?,
        }
        Ok(())
    }

    async fn create_tables(&self) {
        for sql in [
            "CREATE TABLE effects (step_id TEXT PRIMARY KEY, count BIGINT NOT NULL, attempt BIGINT NOT NULL,
                 pid BIGINT NOT NULL)",
            "CREATE TABLE invocations (step_id TEXT NOT NULL, attempt BIGINT NOT NULL, pid BIGINT NOT NULL)",
        ] {
            let created: Result<(), EffectError> = match self {
                Effects::Pg(p) => sqlx::query(sql).execute(p).await.map(drop).map_err(Into::into),
                Effects::Sqlite(e) => e.execute(sql, ()).await.map_err(Into::into),
            };
            created.expect("create the effect tables");
        }
    }

    /// A counter keyed by the step id (deliberately not idempotent: a second execution counts twice).
    async fn count(&self, s: &StepContext) -> Result<(), EffectError> {
        let sql = "INSERT INTO effects (step_id, count, attempt, pid) VALUES ($1, 1, $2, $3)
                   ON CONFLICT (step_id) DO UPDATE SET count = effects.count + 1";
        self.execute_for_step(sql, s).await
    }

    /// An idempotent effect keyed by the step id: the first execution's row stays.
    async fn apply_once(&self, s: &StepContext) -> Result<(), EffectError> {
        let sql = "INSERT INTO effects (step_id, count, attempt, pid) VALUES ($1, 1, $2, $3)
                   ON CONFLICT (step_id) DO NOTHING";
        self.execute_for_step(sql, s).await
    }

    /// Records that this attempt ran the step body.
    async fn invoked(&self, s: &StepContext) -> Result<(), EffectError> {
        self.execute_for_step("INSERT INTO invocations (step_id, attempt, pid) VALUES ($1, $2, $3)", s).await
    }

    async fn effect_rows(&self) -> Vec<EffectRow> {
        let sql = "SELECT step_id, count, attempt, pid FROM effects ORDER BY step_id";
        match self {
            Effects::Pg(p) => sqlx::query_as(sql).fetch_all(p).await.expect("read effects"),
            Effects::Sqlite(e) => {
                let row = |r: &rusqlite::Row<'_>| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?));
                e.query(sql, (), row).await.expect("read effects")
            }
        }
    }

    async fn invocation_rows(&self) -> Vec<InvocationRow> {
        let sql = "SELECT step_id, attempt, pid FROM invocations ORDER BY step_id, attempt";
        match self {
            Effects::Pg(p) => sqlx::query_as(sql).fetch_all(p).await.expect("read invocations"),
            Effects::Sqlite(e) => {
                let row = |r: &rusqlite::Row<'_>| Ok((r.get(0)?, r.get(1)?, r.get(2)?));
                e.query(sql, (), row).await.expect("read invocations")
            }
        }
    }

    async fn close(&self) {
        if let Effects::Pg(p) = self {
            p.close().await;
        }
    }
}

fn step_error(e: EffectError) -> StepError {
    StepError::retryable(e.to_string())
}

// ---------------------------------------------------------------------------------------------
// The child process: an engine executing some workflows until its stdin closes or it is killed.
// ---------------------------------------------------------------------------------------------

/// What a worker process runs.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct ChildConfig {
    db: Db,
    /// The workflows it registers, and therefore the only runs it executes.
    workflows: Vec<String>,
    workers: usize,
    lease_ms: u64,
}

/// `five_steps`: five steps, each counting its effect; returns the sum of their results (10).
async fn five_steps(ctx: WorkflowContext, effects: Arc<Effects>) -> Result<Value, WorkflowError> {
    let mut sum = 0;
    for i in 0..5u64 {
        let effects = Arc::clone(&effects);
        sum += ctx
            .step(&format!("s{i}"), move |s: StepContext| async move {
                effects.count(&s).await.map_err(step_error)?;
                Ok(i)
            })
            .await?;
    }
    Ok(json!(sum))
}

/// `claim_<i>`: once the process was told `go`, asks for the hook `input.token`. The owner holds
/// it until a payload arrives; a run that gets a conflict completes with the owner's id.
async fn claim(ctx: WorkflowContext, input: Value, mut go: watch::Receiver<bool>) -> Result<Value, WorkflowError> {
    let token = input["token"].as_str().unwrap_or_default().to_owned();
    println!("{CLAIM_READY} {}", ctx.run_id());
    // Only this process executes this workflow, so a replay passes here at once.
    let _ = go.wait_for(|go| *go).await;
    match ctx.hook(&token, json!({ "pid": pid() })).await {
        Ok(hook) => Ok(json!({ "created": true, "payload": hook.next().await? })),
        Err(WorkflowError::HookConflict { owner_run_id, .. }) => Ok(json!({ "conflict": owner_run_id })),
        Err(e) => Err(e),
    }
}

/// `kill_step`: one step that applies its idempotent effect and then, in its first attempt, tells
/// the parent and blocks until the process is killed. Returns the attempt that completed.
async fn kill_step(ctx: WorkflowContext, effects: Arc<Effects>) -> Result<Value, WorkflowError> {
    let attempt: u32 = ctx
        .step("effect", move |s: StepContext| async move {
            effects.invoked(&s).await.map_err(step_error)?;
            effects.apply_once(&s).await.map_err(step_error)?;
            if s.attempt == 1 {
                println!("{IN_STEP} {} {} {}", s.run_id, s.step_id, pid());
                std::future::pending::<()>().await;
            }
            Ok(s.attempt)
        })
        .await?;
    Ok(json!({ "attempt": attempt }))
}

/// `sleeper`: sleeps durably for `input.sleep_ms`.
async fn sleeper(ctx: WorkflowContext, input: Value) -> Result<Value, WorkflowError> {
    ctx.sleep(Duration::from_millis(input["sleep_ms"].as_u64().unwrap_or(0))).await;
    Ok(json!("woke"))
}

/// `resumed`: takes `input.n` payloads of the hook `input.token`, printing when it holds each
/// (replays print the earlier ones again).
async fn resumed(ctx: WorkflowContext, input: Value) -> Result<Value, WorkflowError> {
    let token = input["token"].as_str().unwrap_or_default().to_owned();
    let n = input["n"].as_u64().unwrap_or(0);
    let hook = ctx.hook(&token, json!({})).await?;
    for i in 0..n {
        hook.next().await?;
        println!("{GOT} {} {i} {}", ctx.run_id(), unix_micros());
    }
    Ok(json!(n))
}

fn register(
    builder: EngineBuilder,
    name: &str,
    effects: Option<&Arc<Effects>>,
    go: &watch::Receiver<bool>,
) -> EngineBuilder {
    let effects = effects.cloned();
    let needs_effects = move || Arc::clone(effects.as_ref().expect("effects"));
    match name {
        FIVE_STEPS => {
            let effects = needs_effects();
            builder.register(name, move |ctx, _input| five_steps(ctx, Arc::clone(&effects)))
        }
        KILL_STEP => {
            let effects = needs_effects();
            builder.register(name, move |ctx, _input| kill_step(ctx, Arc::clone(&effects)))
        }
        SLEEPER => builder.register(name, sleeper),
        RESUMED => builder.register(name, resumed),
        claim_name if claim_name.starts_with(CLAIM_PREFIX) => {
            let go = go.clone();
            builder.register(name, move |ctx, input| claim(ctx, input, go.clone()))
        }
        other => panic!("unknown workflow {other}"),
    }
}

async fn child_main(config: ChildConfig, go: watch::Receiver<bool>) {
    let connections = u32::try_from(config.workers).unwrap() + 2;
    let store = config.db.open_store(connections).await;
    let needs_effects = config.workflows.iter().any(|w| w == FIVE_STEPS || w == KILL_STEP);
    let effects = match needs_effects {
        true => Some(Arc::new(config.db.effects(2).await)),
        false => None,
    };
    let mut builder = Engine::builder(store)
        .workers(config.workers)
        .lease(Duration::from_millis(config.lease_ms))
        .poll_interval(config.db.poll_interval());
    for name in &config.workflows {
        builder = register(builder, name, effects.as_ref(), &go);
    }
    let _engine = builder.build();
    println!("{READY}");
    tokio::time::sleep(CHILD_LIFETIME).await;
}

/// The entry point of a worker process; does nothing in a normal test run.
#[test]
fn child_process_entry() {
    let Ok(config) = std::env::var(CHILD_ENV) else {
        return;
    };
    let config: ChildConfig = serde_json::from_str(&config).expect("child configuration");
    let (go_tx, go) = watch::channel(false);
    // `go` lines release the claim workflows; the end of stdin (the parent went away) ends the process.
    std::thread::spawn(move || {
        for line in std::io::stdin().lock().lines() {
            match line {
                Ok(line) if line.trim() == "go" => {
                    let _ = go_tx.send(true);
                }
                Ok(_) => {}
                Err(_) => break,
            }
        }
        std::process::exit(0);
    });
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    runtime.block_on(child_main(config, go));
    std::process::exit(0);
}

// ---------------------------------------------------------------------------------------------
// The parent: a client engine, the side-effect tables, and a fleet of worker processes.
// ---------------------------------------------------------------------------------------------

/// A worker process.
struct Proc {
    child: Child,
    stdin: Option<ChildStdin>,
    pid: i64,
}

/// The worker processes of a test and every marker line they printed, tagged by process index.
struct Fleet {
    procs: Vec<Proc>,
    tx: mpsc::UnboundedSender<(usize, String)>,
    rx: mpsc::UnboundedReceiver<(usize, String)>,
    printed: Vec<(usize, String)>,
}

impl Fleet {
    fn new() -> Fleet {
        let (tx, rx) = mpsc::unbounded_channel();
        Fleet { procs: Vec::new(), tx, rx, printed: Vec::new() }
    }

    /// Starts a worker process (killed when the fleet is dropped); returns its index.
    fn spawn(&mut self, config: &ChildConfig) -> usize {
        let exe = std::env::current_exe().expect("test binary path");
        let mut child = Command::new(exe)
            .args(["--exact", "child_process_entry", "--nocapture", "--test-threads=1"])
            .env(CHILD_ENV, serde_json::to_string(config).unwrap())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .expect("spawn worker process");
        let index = self.procs.len();
        let stdout = child.stdout.take().expect("child stdout");
        let tx = self.tx.clone();
        tokio::spawn(async move {
            let mut reader = BufReader::new(stdout).lines();
            while let Ok(Some(line)) = reader.next_line().await {
                // libtest may print "test child_process_entry ... " before the first marker.
                if let Some(i) = line.find("MP-") {
                    if tx.send((index, line[i..].to_owned())).is_err() {
                        break;
                    }
                }
            }
        });
        let pid = i64::from(child.id().expect("child pid"));
        let stdin = child.stdin.take();
        self.procs.push(Proc { child, stdin, pid });
        index
    }

    /// Starts `n` worker processes at once and waits until each one's engine runs.
    async fn start(&mut self, config: &ChildConfig, n: usize) -> Vec<usize> {
        let started: Vec<usize> = (0..n).map(|_| self.spawn(config)).collect();
        for &i in &started {
            self.wait_line(&format!("process {i} to be ready"), |p, l| p == i && l == READY).await;
        }
        started
    }

    fn pid(&self, index: usize) -> i64 {
        self.procs[index].pid
    }

    /// The first line (of any process) that `matches`, printed already or waited for.
    async fn wait_line(&mut self, what: &str, matches: impl Fn(usize, &str) -> bool) -> (usize, String) {
        if let Some(found) = self.printed.iter().find(|(p, l)| matches(*p, l)) {
            return found.clone();
        }
        let deadline = Instant::now() + TIMEOUT;
        loop {
            match tokio::time::timeout_at(deadline, self.rx.recv()).await {
                Ok(Some((p, line))) => {
                    self.printed.push((p, line.clone()));
                    if matches(p, &line) {
                        return (p, line);
                    }
                }
                Ok(None) => unreachable!("the fleet holds a sender"),
                Err(_) => panic!("timed out waiting for {what}; the workers printed {:?}", self.printed),
            }
        }
    }

    /// Tells every process `line` on its stdin, all at about the same moment.
    async fn tell_all(&mut self, line: &str) {
        for proc in &mut self.procs {
            let stdin = proc.stdin.as_mut().expect("child stdin");
            stdin.write_all(format!("{line}\n").as_bytes()).await.expect("write to child");
            stdin.flush().await.expect("flush child stdin");
        }
    }

    /// Kills process `index` with SIGKILL and reaps it.
    async fn kill(&mut self, index: usize) {
        let child = &mut self.procs[index].child;
        child.start_kill().expect("send SIGKILL");
        let status = child.wait().await.expect("reap child");
        assert_eq!(status.signal(), Some(9), "worker {index} ended on its own: {status:?}");
    }

    /// Stops every process: their stdin closes (they exit), then whatever remains is killed.
    async fn stop(mut self) {
        for proc in &mut self.procs {
            proc.stdin = None;
        }
        for proc in &mut self.procs {
            let _ = proc.child.start_kill();
            let _ = proc.child.wait().await;
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Backend {
    Pg,
    Sqlite,
}

/// Removes a test's database when dropped: its PostgreSQL schema, or its SQLite directory.
enum Cleanup {
    Schema { url: String, schema: String },
    Dir(PathBuf),
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        match self {
            Cleanup::Dir(dir) => {
                let _ = std::fs::remove_dir_all(dir);
            }
            Cleanup::Schema { url, schema } => {
                let (url, schema) = (url.clone(), schema.clone());
                // Drop runs inside the test's runtime: clean up on a thread of its own.
                let cleanup = std::thread::spawn(move || {
                    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
                    runtime.block_on(drop_schema(&url, &schema));
                });
                let _ = cleanup.join();
            }
        }
    }
}

/// Drops a test schema, best effort (a leftover is swept by the PostgreSQL tests after an hour).
async fn drop_schema(url: &str, schema: &str) {
    let Ok(Ok(mut conn)) = tokio::time::timeout(Duration::from_secs(5), sqlx::PgConnection::connect(url)).await else {
        return;
    };
    let _ = sqlx::query("SET lock_timeout = '5s'").execute(&mut conn).await;
    // Test schema names are plain identifiers.
    let _ = sqlx::query(&format!("DROP SCHEMA IF EXISTS {schema} CASCADE")).execute(&mut conn).await;
    let _ = conn.close().await;
}

/// One test's database, client engine and side-effect tables.
struct Setup {
    db: Db,
    engine: Engine,
    effects: Effects,
    _cleanup: Cleanup,
}

impl Setup {
    /// A fresh database for the test `name`, with a client engine that knows `workflows` (to start
    /// them) but executes nothing. `None` when the PostgreSQL tests are skipped.
    async fn new(backend: Backend, name: &str, workflows: &[String], relaxed: bool) -> Option<Setup> {
        let (db, cleanup) = match backend {
            Backend::Pg => {
                let url = resumable_workflow::testing::postgres_url()?;
                // The format whose leftovers the PostgreSQL tests sweep away.
                let secs = now_ms() / 1000;
                let schema = format!("rt_{secs}_{}_mp_{name}", random_hex(6));
                let cleanup = Cleanup::Schema { url: url.clone(), schema: schema.clone() };
                (Db::Pg { url, schema }, cleanup)
            }
            Backend::Sqlite => {
                let dir = std::env::temp_dir().join(format!("resumable-multiprocess-{name}-{}", random_hex(8)));
                std::fs::create_dir_all(&dir).unwrap();
                (Db::Sqlite { dir: dir.clone(), relaxed }, Cleanup::Dir(dir))
            }
        };
        // Opening the store creates the schema and its tables before any worker process starts.
        let store = db.open_store(4).await;
        let mut builder = Engine::builder(store).workers(0);
        for workflow in workflows {
            builder = builder.register(workflow, |_ctx: WorkflowContext, _input: Value| async {
                Err(WorkflowError::msg("the test process executes nothing"))
            });
        }
        let engine = builder.build();
        let effects = db.effects(4).await;
        effects.create_tables().await;
        Some(Setup { db, engine, effects, _cleanup: cleanup })
    }

    fn config(&self, workflows: &[&str], workers: usize, lease: Duration) -> ChildConfig {
        ChildConfig {
            db: self.db.clone(),
            workflows: workflows.iter().map(|w| (*w).to_owned()).collect(),
            workers,
            lease_ms: u64::try_from(lease.as_millis()).unwrap(),
        }
    }

    fn label(&self) -> &'static str {
        match self.db {
            Db::Pg { .. } => "postgres",
            Db::Sqlite { .. } => "sqlite",
        }
    }

    async fn start(&self, workflow: &str, input: Value) -> RunId {
        self.engine.start(workflow, input, StartOptions::default()).await.expect("start run")
    }

    /// Polls the run and its events until `check` holds; returns the events.
    async fn wait_events(&self, run: &RunId, what: &str, check: impl Fn(&RunInfo, &[Event]) -> bool) -> Vec<Event> {
        let deadline = Instant::now() + TIMEOUT;
        loop {
            let info = self.engine.get_run(run).await.unwrap();
            let events = self.engine.events(run).await.unwrap();
            if check(&info, &events) {
                return events;
            }
            assert!(Instant::now() < deadline, "run {run} never got {what}: {info:?}\n{events:#?}");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    async fn completed(&self, run: &RunId) -> RunInfo {
        let info = self.engine.wait_for(run, TIMEOUT).await.expect("run ends");
        assert_eq!(info.status, RunStatus::Completed, "run {run}: {info:?}");
        info
    }

    async fn finish(self) {
        self.engine.shutdown().await;
        self.effects.close().await;
    }
}

/// The events of `kind`.
fn of(events: &[Event], kind: EventKind) -> Vec<&Event> {
    events.iter().filter(|e| e.kind == kind).collect()
}

fn at_ms(e: &Event) -> i64 {
    ms_of(e.created_at)
}

fn owners(events: &[Event]) -> Vec<String> {
    of(events, EventKind::RunStarted).iter().map(|e| e.payload["owner"].as_str().unwrap().to_owned()).collect()
}

fn median(xs: &mut [f64]) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}

// ---------------------------------------------------------------------------------------------
// 1. Four worker processes, 1,000 runs of five steps: every step executed exactly once.
// ---------------------------------------------------------------------------------------------

const RUNS: usize = 1_000;
const STEPS: usize = 5;
const PROCESSES: usize = 4;

async fn many_runs_exactly_once(backend: Backend) {
    // SQLite: 1,000 runs are ~12,000 write transactions of the run store serialized across the
    // processes, plus 5,000 of the effects database; with `synchronous = FULL` most cost an fsync
    // (~2 ms on the test machine: the test took ~30 s instead of ~17 s), so this test relaxes it to
    // NORMAL, durable against process crashes, which is all it needs. The other tests keep FULL.
    let workflows = [FIVE_STEPS.to_owned()];
    let Some(setup) = Setup::new(backend, "runs", &workflows, true).await else { return };
    // A long lease: a busy machine must not make any execution lose its lease (checked below).
    let config = setup.config(&[FIVE_STEPS], 4, Duration::from_secs(10));

    // The runs are created first, so that the 4 processes compete for a full queue from their first
    // claims, and the creations do not compete with the workers for the small machine's cores.
    let began = Instant::now();
    let starters: Vec<_> = (0..4)
        .map(|_| {
            let engine = setup.engine.clone();
            tokio::spawn(async move {
                let mut ids = Vec::new();
                for _ in 0..RUNS / 4 {
                    ids.push(engine.start(FIVE_STEPS, json!({}), StartOptions::default()).await.expect("start"));
                }
                ids
            })
        })
        .collect();
    let mut ids = HashSet::new();
    for starter in starters {
        ids.extend(starter.await.unwrap());
    }
    assert_eq!(ids.len(), RUNS);
    let started = began.elapsed();
    let mut fleet = Fleet::new();
    let began = Instant::now();
    let procs = fleet.start(&config, PROCESSES).await;

    // The parent only waits: until no run is left pending, running or waiting. The 4 processes
    // compete for the 1,000 pending runs from the start.
    let open = RunFilter::default().status(RunStatus::Pending).status(RunStatus::Running).status(RunStatus::Waiting);
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        if setup.engine.list_runs(&open.clone().limit(1)).await.unwrap().runs.is_empty() {
            break;
        }
        assert!(Instant::now() < deadline, "runs still open after 120 s");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let elapsed = began.elapsed();

    // Every run completed, claimed exactly once (its lease attempt is 1: nothing was taken over).
    let page = setup.engine.list_runs(&RunFilter::default().limit(RunFilter::MAX_LIMIT)).await.unwrap();
    assert!(page.next_cursor.is_none(), "more runs than started");
    assert_eq!(page.runs.len(), RUNS);
    for run in &page.runs {
        assert!(ids.contains(&run.id), "unknown run {}", run.id);
        assert_eq!(run.status, RunStatus::Completed, "{run:?}");
        assert_eq!(run.output, Some(json!(10)), "{run:?}");
        assert_eq!(run.attempt, 1, "run {} was claimed {} times", run.id, run.attempt);
    }

    // The event logs agree: one claim, five steps started and completed once each, as attempt 1.
    let ids: Vec<RunId> = ids.into_iter().collect();
    let checkers: Vec<_> = ids
        .chunks(RUNS / 4)
        .map(|chunk| {
            let (engine, chunk) = (setup.engine.clone(), chunk.to_vec());
            tokio::spawn(async move {
                for run in chunk {
                    let events = engine.events(&run).await.unwrap();
                    assert_eq!(of(&events, EventKind::RunStarted).len(), 1, "run {run}");
                    assert_eq!(of(&events, EventKind::StepStarted).len(), STEPS, "run {run}");
                    let completed = of(&events, EventKind::StepCompleted);
                    assert_eq!(completed.len(), STEPS, "run {run}");
                    assert!(completed.iter().all(|e| e.payload["attempt"] == json!(1)), "run {run}: {completed:?}");
                }
            })
        })
        .collect();
    for checker in checkers {
        checker.await.unwrap();
    }

    // The side effects: one row per step id, each counted once, by attempt 1.
    let rows = setup.effects.effect_rows().await;
    let expected: HashSet<String> = ids.iter().flat_map(|run| (0..STEPS).map(move |p| format!("{run}:{p}"))).collect();
    let seen: HashSet<String> = rows.iter().map(|r| r.0.clone()).collect();
    assert_eq!(rows.len(), RUNS * STEPS);
    assert_eq!(seen, expected, "the steps ran under these step ids");
    let twice: Vec<&EffectRow> = rows.iter().filter(|r| r.1 != 1 || r.2 != 1).collect();
    assert!(twice.is_empty(), "steps executed more than once or not as attempt 1: {twice:?}");
    let mut per_process = BTreeMap::new();
    for row in &rows {
        *per_process.entry(row.3).or_insert(0usize) += 1;
    }
    let pids: Vec<i64> = procs.iter().map(|&p| fleet.pid(p)).collect();
    assert!(per_process.keys().all(|p| pids.contains(p)), "steps ran outside the workers: {per_process:?}");
    assert_eq!(per_process.len(), PROCESSES, "every worker process executed steps: {per_process:?}");

    eprintln!(
        "[{}] {RUNS} runs x {STEPS} steps: started in {:.2} s, then done by {PROCESSES} processes in {:.2} s \
         ({:.0} steps/s); steps per process {:?}",
        setup.label(),
        started.as_secs_f64(),
        elapsed.as_secs_f64(),
        (RUNS * STEPS) as f64 / elapsed.as_secs_f64(),
        per_process.values().collect::<Vec<_>>(),
    );
    fleet.stop().await;
    setup.finish().await;
}

on_both_backends!(many_runs_exactly_once: pg_four_processes_run_every_step_exactly_once, sqlite_four_processes_run_every_step_exactly_once);

// ---------------------------------------------------------------------------------------------
// 2. Twelve processes claim one hook token at about the same moment: one wins.
// ---------------------------------------------------------------------------------------------

const CLAIMERS: usize = 12;

async fn concurrent_hook_claims(backend: Backend) {
    let names: Vec<String> = (0..CLAIMERS).map(|i| format!("{CLAIM_PREFIX}{i}")).collect();
    let Some(setup) = Setup::new(backend, "claims", &names, false).await else { return };
    let mut fleet = Fleet::new();
    // Each process registers its own workflow, so each run executes in its own process.
    let procs: Vec<usize> =
        names.iter().map(|name| fleet.spawn(&setup.config(&[name.as_str()], 1, Duration::from_secs(10)))).collect();
    for &p in &procs {
        fleet.wait_line("the claimers to be ready", |i, l| i == p && l == READY).await;
    }
    let token = format!("contended-{}", random_hex(8));
    let mut runs = Vec::new();
    for name in &names {
        runs.push(setup.start(name, json!({ "token": token })).await);
    }
    // Every run is executing in its process and about to ask; then all are released together.
    let mut claimed_by = Vec::new();
    for run in &runs {
        let line = format!("{CLAIM_READY} {run}");
        claimed_by.push(fleet.wait_line("every run to be ready to claim", |_, l| l == line).await.0);
    }
    assert_eq!(claimed_by.iter().collect::<HashSet<_>>().len(), CLAIMERS, "one run per process");
    fleet.tell_all("go").await;

    // The owner waits on its hook; the others complete with a conflict.
    let mut infos = Vec::new();
    for run in &runs {
        let info = setup.engine.wait_until(run, TIMEOUT, |r| r.status.is_terminal() || r.status == RunStatus::Waiting);
        infos.push(info.await.expect("the claim is decided"));
    }
    let waiting: Vec<&RunInfo> = infos.iter().filter(|r| r.status == RunStatus::Waiting).collect();
    assert_eq!(waiting.len(), 1, "exactly one run owns the hook: {infos:#?}");
    let owner = waiting[0].id.clone();
    assert_eq!(setup.engine.get_hook(&token).await.unwrap().expect("active hook").run_id, owner);
    let mut decided_at = Vec::new();
    let mut engines = HashSet::new();
    for info in &infos {
        let events = setup.engine.events(&info.id).await.unwrap();
        let (created, conflicts) = (of(&events, EventKind::HookCreated), of(&events, EventKind::HookConflict));
        decided_at.extend(created.iter().chain(&conflicts).map(|e| at_ms(e)));
        engines.extend(owners(&events));
        if info.id == owner {
            assert_eq!((created.len(), conflicts.len()), (1, 0), "the owner: {events:#?}");
        } else {
            assert_eq!(info.status, RunStatus::Completed, "{info:?}");
            assert_eq!(info.output, Some(json!({ "conflict": owner })), "{info:?}");
            assert_eq!((created.len(), conflicts.len()), (0, 1), "a loser: {events:#?}");
            assert_eq!(conflicts[0].payload["owner_run_id"], json!(owner));
        }
    }
    assert_eq!(engines.len(), CLAIMERS, "each run was executed by the engine of its own process");
    let losers = infos.iter().filter(|r| r.status == RunStatus::Completed).count();
    assert_eq!(losers, CLAIMERS - 1);

    // The owner completes once resumed, and its hook is disposed with it.
    setup.engine.resume_hook(&token, json!("done")).await.expect("resume the owner");
    let info = setup.completed(&owner).await;
    assert_eq!(info.output, Some(json!({ "created": true, "payload": "done" })));
    assert_eq!(setup.engine.get_hook(&token).await.unwrap(), None);
    let spread = decided_at.iter().max().unwrap() - decided_at.iter().min().unwrap();
    eprintln!(
        "[{}] {CLAIMERS} concurrent claims from {CLAIMERS} processes: 1 created, {losers} conflicts, \
         decided within {spread} ms",
        setup.label()
    );
    fleet.stop().await;
    setup.finish().await;
}

on_both_backends!(concurrent_hook_claims: pg_concurrent_hook_claims_from_twelve_processes, sqlite_concurrent_hook_claims_from_twelve_processes);

// ---------------------------------------------------------------------------------------------
// 3. A worker killed inside a step: another process takes the run over after the lease.
// ---------------------------------------------------------------------------------------------

/// Short, so that the takeover comes quickly.
const SHORT_LEASE: Duration = Duration::from_secs(1);

async fn killed_worker_is_taken_over(backend: Backend) {
    let Some(setup) = Setup::new(backend, "kill", &[KILL_STEP.to_owned()], false).await else { return };
    let mut fleet = Fleet::new();
    let procs = fleet.start(&setup.config(&[KILL_STEP], 2, SHORT_LEASE), 2).await;
    let run = setup.start(KILL_STEP, json!({})).await;
    let prefix = format!("{IN_STEP} {run} ");
    let (victim, line) = fleet.wait_line("the step's first attempt", |_, l| l.starts_with(&prefix)).await;
    let step_id = line.split(' ').nth(2).expect("step id").to_owned();
    let (victim_pid, survivor) = (fleet.pid(victim), procs.iter().copied().find(|&p| p != victim).unwrap());
    let killed_at = now_ms();
    fleet.kill(victim).await;

    let info = setup.completed(&run).await;
    assert_eq!(info.output, Some(json!({ "attempt": 2 })));
    assert_eq!(info.attempt, 2, "claimed twice: by the victim, then by the survivor");
    let events = setup.engine.events(&run).await.unwrap();
    let started = of(&events, EventKind::StepStarted);
    let attempts: Vec<&Value> = started.iter().map(|e| &e.payload["attempt"]).collect();
    assert_eq!(attempts, [&json!(1), &json!(2)], "{events:#?}");
    let completed = of(&events, EventKind::StepCompleted);
    assert_eq!(completed.len(), 1, "{events:#?}");
    assert_eq!(completed[0].payload["attempt"], json!(2));
    let owners = owners(&events);
    assert_eq!(owners.len(), 2, "{events:#?}");
    assert_ne!(owners[0], owners[1], "taken over by another engine");

    // The effect exists once (from the killed attempt); both attempts ran the body, in two processes.
    assert_eq!(step_id, format!("{run}:0"));
    assert_eq!(setup.effects.effect_rows().await, vec![(step_id.clone(), 1, 1, victim_pid)]);
    let survivor_pid = fleet.pid(survivor);
    assert_eq!(
        setup.effects.invocation_rows().await,
        vec![(step_id.clone(), 1, victim_pid), (step_id, 2, survivor_pid)]
    );

    let takeover = at_ms(started[1]) - killed_at;
    eprintln!(
        "[{}] worker killed inside a step; taken over by another process {takeover} ms after the kill \
         (lease {} ms)",
        setup.label(),
        SHORT_LEASE.as_millis()
    );
    assert!(takeover < TIMEOUT.as_millis() as i64);
    fleet.stop().await;
    setup.finish().await;
}

on_both_backends!(killed_worker_is_taken_over: pg_worker_killed_inside_a_step_is_taken_over, sqlite_worker_killed_inside_a_step_is_taken_over);

// ---------------------------------------------------------------------------------------------
// 4. A timer due while every worker is down fires once when a worker comes back.
// ---------------------------------------------------------------------------------------------

/// Long enough that the only worker is surely killed before the timer falls due.
const SLEEP_MS: u64 = 1200;
/// How long after the due time the workers stay down.
const DOWN_PAST_DUE_MS: i64 = 300;

async fn timer_due_while_workers_are_down(backend: Backend) {
    let Some(setup) = Setup::new(backend, "timer", &[SLEEPER.to_owned()], false).await else { return };
    let config = setup.config(&[SLEEPER], 1, Duration::from_secs(5));
    let mut fleet = Fleet::new();
    let first = fleet.start(&config, 1).await[0];
    let run = setup.start(SLEEPER, json!({ "sleep_ms": SLEEP_MS })).await;
    setup
        .wait_events(&run, "waiting on its timer", |info, events| {
            info.status == RunStatus::Waiting && !of(events, EventKind::WaitCreated).is_empty()
        })
        .await;
    fleet.kill(first).await;
    let events = setup.engine.events(&run).await.unwrap();
    assert!(of(&events, EventKind::WaitCompleted).is_empty(), "the timer fired before every worker was down");
    let due_at = of(&events, EventKind::WaitCreated)[0].payload["due_at"].as_i64().expect("due_at");

    // No worker while the timer falls due: nothing happens.
    let wait = (due_at + DOWN_PAST_DUE_MS - now_ms()).max(0);
    tokio::time::sleep(Duration::from_millis(wait.unsigned_abs())).await;
    let info = setup.engine.get_run(&run).await.unwrap();
    assert_eq!(info.status, RunStatus::Waiting, "{info:?}");
    assert!(of(&setup.engine.events(&run).await.unwrap(), EventKind::WaitCompleted).is_empty());

    let restarted_at = now_ms();
    fleet.start(&config, 1).await;
    let info = setup.completed(&run).await;
    assert_eq!(info.output, Some(json!("woke")));
    let events = setup.engine.events(&run).await.unwrap();
    let fired = of(&events, EventKind::WaitCompleted);
    assert_eq!(fired.len(), 1, "the timer fired once: {events:#?}");
    assert_eq!(fired[0].payload["fired"], json!(true));
    let fired_at = at_ms(fired[0]);
    assert!(fired_at >= due_at, "fired {} ms early", due_at - fired_at);
    assert!(fired_at >= restarted_at, "fired before a worker came back");
    assert!(ms_of(info.completed_at.expect("completion time")) >= due_at);
    let owners = owners(&events);
    assert_eq!(owners.len(), 2, "{events:#?}");
    assert_ne!(owners[0], owners[1]);
    eprintln!(
        "[{}] timer due while every worker was down: fired once, {} ms after the new worker was started \
         ({} ms after its due time)",
        setup.label(),
        fired_at - restarted_at,
        fired_at - due_at
    );
    fleet.stop().await;
    setup.finish().await;
}

on_both_backends!(timer_due_while_workers_are_down: pg_timer_due_while_every_worker_is_down_fires_once, sqlite_timer_due_while_every_worker_is_down_fires_once);

// ---------------------------------------------------------------------------------------------
// 5. A hook resumed from another process wakes the waiting run quickly.
// ---------------------------------------------------------------------------------------------

const RESUMES: u64 = 10;

async fn cross_process_resume_wakes_quickly(backend: Backend) {
    let Some(setup) = Setup::new(backend, "wake", &[RESUMED.to_owned()], false).await else { return };
    let mut fleet = Fleet::new();
    fleet.start(&setup.config(&[RESUMED], 2, Duration::from_secs(10)), 1).await;
    let token = format!("wake-{}", random_hex(8));
    let run = setup.start(RESUMED, json!({ "token": token, "n": RESUMES })).await;
    let mut latencies = Vec::new();
    for i in 0..RESUMES {
        let waiting = setup.engine.wait_until(&run, TIMEOUT, |r| r.status == RunStatus::Waiting).await;
        waiting.expect("the run waits on its hook");
        let resumed_at = unix_micros();
        setup.engine.resume_hook(&token, json!(i)).await.expect("resume");
        let prefix = format!("{GOT} {run} {i} ");
        let (_, line) = fleet.wait_line("the payload in the worker", |_, l| l.starts_with(&prefix)).await;
        let got: i64 = line[prefix.len()..].parse().expect("timestamp");
        latencies.push((got - resumed_at) as f64 / 1000.0);
    }
    assert_eq!(setup.completed(&run).await.output, Some(json!(RESUMES)));
    let max = latencies.iter().copied().fold(0.0, f64::max);
    eprintln!(
        "[{}] hook resumed from the test process -> payload in the worker process: p50 {:.2} ms, max {max:.2} ms \
         ({RESUMES} resumes{})",
        setup.label(),
        median(&mut latencies.clone()),
        if backend == Backend::Pg { ", NOTIFY" } else { ", polling every 25 ms" }
    );
    assert!(max < 1000.0, "a resume took {max} ms to reach the worker: {latencies:?}");
    fleet.stop().await;
    setup.finish().await;
}

on_both_backends!(cross_process_resume_wakes_quickly: pg_cross_process_hook_resume_wakes_the_run_quickly, sqlite_cross_process_hook_resume_wakes_the_run_quickly);
