//! The parent against a hostile worker process.
//!
//! A script that takes over its worker process (through a memory-safety bug of QuickJS, say)
//! controls every byte the worker sends. This test binary is its own fake worker: started with
//! `--hostile MODE`, it speaks the frame protocol by hand (4-byte little-endian length, then JSON)
//! and sends forged frames. Each scenario checks that the run ends with a stable code, that no
//! host function runs with forged input, that a stored token stays single-use, and that the
//! parent's memory stays bounded.
//!
//! Without `--hostile` it runs the scenarios and ends with an `N passed, N failed` line.

use std::io::{Read, Write};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use resumable_runner::codec::{SignedCodec, SignedCodecConfig};
use resumable_runner::host::{CancelSignal, HostFunctions};
use resumable_runner::process::ProcessConfig;
use resumable_runner::{
    ErrorCode, Limit, LimitOverrides, MemoryContinuationStore, Outcome, Resolution, RunError, RunRequest, Runner,
    RunnerConfig, StoredCodec,
};
use serde_json::{Value, json};

const SECRET: &[u8] = b"a-secret-for-the-hostile-worker-suite!!";
const REAL_WORKER: &str = env!("CARGO_BIN_EXE_resumable-worker");
const REFUND: &str = "return await tools.refund('A-1002', 1500)";

// ---- the fake worker ----

fn read_frame(input: &mut impl Read) -> Option<Value> {
    let mut length = [0u8; 4];
    input.read_exact(&mut length).ok()?;
    let mut body = vec![0u8; u32::from_le_bytes(length) as usize];
    input.read_exact(&mut body).ok()?;
    serde_json::from_slice(&body).ok()
}

fn write_raw(out: &mut impl Write, body: &[u8]) {
    let _ = out.write_all(&(body.len() as u32).to_le_bytes());
    let _ = out.write_all(body);
    let _ = out.flush();
}

fn write_frame(out: &mut impl Write, frame: &Value) {
    write_raw(out, frame.to_string().as_bytes());
}

fn call(index: u64, function: &str, arguments: &str, resumed: bool) -> Value {
    json!({ "Call": { "index": index, "function": function, "arguments": arguments, "resumed": resumed } })
}

fn done_completed(value: Value) -> Value {
    json!({ "Done": [{ "Ok": { "Completed": { "value": value, "console": [] } } }, null] })
}

fn read_bytes(input: &mut impl Read) -> Option<Vec<u8>> {
    let mut length = [0u8; 4];
    input.read_exact(&mut length).ok()?;
    let mut body = vec![0u8; u32::from_le_bytes(length) as usize];
    input.read_exact(&mut body).ok()?;
    Some(body)
}

/// One entry of a run's prior ledger, as far as the fake worker needs it.
struct Entry {
    function: String,
    arguments: String,
    interrupted: bool,
}

/// The prior ledger that follows a run's frame, in the continuation state's encoding: magic,
/// version, two hashes, run id, seed and clock, the functions called (version 2), then the
/// entries, then a checksum.
fn parse_ledger(bytes: &[u8]) -> Vec<Entry> {
    fn uint(bytes: &mut &[u8]) -> u64 {
        let mut value = 0;
        for shift in (0..64).step_by(7) {
            let (&byte, rest) = bytes.split_first().expect("a whole integer");
            *bytes = rest;
            value |= u64::from(byte & 0x7F) << shift;
            if byte & 0x80 == 0 {
                break;
            }
        }
        value
    }
    fn take<'a>(bytes: &mut &'a [u8], n: usize) -> &'a [u8] {
        let (head, rest) = bytes.split_at(n);
        *bytes = rest;
        head
    }
    fn text(bytes: &mut &[u8]) -> String {
        let length = uint(bytes) as usize;
        String::from_utf8(take(bytes, length).to_vec()).expect("text")
    }
    let mut bytes = bytes;
    take(&mut bytes, 4);
    let version = uint(&mut bytes);
    take(&mut bytes, 64);
    text(&mut bytes);
    take(&mut bytes, 16);
    if version >= 2 {
        for _ in 0..uint(&mut bytes) {
            text(&mut bytes);
            take(&mut bytes, 32);
        }
    }
    let count = uint(&mut bytes);
    (0..count)
        .map(|_| {
            let (function, arguments) = (text(&mut bytes), text(&mut bytes));
            let tag = take(&mut bytes, 1)[0];
            text(&mut bytes);
            if tag == 1 && take(&mut bytes, 1)[0] == 1 {
                text(&mut bytes);
            }
            if take(&mut bytes, 1)[0] == 1 {
                uint(&mut bytes);
            }
            take(&mut bytes, 8);
            Entry { function, arguments, interrupted: tag == 2 }
        })
        .collect()
}

/// The first interrupted entry of the run's ledger that has a decision: (index, function, arguments).
fn decided_entry(run: &Value, ledger: &[Entry]) -> Option<(u64, String, String)> {
    let replay = &run["Run"]["run"]["replay"];
    ledger.iter().enumerate().find_map(|(i, entry)| {
        let index = i as u64 + 1;
        let decided = replay["resolutions"].get(index.to_string()).is_some();
        (decided && entry.interrupted).then(|| (index, entry.function.clone(), entry.arguments.clone()))
    })
}

