//! Benchmark of the engine scaled out over worker processes on PostgreSQL.
//!
//! `cargo run --release -p resumable-workflow --example bench_processes -- [--db URL]` prints one
//! JSON object. The database is `--db URL` (default: `RESUMABLE_TEST_PG_URL`); the bench works in a
//! fresh schema of its own (`rt_<unix seconds>_<random>_bench`, the format whose leftovers the
//! PostgreSQL tests sweep away), dropped at the end. Worker processes are this program re-executed
//! with `--worker` (configured through an environment variable); each opens its own [`PgStore`]
//! (a pool of `--connections-per-process` connections, 2 by default, all opened before the
//! measurement) and runs an engine with `--workers-per-process` workers (8 by default), which take
//! turns on the connections. A few connections per process suit a fleet that shares a 2-core
//! server (more backends than cores only add contention on the server). With 4 processes,
//! alternated in one sitting: 10 connections each gave 1,266–1,397 steps/s, 3 each 1,578–1,634;
//! in a later one (medians of 3 repetitions), 3 each 1,623 and 1,821, 2 each 1,883 and 1,941.
//! The bench process itself only starts,
//! watches and resumes runs (an engine without workers). Measured, each `--reps` times (3 by
//! default), medians reported:
//!
//! - `steps`: with 1, 2 and 4 worker processes, `--runs` runs (400) of `--steps` no-op steps (10)
//!   are created while no worker runs; then every process is told to start at once, and
//!   `steps_per_s` is the number of steps over the span from the first claim to the last
//!   completion (the runs' `started_at` and `completed_at`). `wall_ms` is the time from the start
//!   signal until the bench saw no open run (polling every 10 ms). Where the time goes, per step:
//!   `worker_cpu_ms_per_step` (user + system time of the worker processes), `server_cpu_ms_per_step`
//!   (of the server processes serving them, found by `application_name`), `commits_per_step`
//!   (the database's `xact_commit`, read-only statements included) and `wal_syncs_per_step`
//!   (`pg_stat_wal`: WAL flushes; both counters are shared with other clients of the server, so
//!   approximate). `activity` samples `pg_stat_activity` of the database every 20 ms during the
//!   phase: the average number of non-idle backends in each state and wait event (`idle in
//!   transaction Client:ClientRead` is a transaction waiting for its client's next statement).
//! - `hook`: a run waiting on a hook in a worker process (with 1 worker process, then with 4 all
//!   listening) is resumed from the bench process `--resumes` times (100), each time once it is
//!   `waiting` again. `resume_to_continue_ms` is from just before [`Engine::resume_hook`] until the
//!   workflow body in the worker holds the payload (timestamps of the wall clock, shared by the
//!   processes of one machine); `resume_to_execution_ms` until the worker's execution of the run
//!   began (NOTIFY delivered, run claimed, history loaded); `resume_call_ms` is the call alone.
//!   Every resume replays the run from the top; the history grows by one payload each time.
//!
//! `--quick` shrinks every size for a smoke test; `--processes 1,2,4` chooses the fleet sizes.
//! Targets: at least 2,000 steps/s with 4 worker processes, and a hook resume → continue p50 of
//! at most 5 ms across processes.

#[path = "support/stats.rs"]
mod bench_stats;

use std::process::Stdio;
use std::str::FromStr;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bench_stats::{loadavg, median, ms, r3, stats};
use resumable_workflow::{
    Engine, PgStore, PgStoreOptions, RunFilter, RunStatus, StartOptions, StepError, WorkflowContext, WorkflowError,
};
use serde_json::{Map, Value, json};
use sqlx::Connection;
use sqlx::postgres::PgConnectOptions;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdin, Command};
use tokio::sync::mpsc;

/// Set (to the worker's configuration as JSON) in a worker process.
const WORKER_ENV: &str = "RESUMABLE_BENCH_PROCESSES_WORKER";
/// How long any single wait of the bench may take before it gives up.
const PATIENCE: Duration = Duration::from_secs(300);
const STEPS_WORKFLOW: &str = "steps";
const HOOKS_WORKFLOW: &str = "hooks";

struct Args {
    db: String,
    quick: bool,
    runs: usize,
    steps: usize,
    workers: usize,
    connections: usize,
    reps: usize,
    resumes: usize,
    processes: Vec<usize>,
}

