//! Benchmark of the runner on the shared peer workloads a–h.
//!
//! `cargo run --release -p resumable-runner --example bench` prints one JSON
//! object with the same keys and shapes as `shared/peers/bench-run.mjs`
//! (timed figures as `{n, min, median, mean, max}` in milliseconds), so the
//! numbers can be compared with Vercel `run` and modebox in one sitting.
//! `--processes` runs the scripts in worker processes (this program started as
//! `__worker`) instead of threads. `--rss` is internal: the child process for
//! workload h. Beyond the peer keys, `bytecode_cold_ms` (a new source every run,
//! always compiled), `bytecode_warm_ms` (the same source, from the bytecode
//! cache) and `bytecode_speedup` (ratio of their medians) show what the cache saves,
//! and `c_200_calls_small_events_ms` is workload c read as live events. With `--processes`,
//! `a_trivial_fresh_process_ms` is workload a with a new worker process for every run
//! (`ProcessConfig::reuse(false)`), and `confinement_syscall_ns` what the worker's seccomp
//! filters add to each system call (measured in a child that confines itself).

use resumable_runner::codec::{SignedCodec, SignedCodecConfig};
use resumable_runner::host::{HostError, HostFunctions};
use resumable_runner::process::{ProcessConfig, WORKER_ARGUMENT, serve_worker};
use resumable_runner::{Outcome, Resolution, RunRequest, Runner, RunnerConfig};
use serde_json::{Map, Value, json};
use std::time::Instant;

const SECRET: &[u8] = b"peer-benchmark-continuation-secret-0123456789abcdef";

const TRIVIAL: &str = "return 1+1";
const ONE_CALL: &str = "return await tools.echo(1)";
const CALLS_200_SMALL: &str = "let s = 0; for (let i = 0; i < 200; i++) s += await tools.echo(i); return s";
const CALLS_200: &str = "let n = 0; for (let i = 0; i < 200; i++) n += (await tools.fetch(i)).length; return n";
const CALLS_200_INTERRUPT: &str = "let n = 0; for (let i = 0; i < 200; i++) n += (await tools.fetch(i)).length; const ok = await tools.approve(); return ok ? n : -1";
const CALLS_200_RETAIN_INTERRUPT: &str = "const out = []; for (let i = 0; i < 200; i++) out.push(await tools.fetch(i)); const ok = await tools.approve(); return ok ? out.reduce((a, s) => a + s.length, 0) : -1";
const CPU: &str = "let s=0; for (let i=0;i<1e7;i++) s+=i; return s";
const CALLS_200_VALUE: u64 = 200 * 4096;
/// Functions in the script of the bytecode-cache workload.
const CACHE_SCRIPT_FUNCTIONS: usize = 60;
const CPU_VALUE: u64 = 49_999_995_000_000;

struct Reps {
    fast: usize,
    warm_fast: usize,
    calls: usize,
    warm_calls: usize,
    cpu: usize,
    warm_cpu: usize,
}

fn env_reps(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn r3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

fn stats(xs: &[f64]) -> Value {
    let mut s = xs.to_vec();
    s.sort_by(f64::total_cmp);
    let n = s.len();
    let median = if n % 2 == 1 { s[n / 2] } else { (s[n / 2 - 1] + s[n / 2]) / 2.0 };
    json!({ "n": n, "min": r3(s[0]), "median": r3(median), "mean": r3(s.iter().sum::<f64>() / n as f64), "max": r3(s[n - 1]) })
}

fn ms(since: Instant) -> f64 {
    since.elapsed().as_secs_f64() * 1000.0
}

/// Deterministic 4 KiB hex strings, distinct per index (as the peer uses random ones).
fn hex_pool() -> Vec<String> {
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    (0..200)
        .map(|_| {
            (0..256)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    format!("{:016x}", x)
                })
                .collect()
        })
        .collect()
}

