use crate::common::*;
use resumable_runner::codec::{SignedCodec, SignedCodecConfig};
use resumable_runner::host::CancelSignal;
use resumable_runner::process::ProcessConfig;
use resumable_runner::{
    ErrorCode, MemoryContinuationStore, Outcome, Resolution, RunRequest, Runner, RunnerConfig, StoredCodec,
};
use serde_json::json;
use std::sync::Arc;
use std::time::{Duration, Instant};

const WORKER: &str = env!("CARGO_BIN_EXE_resumable-worker");

/// A runner whose workers carry `tag` on their command line (the worker
/// program ignores it), so a test can find its own children.
pub fn process_runner(workers: usize, tag: &str) -> Runner {
    let codec = SignedCodec::new(SignedCodecConfig::new(SECRET)).unwrap();
    let processes = ProcessConfig::new(WORKER).arg(format!("--tag={tag}"));
    Runner::new(RunnerConfig::new().workers(workers).codec(codec).processes(processes)).unwrap()
}

/// Pids of this process's children started with `tag`, with their state letter.
fn worker_children(tag: &str) -> Vec<(u32, char)> {
    let me = std::process::id();
    let mut out = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else { continue };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { continue };
        // pid (comm) state ppid …; comm may contain spaces, so split after the last ')'.
        let Some(rest) = stat.rsplit_once(") ").map(|(_, rest)| rest) else { continue };
        let mut fields = rest.split_whitespace();
        let state = fields.next().and_then(|s| s.chars().next()).unwrap_or('?');
        let parent: u32 = fields.next().and_then(|p| p.parse().ok()).unwrap_or(0);
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        if parent == me && String::from_utf8_lossy(&cmdline).contains(&format!("--tag={tag}")) {
            out.push((pid, state));
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runs_host_calls_and_interrupts_in_a_worker_process() {
    let runner = process_runner(1, "basic");
    let tools = Tools::default();
    assert_eq!(value(&runner, RunRequest::new("return 6 * 7")).await, json!(42));
    let source = "const s = await tools.sum(1, 2); await tools.effect(); const ok = await tools.approve(s); \
                  console.log('done'); return [s, ok]";
    let first = run(&runner, RunRequest::new(source).host(tools.host())).await.unwrap();
    let paused = first.interrupted().expect("interrupted").clone();
    assert_eq!(paused.interruptions[0].id, "interrupt-3");
    let resumed = RunRequest::new(source)
        .host(tools.host())
        .resume(paused.continuation, [Resolution::new("interrupt-3", json!("yes"))]);
    let Outcome::Completed(done) = run(&runner, resumed).await.unwrap() else { panic!() };
    assert_eq!(done.value, json!([3, "yes"]));
    assert_eq!(done.console[0].text, "done");
    assert_eq!((tools.count("sum"), tools.count("effect"), tools.count("approve")), (1, 1, 2));
    let err = error(&runner, RunRequest::new("await tools.fail('nope')").host(tools.host())).await;
    assert_code(&err, ErrorCode::HostFunctionError);
}

/// A worker process gets the whole ledger of a large continuation, decoded frame by frame.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_ledger_resumes_in_a_worker_process() {
    use crate::continuations::LARGE_LEDGER;
    let runner = process_runner(1, "large");
    let tools = Tools::default();
    let first = run(&runner, RunRequest::new(LARGE_LEDGER).host(tools.host())).await.unwrap();
    let paused = first.interrupted().expect("interrupted").clone();
    assert!(paused.continuation.len() > 100_000, "{} bytes", paused.continuation.len());
    let resolution = Resolution::new(paused.interruptions[0].id.clone(), json!("yes"));
    let resumed = RunRequest::new(LARGE_LEDGER).host(tools.host()).resume(paused.continuation, [resolution]);
    assert_eq!(value(&runner, resumed).await[1], json!("yes"));
    assert_eq!((tools.count("echo"), tools.count("approve")), (40, 2));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stored_tokens_are_consumed_by_the_parent() {
    let store = Arc::new(MemoryContinuationStore::new());
    let runner = Runner::new(
        RunnerConfig::new().workers(2).codec(StoredCodec::new(store.clone())).processes(ProcessConfig::new(WORKER)),
    )
    .unwrap();
    let tools = Tools::default();
    let source = "await tools.effect(); return await tools.approve()";
    let first = run(&runner, RunRequest::new(source).host(tools.host())).await.unwrap();
    let token = first.interrupted().unwrap().continuation.clone();
    let resume =
        || RunRequest::new(source).host(tools.host()).resume(&token, [Resolution::new("interrupt-2", json!(1))]);
    assert_eq!(value(&runner, resume()).await, json!(1));
    assert_code(&error(&runner, resume()).await, ErrorCode::ProtocolError);
    assert_eq!(tools.count("effect"), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runaway_native_operations_are_killed_at_the_deadline() {
    let runner = process_runner(1, "runaway");
    for source in [
        "for (;;) JSON.stringify(new Array(1e6).fill(1))",
        "const big = 'y'.repeat(1e6); for (;;) big.indexOf('x')",
        "new Array(1e8).join(',')",
    ] {
        let started = Instant::now();
        let err = error(&runner, RunRequest::new(source).limits(timeout_ms(100))).await;
        let elapsed = started.elapsed();
        assert_code(&err, ErrorCode::Timeout);
        // 100 ms + 30 ms grace, then the kill (measured here: 132-148 ms in a debug build, up to
        // 230 ms on a loaded machine); without the kill such a loop overshoots by minutes.
        assert!(elapsed < Duration::from_millis(1_000), "{source}: {elapsed:?}");
        assert_eq!(value(&runner, RunRequest::new("return 'fresh worker'")).await, json!("fresh worker"));
    }
    let stats = runner.stats();
    assert_eq!((stats.processes_killed, stats.processes_started), (3, 4), "each runaway killed, one more started");
    assert_eq!((stats.processes_busy, stats.processes_idle), (0, 1));
}

/// A cancel reaches a worker whose script only computes (a signal, which the engine's interrupt
/// handler sees) and one that waits on a host call: both runs end as aborted well within the
/// grace, and the same worker process serves the next run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_stops_a_computing_or_waiting_script_and_keeps_its_worker() {
    let processes = ProcessConfig::new(WORKER).arg("--tag=cancel").grace(Duration::from_secs(5));
    let codec = SignedCodec::new(SignedCodecConfig::new(SECRET)).unwrap();
    let runner = Runner::new(RunnerConfig::new().workers(1).codec(codec).processes(processes)).unwrap();
    let tools = Tools::default();
    assert_eq!(value(&runner, RunRequest::new("return 1")).await, json!(1));
    let pids = || worker_children("cancel").into_iter().map(|(pid, _)| pid).collect::<Vec<_>>();
    let workers = pids();
    assert_eq!(workers.len(), 1, "{workers:?}");
    for source in ["while (true) {}", "await tools.never()"] {
        let cancel = CancelSignal::new();
        let request = RunRequest::new(source).host(tools.host()).limits(timeout_ms(30_000)).cancel(cancel.clone());
        let pending = tokio::spawn({
            let runner = runner.clone();
            async move { runner.run(request).await }
        });
        tokio::time::sleep(Duration::from_millis(200)).await;
        let cancelled = Instant::now();
        cancel.cancel();
        let err = pending.await.unwrap().unwrap_err();
        assert_code(&err, ErrorCode::Aborted);
        assert!(cancelled.elapsed() < Duration::from_secs(2), "{source}: {:?}", cancelled.elapsed());
        assert_eq!(value(&runner, RunRequest::new("return 2")).await, json!(2));
        assert_eq!(pids(), workers, "{source}: the worker was kept");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashed_worker_fails_only_its_run() {
    let runner = process_runner(1, "crash");
    let pending = tokio::spawn({
        let runner = runner.clone();
        async move { runner.run(RunRequest::new("while (true) {}").limits(timeout_ms(10_000))).await }
    });
    let mut victim = None;
    for _ in 0..100 {
        tokio::time::sleep(Duration::from_millis(20)).await;
        if let Some(&(pid, _)) = worker_children("crash").first() {
            victim = Some(pid);
            break;
        }
    }
    let pid = victim.expect("a worker process is running");
    // Rust's runtime handles the first SIGSEGV (to report stack overflows) and
    // then restores the default action; the second one crashes the worker as
    // a real segmentation fault would.
    // SAFETY: signalling a child of this test.
    assert_eq!(unsafe { libc::kill(pid as i32, libc::SIGSEGV) }, 0);
    tokio::time::sleep(Duration::from_millis(50)).await;
    // SAFETY: as above.
    unsafe { libc::kill(pid as i32, libc::SIGSEGV) };
    let err = pending.await.unwrap().unwrap_err();
    assert_code(&err, ErrorCode::Error);
    assert!(err.retryable, "a crash is worth retrying: {err}");
    assert_eq!(value(&runner, RunRequest::new("return 'recovered'")).await, json!("recovered"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workers_inherit_no_environment_and_leave_no_zombies() {
    let runner = process_runner(2, "zombies");
    assert_eq!(value(&runner, RunRequest::new("return 1")).await, json!(1));
    let started = worker_children("zombies");
    assert!(!started.is_empty());
    for (pid, _) in started {
        let environ = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
        let environ = String::from_utf8_lossy(&environ);
        assert_eq!(environ, "TZ=:/etc/localtime\0", "worker {pid} inherited environment");
        let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).unwrap();
        let limit = |name: &str| {
            let line = limits.lines().find(|l| l.starts_with(name)).unwrap_or_default();
            line[name.len()..].split_whitespace().next().unwrap_or_default().to_string()
        };
        assert_eq!(limit("Max address space"), (16u64 << 30).to_string(), "{limits}");
        assert_eq!(limit("Max cpu time"), "3600", "{limits}");
        assert_eq!(limit("Max core file size"), "0", "{limits}");
    }
    for _ in 0..100 {
        let err =
            error(&runner, RunRequest::new("for (;;) JSON.stringify(new Array(1e5).fill(1))").limits(timeout_ms(5)))
                .await;
        assert_code(&err, ErrorCode::Timeout);
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let children = worker_children("zombies");
    assert!(children.iter().all(|&(_, state)| state != 'Z'), "zombies: {children:?}");
    assert!(children.len() <= 2, "at most one process per worker slot: {children:?}");
}

#[test]
fn a_runtime_without_io_is_a_configuration_error() {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap();
    let runner = process_runner(1, "no-io");
    let err = runtime.block_on(runner.run(RunRequest::new("return 1"))).unwrap_err();
    assert_code(&err, ErrorCode::ConfigurationError);
    assert!(err.message.contains("enable_all"), "{}", err.message);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_process_never_serves_two_isolation_keys() {
    let runner = process_runner(1, "tenants");
    let pids = || worker_children("tenants").into_iter().map(|(pid, _)| pid).collect::<std::collections::BTreeSet<_>>();
    let run_as = |tenant: &'static str| {
        let runner = runner.clone();
        async move { value(&runner, RunRequest::new("return 1").isolation(tenant)).await }
    };
    run_as("acme").await;
    let acme = pids();
    assert_eq!(acme.len(), 1, "{acme:?}");
    run_as("globex").await;
    let both = pids();
    assert_eq!(both.len(), 2, "globex got a worker of its own: {both:?}");
    let globex: Vec<u32> = both.difference(&acme).copied().collect();
    // Each tenant's next run reuses its own worker, and no other.
    run_as("acme").await;
    run_as("globex").await;
    assert_eq!(pids(), both);
    // A run without a key shares neither.
    assert_eq!(value(&runner, RunRequest::new("return 2")).await, json!(2));
    assert_eq!(pids().len(), 3, "{:?} (globex: {globex:?})", pids());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_workers_are_capped_and_runs_can_each_get_a_fresh_process() {
    let capped = Runner::new(
        RunnerConfig::new().workers(1).processes(ProcessConfig::new(WORKER).arg("--tag=capped").max_idle(2)),
    )
    .unwrap();
    for tenant in ["a", "b", "c", "d"] {
        assert_eq!(value(&capped, RunRequest::new("return 1").isolation(tenant)).await, json!(1));
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(worker_children("capped").len(), 2, "only the two most recent stay idle");
    let stats = capped.stats();
    assert_eq!((stats.processes_started, stats.processes_retired, stats.processes_killed), (4, 2, 0));
    assert_eq!((stats.processes_busy, stats.processes_idle), (0, 2));
    let fresh = Runner::new(
        RunnerConfig::new().workers(1).processes(ProcessConfig::new(WORKER).arg("--tag=fresh").reuse(false)),
    )
    .unwrap();
    for _ in 0..3 {
        assert_eq!(value(&fresh, RunRequest::new("return 1")).await, json!(1));
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(worker_children("fresh").is_empty(), "no worker outlives its run");
    let stats = fresh.stats();
    assert_eq!((stats.processes_started, stats.processes_retired, stats.processes_idle), (3, 3, 0));
}