impl Args {
    fn parse() -> Args {
        let args: Vec<String> = std::env::args().collect();
        let value = |name: &str| args.iter().position(|a| a == name).and_then(|i| args.get(i + 1)).cloned();
        let number = |name: &str, default: usize| value(name).map_or(default, |v| v.parse().expect(name));
        let quick = args.iter().any(|a| a == "--quick");
        let db = value("--db")
            .or_else(|| std::env::var("RESUMABLE_TEST_PG_URL").ok().filter(|u| !u.is_empty()))
            .expect("--db URL or RESUMABLE_TEST_PG_URL");
        let processes = value("--processes").map_or_else(
            || vec![1, 2, 4],
            |v| v.split(',').map(|n| n.trim().parse().expect("--processes 1,2,4")).collect(),
        );
        Args {
            db,
            quick,
            runs: number("--runs", if quick { 50 } else { 400 }),
            steps: number("--steps", 10),
            workers: number("--workers-per-process", 8),
            connections: number("--connections-per-process", 2),
            reps: number("--reps", if quick { 1 } else { 3 }),
            resumes: number("--resumes", if quick { 20 } else { 100 }),
            processes,
        }
    }
}

fn unix_micros() -> i64 {
    i64::try_from(SystemTime::now().duration_since(UNIX_EPOCH).expect("clock").as_micros()).expect("time")
}

fn random_hex(bytes: usize) -> String {
    let mut buf = vec![0u8; bytes];
    getrandom::fill(&mut buf).expect("random bytes");
    buf.iter().map(|b| format!("{b:02x}")).collect()
}

/// The `application_name` of the worker processes' connections.
fn worker_application(schema: &str) -> String {
    format!("{schema}_worker")
}

/// CPU time (user + system) of the processes `pids`, in milliseconds, from `/proc/<pid>/stat`.
fn cpu_ms_of(pids: &[i32]) -> f64 {
    // SAFETY: sysconf has no preconditions.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    let mut total = 0.0;
    for pid in pids {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        // Fields after the command name (which may contain spaces): state is field 3, utime 14, stime 15.
        let fields: Vec<&str> = stat.rsplit_once(')').map_or("", |(_, rest)| rest).split_whitespace().collect();
        let field = |i: usize| fields.get(i - 3).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
        total += field(14) + field(15);
    }
    total * 1000.0 / ticks
}

/// CPU time (user + system) of this process's children that ended and were waited for, in ms.
fn children_cpu_ms() -> f64 {
    // SAFETY: `usage` is a valid, writable rusage for the duration of the call.
    let usage = unsafe {
        let mut usage: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_CHILDREN, &mut usage);
        usage
    };
    let tv = |t: libc::timeval| t.tv_sec as f64 * 1000.0 + t.tv_usec as f64 / 1000.0;
    tv(usage.ru_utime) + tv(usage.ru_stime)
}

fn store_options(schema: &str, connections: u32) -> PgStoreOptions {
    PgStoreOptions {
        max_connections: connections,
        min_connections: connections,
        schema: Some(schema.to_owned()),
        notify_channel: schema.to_owned(),
        ..PgStoreOptions::default()
    }
}

// ---------------------------------------------------------------------------------------------
// The worker process.
// ---------------------------------------------------------------------------------------------

/// `steps`: `input.steps` no-op steps.
async fn steps_workflow(ctx: WorkflowContext, input: Value) -> Result<Value, WorkflowError> {
    let n = input["steps"].as_u64().unwrap_or(0);
    for i in 0..n {
        ctx.step("noop", move |_s| async move { Ok::<u64, StepError>(i) }).await?;
    }
    Ok(json!(n))
}

/// `hooks`: takes `input.n` payloads of the hook `input.token`, printing when each execution
/// begins and when it holds each payload (replays print the earlier ones again).
async fn hooks_workflow(ctx: WorkflowContext, input: Value) -> Result<Value, WorkflowError> {
    println!("ENTER {}", unix_micros());
    let token = input["token"].as_str().unwrap_or_default().to_owned();
    let n = input["n"].as_u64().unwrap_or(0);
    let hook = ctx.hook(&token, json!({})).await?;
    for i in 0..n {
        hook.next().await?;
        println!("GOT {i} {}", unix_micros());
    }
    Ok(json!(n))
}