fn host(hex: bool) -> HostFunctions {
    let repeat: Value = json!("x".repeat(4096));
    let pool: Vec<Value> = hex_pool().into_iter().map(Value::String).collect();
    HostFunctions::builder()
        .function("tools.echo", |_ctx, args| async move { Ok(args.into_iter().next().unwrap_or(Value::Null)) })
        .function("tools.fetch", move |_ctx, args| {
            let value = if hex {
                let i = args.first().and_then(Value::as_u64).unwrap_or(0) as usize;
                pool[i % pool.len()].clone()
            } else {
                repeat.clone()
            };
            async move { Ok(value) }
        })
        .function("tools.approve", |ctx, _args| async move {
            match ctx.resume() {
                None => Err(HostError::Interrupt(json!({ "kind": "approval", "message": "approve?" }))),
                Some(resume) => Ok(json!(resume.resolution == json!(true))),
            }
        })
        .build()
        .expect("valid host functions")
}

fn check(outcome: Result<Outcome, resumable_runner::RunError>, expected: &Value, label: &str) {
    match outcome {
        Ok(Outcome::Completed(done)) if &done.value == expected => {}
        other => panic!("{label}: unexpected result {other:?}"),
    }
}

async fn timed(runner: &Runner, label: &str, request: RunRequest, expected: Value, warm: usize, reps: usize) -> Value {
    for _ in 0..warm {
        check(runner.run(request.clone()).await, &expected, label);
    }
    let mut times = Vec::with_capacity(reps);
    for _ in 0..reps {
        let started = Instant::now();
        let outcome = runner.run(request.clone()).await;
        times.push(ms(started));
        check(outcome, &expected, label);
    }
    stats(&times)
}

/// A script of some size (60 small functions, about 9 KB) that runs briefly, so
/// that compiling it is a visible part of a run.
fn cache_script() -> String {
    let mut source = String::new();
    for i in 0..CACHE_SCRIPT_FUNCTIONS {
        source.push_str(&format!(
            "function step{i}(state) {{\n  const items = state.items.map((x, j) => ({{ id: j, v: x * {i} + 1 }}));\n  \
             const total = items.reduce((a, b) => a + b.v, 0);\n  \
             return {{ items: state.items, total: state.total + (total % 7), label: `step-{i}-${{total}}` }};\n}}\n"
        ));
    }
    source.push_str("let state = { items: [1, 2, 3], total: 0 };\n");
    for i in 0..CACHE_SCRIPT_FUNCTIONS {
        source.push_str(&format!("state = step{i}(state);\n"));
    }
    source.push_str("return state.total;\n");
    source
}

/// Runs of the same source (`warm`, bytecode from the cache) against runs of a
/// new source each time (`cold`, always compiled): `[cold, warm]`.
async fn bytecode_cache(runner: &Runner, warm: usize, reps: usize) -> [Value; 2] {
    let script = cache_script();
    let expected = match runner.run(RunRequest::new(script.as_str())).await {
        Ok(Outcome::Completed(done)) => done.value,
        other => panic!("cache script: {other:?}"),
    };
    let mut cold = Vec::with_capacity(reps);
    for i in 0..warm + reps {
        // A comment makes each source new to the cache and changes nothing else.
        let request = RunRequest::new(format!("// cold run {i}\n{script}"));
        let started = Instant::now();
        let outcome = runner.run(request).await;
        if i >= warm {
            cold.push(ms(started));
        }
        check(outcome, &expected, "bytecode-cold");
    }
    let warm_ms = timed(runner, "bytecode-warm", RunRequest::new(script), expected, warm, reps).await;
    [stats(&cold), warm_ms]
}

/// Workload c (200 small calls) read as live events: 400 call events and the end.
async fn streamed_calls(runner: &Runner, host: &HostFunctions, warm: usize, reps: usize) -> Value {
    let mut times = Vec::with_capacity(reps);
    for i in 0..warm + reps {
        let started = Instant::now();
        let mut events = runner.start(RunRequest::new(CALLS_200_SMALL).host(host.clone())).events();
        let mut count = 0;
        while events.next().await.is_some() {
            count += 1;
        }
        let outcome = events.outcome().await;
        if i >= warm {
            times.push(ms(started));
        }
        assert_eq!(count, 401, "every event arrives");
        check(outcome, &json!(19900), "c-events");
    }
    stats(&times)
}

