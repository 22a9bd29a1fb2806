//! Crash tests: workflows run in child processes (this test binary, re-executed) that are killed
//! with SIGKILL at chosen points, then restarted on the same SQLite database file.
//!
//! The workflow is `step a → step b → sleep → hook → step c`. Kill points: inside a step (started,
//! not completed), between two steps (one completed, the next not started), while sleeping on the
//! durable timer, right after the timer fired, while waiting on the hook, and during a hook resume
//! (right after the payload was committed, in the continuation between operations, and inside the
//! step that follows). After the restarts every run must complete; each step's recorded result must
//! be the value the workflow saw, before and after every crash; a side-effect counter keyed by the
//! step id must show exactly one effect per step; the timer must fire exactly once, never early.
//!
//! Side effects live in a separate SQLite file and are a plain (non-idempotent) counter, so a step
//! executed again after it completed would count twice. A step body applies its effect only after
//! the point where it may block to be killed, so a killed attempt leaves no effect behind.

use std::io::Read;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, UNIX_EPOCH};

use resumable_workflow::{
    Engine, Event, EventKind, RunId, RunStatus, SqliteStore, SqliteStoreOptions, StartOptions, StepContext, StepError,
    WorkflowContext, WorkflowError,
};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, ChildStdin, Command};
use tokio::sync::mpsc;
use tokio::time::Instant;

mod effects;
use effects::SqliteEffects;

/// Set (to the test's directory) in a child process.
const CHILD_DIR_ENV: &str = "RESUMABLE_CRASH_CHILD_DIR";
/// The child's phase: 1 for the first process of a test, 2 for the first restart, ...
const CHILD_PHASE_ENV: &str = "RESUMABLE_CRASH_CHILD_PHASE";
const WORKFLOW: &str = "crashy";
/// Short, so that a restart takes over a killed process's runs quickly; long enough that a busy
/// machine does not delay a heartbeat past it (a healthy execution losing its lease would run a
/// step's effect again, which this test counts as a failure).
const LEASE: Duration = Duration::from_millis(1000);
/// Enough workers for every run of a test to be blocked at once, plus spares.
const CHILD_WORKERS: usize = 10;
/// A child never outlives this, even if its parent vanished without closing its stdin.
const CHILD_LIFETIME: Duration = Duration::from_secs(120);
/// Generous: the machine may be slow and busy.
const TIMEOUT: Duration = Duration::from_secs(30);
const MARK: &str = "CRASH-MARK";
const READY: &str = "CRASH-READY";
/// The sleep of a run that is killed while sleeping (long enough to be still asleep at the kill).
const LONG_SLEEP_MS: u64 = 1500;
const SHORT_SLEEP_MS: u64 = 300;

/// Operation positions of the workflow (steps, timers and hooks share one counter).
const POS_A: u64 = 0;
const POS_B: u64 = 1;
const POS_SLEEP: u64 = 2;
const POS_HOOK: u64 = 3;
const POS_C: u64 = 4;

/// Where a child may block so that it is killed there.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Point {
    /// Inside step a, after its attempt started, before its effect.
    InA,
    /// After step a completed, before step b.
    BetweenAB,
    /// Inside step b.
    InB,
    /// After the timer fired, before the hook.
    AfterSleep,
    /// After the hook payload was received, before step c.
    AfterHook,
    /// Inside step c.
    InC,
}

impl Point {
    fn name(self) -> &'static str {
        match self {
            Point::InA => "in_a",
            Point::BetweenAB => "between_a_b",
            Point::InB => "in_b",
            Point::AfterSleep => "after_sleep",
            Point::AfterHook => "after_hook",
            Point::InC => "in_c",
        }
    }
}

/// Where a run stands when its process is killed, in one phase.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stop {
    /// Blocked at this point (the child prints a marker there).
    At(Point),
    /// Suspended on its durable timer.
    Sleeping,
    /// Suspended on its hook.
    OnHook,
    /// The hook is resumed from outside; then blocked at this point of the continuation.
    ResumeThen(Point),
    /// The hook is resumed from outside and the process killed at once (step c is armed, so the
    /// kill cannot fall between its effect and its recorded completion).
    ResumeAndKill,
}