/// A worker process: connects, says `READY`, starts its engine on `go`, stops when stdin closes.
async fn worker(config: Value) {
    let schema = config["schema"].as_str().expect("schema");
    // Named, so that the bench can find this process's backends (and their CPU time).
    let url = config["url"].as_str().expect("url");
    let separator = if url.contains('?') { '&' } else { '?' };
    let url = format!("{url}{separator}application_name={}", worker_application(schema));
    let url = url.as_str();
    let workers = usize::try_from(config["workers"].as_u64().expect("workers")).expect("workers");
    let connections = u32::try_from(config["connections"].as_u64().expect("connections")).expect("connections");
    let store = PgStore::open_with(url, store_options(schema, connections)).await.expect("open store");
    let (lines_tx, mut lines) = mpsc::unbounded_channel();
    std::thread::spawn(move || {
        for line in std::io::stdin().lines() {
            let Ok(line) = line else { break };
            if lines_tx.send(line).is_err() {
                return;
            }
        }
    });
    println!("READY");
    while let Some(line) = lines.recv().await {
        if line.trim() == "go" {
            break;
        }
    }
    let engine = Engine::builder(Arc::new(store.clone()))
        .workers(workers)
        .register(STEPS_WORKFLOW, steps_workflow)
        .register(HOOKS_WORKFLOW, hooks_workflow)
        .build();
    // Until stdin closes.
    while lines.recv().await.is_some() {}
    engine.shutdown().await;
    store.close().await;
}

// ---------------------------------------------------------------------------------------------
// The bench process.
// ---------------------------------------------------------------------------------------------

/// Worker processes and the lines they print, tagged by process.
struct Fleet {
    children: Vec<(Child, Option<ChildStdin>)>,
    lines: mpsc::UnboundedReceiver<(usize, String)>,
}

impl Fleet {
    /// Starts `n` worker processes and waits until each one's pool is connected.
    async fn start(url: &str, schema: &str, workers: usize, connections: usize, n: usize) -> Fleet {
        let (tx, lines) = mpsc::unbounded_channel();
        let config =
            json!({ "url": url, "schema": schema, "workers": workers, "connections": connections }).to_string();
        let mut children = Vec::new();
        for index in 0..n {
            let mut child = Command::new(std::env::current_exe().expect("own path"))
                .arg("--worker")
                .env(WORKER_ENV, &config)
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::inherit())
                .kill_on_drop(true)
                .spawn()
                .expect("spawn worker process");
            let stdout = child.stdout.take().expect("stdout");
            let tx = tx.clone();
            tokio::spawn(async move {
                let mut reader = BufReader::new(stdout).lines();
                while let Ok(Some(line)) = reader.next_line().await {
                    if tx.send((index, line)).is_err() {
                        break;
                    }
                }
            });
            let stdin = child.stdin.take();
            children.push((child, stdin));
        }
        let mut fleet = Fleet { children, lines };
        let mut ready = 0;
        while ready < n {
            if fleet.next_line().await.1 == "READY" {
                ready += 1;
            }
        }
        fleet
    }

    async fn next_line(&mut self) -> (usize, String) {
        let line = tokio::time::timeout(PATIENCE, self.lines.recv()).await;
        line.expect("a worker line in time").expect("workers alive")
    }

    /// Discards the lines printed so far.
    fn drain(&mut self) {
        while self.lines.try_recv().is_ok() {}
    }

    async fn go(&mut self) {
        for (_, stdin) in &mut self.children {
            let stdin = stdin.as_mut().expect("stdin");
            stdin.write_all(b"go\n").await.expect("tell worker");
            stdin.flush().await.expect("flush");
        }
    }

    /// Closes the workers' stdin (they shut their engines down and exit) and waits for them.
    async fn stop(mut self) {
        for (child, stdin) in &mut self.children {
            *stdin = None;
            let exited = tokio::time::timeout(Duration::from_secs(30), child.wait()).await;
            if exited.is_err() {
                let _ = child.start_kill();
                let _ = child.wait().await;
            }
        }
    }
}

/// A connection of the bench's own, for the database-wide counters.
struct Probe {
    conn: sqlx::PgConnection,
}

impl Probe {
    async fn connect(url: &str) -> Probe {
        let options = PgConnectOptions::from_str(url).expect("URL");
        Probe { conn: sqlx::PgConnection::connect_with(&options).await.expect("connect") }
    }

    /// Commits of the database so far (flushed statistics of ended and idle backends).
    async fn commits(&mut self) -> i64 {
        let _ = sqlx::query("SELECT pg_stat_clear_snapshot()").execute(&mut self.conn).await;
        sqlx::query_scalar("SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()")
            .fetch_one(&mut self.conn)
            .await
            .expect("xact_commit")
    }

