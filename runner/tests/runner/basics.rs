use crate::common::*;
use resumable_runner::{ConsoleLevel, ErrorCode, Limit, LimitOverrides, Outcome, RunRequest};
use serde_json::json;
use std::time::{Duration, Instant};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn returns_a_value() {
    let runner = runner();
    assert_eq!(value(&runner, RunRequest::new("return 2 + 3")).await, json!(5));
    assert_eq!(value(&runner, RunRequest::new("const x = await Promise.resolve(4); return x * 2")).await, json!(8));
    assert_eq!(value(&runner, RunRequest::new("1 + 1")).await, json!(null), "no return is undefined, i.e. null");
}

/// The runner's own functions (console methods, host functions) belong to each
/// run's realm: what one run does to them or their prototypes, the next never
/// sees. (Functions built by rquickjs once took the first realm's
/// `Function.prototype`, shared by every later run on that worker.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_runners_functions_carry_nothing_between_runs() {
    let codec = resumable_runner::codec::SignedCodec::new(resumable_runner::codec::SignedCodecConfig::new(SECRET));
    let one_worker = resumable_runner::RunnerConfig::new().workers(1).codec(codec.unwrap());
    let runner = resumable_runner::Runner::new(one_worker).unwrap();
    let tools = Tools::default();
    let source = "const natives = [console.log, console.error, tools.sum, Object.getPrototypeOf(console.log), \
                  Object.getPrototypeOf(tools.sum)]; \
                  const seen = natives.map((f) => f.leak === undefined); \
                  natives.forEach((f, i) => { f.leak = i; }); \
                  return [seen, Object.getPrototypeOf(console.log) === Function.prototype, \
                          Object.getPrototypeOf(tools.sum) === Function.prototype, await tools.sum(1, 2)]";
    for _ in 0..4 {
        let request = RunRequest::new(source).host(tools.host());
        assert_eq!(value(&runner, request).await, json!([[true, true, true, true, true], true, true, 3]));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_runs_have_their_own_realms() {
    let runner = runner();
    let runs = (0..4).map(|i| {
        let runner = runner.clone();
        tokio::spawn(async move {
            let source = format!(
                "globalThis.marker = {i}; Array.prototype.extra = {i}; await Promise.resolve(); \
                 return [globalThis.marker, [].extra]"
            );
            value(&runner, RunRequest::new(source)).await
        })
    });
    for (i, run) in runs.enumerate() {
        assert_eq!(run.await.unwrap(), json!([i, i]));
    }
    let leaked = value(&runner, RunRequest::new("return [typeof marker, [].extra === undefined]")).await;
    assert_eq!(leaked, json!(["undefined", true]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn syntax_errors_name_the_users_line_and_column() {
    let runner = runner();
    let err = error(&runner, RunRequest::new("const a = 1;\nconst b = ;")).await;
    assert_code(&err, ErrorCode::Error);
    assert!(!err.retryable);
    assert!(err.message.starts_with("SyntaxError"), "{}", err.message);
    assert!(err.message.contains("script.js:2:11"), "{}", err.message);
    let err = error(&runner, RunRequest::new("\n\nnull.x")).await;
    assert!(err.message.contains("TypeError") && err.message.contains("script.js:3:"), "{}", err.message);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn console_is_captured_and_bounded() {
    let runner = runner();
    let request = RunRequest::new(
        "console.log('a', 1, {b: [2]}, undefined); console.warn('w'); console.error(new Date(0)); return 1",
    );
    let Outcome::Completed(done) = run(&runner, request).await.unwrap() else { panic!() };
    let lines: Vec<_> = done.console.iter().map(|l| (l.level, l.text.as_str())).collect();
    assert_eq!(
        lines,
        [
            (ConsoleLevel::Log, "a 1 {\"b\":[2]} undefined"),
            (ConsoleLevel::Warn, "w"),
            (ConsoleLevel::Error, "\"1970-01-01T00:00:00.000Z\""),
        ]
    );
    let limits = LimitOverrides::new().with(Limit::Console, 100).unwrap();
    let request = RunRequest::new("for (let i = 0; i < 1000; i++) console.log('line ' + i); return 1").limits(limits);
    let Outcome::Completed(done) = run(&runner, request).await.unwrap() else { panic!() };
    let total: usize = done.console.iter().map(|l| l.text.len()).sum();
    assert!(total < 200, "{total}");
    assert_eq!(done.console.last().unwrap().level, ConsoleLevel::Truncated);
    assert_eq!(done.console.iter().filter(|l| l.level == ConsoleLevel::Truncated).count(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn guest_cannot_forge_reserved_codes() {
    let runner = runner();
    let err = error(&runner, RunRequest::new("throw {code: 'RUN_TIMEOUT', message: 'x'}")).await;
    assert_code(&err, ErrorCode::Error);
    let err = error(
        &runner,
        RunRequest::new("const e = new Error('x'); e.code = 'RUN_MEMORY_LIMIT'; e.name = 'HostFunctionError'; throw e"),
    )
    .await;
    assert_code(&err, ErrorCode::Error);
    let err = error(&runner, RunRequest::new("throw new RangeError('Maximum call stack size exceeded')")).await;
    assert_code(&err, ErrorCode::Error);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancellation_aborts_and_signals_host_calls() {
    let runner = runner();
    let tools = Tools::default();
    let cancel = resumable_runner::host::CancelSignal::new();
    let request = RunRequest::new("await tools.never()").host(tools.host()).cancel(cancel.clone());
    let pending = tokio::spawn({
        let runner = runner.clone();
        async move { runner.run(request).await }
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    let started = Instant::now();
    cancel.cancel();
    let err = pending.await.unwrap().unwrap_err();
    assert_code(&err, ErrorCode::Aborted);
    assert!(err.retryable);
    assert!(started.elapsed() < Duration::from_millis(500));
    assert!(tools.cancels.lock().unwrap().iter().all(|c| c.is_cancelled()));
    // A cancelled CPU loop stops too.
    let cancel = resumable_runner::host::CancelSignal::new();
    let request = RunRequest::new("while (true) {}").cancel(cancel.clone());
    let pending = tokio::spawn({
        let runner = runner.clone();
        async move { runner.run(request).await }
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    cancel.cancel();
    assert_code(&pending.await.unwrap().unwrap_err(), ErrorCode::Aborted);
    assert_eq!(value(&runner, RunRequest::new("return 'still works'")).await, json!("still works"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_queue_is_a_concurrency_limit() {
    use resumable_runner::{Runner, RunnerConfig};
    let runner = Runner::new(RunnerConfig::new().workers(1).queue_capacity(1)).unwrap();
    let slow = || RunRequest::new("const end = Date.now(); let i = 0; while (i < 3e7) i++; return i");
    let handles: Vec<_> = (0..4)
        .map(|_| {
            let runner = runner.clone();
            let request = slow();
            tokio::spawn(async move { runner.run(request).await })
        })
        .collect();
    let mut limited = 0;
    for handle in handles {
        if let Err(e) = handle.await.unwrap() {
            assert_code(&e, ErrorCode::ConcurrencyLimit);
            assert!(e.retryable);
            limited += 1;
        }
    }
    assert!(limited >= 1, "at least one run should have been refused");
    assert!(Runner::new(RunnerConfig::new().workers(0)).is_err());
    assert!(Runner::new(RunnerConfig::new().queue_capacity(0)).is_err());
}