async fn interrupt_resume(runner: &Runner, source: &str, host: &HostFunctions, warm: usize, reps: usize) -> [Value; 3] {
    let (mut to_interrupt, mut token_bytes, mut resume) = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..warm + reps {
        let started = Instant::now();
        let first = runner.run(RunRequest::new(source).host(host.clone())).await;
        let t_interrupt = ms(started);
        let Ok(Outcome::Interrupted(suspension)) = first else { panic!("interrupt: unexpected {first:?}") };
        assert_eq!(suspension.interruptions.len(), 1);
        let token_len = suspension.continuation.len();
        let request = RunRequest::new(source)
            .host(host.clone())
            .resume(suspension.continuation, [Resolution::new(suspension.interruptions[0].id.clone(), json!(true))]);
        let started = Instant::now();
        let done = runner.run(request).await;
        let t_resume = ms(started);
        check(done, &json!(CALLS_200_VALUE), "resume");
        if i >= warm {
            to_interrupt.push(t_interrupt);
            token_bytes.push(token_len as f64);
            resume.push(t_resume);
        }
    }
    [stats(&to_interrupt), stats(&token_bytes), stats(&resume)]
}

fn peak_rss_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse::<u64>().ok())
            .map(|kb| kb * 1024)
            .unwrap_or(0)
    };
    field("VmHWM:").max(field("VmRSS:"))
}

fn current_rss_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse::<u64>().ok())
        .map(|kb| kb * 1024)
        .unwrap_or(0)
}

/// Thread workers by default; worker processes (this program as `__worker`) with `--processes`.
fn new_runner() -> Runner {
    let codec = SignedCodec::new(SignedCodecConfig::new(SECRET)).expect("valid secret");
    let mut config = RunnerConfig::new().codec(codec);
    if std::env::args().any(|a| a == "--processes") {
        config = config.processes(ProcessConfig::current_exe().expect("own path"));
    }
    Runner::new(config).expect("runner starts")
}

/// A tight loop of one workload, for profilers: `bench --profile trivial|calls|calls4k|cpu|interrupt|resume N`.
async fn profile(workload: &str, n: usize) {
    let runner = new_runner();
    let (request, expected) = match workload {
        "trivial" => (RunRequest::new(TRIVIAL), json!(2)),
        "calls" => (RunRequest::new(CALLS_200_SMALL).host(host(false)), json!(19900)),
        "calls4k" => (RunRequest::new(CALLS_200).host(host(true)), json!(CALLS_200_VALUE)),
        "cpu" => (RunRequest::new(CPU), json!(CPU_VALUE)),
        "interrupt" => {
            let hex = host(true);
            let started = Instant::now();
            for _ in 0..n {
                let first = runner.run(RunRequest::new(CALLS_200_INTERRUPT).host(hex.clone())).await;
                assert!(matches!(first, Ok(Outcome::Interrupted(_))));
            }
            eprintln!("{workload}: {:.3} ms per run", ms(started) / n as f64);
            return;
        }
        "resume" => {
            let hex = host(true);
            let Ok(Outcome::Interrupted(first)) =
                runner.run(RunRequest::new(CALLS_200_INTERRUPT).host(hex.clone())).await
            else {
                panic!("no interruption")
            };
            let id = first.interruptions[0].id.clone();
            let request = RunRequest::new(CALLS_200_INTERRUPT)
                .host(hex)
                .resume(first.continuation, [Resolution::new(id, json!(true))]);
            (request, json!(CALLS_200_VALUE))
        }
        other => panic!("unknown workload {other}"),
    };
    let started = Instant::now();
    for _ in 0..n {
        check(runner.run(request.clone()).await, &expected, "profile");
    }
    eprintln!("{workload}: {:.3} ms per run", ms(started) / n as f64);
}

/// What one system call a worker makes while it waits (a `ppoll` that finds nothing) costs
/// before and after `confine_worker` installs its seccomp filters: the median of 20 batches of
/// 10,000 calls, in nanoseconds per call.
fn confinement_probe() {
    fn per_call_ns() -> f64 {
        let mut batches: Vec<f64> = (0..20)
            .map(|_| {
                let started = Instant::now();
                for _ in 0..10_000 {
                    let mut poll = libc::pollfd { fd: 0, events: libc::POLLIN, revents: 0 };
                    let zero = libc::timespec { tv_sec: 0, tv_nsec: 0 };
                    // SAFETY: one valid pollfd, a valid timespec, no signal mask.
                    unsafe { libc::ppoll(&mut poll, 1, &zero, std::ptr::null()) };
                }
                started.elapsed().as_nanos() as f64 / 10_000.0
            })
            .collect();
        batches.sort_by(f64::total_cmp);
        r3(batches[batches.len() / 2])
    }
    let unconfined = per_call_ns();
    resumable_runner::process::confine_worker().expect("this machine confines workers");
    let confined = per_call_ns();
    print!("{}", json!({ "unconfined": unconfined, "confined": confined, "added": r3(confined - unconfined) }));
}