    /// The server's WAL flushes so far (cluster-wide: other databases count too).
    async fn wal_syncs(&mut self) -> i64 {
        let _ = sqlx::query("SELECT pg_stat_clear_snapshot()").execute(&mut self.conn).await;
        sqlx::query_scalar("SELECT wal_sync FROM pg_stat_wal").fetch_one(&mut self.conn).await.unwrap_or(0)
    }

    /// The server processes serving connections named `application`.
    async fn backends(&mut self, application: &str) -> Vec<i32> {
        sqlx::query_scalar("SELECT pid FROM pg_stat_activity WHERE application_name = $1")
            .bind(application)
            .fetch_all(&mut self.conn)
            .await
            .unwrap_or_default()
    }

    /// Backends of the database by state and wait event, other than this one.
    async fn activity(&mut self) -> Vec<(String, i64)> {
        sqlx::query_as(
            "SELECT coalesce(state, '?') || ' ' || coalesce(wait_event_type || ':' || wait_event, 'on cpu'), count(*)
             FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()
               AND backend_type = 'client backend' AND state IS DISTINCT FROM 'idle'
             GROUP BY 1",
        )
        .fetch_all(&mut self.conn)
        .await
        .unwrap_or_default()
    }
}

struct Bench {
    args: Args,
    schema: String,
    engine: Engine,
    store: PgStore,
    probe: Probe,
}

