//! Benchmark of the durable workflow engine on a SQLite file database.
//!
//! `cargo run --release -p resumable-workflow --example bench_engine` prints one JSON object (timed
//! figures as `{n, min, p50, p90, p99, max, mean}` in the unit their key names, percentiles by
//! nearest rank). Every phase opens
//! a fresh database file with the default [`SqliteStoreOptions`] (WAL, `synchronous = FULL`) in
//! `$BENCH_DIR` (the system temp directory by default), removed at the end. Measured:
//!
//! - `sync_probe`: for context, the cost of syncing a 4 KiB write in that directory: `fdatasync` and
//!   `fsync` of a block rewritten in place, and `fsync` of a growing file (a SQLite WAL commit).
//! - `step_overhead_ms`: the time between the bodies of consecutive no-op steps of a 1,000-step
//!   workflow (each step body records an `Instant`; the differences are the engine's cost per step).
//! - `hook_resume_to_continue_ms`: a workflow loops on `hook.next()`; with the run `waiting`, the
//!   bench calls [`Engine::resume_hook`] and measures until the workflow body holds the payload
//!   (sent back over a channel with its `Instant`). `resume_hook_call_ms` is the call alone.
//!   Every wake-up replays the run from the top, so the figures of the first and last 20 resumes
//!   are also given (the history grows by one payload per resume).
//! - `short_run_latency_ms`, `throughput_*`: one-step workflows, started one by one and awaited
//!   one by one, then N started back to back and awaited all (runs/s), with 1 worker and with the
//!   default 4.
//! - `rss_*`: in a child process (this program with `--rss`), the resident set size before and
//!   after 10,000 runs that each create a hook and wait on it are all `waiting`: at half, at once,
//!   after a 2 s settle, and after `malloc_trim` (what the allocator merely kept cached).
//!   Warm-up first: 300 such runs are started, parked and resumed to completion. SQLite's own heap
//!   (`sqlite3_memory_used`: page caches of the writer and reader connections, statements) is
//!   reported beside it, and `rss_growth_excluding_sqlite_mib` is the growth without it.
//!
//! The load average at start and end is in the output: other processes on the machine share the
//! disk and the cores, and every figure here is dominated by fsync and thread wake-up latency.
//!
//! `--quick` (or `BENCH_QUICK=1`) shrinks every size for a smoke test; `BENCH_PARKED_RUNS=N` sets the
//! number of waiting runs of the RSS measurement; `--phase NAME` runs one phase alone, for profilers
//! (`steps`, `hooks`, `throughput`, `throughput1` or `sync`); `--rss` is internal (the child process).

#[path = "support/stats.rs"]
mod bench_stats;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bench_stats::{loadavg, median, ms, r3, stats};
use resumable_workflow::{
    Engine, RunId, RunStatus, SqliteStore, SqliteStoreOptions, StartOptions, StepError, WorkflowContext, WorkflowError,
};
use serde_json::{Map, Value, json};
use tokio::sync::mpsc;

/// How long any single wait of the bench may take before it gives up.
const PATIENCE: Duration = Duration::from_secs(120);

struct Sizes {
    steps: usize,
    step_runs: usize,
    hook_resumes: usize,
    latency_runs: usize,
    short_runs: usize,
    parked_runs: usize,
    parked_warmup: usize,
}

impl Sizes {
    fn new(quick: bool) -> Sizes {
        let mut sizes = Sizes::defaults(quick);
        if let Some(n) = std::env::var("BENCH_PARKED_RUNS").ok().and_then(|v| v.parse().ok()) {
            sizes.parked_runs = n;
        }
        sizes
    }

    fn defaults(quick: bool) -> Sizes {
        if quick {
            Sizes {
                steps: 100,
                step_runs: 1,
                hook_resumes: 20,
                latency_runs: 10,
                short_runs: 100,
                parked_runs: 500,
                parked_warmup: 50,
            }
        } else {
            Sizes {
                steps: 1_000,
                step_runs: 3,
                hook_resumes: 200,
                latency_runs: 50,
                short_runs: 1_000,
                parked_runs: 10_000,
                parked_warmup: 300,
            }
        }
    }
}

fn quick() -> bool {
    std::env::args().any(|a| a == "--quick") || std::env::var("BENCH_QUICK").is_ok_and(|v| !v.is_empty() && v != "0")
}

/// A directory of database files, removed on drop.
struct Scratch {
    dir: PathBuf,
}