/// Serves runs on stdin/stdout the way `mode` says, forever.
fn fake_worker(mode: &str, arg: Option<&str>) {
    let mut input = std::io::stdin().lock();
    let mut out = std::io::stdout().lock();
    while let Some(run) = read_frame(&mut input) {
        // Sends much more than a pipe holds before it reads the ledger, as an honest worker may
        // (events while it replays), while the parent writes a ledger larger than a pipe holds.
        if mode == "writes-first" {
            let event = json!({ "Event": { "type": "call_started", "index": 1, "name": "x".repeat(1000) } });
            for _ in 0..3000 {
                write_frame(&mut out, &event);
            }
        }
        let ledger = parse_ledger(&read_bytes(&mut input).expect("the ledger after the run"));
        let next_live = || ledger.len() as u64 + 1;
        match mode {
            // Spends the decision on another order and amount than the approver saw.
            "forged-resume" | "honest-resume" => {
                let (index, function, arguments) = decided_entry(&run, &ledger).expect("a decided call");
                let arguments = if mode == "forged-resume" { r#"["A-1004",31000]"#.to_owned() } else { arguments };
                write_frame(&mut out, &call(index, &function, &arguments, true));
                let settled = read_frame(&mut input).unwrap_or(Value::Null);
                write_frame(&mut out, &done_completed(settled["Settled"]["outcome"].clone()));
            }
            // Makes a call, lets it interrupt, then claims another ledger and other interruptions.
            "forged-ledger" => {
                write_frame(&mut out, &call(next_live(), "tools.refund", r#"["A-1002",1500]"#, false));
                let _ = read_frame(&mut input);
                let forged = json!({ "Done": [{ "Ok": { "Interrupted": {
                    "settled": [{ "index": 1, "settle_order": null }],
                    "console": [],
                    "ledger": [{ "function": "tools.refund", "arguments": "[\"A-1004\",31000]" }],
                    "interruptions": [{ "id": "interrupt-1", "function": "tools.refund",
                                        "arguments": ["A-1004", 31000], "payload": { "amount": 31000 } }]
                } } }, null] });
                write_frame(&mut out, &forged);
            }
            // Reports a settle time for a call it was never served.
            "unserved-settlement" => {
                write_frame(&mut out, &call(next_live(), "tools.refund", r#"["A-1002",1500]"#, false));
                let _ = read_frame(&mut input);
                let forged = json!({ "Done": [{ "Ok": { "Interrupted": {
                    "settled": [{ "index": 1, "settle_order": null },
                                { "index": 2, "settle_order": 0 }],
                    "console": []
                } } }, null] });
                write_frame(&mut out, &forged);
            }
            // Skips ahead of the ledger.
            "skipped-index" => write_frame(&mut out, &call(next_live() + 5, "tools.count", "[]", false)),
            // A resumed call where there is nothing to resume.
            "undecided-resume" => write_frame(&mut out, &call(1, "tools.refund", r#"["A-1002",1500]"#, true)),
            // Arguments one byte over the argument limit (`arg` bytes).
            "large-arguments" => {
                let limit: usize = arg.and_then(|a| a.parse().ok()).unwrap_or(0);
                let arguments = format!("[\"{}\"]", "x".repeat(limit + 1 - 4));
                write_frame(&mut out, &call(next_live(), "tools.count", &arguments, false));
            }
            // More calls than the host-call limit, each answered.
            "too-many-calls" => {
                for index in next_live()..next_live() + 10 {
                    write_frame(&mut out, &call(index, "tools.count", "[]", false));
                    if read_frame(&mut input).is_none() {
                        return;
                    }
                }
                write_frame(&mut out, &done_completed(json!("all ten")));
            }
            // More calls in flight than allowed: slow calls, none awaited.
            "too-many-in-flight" => {
                for index in next_live()..next_live() + 10 {
                    write_frame(&mut out, &call(index, "tools.slow", "[]", false));
                }
                std::thread::sleep(Duration::from_secs(30));
            }
            // A frame of exactly `arg` bytes (accepted), then one of `arg` + 1 (refused).
            "frame-at-limit" | "frame-over-limit" => {
                let limit: usize = arg.and_then(|a| a.parse().ok()).unwrap_or(0);
                let size = if mode == "frame-at-limit" { limit } else { limit + 1 };
                let mut body = done_completed(json!("padded")).to_string().into_bytes();
                body.resize(size, b' ');
                write_raw(&mut out, &body);
            }
            // Announces a frame of 511 MiB and sends nothing more.
            "huge-frame" => {
                let _ = out.write_all(&(511u32 * 1024 * 1024).to_le_bytes());
                let _ = out.flush();
                std::thread::sleep(Duration::from_secs(30));
            }
            // A flood of events, each about 1 KiB, then an answer.
            "event-flood" => {
                let event = json!({ "Event": { "type": "call_started", "index": 1, "name": "x".repeat(1000) } });
                let body = event.to_string();
                let count: usize = arg.and_then(|a| a.parse().ok()).unwrap_or(0);
                for _ in 0..count {
                    write_raw(&mut out, body.as_bytes());
                }
                write_frame(&mut out, &done_completed(json!("flooded")));
            }
            // Waits on a slow call until it is told to abort, then asks for a refund all the same.
            "calls-after-abort" => {
                static ABORTED: AtomicBool = AtomicBool::new(false);
                extern "C" fn on_abort(_: libc::c_int) {
                    ABORTED.store(true, Ordering::SeqCst);
                }
                // SAFETY: a handler that only stores to a static atomic.
                unsafe { libc::signal(libc::SIGUSR1, on_abort as extern "C" fn(libc::c_int) as libc::sighandler_t) };
                write_frame(&mut out, &call(next_live(), "tools.slow", "[]", false));
                while !ABORTED.load(Ordering::SeqCst) {
                    std::thread::sleep(Duration::from_millis(5));
                }
                write_frame(&mut out, &call(next_live() + 1, "tools.refund", r#"["A-1002",1500]"#, false));
                std::thread::sleep(Duration::from_secs(30));
            }
            // Events without end, as fast as it can write them.
            "endless-events" => {
                let event = json!({ "Event": { "type": "call_started", "index": 1, "name": "x".repeat(1000) } });
                let body = event.to_string();
                let mut batch = Vec::new();
                for _ in 0..256 {
                    batch.extend_from_slice(&(body.len() as u32).to_le_bytes());
                    batch.extend_from_slice(body.as_bytes());
                }
                while out.write_all(&batch).is_ok() {}
            }
            "writes-first" => {
                let (index, function, arguments) = decided_entry(&run, &ledger).expect("a decided call");
                write_frame(&mut out, &call(index, &function, &arguments, true));
                let _ = read_frame(&mut input);
                write_frame(&mut out, &done_completed(json!(ledger.len())));
            }
            // Asks for a large result and completes with it, whatever the output limit says.
            "ignores-output-limit" => {
                write_frame(&mut out, &call(next_live(), "tools.big", "[]", false));
                let settled = read_frame(&mut input).unwrap_or(Value::Null);
                write_frame(&mut out, &done_completed(settled["Settled"]["outcome"]["Value"].clone()));
            }
            // Asks for a large result and never reads again.
            "stops-reading" => {
                write_frame(&mut out, &call(next_live(), "tools.big", "[]", false));
                std::thread::sleep(Duration::from_secs(30));
            }
            // Answers without ever using the stored token.
            "no-consume" => write_frame(&mut out, &done_completed(json!("without consuming"))),
            // Confines itself as a real worker does (unless `arg` ends in `:unconfined`), then
            // tries what a script that took over its worker would try, and says what happened.
            "probe" => {
                let arg = arg.unwrap_or_default();
                let (attempt, unconfined) = match arg.strip_suffix(":unconfined") {
                    Some(attempt) => (attempt, true),
                    None => (arg, false),
                };
                let parent = std::os::unix::process::parent_id();
                if !unconfined {
                    resumable_runner::process::confine_worker().expect("the worker confines itself");
                }
                let result = probe(attempt, parent);
                write_frame(&mut out, &done_completed(json!(result)));
            }
            other => panic!("unknown mode {other}"),
        }
    }
}

/// Makes the system call that `attempt` names; its result, or `-errno` when it failed.
fn probe(attempt: &str, parent: u32) -> i64 {
    let path = |p: &str| std::ffi::CString::new(p).unwrap();
    // SAFETY: each call gets valid, NUL-terminated paths and plain integers; the probe wants to
    // know whether the kernel lets it through, nothing more.
    let result = unsafe {
        match attempt.split_once('=').map_or((attempt, ""), |(a, b)| (a, b)) {
            ("open", file) => libc::open(path(file).as_ptr(), libc::O_RDONLY) as i64,
            ("parent-environ", _) => {
                libc::open(path(&format!("/proc/{parent}/environ")).as_ptr(), libc::O_RDONLY) as i64
            }
            ("parent-cmdline", _) => {
                libc::open(path(&format!("/proc/{parent}/cmdline")).as_ptr(), libc::O_RDONLY) as i64
            }
            ("socket", _) => libc::socket(libc::AF_INET, libc::SOCK_STREAM, 0) as i64,
            ("connect", _) => {
                let address = libc::sockaddr_in {
                    sin_family: libc::AF_INET as libc::sa_family_t,
                    sin_port: 80u16.to_be(),
                    sin_addr: libc::in_addr { s_addr: u32::from_be_bytes([127, 0, 0, 1]).to_be() },
                    sin_zero: [0; 8],
                };
                let size = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
                libc::connect(0, (&address as *const libc::sockaddr_in).cast(), size) as i64
            }
            ("execve", _) => {
                let program = path("/nonexistent/program");
                let argv = [program.as_ptr(), std::ptr::null()];
                let envp = [std::ptr::null()];
                libc::execve(program.as_ptr(), argv.as_ptr(), envp.as_ptr()) as i64
            }
            ("ptrace", _) => libc::ptrace(libc::PTRACE_ATTACH, parent as libc::pid_t, 0, 0),
            (other, _) => panic!("unknown probe {other}"),
        }
    };
    if result < 0 { -i64::from(std::io::Error::last_os_error().raw_os_error().unwrap_or(0)) } else { result }
}

// ---- the scenarios ----

/// A refund's arguments, and the decision it was resumed with.
type RefundCall = (Value, Option<Value>);

/// What the host functions were asked, to check that nothing forged reached them.
#[derive(Clone, Default)]
struct Effects {
    refunds: Arc<Mutex<Vec<RefundCall>>>,
    counted: Arc<AtomicUsize>,
}

impl Effects {
    fn host(&self) -> HostFunctions {
        let refunds = self.refunds.clone();
        let counted = self.counted.clone();
        HostFunctions::builder()
            .function("tools.refund", move |ctx, args| {
                let refunds = refunds.clone();
                async move {
                    let resume = ctx.resume().map(|r| r.resolution.clone());
                    refunds.lock().unwrap().push((Value::Array(args.clone()), resume.clone()));
                    match resume {
                        None => Err(ctx.interrupt(json!({ "orderId": args[0], "amount": args[1] }))),
                        Some(decision) => Ok(json!({ "refunded": args[1], "decision": decision })),
                    }
                }
            })
            .function("tools.count", move |_ctx, _args| {
                counted.fetch_add(1, Ordering::SeqCst);
                async move { Ok(json!(1)) }
            })
            .function("tools.slow", |_ctx, _args| async move {
                tokio::time::sleep(Duration::from_secs(20)).await;
                Ok(json!(1))
            })
            .function("tools.big", |_ctx, _args| async move { Ok(json!("y".repeat(1 << 20))) })
            .function("tools.ask", |ctx, args| async move {
                match ctx.resume() {
                    None => Err(ctx.interrupt(json!({ "asked": args }))),
                    Some(resume) => {
                        tokio::time::sleep(Duration::from_millis(20)).await;
                        Ok(resume.resolution.clone())
                    }
                }
            })
            .build()
            .unwrap()
    }

    fn refund_calls(&self) -> usize {
        self.refunds.lock().unwrap().len()
    }
}

fn signed() -> SignedCodec {
    SignedCodec::new(SignedCodecConfig::new(SECRET)).unwrap()
}

/// A runner whose single worker process is this binary in `mode`.
fn hostile(mode: &str, arg: Option<String>) -> Runner {
    let mut processes = ProcessConfig::new(std::env::current_exe().unwrap()).arg("--hostile").arg(mode);
    if let Some(arg) = arg {
        processes = processes.arg(arg);
    }
    Runner::new(RunnerConfig::new().workers(1).codec(signed()).processes(processes)).unwrap()
}

fn real() -> Runner {
    Runner::new(RunnerConfig::new().workers(1).codec(signed()).processes(ProcessConfig::new(REAL_WORKER))).unwrap()
}

fn limits(pairs: &[(Limit, i128)]) -> LimitOverrides {
    pairs.iter().fold(LimitOverrides::new(), |o, (limit, value)| o.with(*limit, *value).unwrap())
}

#[track_caller]
fn assert_code(result: &Result<Outcome, RunError>, code: ErrorCode) {
    match result {
        Err(e) => assert_eq!(e.code, code, "{e}"),
        Ok(outcome) => panic!("expected {code:?}, got {outcome:?}"),
    }
}

/// A real first round of [`REFUND`]: its continuation and interruption id.
async fn first_round(effects: &Effects) -> (String, String) {
    let outcome = real().run(RunRequest::new(REFUND).host(effects.host())).await.unwrap();
    let Outcome::Interrupted(paused) = outcome else { panic!("{outcome:?}") };
    (paused.continuation, paused.interruptions[0].id.clone())
}

async fn a_decision_is_spent_only_on_the_recorded_call() {
    let effects = Effects::default();
    let (token, id) = first_round(&effects).await;
    let resume = || {
        RunRequest::new(REFUND).host(effects.host()).resume(token.clone(), [Resolution::new(&id, json!("approved"))])
    };
    let forged = hostile("forged-resume", None).run(resume()).await;
    assert_code(&forged, ErrorCode::ProtocolError);
    assert_eq!(effects.refund_calls(), 1, "no host function ran with the forged arguments");
    // The same fake worker resuming with the recorded arguments gets the decision (the check can fail).
    let honest = hostile("honest-resume", None).run(resume()).await.unwrap();
    let Outcome::Completed(done) = honest else { panic!("{honest:?}") };
    assert_eq!(done.value["Value"]["decision"], json!("approved"), "{done:?}");
    let refunds = effects.refunds.lock().unwrap().clone();
    assert_eq!(refunds[1], (json!(["A-1002", 1500]), Some(json!("approved"))));
}

async fn the_ledger_and_interruptions_are_what_the_parent_served() {
    let effects = Effects::default();
    let outcome = hostile("forged-ledger", None).run(RunRequest::new(REFUND).host(effects.host())).await.unwrap();
    let Outcome::Interrupted(paused) = outcome else { panic!("{outcome:?}") };
    assert_eq!(paused.interruptions.len(), 1);
    let interruption = &paused.interruptions[0];
    assert_eq!(interruption.arguments, vec![json!("A-1002"), json!(1500)]);
    assert_eq!(interruption.payload, json!({ "orderId": "A-1002", "amount": 1500 }));
    // The continuation records the call that was served, so a real resume replays it.
    let resumed = real()
        .run(
            RunRequest::new(REFUND)
                .host(effects.host())
                .resume(paused.continuation, [Resolution::new(&interruption.id, json!("yes"))]),
        )
        .await
        .unwrap();
    let Outcome::Completed(done) = resumed else { panic!("{resumed:?}") };
    assert_eq!(done.value, json!({ "refunded": 1500, "decision": "yes" }));
    let unserved = hostile("unserved-settlement", None).run(RunRequest::new(REFUND).host(effects.host())).await;
    assert_code(&unserved, ErrorCode::ProtocolError);
}

async fn calls_out_of_order_or_over_the_limits_are_refused() {
    let effects = Effects::default();
    let run = |mode: &str, arg: Option<String>, overrides: LimitOverrides| {
        let runner = hostile(mode, arg);
        let host = effects.host();
        async move { runner.run(RunRequest::new("return 1").host(host).limits(overrides)).await }
    };
    assert_code(&run("skipped-index", None, LimitOverrides::new()).await, ErrorCode::ProtocolError);
    assert_code(&run("undecided-resume", None, LimitOverrides::new()).await, ErrorCode::ProtocolError);
    let arguments = limits(&[(Limit::HostCallArguments, 1000)]);
    assert_code(&run("large-arguments", Some("1000".into()), arguments).await, ErrorCode::ProtocolError);
    let calls = limits(&[(Limit::HostCalls, 3)]);
    assert_code(&run("too-many-calls", None, calls).await, ErrorCode::ProtocolError);
    let in_flight = limits(&[(Limit::HostCallsInFlight, 4), (Limit::Timeout, 5_000)]);
    let started = Instant::now();
    assert_code(&run("too-many-in-flight", None, in_flight).await, ErrorCode::ProtocolError);
    assert!(started.elapsed() < Duration::from_secs(4), "refused at once, not at the deadline");
    assert_eq!(effects.counted.load(Ordering::SeqCst), 3, "only the calls within the limit ran");
    assert_eq!(effects.refund_calls(), 0, "nothing ran for the undecided resume");
}

async fn no_host_function_starts_once_the_run_is_cancelled() {
    let effects = Effects::default();
    let cancel = CancelSignal::new();
    let request = RunRequest::new("return 1").host(effects.host()).cancel(cancel.clone());
    let runner = hostile("calls-after-abort", None);
    let run = tokio::spawn(async move { runner.run(request).await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    cancel.cancel();
    let ended = run.await.unwrap();
    assert_code(&ended, ErrorCode::Aborted);
    assert_eq!(effects.refund_calls(), 0, "nothing started after the cancel");
}

async fn neither_side_holds_the_other_by_filling_a_pipe() {
    let effects = Effects::default();
    let source =
        "const a = await tools.big(); const b = await tools.big(); return [a.length + b.length, await tools.ask()]";
    let big = limits(&[(Limit::Result, 8 << 20), (Limit::Continuation, 64 << 20), (Limit::Timeout, 20_000)]);
    let first = real().run(RunRequest::new(source).host(effects.host()).limits(big)).await.unwrap();
    let Outcome::Interrupted(paused) = first else { panic!("{first:?}") };
    let resume = RunRequest::new(source)
        .host(effects.host())
        .limits(big)
        .resume(paused.continuation, [Resolution::new(&paused.interruptions[0].id, json!("yes"))]);
    let started = Instant::now();
    let done = hostile("writes-first", None).run(resume).await;
    let Ok(Outcome::Completed(done)) = done else { panic!("{done:?}") };
    assert_eq!(done.value, json!(3), "the worker read the whole ledger");
    assert!(started.elapsed() < Duration::from_secs(10), "no wait for the deadline: {:?}", started.elapsed());
}

async fn a_worker_that_never_stops_sending_ends_at_the_deadline() {
    let started = Instant::now();
    let flooded =
        hostile("endless-events", None).run(RunRequest::new("return 1").limits(limits(&[(Limit::Timeout, 500)]))).await;
    assert_code(&flooded, ErrorCode::Timeout);
    assert!(started.elapsed() < Duration::from_secs(3), "{:?}", started.elapsed());
}

async fn outputs_over_the_limit_are_refused_by_the_parent() {
    let effects = Effects::default();
    let request = || RunRequest::new("return 1").host(effects.host());
    let within = limits(&[(Limit::Result, 2 << 20)]);
    let done = hostile("ignores-output-limit", None).run(request().limits(within)).await;
    let Ok(Outcome::Completed(done)) = done else { panic!("{done:?}") };
    assert_eq!(done.value.as_str().map(str::len), Some(1 << 20), "the worker got the output");
    let over = limits(&[(Limit::Result, 2 << 20), (Limit::HostCallOutput, 1000)]);
    let refused = hostile("ignores-output-limit", None).run(request().limits(over)).await;
    assert_code(&refused, ErrorCode::BridgeLimit);
}

async fn frames_are_capped_by_the_runs_limits() {
    let overrides = limits(&[
        (Limit::HostCallArguments, 10_000),
        (Limit::Result, 10_000),
        (Limit::Console, 10_000),
        (Limit::HostCalls, 10),
    ]);
    // The cap the parent documents: twice the arguments, the result, 38 times the console,
    // 80 bytes a call, and 64 KiB.
    let cap = 10_000 * 2 + 10_000 + 10_000 * 38 + 10 * 80 + 64 * 1024;
    let at = hostile("frame-at-limit", Some(cap.to_string())).run(RunRequest::new("return 1").limits(overrides)).await;
    let Ok(Outcome::Completed(done)) = at else { panic!("{at:?}") };
    assert_eq!(done.value, json!("padded"));
    let over =
        hostile("frame-over-limit", Some(cap.to_string())).run(RunRequest::new("return 1").limits(overrides)).await;
    assert_code(&over, ErrorCode::ProtocolError);
    let before = resident_bytes();
    let started = Instant::now();
    let huge = hostile("huge-frame", None).run(RunRequest::new("return 1")).await;
    assert_code(&huge, ErrorCode::ProtocolError);
    assert!(started.elapsed() < Duration::from_secs(5), "refused when announced");
    assert!(resident_bytes().saturating_sub(before) < 64 << 20, "nothing was allocated for the announced frame");
}

async fn an_honest_worker_stays_within_the_caps_with_many_short_console_lines() {
    // Each empty line counts one byte against the console limit but takes some 26 bytes of JSON.
    let small = limits(&[
        (Limit::Console, 100_000),
        (Limit::Result, 1_000),
        (Limit::HostCallArguments, 1_000),
        (Limit::HostCalls, 1),
    ]);
    let source = "for (let i = 0; i < 200000; i++) console.log(); return 'quiet'";
    let done = real().run(RunRequest::new(source).limits(small)).await.unwrap();
    let Outcome::Completed(done) = done else { panic!("{done:?}") };
    assert_eq!(done.value, json!("quiet"));
    assert!(done.console.len() > 50_000, "{} lines", done.console.len());
    let live = real().start(RunRequest::new(source).limits(small)).events();
    let outcome = live.outcome().await.unwrap();
    assert!(matches!(outcome, Outcome::Completed(_)), "{outcome:?}");
}

async fn a_flood_of_events_keeps_the_parents_memory_bounded() {
    let before = resident_bytes();
    // 100,000 events of about 1 KiB: 100 MB through the pipe.
    let runner = hostile("event-flood", Some("100000".into()));
    let outcome = runner.run(RunRequest::new("return 1").limits(limits(&[(Limit::Timeout, 60_000)]))).await.unwrap();
    let Outcome::Completed(done) = outcome else { panic!("{outcome:?}") };
    assert_eq!(done.value, json!("flooded"));
    let grown = resident_bytes().saturating_sub(before);
    assert!(grown < 64 << 20, "the parent grew by {grown} bytes");
    // With a consumer that reads nothing until the end, the events kept stay bounded too.
    let before = resident_bytes();
    let live = runner.start(RunRequest::new("return 1").limits(limits(&[(Limit::Timeout, 60_000)]))).events();
    let outcome = live.outcome().await.unwrap();
    assert!(matches!(outcome, Outcome::Completed(_)), "{outcome:?}");
    let grown = resident_bytes().saturating_sub(before);
    assert!(grown < 64 << 20, "with a lagging consumer the parent grew by {grown} bytes");
}

async fn a_worker_that_stops_reading_is_killed_at_the_deadline() {
    let effects = Effects::default();
    let runner = hostile("stops-reading", None);
    let started = Instant::now();
    let stuck =
        runner.run(RunRequest::new("return 1").host(effects.host()).limits(limits(&[(Limit::Timeout, 500)]))).await;
    assert_code(&stuck, ErrorCode::Timeout);
    assert!(started.elapsed() < Duration::from_secs(5), "{:?}", started.elapsed());
    // Its slot is free again: the next run gets a fresh worker (which stops reading too).
    let again =
        runner.run(RunRequest::new("return 1").host(effects.host()).limits(limits(&[(Limit::Timeout, 500)]))).await;
    assert_code(&again, ErrorCode::Timeout);
}

async fn a_stored_token_stays_single_use_whatever_the_worker_does() {
    let store = Arc::new(MemoryContinuationStore::new());
    let effects = Effects::default();
    let stored = |processes: ProcessConfig| {
        Runner::new(RunnerConfig::new().workers(1).codec(StoredCodec::new(store.clone())).processes(processes)).unwrap()
    };
    let fake = |mode: &str| ProcessConfig::new(std::env::current_exe().unwrap()).arg("--hostile").arg(mode);
    let first = stored(ProcessConfig::new(REAL_WORKER)).run(RunRequest::new(REFUND).host(effects.host())).await;
    let Ok(Outcome::Interrupted(paused)) = first else { panic!("{first:?}") };
    let id = paused.interruptions[0].id.clone();
    let resume =
        || RunRequest::new(REFUND).host(effects.host()).resume(&paused.continuation, [Resolution::new(&id, json!(1))]);
    // A worker that answers without resuming the decided call breaks the protocol; nothing ran,
    // so the token is not used up.
    let skipped = stored(fake("no-consume")).run(resume()).await;
    assert_code(&skipped, ErrorCode::ProtocolError);
    assert_eq!(effects.refund_calls(), 1);
    // A worker that never asks to use the token still has it used up by the parent, before the
    // resumed call runs: the token resumes once.
    let spent = stored(fake("honest-resume")).run(resume()).await.unwrap();
    assert!(matches!(spent, Outcome::Completed(_)), "{spent:?}");
    let again = stored(ProcessConfig::new(REAL_WORKER)).run(resume()).await;
    assert_code(&again, ErrorCode::ProtocolError);
    assert_eq!(effects.refund_calls(), 2, "the approval was spent once");
}

/// A store whose `consume` never answers.
struct HangingConsume(MemoryContinuationStore);

impl resumable_runner::ContinuationStore for HangingConsume {
    fn set(
        &self,
        key: [u8; 32],
        record: resumable_runner::StoredContinuation,
    ) -> resumable_runner::StoreFuture<'_, ()> {
        self.0.set(key, record)
    }
    fn acquire(
        &self,
        key: [u8; 32],
        claim: resumable_runner::ClaimId,
        lease: Duration,
    ) -> resumable_runner::StoreFuture<'_, resumable_runner::StoredContinuation> {
        self.0.acquire(key, claim, lease)
    }
    fn consume(&self, _key: [u8; 32], _claim: resumable_runner::ClaimId) -> resumable_runner::StoreFuture<'_, ()> {
        Box::pin(std::future::pending())
    }
    fn release(&self, key: [u8; 32], claim: resumable_runner::ClaimId) -> resumable_runner::StoreFuture<'_, ()> {
        self.0.release(key, claim)
    }
    fn peek(&self, key: [u8; 32]) -> resumable_runner::StoreFuture<'_, resumable_runner::StoredContinuation> {
        self.0.peek(key)
    }
}

async fn a_store_that_hangs_on_consume_cannot_hold_the_run_past_its_deadline() {
    let effects = Effects::default();
    let runner = Runner::new(
        RunnerConfig::new()
            .workers(1)
            .codec(StoredCodec::new(Arc::new(HangingConsume(MemoryContinuationStore::new()))))
            .processes(ProcessConfig::new(REAL_WORKER)),
    )
    .unwrap();
    let first = runner.run(RunRequest::new(REFUND).host(effects.host())).await;
    let Ok(Outcome::Interrupted(paused)) = first else { panic!("{first:?}") };
    let resume = RunRequest::new(REFUND)
        .host(effects.host())
        .limits(limits(&[(Limit::Timeout, 500)]))
        .resume(&paused.continuation, [Resolution::new(&paused.interruptions[0].id, json!(1))]);
    let started = Instant::now();
    let stuck = runner.run(resume).await;
    assert_code(&stuck, ErrorCode::Timeout);
    assert!(started.elapsed() < Duration::from_secs(5), "{:?}", started.elapsed());
    assert_eq!(effects.refund_calls(), 1, "the resumed call never ran");
}

/// What probing `attempt` in a worker gives: `Ok(result)` when the call returned, `Err` when the
/// worker died making it.
async fn probe_in_worker(attempt: &str) -> Result<i64, RunError> {
    let runner = hostile("probe", Some(attempt.to_owned()));
    match runner.run(RunRequest::new("return 1")).await? {
        Outcome::Completed(done) => Ok(done.value.as_i64().expect("a number")),
        other => panic!("{other:?}"),
    }
}

async fn a_confined_worker_can_open_nothing_reach_nothing_and_start_nothing() {
    let dir = std::env::temp_dir().join(format!("resumable-probe-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let secret = dir.join("secret");
    std::fs::write(&secret, "00".repeat(32)).unwrap();
    let database = dir.join("server.db");
    std::fs::write(&database, "").unwrap();
    let files = [
        "open=/etc/passwd".to_owned(),
        format!("open={}", secret.display()),
        format!("open={}", database.display()),
        "parent-environ".to_owned(),
        "parent-cmdline".to_owned(),
    ];
    for attempt in &files {
        // The call returns EACCES: no file is opened.
        assert_eq!(probe_in_worker(attempt).await.ok(), Some(-i64::from(libc::EACCES)), "{attempt}");
        // The same probe unconfined opens it (so this test can fail). The parent's environment
        // needs the right to trace the parent, which a worker in its own user namespace lacks
        // even unconfined.
        if attempt != "parent-environ" {
            let unconfined = probe_in_worker(&format!("{attempt}:unconfined")).await;
            assert!(unconfined.as_ref().is_ok_and(|fd| *fd >= 0), "{attempt} unconfined: {unconfined:?}");
        }
    }
    for attempt in ["socket", "connect", "execve", "ptrace"] {
        // The worker is killed making the call.
        let confined = probe_in_worker(attempt).await;
        assert!(confined.as_ref().is_err_and(|e| e.code == ErrorCode::Error), "{attempt}: {confined:?}");
        // Unconfined, the call returns (whatever the kernel answers).
        let unconfined = probe_in_worker(&format!("{attempt}:unconfined")).await;
        assert!(unconfined.is_ok(), "{attempt} unconfined: {unconfined:?}");
    }
    let _ = std::fs::remove_dir_all(dir);
}

async fn a_running_worker_shows_its_confinement_in_proc() {
    let runner = real();
    let busy = tokio::spawn({
        let runner = runner.clone();
        async move { runner.run(RunRequest::new("for (;;) {}").limits(limits(&[(Limit::Timeout, 3_000)]))).await }
    });
    // The real worker among this process's children (the fake ones of other scenarios may still
    // be going away), once it has confined itself and started the script.
    let me = std::process::id();
    let is_real_worker = |pid: u32| {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        let fields: Vec<&str> =
            stat.rsplit_once(") ").map(|(_, rest)| rest.split_whitespace().collect()).unwrap_or_default();
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        fields.get(1) == Some(&me.to_string().as_str())
            && fields.first() != Some(&"Z")
            && String::from_utf8_lossy(&cmdline).contains("resumable-worker")
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    let (worker, confinement) = loop {
        let found = std::fs::read_dir("/proc")
            .unwrap()
            .flatten()
            .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
            .find(|&pid| is_real_worker(pid));
        if let Some(pid) = found {
            let confinement = resumable_runner::process::Confinement::of(pid);
            if confinement.seccomp || Instant::now() > deadline {
                break (pid, confinement);
            }
        }
        assert!(Instant::now() < deadline, "no worker process started");
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    assert!(confinement.seccomp, "Seccomp: 2 on every thread: {confinement:?}");
    assert!(confinement.no_new_privs, "NoNewPrivs: 1 on every thread: {confinement:?}");
    assert_eq!(confinement.descriptors, 3, "only the three pipes are open: {confinement:?}");
    assert!(confinement.is_minimal());
    let fds: Vec<String> = std::fs::read_dir(format!("/proc/{worker}/fd"))
        .unwrap()
        .flatten()
        .filter_map(|fd| std::fs::read_link(fd.path()).ok().map(|l| l.display().to_string()))
        .collect();
    assert!(fds.iter().all(|fd| fd.starts_with("pipe:")), "{fds:?}");
    let outcome = busy.await.unwrap();
    assert_code(&outcome, ErrorCode::Timeout);
    // A worker that answers is read once, and found confined.
    assert_eq!(
        runner.run(RunRequest::new("return 1")).await.ok().map(|o| matches!(o, Outcome::Completed(_))),
        Some(true)
    );
    assert!(runner.worker_confinement().is_some_and(|c| c.is_minimal()), "{:?}", runner.worker_confinement());
}

async fn more_decided_calls_than_the_in_flight_limit_resume_together() {
    let effects = Effects::default();
    let source = "const a = tools.ask(1); await tools.count(); const b = tools.ask(2); await tools.count();
        const c = tools.ask(3); await tools.count(); return [await a, await b, await c]";
    let two = limits(&[(Limit::HostCallsInFlight, 2)]);
    let runner = real();
    let first = runner.run(RunRequest::new(source).host(effects.host()).limits(two)).await.unwrap();
    let Outcome::Interrupted(paused) = first else { panic!("{first:?}") };
    assert_eq!(paused.interruptions.len(), 3);
    let decisions = paused.interruptions.iter().map(|i| Resolution::new(&i.id, json!(i.id)));
    let resumed = RunRequest::new(source).host(effects.host()).limits(two).resume(paused.continuation, decisions);
    let done = runner.run(resumed).await.unwrap();
    let Outcome::Completed(done) = done else { panic!("{done:?}") };
    assert_eq!(done.value, json!(["interrupt-1", "interrupt-3", "interrupt-5"]));
}

/// This process's resident memory.
fn resident_bytes() -> usize {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let kib = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<usize>().ok());
    kib.unwrap_or(0) * 1024
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if let Some(at) = args.iter().position(|a| a == "--hostile") {
        fake_worker(&args[at + 1], args.get(at + 2).map(String::as_str));
        return;
    }
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    type Scenario = fn() -> std::pin::Pin<Box<dyn std::future::Future<Output = ()>>>;
    let scenarios: [(&str, Scenario); 16] = [
        ("a_store_that_hangs_on_consume_cannot_hold_the_run_past_its_deadline", || {
            Box::pin(a_store_that_hangs_on_consume_cannot_hold_the_run_past_its_deadline())
        }),
        ("an_honest_worker_stays_within_the_caps_with_many_short_console_lines", || {
            Box::pin(an_honest_worker_stays_within_the_caps_with_many_short_console_lines())
        }),
        ("more_decided_calls_than_the_in_flight_limit_resume_together", || {
            Box::pin(more_decided_calls_than_the_in_flight_limit_resume_together())
        }),
        ("a_confined_worker_can_open_nothing_reach_nothing_and_start_nothing", || {
            Box::pin(a_confined_worker_can_open_nothing_reach_nothing_and_start_nothing())
        }),
        ("a_running_worker_shows_its_confinement_in_proc", || {
            Box::pin(a_running_worker_shows_its_confinement_in_proc())
        }),
        ("a_decision_is_spent_only_on_the_recorded_call", || Box::pin(a_decision_is_spent_only_on_the_recorded_call())),
        ("the_ledger_and_interruptions_are_what_the_parent_served", || {
            Box::pin(the_ledger_and_interruptions_are_what_the_parent_served())
        }),
        ("calls_out_of_order_or_over_the_limits_are_refused", || {
            Box::pin(calls_out_of_order_or_over_the_limits_are_refused())
        }),
        ("frames_are_capped_by_the_runs_limits", || Box::pin(frames_are_capped_by_the_runs_limits())),
        ("no_host_function_starts_once_the_run_is_cancelled", || {
            Box::pin(no_host_function_starts_once_the_run_is_cancelled())
        }),
        ("neither_side_holds_the_other_by_filling_a_pipe", || {
            Box::pin(neither_side_holds_the_other_by_filling_a_pipe())
        }),
        ("a_worker_that_never_stops_sending_ends_at_the_deadline", || {
            Box::pin(a_worker_that_never_stops_sending_ends_at_the_deadline())
        }),
        ("outputs_over_the_limit_are_refused_by_the_parent", || {
            Box::pin(outputs_over_the_limit_are_refused_by_the_parent())
        }),
        ("a_flood_of_events_keeps_the_parents_memory_bounded", || {
            Box::pin(a_flood_of_events_keeps_the_parents_memory_bounded())
        }),
        ("a_worker_that_stops_reading_is_killed_at_the_deadline", || {
            Box::pin(a_worker_that_stops_reading_is_killed_at_the_deadline())
        }),
        ("a_stored_token_stays_single_use_whatever_the_worker_does", || {
            Box::pin(a_stored_token_stays_single_use_whatever_the_worker_does())
        }),
    ];
    let filter = args.iter().skip(1).find(|a| !a.starts_with('-'));
    let (mut passed, mut failed) = (0, 0);
    for (name, scenario) in scenarios {
        if filter.is_some_and(|f| !name.contains(f.as_str())) {
            continue;
        }
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| runtime.block_on(scenario())));
        if result.is_ok() {
            passed += 1;
            println!("test {name} ... ok");
        } else {
            failed += 1;
            println!("test {name} ... FAILED");
        }
    }
    println!("{passed} passed, {failed} failed");
    std::process::exit(i32::from(failed > 0));
}