async fn rss_child() {
    let baseline = peak_rss_bytes();
    let runner = new_runner();
    for _ in 0..100 {
        check(runner.run(RunRequest::new(TRIVIAL)).await, &json!(2), "rss");
    }
    let peak = peak_rss_bytes();
    print!(
        "{}",
        json!({ "baseline_peak_rss_bytes": baseline, "peak_rss_bytes": peak, "current_rss_bytes": current_rss_bytes() })
    );
}

async fn bench() {
    let reps = Reps {
        fast: env_reps("BENCH_REPS_FAST", 50),
        warm_fast: env_reps("BENCH_WARMUP_FAST", 20),
        calls: env_reps("BENCH_REPS_CALLS", 30),
        warm_calls: env_reps("BENCH_WARMUP_CALLS", 5),
        cpu: env_reps("BENCH_REPS_CPU", 5),
        warm_cpu: env_reps("BENCH_WARMUP_CPU", 1),
    };
    let mut out = Map::new();
    out.insert("peer".into(), json!("resumable"));
    out.insert("version".into(), json!(env!("CARGO_PKG_VERSION")));
    let mode = if std::env::args().any(|a| a == "--processes") { "process" } else { "thread" };
    out.insert("runtime".into(), json!(format!("rquickjs 0.14 (quickjs-ng), {mode} workers")));
    out.insert("cores".into(), json!(std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0)));
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let load: Vec<f64> = load.split_whitespace().take(3).filter_map(|v| v.parse().ok()).collect();
    out.insert("loadavg_at_start".into(), json!(load));
    out.insert(
        "reps".into(),
        json!({ "fast": reps.fast, "warmFast": reps.warm_fast, "calls": reps.calls, "warmCalls": reps.warm_calls, "cpu": reps.cpu, "warmCpu": reps.warm_cpu }),
    );

    let started = Instant::now();
    let runner = new_runner();
    out.insert("runner_create_ms".into(), json!(r3(ms(started))));
    let started = Instant::now();
    check(runner.run(RunRequest::new(TRIVIAL)).await, &json!(2), "first");
    out.insert("first_run_ms".into(), json!(r3(ms(started))));

    let repeat = host(false);
    let hex = host(true);
    let (fast, warm_fast) = (reps.fast, reps.warm_fast);
    out.insert("a_trivial_ms".into(), timed(&runner, "a", RunRequest::new(TRIVIAL), json!(2), warm_fast, fast).await);
    let b = RunRequest::new(ONE_CALL).host(repeat.clone());
    out.insert("b_one_call_ms".into(), timed(&runner, "b", b, json!(1), warm_fast, fast).await);
    let c = RunRequest::new(CALLS_200_SMALL).host(repeat.clone());
    out.insert(
        "c_200_calls_small_ms".into(),
        timed(&runner, "c-small", c, json!(19900), reps.warm_calls, reps.calls).await,
    );
    out.insert(
        "c_200_calls_small_events_ms".into(),
        streamed_calls(&runner, &repeat, reps.warm_calls, reps.calls).await,
    );
    let c = RunRequest::new(CALLS_200).host(repeat.clone());
    let value = json!(CALLS_200_VALUE);
    out.insert(
        "c_200_calls_4k_repeat_ms".into(),
        timed(&runner, "c-repeat", c, value.clone(), reps.warm_calls, reps.calls).await,
    );
    let c = RunRequest::new(CALLS_200).host(hex.clone());
    out.insert("c_200_calls_4k_hex_ms".into(), timed(&runner, "c-hex", c, value, reps.warm_calls, reps.calls).await);

    for (key, source, host) in [
        ("4k_repeat", CALLS_200_INTERRUPT, &repeat),
        ("4k_hex", CALLS_200_INTERRUPT, &hex),
        ("4k_hex_retained", CALLS_200_RETAIN_INTERRUPT, &hex),
    ] {
        let [to_interrupt, tokens, resume] = interrupt_resume(&runner, source, host, reps.warm_calls, reps.calls).await;
        out.insert(format!("d_token_bytes_{key}"), tokens);
        out.insert(format!("d_run_to_interrupt_ms_{key}"), to_interrupt);
        out.insert(format!("e_resume_ms_{key}"), resume);
    }

    let [cold, warm] = bytecode_cache(&runner, warm_fast, fast).await;
    let median = |v: &Value| v["median"].as_f64().unwrap_or(f64::NAN);
    out.insert("bytecode_speedup".into(), json!(r3(median(&cold) / median(&warm))));
    out.insert("bytecode_cold_ms".into(), cold);
    out.insert("bytecode_warm_ms".into(), warm);

    out.insert(
        "f_cpu_sum_1e7_ms".into(),
        timed(&runner, "f", RunRequest::new(CPU), json!(CPU_VALUE), reps.warm_cpu, reps.cpu).await,
    );

    let batch = || async {
        let runs = (0..8).map(|_| {
            let runner = runner.clone();
            tokio::spawn(async move { runner.run(RunRequest::new(TRIVIAL)).await })
        });
        for run in runs.collect::<Vec<_>>() {
            check(run.await.expect("task"), &json!(2), "g");
        }
    };
    for _ in 0..warm_fast {
        batch().await;
    }
    let mut batches = Vec::with_capacity(fast);
    for _ in 0..fast {
        let started = Instant::now();
        batch().await;
        batches.push(ms(started));
    }
    let g = stats(&batches);
    let median = g["median"].as_f64().unwrap_or(f64::NAN);
    out.insert("g_parallel8_batch_ms".into(), g);
    out.insert("g_parallel8_runs_per_sec".into(), json!(r3(8000.0 / median)));

    if mode == "process" {
        // One process per run (`ProcessConfig::reuse(false)`), and what confinement adds to
        // each system call a worker makes.
        let fresh = ProcessConfig::current_exe().expect("own path").reuse(false);
        let fresh = Runner::new(RunnerConfig::new().processes(fresh)).expect("runner starts");
        let fresh_reps = fast.min(20);
        out.insert(
            "a_trivial_fresh_process_ms".into(),
            timed(&fresh, "a-fresh", RunRequest::new(TRIVIAL), json!(2), 2, fresh_reps).await,
        );
        let exe = std::env::current_exe().expect("own path");
        let probe = std::process::Command::new(exe).arg("--confinement-probe").output().expect("probe child");
        let probe: Value = serde_json::from_slice(&probe.stdout).expect("probe output");
        out.insert("confinement_syscall_ns".into(), probe);
    }

    let exe = std::env::current_exe().expect("own path");
    let mut rss = std::process::Command::new(exe);
    rss.arg("--rss").args(std::env::args().filter(|a| a == "--processes"));
    let child = rss.output().expect("rss child");
    let h: Value = serde_json::from_slice(&child.stdout).expect("rss child output");
    for key in ["baseline_peak_rss_bytes", "peak_rss_bytes", "current_rss_bytes"] {
        out.insert(format!("h_{key}"), h[key].clone());
    }
    println!("{}", Value::Object(out));
}

fn main() {
    if std::env::args().nth(1).as_deref() == Some(WORKER_ARGUMENT) {
        serve_worker();
    }
    if std::env::args().nth(1).as_deref() == Some("--confinement-probe") {
        confinement_probe();
        return;
    }
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("tokio");
    let args: Vec<String> = std::env::args().collect();
    if let Some(i) = args.iter().position(|a| a == "--profile") {
        let workload = args.get(i + 1).expect("a workload");
        let n = args.get(i + 2).and_then(|n| n.parse().ok()).expect("a count");
        runtime.block_on(profile(workload, n));
    } else if args.iter().any(|a| a == "--rss") {
        runtime.block_on(rss_child());
    } else {
        runtime.block_on(bench());
    }
}