impl Scratch {
    fn new() -> Scratch {
        let base = std::env::var_os("BENCH_DIR").map_or_else(std::env::temp_dir, PathBuf::from);
        let mut bytes = [0u8; 6];
        getrandom::fill(&mut bytes).expect("random bytes");
        let name: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
        let dir = base.join(format!("resumable-workflow-bench-{name}"));
        std::fs::create_dir_all(&dir).expect("scratch directory");
        Scratch { dir }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.join(format!("{name}.db"))
    }

    async fn open(&self, name: &str) -> SqliteStore {
        let url = format!("sqlite://{}", self.path(name).display());
        SqliteStore::open_with(&url, SqliteStoreOptions::default()).await.expect("open SQLite store")
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Bytes of the database and its WAL.
fn db_bytes(path: &Path) -> u64 {
    let wal = PathBuf::from(format!("{}-wal", path.display()));
    [path, wal.as_path()].iter().filter_map(|p| std::fs::metadata(p).ok()).map(|m| m.len()).sum()
}

/// Fields of `/proc/self/status` in bytes (`VmRSS`, `VmHWM`, `RssAnon`, `RssFile`, `RssShmem`).
fn proc_status(field: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find(|l| l.strip_prefix(field).is_some_and(|rest| rest.starts_with(':')))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

fn mib(bytes: u64) -> f64 {
    r3(bytes as f64 / (1024.0 * 1024.0))
}

fn mib_delta(after: u64, before: u64) -> f64 {
    r3((after as f64 - before as f64) / (1024.0 * 1024.0))
}

fn rss_snapshot() -> Value {
    json!({
        "rss_mib": mib(proc_status("VmRSS")),
        "anon_mib": mib(proc_status("RssAnon")),
        "file_mib": mib(proc_status("RssFile")),
        "shmem_mib": mib(proc_status("RssShmem")),
        "sqlite_heap_mib": mib(sqlite_heap()),
        "sqlite_page_cache_mib": mib(sqlite_page_cache()),
    })
}

// SQLite's own allocation counters, from the library rusqlite links (libsqlite3-sys, bundled).
unsafe extern "C" {
    fn sqlite3_config(op: i32, ...) -> i32;
    fn sqlite3_initialize() -> i32;
    fn sqlite3_memory_used() -> i64;
    fn sqlite3_status64(op: i32, current: *mut i64, highwater: *mut i64, reset: i32) -> i32;
}

/// `SQLITE_STATUS_PAGECACHE_OVERFLOW`: page cache memory taken from the heap (all of it here).
const SQLITE_STATUS_PAGECACHE_OVERFLOW: i32 = 2;

/// `SQLITE_CONFIG_MEMSTATUS`: whether SQLite keeps the statistics read below.
const SQLITE_CONFIG_MEMSTATUS: i32 = 9;

/// Keeps SQLite's memory statistics on for this process: the store turns them off when it
/// opens (they cost a global lock per allocation), and SQLite refuses that once started.
fn keep_sqlite_statistics() {
    // SAFETY: both calls run before any connection exists; MEMSTATUS takes one int.
    unsafe {
        sqlite3_config(SQLITE_CONFIG_MEMSTATUS, 1);
        sqlite3_initialize();
    }
}

/// Bytes of heap that SQLite holds (page caches, prepared statements, schema) in this process.
fn sqlite_heap() -> u64 {
    // SAFETY: a thread-safe read of SQLite's global memory statistics; no arguments.
    unsafe { sqlite3_memory_used() }.unsigned_abs()
}

/// Bytes of SQLite's page caches (all connections) in this process.
fn sqlite_page_cache() -> u64 {
    let (mut current, mut highwater) = (0i64, 0i64);
    // SAFETY: both pointers are valid for writes for the duration of the call.
    let rc = unsafe { sqlite3_status64(SQLITE_STATUS_PAGECACHE_OVERFLOW, &mut current, &mut highwater, 0) };
    if rc == 0 { current.unsigned_abs() } else { 0 }
}

/// Returns freed heap memory to the system, so that what remains is what is live.
fn malloc_trim() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only releases free memory of the allocator; it has no preconditions.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// The latency of one sync of a 4 KiB write in the database directory: `fdatasync` and `fsync`
/// of a block overwritten in place, and `fsync` of a file growing by 4 KiB per write (what a
/// SQLite WAL commit does until a checkpoint restarts the WAL), in milliseconds.
fn sync_probe(scratch: &Scratch, reps: usize) -> Value {
    use std::io::{Seek, SeekFrom, Write};
    let path = scratch.dir.join("sync-probe");
    let block = [0x5au8; 4096];
    let probe = |append: bool, data_only: bool| {
        let mut file = std::fs::File::create(&path).expect("probe file");
        let mut times = Vec::with_capacity(reps);
        for i in 0..reps + 10 {
            if !append {
                file.seek(SeekFrom::Start(0)).expect("seek");
            }
            file.write_all(&block).expect("write");
            let started = Instant::now();
            if data_only { file.sync_data() } else { file.sync_all() }.expect("sync");
            if i >= 10 {
                times.push(ms(started.elapsed()));
            }
        }
        stats(&times)
    };
    let out = json!({
        "fdatasync_overwrite_4k_ms": probe(false, true),
        "fsync_overwrite_4k_ms": probe(false, false),
        "fsync_append_4k_ms": probe(true, false),
    });
    let _ = std::fs::remove_file(&path);
    out
}

async fn wait_status(engine: &Engine, run: &RunId, status: RunStatus) {
    let info = engine.wait_until(run, PATIENCE, |r| r.status == status || r.status.is_terminal()).await;
    let info = info.expect("run reaches the status");
    assert_eq!(info.status, status, "run {run} ended early: {:?}", info.error);
}

async fn wait_completed(engine: &Engine, run: &RunId) -> Value {
    let info = engine.wait_for(run, PATIENCE).await.expect("run ends");
    assert_eq!(info.status, RunStatus::Completed, "run {run} did not complete: {:?}", info.error);
    info.output.unwrap_or(Value::Null)
}

/// A workflow of `input.steps` no-op steps, each recording when its body ran.
async fn steps_workflow(
    ctx: WorkflowContext,
    input: Value,
    stamps: Arc<Mutex<Vec<Instant>>>,
) -> Result<Value, WorkflowError> {
    let n = input["steps"].as_u64().unwrap_or(0);
    for _ in 0..n {
        let stamps = Arc::clone(&stamps);
        ctx.step("noop", move |_s| async move {
            stamps.lock().unwrap_or_else(|p| p.into_inner()).push(Instant::now());
            Ok::<(), StepError>(())
        })
        .await?;
    }
    Ok(json!(n))
}

async fn bench_steps(scratch: &Scratch, sizes: &Sizes) -> Value {
    let store = scratch.open("steps").await;
    let stamps = Arc::new(Mutex::new(Vec::new()));
    let probe = Arc::clone(&stamps);
    let engine = Engine::builder(Arc::new(store.clone()))
        .register("steps", move |ctx, input| steps_workflow(ctx, input, Arc::clone(&probe)))
        .build();
    let run_steps = |n: usize| {
        let engine = engine.clone();
        async move {
            let started = Instant::now();
            let run = engine.start("steps", json!({ "steps": n }), StartOptions::default()).await.expect("start");
            assert_eq!(wait_completed(&engine, &run).await, json!(n));
            started.elapsed()
        }
    };
    run_steps(50).await;
    stamps.lock().unwrap().clear();
    let mut gaps = Vec::new();
    let mut per_run = Vec::new();
    for _ in 0..sizes.step_runs {
        let total = run_steps(sizes.steps).await;
        let stamps = std::mem::take(&mut *stamps.lock().unwrap());
        assert_eq!(stamps.len(), sizes.steps);
        gaps.extend(stamps.windows(2).map(|w| ms(w[1] - w[0])));
        per_run.push(ms(total));
    }
    engine.shutdown().await;
    store.close().await;
    json!({ "step_overhead_ms": stats(&gaps), "steps_run_total_ms": stats(&per_run) })
}

/// A workflow that creates the hook `input.token` and takes `input.n` payloads from it, reporting
/// each with the instant it was observed (replays report the earlier ones again).
async fn hooks_workflow(
    ctx: WorkflowContext,
    input: Value,
    seen: mpsc::UnboundedSender<(u64, Instant)>,
) -> Result<Value, WorkflowError> {
    let token = input["token"].as_str().unwrap_or_default().to_owned();
    let n = input["n"].as_u64().unwrap_or(0);
    let hook = ctx.hook(&token, json!({})).await?;
    for _ in 0..n {
        let payload = hook.next().await?;
        let _ = seen.send((payload.as_u64().unwrap_or(u64::MAX), Instant::now()));
    }
    Ok(json!(n))
}

/// Starts a `hooks` run taking `n` payloads and resumes it `n` times, each once it is `waiting`:
/// (resume until observed by the workflow, the `resume_hook` call alone), in milliseconds.
async fn resume_loop(
    engine: &Engine,
    observed: &mut mpsc::UnboundedReceiver<(u64, Instant)>,
    token: &str,
    n: usize,
) -> (Vec<f64>, Vec<f64>) {
    let run = engine.start("hooks", json!({ "token": token, "n": n }), StartOptions::default()).await.expect("start");
    let (mut to_continue, mut call) = (Vec::with_capacity(n), Vec::with_capacity(n));
    for i in 0..n as u64 {
        wait_status(engine, &run, RunStatus::Waiting).await;
        let started = Instant::now();
        engine.resume_hook(token, json!(i)).await.expect("resume");
        call.push(ms(started.elapsed()));
        loop {
            let next = tokio::time::timeout(PATIENCE, observed.recv()).await;
            let (index, at) = next.expect("payload observed in time").expect("channel open");
            if index == i {
                to_continue.push(ms(at - started));
                break;
            }
        }
    }
    assert_eq!(wait_completed(engine, &run).await, json!(n));
    (to_continue, call)
}

async fn bench_hooks(scratch: &Scratch, sizes: &Sizes) -> Value {
    let store = scratch.open("hooks").await;
    let (seen, mut observed) = mpsc::unbounded_channel();
    let engine = Engine::builder(Arc::new(store.clone()))
        .register("hooks", move |ctx, input| hooks_workflow(ctx, input, seen.clone()))
        .build();
    resume_loop(&engine, &mut observed, "warm-up", 10).await;
    let (to_continue, call) = resume_loop(&engine, &mut observed, "measured", sizes.hook_resumes).await;
    engine.shutdown().await;
    store.close().await;
    let edge = to_continue.len().min(20);
    json!({
        "hook_resume_to_continue_ms": stats(&to_continue),
        "hook_resume_to_continue_first20_p50_ms": median(&to_continue[..edge]),
        "hook_resume_to_continue_last20_p50_ms": median(&to_continue[to_continue.len() - edge..]),
        "resume_hook_call_ms": stats(&call),
    })
}

async fn short_workflow(ctx: WorkflowContext, input: Value) -> Result<Value, WorkflowError> {
    let n = input.as_u64().unwrap_or(0);
    ctx.step("add", move |_s| async move { Ok::<u64, StepError>(n + 1) }).await.map(Value::from)
}

async fn bench_short_runs(scratch: &Scratch, sizes: &Sizes, workers: usize, latency: bool) -> Value {
    let name = format!("short-{workers}");
    let store = scratch.open(&name).await;
    let engine = Engine::builder(Arc::new(store.clone())).workers(workers).register("short", short_workflow).build();
    let mut latencies = Vec::new();
    for i in 0..20 + if latency { sizes.latency_runs } else { 0 } {
        let started = Instant::now();
        let run = engine.start("short", json!(i), StartOptions::default()).await.expect("start");
        assert_eq!(wait_completed(&engine, &run).await, json!(i + 1));
        if i >= 20 {
            latencies.push(ms(started.elapsed()));
        }
    }
    let started = Instant::now();
    let mut runs = Vec::with_capacity(sizes.short_runs);
    for i in 0..sizes.short_runs {
        runs.push(engine.start("short", json!(i), StartOptions::default()).await.expect("start"));
    }
    let started_all = started.elapsed();
    for (i, run) in runs.iter().enumerate() {
        assert_eq!(wait_completed(&engine, run).await, json!(i + 1));
    }
    let wall = started.elapsed();
    engine.shutdown().await;
    store.close().await;
    let mut out = json!({
        "workers": workers,
        "runs": sizes.short_runs,
        "steps_per_run": 1,
        "start_all_ms": r3(ms(started_all)),
        "wall_ms": r3(ms(wall)),
        "runs_per_s": r3(sizes.short_runs as f64 / wall.as_secs_f64()),
    });
    if latency {
        out["short_run_latency_ms"] = stats(&latencies);
    }
    out
}

/// A workflow that creates the hook `input` and waits for one payload.
async fn park_workflow(ctx: WorkflowContext, input: Value) -> Result<Value, WorkflowError> {
    let token = input.as_str().unwrap_or_default().to_owned();
    ctx.hook(&token, json!({})).await?.next().await
}

/// Waits until the run owning the hook `token` is `waiting` (without keeping any id around).
async fn wait_parked(engine: &Engine, token: &str) -> RunId {
    let deadline = Instant::now() + PATIENCE;
    loop {
        if let Some(hook) = engine.get_hook(token).await.expect("get_hook") {
            let run = engine.get_run(&hook.run_id).await.expect("get_run");
            if run.status == RunStatus::Waiting {
                return hook.run_id;
            }
        }
        assert!(Instant::now() < deadline, "run of hook {token} never parked");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

async fn park(engine: &Engine, prefix: &str, range: std::ops::Range<usize>) {
    for i in range.clone() {
        engine.start("park", json!(format!("{prefix}-{i}")), StartOptions::default()).await.expect("start");
    }
    for i in range {
        wait_parked(engine, &format!("{prefix}-{i}")).await;
    }
}

/// The RSS measurement, in its own process so that the other phases leave nothing behind.
async fn rss_child(sizes: &Sizes) -> Value {
    let scratch = Scratch::new();
    let store = scratch.open("rss").await;
    let engine = Engine::builder(Arc::new(store.clone())).register("park", park_workflow).build();
    let started = Instant::now();
    park(&engine, "warm", 0..sizes.parked_warmup).await;
    for i in 0..sizes.parked_warmup {
        let receipt = engine.resume_hook(&format!("warm-{i}"), json!(i)).await.expect("resume");
        assert_eq!(wait_completed(&engine, &receipt.run_id).await, json!(i));
    }
    let warmup = started.elapsed();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let baseline = proc_status("VmRSS");
    let baseline_sqlite = sqlite_heap();
    let baseline_cache = sqlite_page_cache();
    let baseline_snapshot = rss_snapshot();
    let started = Instant::now();
    let half = sizes.parked_runs / 2;
    park(&engine, "park", 0..half).await;
    let at_half = proc_status("VmRSS");
    park(&engine, "park", half..sizes.parked_runs).await;
    let parked = started.elapsed();
    let at_all = proc_status("VmRSS");
    let all_snapshot = rss_snapshot();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let settled = proc_status("VmRSS");
    let settled_sqlite = sqlite_heap();
    let settled_cache = sqlite_page_cache();
    let settled_snapshot = rss_snapshot();
    malloc_trim();
    let trimmed = proc_status("VmRSS");
    let trimmed_snapshot = rss_snapshot();
    let peak = proc_status("VmHWM");
    let out = json!({
        "rss_parked_runs": sizes.parked_runs,
        "rss_warmup_runs": sizes.parked_warmup,
        "rss_warmup_ms": r3(ms(warmup)),
        "rss_park_all_ms": r3(ms(parked)),
        "rss_park_runs_per_s": r3(sizes.parked_runs as f64 / parked.as_secs_f64()),
        "rss_baseline_mib": mib(baseline),
        "rss_growth_at_half_mib": mib_delta(at_half, baseline),
        "rss_growth_all_waiting_mib": mib_delta(at_all, baseline),
        "rss_growth_settled_mib": mib_delta(settled, baseline),
        "rss_growth_after_malloc_trim_mib": mib_delta(trimmed, baseline),
        "rss_growth_second_half_mib": mib_delta(at_all, at_half),
        "rss_sqlite_heap_growth_mib": mib_delta(settled_sqlite, baseline_sqlite),
        "rss_sqlite_page_cache_growth_mib": mib_delta(settled_cache, baseline_cache),
        "rss_growth_excluding_sqlite_mib": r3(mib_delta(settled, baseline) - mib_delta(settled_sqlite, baseline_sqlite)),
        "rss_peak_hwm_mib": mib(peak),
        "rss_breakdown": {
            "baseline": baseline_snapshot,
            "all_waiting": all_snapshot,
            "settled": settled_snapshot,
            "after_malloc_trim": trimmed_snapshot,
        },
        "rss_db_bytes": db_bytes(&scratch.path("rss")),
    });
    engine.shutdown().await;
    store.close().await;
    out
}

fn run_rss_child() -> Value {
    let exe = std::env::current_exe().expect("own path");
    let mut child = std::process::Command::new(exe);
    child.arg("--rss");
    if quick() {
        child.arg("--quick");
    }
    let output = child.output().expect("rss child");
    assert!(output.status.success(), "rss child failed: {}", String::from_utf8_lossy(&output.stderr));
    serde_json::from_slice(&output.stdout).expect("rss child output")
}

async fn bench(sizes: &Sizes) -> Value {
    let started = Instant::now();
    let scratch = Scratch::new();
    let mut out = Map::new();
    let options = SqliteStoreOptions::default();
    out.insert(
        "config".into(),
        json!({
            "quick": quick(),
            "workers_default": resumable_workflow::EngineOptions::default().workers,
            "synchronous": format!("{:?}", options.synchronous).to_uppercase(),
            "journal_mode": "WAL",
            "read_connections": options.read_connections,
            "db_dir": scratch.dir.display().to_string(),
            "loadavg_at_start": loadavg(),
            "cores": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0),
            "tokio_worker_threads": tokio::runtime::Handle::current().metrics().num_workers(),
            "steps_per_run": sizes.steps,
            "step_runs": sizes.step_runs,
            "hook_resumes": sizes.hook_resumes,
            "short_runs": sizes.short_runs,
            "parked_runs": sizes.parked_runs,
        }),
    );
    out.insert("sync_probe".into(), sync_probe(&scratch, 200));
    let phase = |v: Value, out: &mut Map<String, Value>| {
        if let Value::Object(m) = v {
            out.extend(m);
        }
    };
    phase(bench_steps(&scratch, sizes).await, &mut out);
    phase(bench_hooks(&scratch, sizes).await, &mut out);
    let one = bench_short_runs(&scratch, sizes, 1, false).await;
    let default_workers = resumable_workflow::EngineOptions::default().workers;
    let mut default = bench_short_runs(&scratch, sizes, default_workers, true).await;
    if let Some(latency) = default.as_object_mut().and_then(|m| m.remove("short_run_latency_ms")) {
        out.insert("short_run_latency_ms".into(), latency);
    }
    out.insert("throughput_1_worker".into(), one);
    out.insert("throughput_default_workers".into(), default);
    drop(scratch);
    phase(run_rss_child(), &mut out);
    let get = |k: &str, p: &str| out.get(k).and_then(|v| v.get(p)).and_then(Value::as_f64).unwrap_or(f64::NAN);
    let step_p50 = get("step_overhead_ms", "p50");
    let resume_p50 = get("hook_resume_to_continue_ms", "p50");
    let rss = out.get("rss_growth_settled_mib").and_then(Value::as_f64).unwrap_or(f64::NAN);
    let rss_engine = out.get("rss_growth_excluding_sqlite_mib").and_then(Value::as_f64).unwrap_or(f64::NAN);
    out.insert(
        "targets".into(),
        json!({
            "step_overhead_p50_ms": { "target": 0.5, "value": step_p50, "met": step_p50 <= 0.5 },
            "hook_resume_to_continue_p50_ms": { "target": 2.0, "value": resume_p50, "met": resume_p50 <= 2.0 },
            "rss_growth_settled_mib": { "target": 5.0, "value": rss, "met": rss <= 5.0 },
            "rss_growth_excluding_sqlite_mib": { "target": 5.0, "value": rss_engine, "met": rss_engine <= 5.0 },
        }),
    );
    out.insert("loadavg_at_end".into(), json!(loadavg()));
    out.insert("total_wall_ms".into(), json!(r3(ms(started.elapsed()))));
    Value::Object(out)
}

/// One phase alone, for profilers: `bench --phase steps|hooks|throughput [--quick]`.
async fn phase_alone(name: &str, sizes: &Sizes) -> Value {
    let scratch = Scratch::new();
    match name {
        "steps" => bench_steps(&scratch, sizes).await,
        "hooks" => bench_hooks(&scratch, sizes).await,
        "throughput" => {
            bench_short_runs(&scratch, sizes, resumable_workflow::EngineOptions::default().workers, true).await
        }
        "throughput1" => bench_short_runs(&scratch, sizes, 1, false).await,
        "sync" => sync_probe(&scratch, 200),
        other => panic!("unknown phase {other}"),
    }
}

fn main() {
    keep_sqlite_statistics();
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("tokio");
    let sizes = Sizes::new(quick());
    let args: Vec<String> = std::env::args().collect();
    let out = if let Some(i) = args.iter().position(|a| a == "--phase") {
        runtime.block_on(phase_alone(args.get(i + 1).expect("a phase"), &sizes))
    } else if args.iter().any(|a| a == "--rss") {
        runtime.block_on(rss_child(&sizes))
    } else {
        runtime.block_on(bench(&sizes))
    };
    println!("{out}");
}