impl Bench {
    /// One measurement: `args.runs` runs of `args.steps` steps on `processes` worker processes.
    async fn steps_once(&mut self, processes: usize, rep: usize) -> Value {
        let (runs, steps) = (self.args.runs, self.args.steps);
        let batch = format!("p{processes}r{rep}");
        let created_after = SystemTime::now() - Duration::from_millis(1);
        let starters: Vec<_> = (0..8)
            .map(|i| {
                let engine = self.engine.clone();
                let input = json!({ "steps": steps, "batch": batch });
                let n = runs / 8 + usize::from(i < runs % 8);
                tokio::spawn(async move {
                    for _ in 0..n {
                        engine.start(STEPS_WORKFLOW, input.clone(), StartOptions::default()).await.expect("start");
                    }
                })
            })
            .collect();
        for s in starters {
            s.await.expect("starter");
        }
        let client_cpu_before = children_cpu_ms();
        let mut fleet =
            Fleet::start(&self.args.db, &self.schema, self.args.workers, self.args.connections, processes).await;
        tokio::time::sleep(Duration::from_millis(200)).await;
        let backends = self.probe.backends(&worker_application(&self.schema)).await;
        let server_cpu_before = cpu_ms_of(&backends);
        let commits_before = self.probe.commits().await;
        let wal_syncs_before = self.probe.wal_syncs().await;
        let began = Instant::now();
        fleet.go().await;
        let open = RunFilter::default()
            .workflow(STEPS_WORKFLOW)
            .status(RunStatus::Pending)
            .status(RunStatus::Running)
            .status(RunStatus::Waiting)
            .limit(1);
        let mut samples: Map<String, Value> = Map::new();
        let mut sampled = 0u64;
        let mut last_sample = Instant::now();
        loop {
            if self.engine.list_runs(&open).await.expect("list").runs.is_empty() {
                break;
            }
            assert!(began.elapsed() < PATIENCE, "runs still open");
            if last_sample.elapsed() >= Duration::from_millis(20) {
                last_sample = Instant::now();
                sampled += 1;
                for (what, n) in self.probe.activity().await {
                    let entry = samples.entry(what).or_insert(json!(0));
                    *entry = json!(entry.as_i64().unwrap_or(0) + n);
                }
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let wall = began.elapsed();
        let server_cpu = cpu_ms_of(&backends) - server_cpu_before;
        fleet.stop().await;
        let client_cpu = children_cpu_ms() - client_cpu_before;
        let commits = self.probe.commits().await - commits_before;
        let wal_syncs = self.probe.wal_syncs().await - wal_syncs_before;
        // The span from the first claim to the last completion, from the runs themselves.
        let mut filter = RunFilter { created_after: Some(created_after), ..RunFilter::default() }
            .workflow(STEPS_WORKFLOW)
            .limit(RunFilter::MAX_LIMIT);
        let (mut first, mut last, mut done) = (i64::MAX, i64::MIN, 0usize);
        loop {
            let page = self.engine.list_runs(&filter).await.expect("list");
            for run in page.runs.iter().filter(|r| r.input["batch"] == json!(batch)) {
                assert_eq!(run.status, RunStatus::Completed, "{run:?}");
                let at = |t: Option<SystemTime>| {
                    let t = t.expect("timestamp").duration_since(UNIX_EPOCH).expect("clock");
                    i64::try_from(t.as_millis()).expect("ms")
                };
                first = first.min(at(run.started_at));
                last = last.max(at(run.completed_at));
                done += 1;
            }
            match page.next_cursor {
                Some(cursor) => filter.cursor = Some(cursor),
                None => break,
            }
        }
        assert_eq!(done, runs, "every run of the batch completed");
        let total_steps = (runs * steps) as f64;
        let span_s = ((last - first).max(1)) as f64 / 1000.0;
        // Per sample: the average number of backends in each state.
        let activity: Map<String, Value> = samples
            .into_iter()
            .map(|(k, v)| (k, json!(r3(v.as_f64().unwrap_or(0.0) / sampled.max(1) as f64))))
            .collect();
        json!({
            "steps_per_s": r3(total_steps / span_s),
            "runs_per_s": r3(runs as f64 / span_s),
            "span_ms": last - first,
            "wall_ms": r3(ms(wall)),
            "commits_per_step": r3(commits as f64 / total_steps),
            "wal_syncs_per_step": r3(wal_syncs as f64 / total_steps),
            "worker_cpu_ms_per_step": r3(client_cpu / total_steps),
            "server_cpu_ms_per_step": r3(server_cpu / total_steps),
            "backends": backends.len(),
            "activity": activity,
        })
    }

    async fn steps(&mut self) -> Value {
        let mut out = Map::new();
        for processes in self.args.processes.clone() {
            let mut reps = Vec::new();
            for rep in 0..self.args.reps {
                let one = self.steps_once(processes, rep).await;
                eprintln!("steps, {processes} process(es), rep {rep}: {one}");
                reps.push(one);
            }
            let field = |k: &str| reps.iter().map(|r| r[k].as_f64().unwrap_or(f64::NAN)).collect::<Vec<_>>();
            out.insert(
                processes.to_string(),
                json!({
                    "steps_per_s": median(&field("steps_per_s")),
                    "steps_per_s_reps": field("steps_per_s"),
                    "wall_ms": median(&field("wall_ms")),
                    "commits_per_step": median(&field("commits_per_step")),
                    "wal_syncs_per_step": median(&field("wal_syncs_per_step")),
                    "worker_cpu_ms_per_step": median(&field("worker_cpu_ms_per_step")),
                    "server_cpu_ms_per_step": median(&field("server_cpu_ms_per_step")),
                    "reps": reps,
                }),
            );
        }
        Value::Object(out)
    }

    /// One measurement: `args.resumes` resumes of a run waiting in one of `processes` processes.
    async fn hook_once(&mut self, processes: usize) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
        let mut fleet =
            Fleet::start(&self.args.db, &self.schema, self.args.workers, self.args.connections, processes).await;
        fleet.go().await;
        let token = format!("bench-{}", random_hex(8));
        let n = self.args.resumes;
        let run = self.engine.start(HOOKS_WORKFLOW, json!({ "token": token, "n": n }), StartOptions::default());
        let run = run.await.expect("start");
        let (mut to_continue, mut to_execution, mut call) = (Vec::new(), Vec::new(), Vec::new());
        for i in 0..n {
            let waiting = self.engine.wait_until(&run, PATIENCE, |r| r.status == RunStatus::Waiting).await;
            waiting.expect("the run waits on its hook");
            // Every process's execution has printed by now; later lines belong to this resume.
            tokio::time::sleep(Duration::from_millis(2)).await;
            fleet.drain();
            let started = unix_micros();
            let timer = Instant::now();
            self.engine.resume_hook(&token, json!(i)).await.expect("resume");
            call.push(ms(timer.elapsed()));
            let mut entered = None;
            let expected = format!("GOT {i} ");
            loop {
                let (_, line) = fleet.next_line().await;
                if let Some(at) = line.strip_prefix("ENTER ") {
                    entered = entered.or(Some(at.parse::<i64>().expect("time")));
                } else if let Some(at) = line.strip_prefix(&expected) {
                    to_continue.push((at.parse::<i64>().expect("time") - started) as f64 / 1000.0);
                    to_execution.push((entered.expect("execution began") - started) as f64 / 1000.0);
                    break;
                }
            }
        }
        let info = self.engine.wait_for(&run, PATIENCE).await.expect("run ends");
        assert_eq!(info.status, RunStatus::Completed, "{info:?}");
        fleet.stop().await;
        (to_continue, to_execution, call)
    }

    async fn hooks(&mut self) -> Value {
        let mut out = Map::new();
        for processes in [1, 4] {
            let (mut p50s, mut all) = (Vec::new(), (Vec::new(), Vec::new(), Vec::new()));
            for rep in 0..self.args.reps {
                let (to_continue, to_execution, call) = self.hook_once(processes).await;
                let p50 = median(&to_continue);
                eprintln!("hook resume, {processes} process(es), rep {rep}: continue p50 {p50} ms");
                p50s.push(p50);
                all.0.extend(to_continue);
                all.1.extend(to_execution);
                all.2.extend(call);
            }
            out.insert(
                processes.to_string(),
                json!({
                    "resume_to_continue_p50_ms": median(&p50s),
                    "resume_to_continue_p50_ms_reps": p50s,
                    "resume_to_continue_ms": stats(&all.0),
                    "resume_to_execution_ms": stats(&all.1),
                    "resume_call_ms": stats(&all.2),
                }),
            );
        }
        Value::Object(out)
    }
}

async fn bench(args: Args) -> Value {
    let started = Instant::now();
    let secs = SystemTime::now().duration_since(UNIX_EPOCH).expect("clock").as_secs();
    let schema = format!("rt_{secs}_{}_bench", random_hex(6));
    let store = PgStore::open_with(&args.db, store_options(&schema, 4)).await.expect("open store");
    let idle = |_ctx: WorkflowContext, _input: Value| async { Err(WorkflowError::msg("the bench executes nothing")) };
    let engine = Engine::builder(Arc::new(store.clone()))
        .workers(0)
        .register(STEPS_WORKFLOW, idle)
        .register(HOOKS_WORKFLOW, idle)
        .build();
    let mut probe = Probe::connect(&args.db).await;
    let settings: Vec<(String, String)> = sqlx::query_as(
        "SELECT name, setting FROM pg_settings
         WHERE name IN ('server_version', 'synchronous_commit', 'fsync', 'wal_sync_method', 'commit_delay',
                        'shared_buffers', 'max_connections')",
    )
    .fetch_all(&mut probe.conn)
    .await
    .unwrap_or_default();
    let config = json!({
        "quick": args.quick,
        "schema": schema,
        "runs": args.runs,
        "steps_per_run": args.steps,
        "workers_per_process": args.workers,
        "connections_per_process": args.connections,
        "reps": args.reps,
        "resumes": args.resumes,
        "processes": args.processes,
        "cores": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0),
        "loadavg_at_start": loadavg(),
        "server": settings.into_iter().map(|(k, v)| (k, json!(v))).collect::<Map<String, Value>>(),
    });
    let mut bench = Bench { args, schema: schema.clone(), engine, store, probe };
    let steps = bench.steps().await;
    let hook = bench.hooks().await;
    let steps4 = steps.get("4").and_then(|v| v["steps_per_s"].as_f64()).unwrap_or(f64::NAN);
    let resume = hook["1"]["resume_to_continue_p50_ms"].as_f64().unwrap_or(f64::NAN);
    let out = json!({
        "config": config,
        "steps": steps,
        "hook": hook,
        "targets": {
            "steps_per_s_4_processes": { "target": 2000.0, "value": steps4, "met": steps4 >= 2000.0 },
            "hook_resume_to_continue_p50_ms": { "target": 5.0, "value": resume, "met": resume <= 5.0 },
        },
        "loadavg_at_end": loadavg(),
        "total_wall_ms": r3(ms(started.elapsed())),
    });
    bench.engine.shutdown().await;
    bench.store.close().await;
    // `schema` is a generated plain identifier.
    let drop = format!("DROP SCHEMA IF EXISTS {schema} CASCADE");
    sqlx::query(&drop).execute(&mut bench.probe.conn).await.expect("drop the bench schema");
    out
}

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("tokio");
    if std::env::args().any(|a| a == "--worker") {
        let config = std::env::var(WORKER_ENV).expect("worker configuration");
        runtime.block_on(worker(serde_json::from_str(&config).expect("worker configuration JSON")));
        return;
    }
    let out = runtime.block_on(bench(Args::parse()));
    println!("{}", serde_json::to_string_pretty(&out).expect("JSON"));
}