impl Stop {
    /// The point the workflow blocks at in this phase, if any.
    fn armed(self) -> Option<Point> {
        match self {
            Stop::At(p) | Stop::ResumeThen(p) => Some(p),
            Stop::ResumeAndKill => Some(Point::InC),
            Stop::Sleeping | Stop::OnHook => None,
        }
    }

    /// The order in which the runs of one phase are brought to their stops: stable ones first, the
    /// timer (which runs out) late, immediate kills last.
    fn rank(self) -> u8 {
        match self {
            Stop::At(_) | Stop::ResumeThen(_) => 0,
            Stop::OnHook => 1,
            Stop::Sleeping => 2,
            Stop::ResumeAndKill => 3,
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The child process: an engine executing the workflow until it is killed.
// ---------------------------------------------------------------------------------------------

/// What the workflow needs in a child process.
struct ChildEnv {
    phase: u64,
    effects: SqliteEffects,
}

impl ChildEnv {
    /// Whether the run's input arms `point` for this process.
    fn armed(&self, input: &Value, point: Point) -> bool {
        input["arm"][point.name()].as_u64() == Some(self.phase)
    }

    /// Blocks forever at `point` if armed, after telling the parent.
    async fn pause(&self, ctx: &WorkflowContext, input: &Value, point: Point, seen: &Value) {
        if self.armed(input, point) {
            mark(point, ctx.run_id(), seen);
            std::future::pending::<()>().await;
        }
    }

    async fn record_invocation(&self, s: &StepContext) -> rusqlite::Result<()> {
        let sql = "INSERT INTO invocations (step_id, attempt, pid) VALUES (?, ?, ?)";
        self.effects.execute(sql, (s.step_id.clone(), s.attempt, std::process::id())).await
    }

    /// The side effect: a counter keyed by the step id (deliberately not idempotent).
    async fn apply_effect(&self, step_id: &str, value: &str) -> rusqlite::Result<()> {
        let sql = "INSERT INTO effects (step_id, count, value) VALUES (?, 1, ?)
                   ON CONFLICT (step_id) DO UPDATE SET count = count + 1, value = excluded.value";
        self.effects.execute(sql, (step_id.to_owned(), value.to_owned())).await
    }
}

fn mark(point: Point, run: &RunId, seen: &Value) {
    // stdout is line-buffered: the parent sees the line at once.
    println!("{MARK} {} {run} {seen}", point.name());
}

fn random_hex() -> String {
    let mut bytes = [0u8; 8];
    getrandom::fill(&mut bytes).expect("random source");
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn step_error(e: rusqlite::Error) -> StepError {
    StepError::retryable(e.to_string())
}

/// A step whose result is random (so a re-execution could not reproduce it) and whose body
/// applies one effect; it blocks before the effect when `point` is armed.
async fn effect_step(
    ctx: &WorkflowContext,
    env: &Arc<ChildEnv>,
    input: &Value,
    name: &str,
    point: Point,
    seen: &Value,
) -> Result<String, WorkflowError> {
    let armed = env.armed(input, point);
    let env = Arc::clone(env);
    let seen = seen.clone();
    ctx.step(name, move |s: StepContext| async move {
        env.record_invocation(&s).await.map_err(step_error)?;
        if armed {
            mark(point, &s.run_id, &seen);
            std::future::pending::<()>().await;
        }
        let value = format!("{}-{}-{}", s.name, std::process::id(), random_hex());
        env.apply_effect(&s.step_id, &value).await.map_err(step_error)?;
        Ok(value)
    })
    .await
}

/// `step a → step b → sleep → hook → step c`, with the kill points of [`Point`] in between.
async fn crashy(ctx: WorkflowContext, input: Value, env: Arc<ChildEnv>) -> Result<Value, WorkflowError> {
    let mut seen = json!({});
    let a = effect_step(&ctx, &env, &input, "a", Point::InA, &seen).await?;
    seen["a"] = json!(a);
    env.pause(&ctx, &input, Point::BetweenAB, &seen).await;
    let b = effect_step(&ctx, &env, &input, "b", Point::InB, &seen).await?;
    seen["b"] = json!(b);
    ctx.sleep(Duration::from_millis(input["sleep_ms"].as_u64().unwrap_or(0))).await;
    env.pause(&ctx, &input, Point::AfterSleep, &seen).await;
    let token = input["token"].as_str().unwrap_or_default();
    let hook = ctx.hook(token, json!({ "crash": true })).await?;
    let payload = hook.next().await?;
    seen["payload"] = payload.clone();
    env.pause(&ctx, &input, Point::AfterHook, &seen).await;
    let c = effect_step(&ctx, &env, &input, "c", Point::InC, &seen).await?;
    Ok(json!({ "a": a, "b": b, "c": c, "payload": payload }))
}

fn store_url(dir: &Path) -> String {
    format!("sqlite://{}", dir.join("runs.db").display())
}

fn open_effects(dir: &Path) -> SqliteEffects {
    SqliteEffects::open(dir, true, Duration::from_secs(10))
}

/// The entry point of a child process; does nothing in a normal test run.
#[test]
fn child_process_entry() {
    let Some(dir) = std::env::var_os(CHILD_DIR_ENV) else {
        return;
    };
    let phase: u64 = std::env::var(CHILD_PHASE_ENV).expect("phase").parse().expect("numeric phase");
    // Exit when the parent goes away (its end of our stdin closes).
    std::thread::spawn(|| {
        let _ = std::io::stdin().read_to_end(&mut Vec::new());
        std::process::exit(0);
    });
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    runtime.block_on(async move {
        let dir = PathBuf::from(dir);
        let store = SqliteStore::open(&store_url(&dir)).await.expect("open run store");
        let env = Arc::new(ChildEnv { phase, effects: open_effects(&dir) });
        let _engine = Engine::builder(Arc::new(store))
            .workers(CHILD_WORKERS)
            .lease(LEASE)
            // Idle workers each poll (a write transaction): not too often, so that the parent's
            // writes are not starved; a resume from the parent is seen within one interval.
            .poll_interval(Duration::from_millis(250))
            .register(WORKFLOW, move |ctx: WorkflowContext, input: Value| crashy(ctx, input, Arc::clone(&env)))
            .build();
        println!("{READY}");
        tokio::time::sleep(CHILD_LIFETIME).await;
    });
    std::process::exit(0);
}

// ---------------------------------------------------------------------------------------------
// The parent: starts runs, drives child processes to their stops, kills them, checks the outcome.
// ---------------------------------------------------------------------------------------------

/// A child process and the lines it printed.
struct Proc {
    child: Child,
    _stdin: ChildStdin,
    lines: mpsc::UnboundedReceiver<String>,
    printed: Vec<String>,
    phase: usize,
}

impl Proc {
    async fn spawn(dir: &Path, phase: usize) -> Proc {
        let exe = std::env::current_exe().expect("test binary path");
        let mut child = Command::new(exe)
            .args(["--exact", "child_process_entry", "--nocapture", "--test-threads=1"])
            .env(CHILD_DIR_ENV, dir)
            .env(CHILD_PHASE_ENV, phase.to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .expect("spawn child process");
        let stdout = child.stdout.take().expect("child stdout");
        let (tx, lines) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            let mut reader = BufReader::new(stdout).lines();
            while let Ok(Some(line)) = reader.next_line().await {
                // libtest may print "test child_process_entry ... " before our first line.
                let line = match line.find("CRASH-") {
                    Some(i) => line[i..].to_owned(),
                    None => line,
                };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let stdin = child.stdin.take().expect("child stdin");
        let mut proc = Proc { child, _stdin: stdin, lines, printed: Vec::new(), phase };
        proc.wait_line("ready", |l| l == READY).await;
        proc
    }

    async fn wait_line(&mut self, what: &str, matches: impl Fn(&str) -> bool) -> String {
        if let Some(line) = self.printed.iter().find(|l| matches(l)) {
            return line.clone();
        }
        let deadline = Instant::now() + TIMEOUT;
        loop {
            match tokio::time::timeout_at(deadline, self.lines.recv()).await {
                Ok(Some(line)) => {
                    self.printed.push(line.clone());
                    if matches(&line) {
                        return line;
                    }
                }
                Ok(None) => {
                    let status = self.child.wait().await;
                    panic!(
                        "child of phase {} exited ({status:?}) before {what}; it printed {:?}",
                        self.phase, self.printed
                    )
                }
                Err(_) => {
                    panic!("timed out waiting for {what} in phase {}; child printed {:?}", self.phase, self.printed)
                }
            }
        }
    }

    /// Waits until the workflow of `run` blocked at `point`; returns the step results it had seen.
    async fn wait_mark(&mut self, point: Point, run: &RunId) -> Value {
        let prefix = format!("{MARK} {} {run} ", point.name());
        let line = self.wait_line(&prefix, |l| l.starts_with(&prefix)).await;
        serde_json::from_str(&line[prefix.len()..]).expect("marker JSON")
    }

    async fn kill(mut self) {
        self.child.start_kill().expect("send SIGKILL");
        let status = self.child.wait().await.expect("reap child");
        assert_eq!(status.signal(), Some(9), "child of phase {} ended on its own: {status:?}", self.phase);
    }
}

/// One run under test and what happened to it.
struct Tracked {
    id: RunId,
    token: String,
    payload: Value,
    sleep_ms: u64,
    stops: Vec<Stop>,
    resumed: bool,
    /// What the workflow had seen at each marker, in every process.
    seen: Vec<Value>,
}

/// A directory with the run store and the effects database, removed on drop.
struct Harness {
    dir: PathBuf,
    /// A client engine (no workers): it starts, inspects and resumes runs but executes nothing.
    engine: Engine,
    effects: SqliteEffects,
}

impl Drop for Harness {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn ms(e: &Event) -> i64 {
    i64::try_from(e.created_at.duration_since(UNIX_EPOCH).unwrap().as_millis()).unwrap()
}

impl Harness {
    async fn new() -> Harness {
        let dir = std::env::temp_dir().join(format!("resumable-crash-test-{}", random_hex()));
        std::fs::create_dir_all(&dir).unwrap();
        let options = SqliteStoreOptions { busy_timeout: TIMEOUT, ..SqliteStoreOptions::default() };
        let store = SqliteStore::open_with(&store_url(&dir), options).await.expect("open run store");
        let engine = Engine::builder(Arc::new(store))
            .workers(0)
            .register(WORKFLOW, |_ctx: WorkflowContext, _input: Value| async {
                Err(WorkflowError::msg("the parent executes nothing"))
            })
            .build();
        let effects = open_effects(&dir);
        for sql in [
            "CREATE TABLE effects (step_id TEXT PRIMARY KEY NOT NULL, count INTEGER NOT NULL, value TEXT NOT NULL)",
            "CREATE TABLE invocations (step_id TEXT NOT NULL, attempt INTEGER NOT NULL, pid INTEGER NOT NULL)",
        ] {
            effects.execute(sql, ()).await.unwrap();
        }
        Harness { dir, engine, effects }
    }

    /// Polls `check` until it holds.
    async fn wait_state(&self, run: &Tracked, what: &str, check: impl Fn(RunStatus, &[Event]) -> bool) {
        let deadline = Instant::now() + TIMEOUT;
        loop {
            let info = self.engine.get_run(&run.id).await.unwrap();
            let status = info.status;
            let events = self.engine.events(&run.id).await.unwrap();
            if check(status, &events) {
                return;
            }
            assert!(!status.is_terminal(), "run {} ({:?}) ended: {info:?}\n{events:#?}", run.id, run.stops);
            assert!(Instant::now() < deadline, "run {} ({:?}) never got {what}: {status}", run.id, run.stops);
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Delivers the run's payload once its hook exists.
    async fn resume(&self, run: &mut Tracked) {
        let deadline = Instant::now() + TIMEOUT;
        while self.engine.get_hook(&run.token).await.unwrap().is_none() {
            assert!(Instant::now() < deadline, "run {} ({:?}) never created its hook", run.id, run.stops);
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let receipt = self.engine.resume_hook(&run.token, run.payload.clone()).await.unwrap();
        assert_eq!((&receipt.run_id, receipt.index), (&run.id, 0));
        run.resumed = true;
    }

    /// Brings every run to its stop of `phase` (1-based) in a new child process, then kills it.
    async fn crash_phase(&self, runs: &mut [Tracked], phase: usize) {
        let mut child = Proc::spawn(&self.dir, phase).await;
        for rank in 0..4 {
            for run in runs.iter_mut() {
                let stop = run.stops[phase - 1];
                if stop.rank() != rank {
                    continue;
                }
                match stop {
                    Stop::At(p) => run.seen.push(child.wait_mark(p, &run.id).await),
                    Stop::ResumeThen(p) => {
                        self.resume(run).await;
                        run.seen.push(child.wait_mark(p, &run.id).await);
                    }
                    Stop::OnHook => {
                        self.wait_state(run, "waiting on its hook", |status, events| {
                            status == RunStatus::Waiting
                                && count(events, EventKind::HookCreated, None) == 1
                                && count(events, EventKind::HookReceived, None) == 0
                        })
                        .await;
                    }
                    Stop::Sleeping => {
                        self.wait_state(run, "sleeping", |status, events| {
                            status == RunStatus::Waiting
                                && count(events, EventKind::WaitCreated, None) == 1
                                && count(events, EventKind::WaitCompleted, None) == 0
                        })
                        .await;
                    }
                    Stop::ResumeAndKill => self.resume(run).await,
                }
            }
        }
        child.kill().await;
        for run in runs.iter().filter(|r| r.stops[phase - 1] == Stop::Sleeping) {
            let events = self.engine.events(&run.id).await.unwrap();
            if count(&events, EventKind::WaitCompleted, None) > 0 {
                // Not wrong, only a weaker test: the machine was too slow to kill during the sleep.
                eprintln!("note: run {} was meant to be killed while sleeping but its timer had fired", run.id);
            }
        }
    }

    /// Checks everything about a run that completed after its crashes.
    async fn verify(&self, run: &Tracked) {
        let ctx = format!("run {} killed at {:?}", run.id, run.stops);
        let info = self.engine.wait_for(&run.id, TIMEOUT).await.unwrap_or_else(|e| panic!("{ctx}: {e}"));
        assert_eq!(info.status, RunStatus::Completed, "{ctx}: {info:?}");
        let out = info.output.expect("output");
        assert_eq!(out["payload"], run.payload, "{ctx}");
        let events = self.engine.events(&run.id).await.unwrap();
        let kinds: Vec<EventKind> = events.iter().map(|e| e.kind).collect();
        for (i, e) in events.iter().enumerate() {
            assert_eq!(e.seq, i as u64 + 1, "{ctx}: gap in the event log {kinds:?}");
        }
        assert_eq!(kinds.first(), Some(&EventKind::RunCreated), "{ctx}");
        assert_eq!(kinds.last(), Some(&EventKind::RunCompleted), "{ctx}");
        assert_eq!(count(&events, EventKind::RunCompleted, None), 1, "{ctx}");

        for (name, pos, point) in [("a", POS_A, Point::InA), ("b", POS_B, Point::InB), ("c", POS_C, Point::InC)] {
            let ctx = format!("{ctx}, step {name}");
            let completed = of(&events, EventKind::StepCompleted, Some(pos));
            assert_eq!(completed.len(), 1, "{ctx}: {kinds:?}");
            let recorded = &completed[0].payload["result"];
            assert_eq!(recorded, &out[name], "{ctx}: the workflow returned the recorded result");
            let started = count(&events, EventKind::StepStarted, Some(pos));
            assert_eq!(completed[0].payload["attempt"], json!(started), "{ctx}: the last attempt completed");

            // Exactly one effect per step id, and it produced the recorded result.
            let step_id = format!("{}:{pos}", run.id);
            let sql = "SELECT count, value FROM effects WHERE step_id = ?";
            let rows = self.effects.query(sql, [step_id.clone()], |r| Ok((r.get(0)?, r.get(1)?))).await.unwrap();
            let (effects, value): (i64, String) = rows.into_iter().next().unwrap_or_else(|| panic!("{ctx}: no effect"));
            assert_eq!(effects, 1, "{ctx}: one effect per step");
            assert_eq!(&json!(value), recorded, "{ctx}: the effect's result is the recorded one");

            // Attempts that ran the body: each at most once, the last the completed one. A step
            // killed inside needed a second attempt; any other ran exactly once.
            let sql = "SELECT attempt FROM invocations WHERE step_id = ? ORDER BY attempt";
            let attempts: Vec<i64> = self.effects.query(sql, [step_id.clone()], |r| r.get(0)).await.unwrap();
            assert!(attempts.windows(2).all(|w| w[0] < w[1]), "{ctx}: an attempt ran twice: {attempts:?}");
            assert_eq!(attempts.last().copied(), Some(i64::try_from(started).unwrap()), "{ctx}: {attempts:?}");
            let killed_inside = run.stops.iter().any(|s| matches!(s, Stop::At(p) | Stop::ResumeThen(p) if *p == point));
            let maybe_inside = point == Point::InC && run.stops.contains(&Stop::ResumeAndKill);
            if killed_inside {
                assert!(started >= 2, "{ctx}: the attempt killed inside the step was not followed by another");
            } else if !maybe_inside {
                assert_eq!((started, attempts.as_slice()), (1, &[1][..]), "{ctx}: a step ran again");
            }
        }
        let sql = "SELECT DISTINCT step_id FROM invocations ORDER BY step_id";
        let ids: Vec<String> = self.effects.query(sql, (), |r| r.get(0)).await.unwrap();
        let ids: Vec<String> = ids.into_iter().filter(|s| s.starts_with(&format!("{}:", run.id))).collect();
        let expected: Vec<String> = [POS_A, POS_B, POS_C].iter().map(|p| format!("{}:{p}", run.id)).collect();
        assert_eq!(ids, expected, "{ctx}: steps ran under these ids");

        // What the workflow saw before each crash is what it saw at the end.
        for seen in &run.seen {
            for (key, value) in seen.as_object().expect("seen is an object") {
                assert_eq!(&out[key], value, "{ctx}: {key} seen before a crash differs from the replayed one");
            }
        }

        // One timer, created once, fired once, not before it was due.
        let created = of(&events, EventKind::WaitCreated, None);
        assert_eq!(created.len(), 1, "{ctx}: {kinds:?}");
        assert_eq!(created[0].payload["position"], json!(POS_SLEEP), "{ctx}");
        let due_at = created[0].payload["due_at"].as_i64().expect("due_at");
        let sleep_ms = i64::try_from(run.sleep_ms).unwrap();
        assert!(due_at <= ms(created[0]) + sleep_ms, "{ctx}: the due time was set after the timer was created");
        let fired = of(&events, EventKind::WaitCompleted, None);
        assert_eq!(fired.len(), 1, "{ctx}: the timer fired {} times: {kinds:?}", fired.len());
        assert_eq!(fired[0].payload["position"], json!(POS_SLEEP), "{ctx}");
        assert_ne!(fired[0].payload["fired"], json!(false), "{ctx}: the timer was cancelled");
        assert!(ms(fired[0]) >= due_at, "{ctx}: the timer fired {} ms early", due_at - ms(fired[0]));
        let hook = of(&events, EventKind::HookCreated, Some(POS_HOOK));
        assert_eq!(hook.len(), 1, "{ctx}: {kinds:?}");
        assert!(ms(hook[0]) >= due_at, "{ctx}: the workflow went past the sleep early");

        // One hook, one payload, disposed at the end.
        assert_eq!(count(&events, EventKind::HookCreated, None), 1, "{ctx}");
        assert_eq!(count(&events, EventKind::HookReceived, None), 1, "{ctx}");
        assert_eq!(count(&events, EventKind::HookDisposed, None), 1, "{ctx}");
        assert_eq!(self.engine.get_hook(&run.token).await.unwrap(), None, "{ctx}");
    }
}

/// The events of `kind` (at operation `position`, if given).
fn of(events: &[Event], kind: EventKind, position: Option<u64>) -> Vec<&Event> {
    events
        .iter()
        .filter(|e| e.kind == kind && position.is_none_or(|p| e.payload["position"].as_u64() == Some(p)))
        .collect()
}

fn count(events: &[Event], kind: EventKind, position: Option<u64>) -> usize {
    of(events, kind, position).len()
}

/// Starts one run per plan (its stop in each phase), runs one child process per phase and kills
/// it at the stops, then restarts a last time and checks every run.
async fn scenario(plans: &[&[Stop]]) {
    let phases = plans[0].len();
    assert!(plans.iter().all(|p| p.len() == phases), "every plan has one stop per phase");
    let h = Harness::new().await;
    let mut runs = Vec::new();
    for (i, stops) in plans.iter().enumerate() {
        let mut arm = serde_json::Map::new();
        for (phase, stop) in stops.iter().enumerate() {
            if let Some(p) = stop.armed() {
                assert!(arm.insert(p.name().to_owned(), json!(phase + 1)).is_none(), "{p:?} armed twice");
            }
        }
        let sleep_ms = if stops.contains(&Stop::Sleeping) { LONG_SLEEP_MS } else { SHORT_SLEEP_MS };
        let token = format!("crash-hook-{i}");
        let input = json!({ "token": token, "sleep_ms": sleep_ms, "arm": arm });
        let id = h.engine.start(WORKFLOW, input, StartOptions::default()).await.unwrap();
        let payload = json!({ "approved": i, "nonce": random_hex() });
        runs.push(Tracked { id, token, payload, sleep_ms, stops: stops.to_vec(), resumed: false, seen: Vec::new() });
    }
    for phase in 1..=phases {
        h.crash_phase(&mut runs, phase).await;
    }
    // Payloads for existing hooks are delivered while no process runs; the others once created.
    for run in runs.iter_mut() {
        if !run.resumed && h.engine.get_hook(&run.token).await.unwrap().is_some() {
            h.resume(run).await;
        }
    }
    let _restart = Proc::spawn(&h.dir, phases + 1).await;
    for run in runs.iter_mut().filter(|r| !r.resumed) {
        h.resume(run).await;
    }
    for run in &runs {
        h.verify(run).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_after_a_step_started() {
    scenario(&[&[Stop::At(Point::InA)], &[Stop::At(Point::InB)]]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_after_a_step_completed_before_the_next() {
    scenario(&[&[Stop::At(Point::BetweenAB)]]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_while_sleeping_and_right_after_the_timer_fired() {
    scenario(&[&[Stop::Sleeping], &[Stop::At(Point::AfterSleep)]]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_while_waiting_on_a_hook() {
    scenario(&[&[Stop::OnHook]]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_during_a_hook_resume() {
    scenario(&[&[Stop::ResumeAndKill], &[Stop::ResumeThen(Point::AfterHook)], &[Stop::ResumeThen(Point::InC)]]).await;
}

/// Eight runs in flight in one process, each at a different point, killed together; twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_runs_in_flight_killed_twice() {
    use Point::*;
    scenario(&[
        &[Stop::At(InA), Stop::At(BetweenAB)],
        &[Stop::At(BetweenAB), Stop::Sleeping],
        &[Stop::At(InB), Stop::At(AfterSleep)],
        &[Stop::Sleeping, Stop::OnHook],
        &[Stop::At(AfterSleep), Stop::ResumeThen(AfterHook)],
        &[Stop::OnHook, Stop::ResumeThen(InC)],
        &[Stop::ResumeThen(AfterHook), Stop::At(InC)],
        &[Stop::OnHook, Stop::ResumeAndKill],
    ])
    .await;
}

/// One run killed at every point in turn, restarted after each kill.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_run_killed_at_every_point_in_turn() {
    use Point::*;
    scenario(&[&[
        Stop::At(InA),
        Stop::At(BetweenAB),
        Stop::At(InB),
        Stop::Sleeping,
        Stop::At(AfterSleep),
        Stop::OnHook,
        Stop::ResumeThen(AfterHook),
        Stop::At(InC),
    ]])
    .await;
}
