use crate::common::*;
use resumable_runner::{ErrorCode, Limit, LimitOverrides, RunRequest};
use serde_json::json;
use std::time::{Duration, Instant};

async fn stops_with(source: &str, code: ErrorCode) {
    let runner = runner();
    // A run expected to hit another limit gets time to reach it on a busy machine.
    let (timeout, bound) = if code == ErrorCode::Timeout { (250, 1) } else { (3_000, 6) };
    let limits = timeout_ms(timeout).with(Limit::Memory, 16 * 1024 * 1024).unwrap();
    let started = Instant::now();
    let err = error(&runner, RunRequest::new(source).limits(limits)).await;
    let elapsed = started.elapsed();
    assert_code(&err, code);
    assert!(elapsed < Duration::from_secs(bound), "{source}: stopped after {elapsed:?}");
    assert_eq!(value(&runner, RunRequest::new("return 'next run works'")).await, json!("next run works"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn infinite_loops_time_out_even_when_caught() {
    stops_with("while (true) {}", ErrorCode::Timeout).await;
    stops_with("for (;;) { try { while (true) {} } catch (e) {} finally { continue } }", ErrorCode::Timeout).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stack_overflow_cannot_be_caught() {
    stops_with("function f() { f() } f()", ErrorCode::StackOverflow).await;
    stops_with("function f() { try { f() } catch (e) {} } f(); return 'survived'", ErrorCode::StackOverflow).await;
    stops_with(
        "function f(n) { try { return f(n + 1) } catch (e) { return f(n + 1) } } f(0)",
        ErrorCode::StackOverflow,
    )
    .await;
}

/// A script that swallowed a stack overflow cannot get a host function to run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_caught_stack_overflow_reaches_no_host_function() {
    let runner = runner();
    let tools = Tools::default();
    let overflow = "function f() { try { f() } catch (e) {} }";
    let source = format!("{overflow} f(); return await tools.effect()");
    let err = error(&runner, RunRequest::new(source).host(tools.host())).await;
    assert_code(&err, ErrorCode::StackOverflow);
    assert_eq!(tools.count("effect"), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_exhaustion_cannot_be_caught() {
    stops_with("const a = []; for (;;) a.push(new Array(10000).fill(1))", ErrorCode::MemoryLimit).await;
    stops_with(
        "const a = []; for (;;) { try { a.push('x'.repeat(1e6) + a.length) } catch (e) {} }",
        ErrorCode::MemoryLimit,
    )
    .await;
    stops_with("try { 'x'.repeat(2 ** 28) } catch (e) { return 'caught' }", ErrorCode::MemoryLimit).await;
}

/// The limit bounds the heap's extent, yet a growing array may use nearly all of it: its
/// buffer grows in place at the top of the heap instead of being copied next to itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_growing_array_uses_most_of_the_memory_limit() {
    let runner = runner();
    let limits = LimitOverrides::new().with(Limit::Memory, 32 * 1024 * 1024).unwrap();
    let source = "const a = []; for (let i = 0; i < 1.25e6; i++) a.push(i); return a.length";
    assert_eq!(value(&runner, RunRequest::new(source).limits(limits)).await, json!(1_250_000));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn endless_microtasks_time_out() {
    stops_with("(function loop() { Promise.resolve().then(loop) })(); await new Promise(() => {})", ErrorCode::Timeout)
        .await;
    stops_with("for (;;) { try { await null } catch (e) {} }", ErrorCode::Timeout).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_call_that_never_settles_times_out_and_is_cancelled() {
    let runner = runner();
    let tools = Tools::default();
    let started = Instant::now();
    let err = error(&runner, RunRequest::new("await tools.never()").host(tools.host()).limits(timeout_ms(100))).await;
    assert_code(&err, ErrorCode::Timeout);
    assert!(err.retryable, "a timeout while waiting on the host may succeed next time");
    assert!(started.elapsed() < Duration::from_millis(600));
    let cancels = tools.cancels.lock().unwrap();
    assert_eq!(cancels.len(), 1);
    assert!(cancels[0].is_cancelled(), "the host's cancel signal fired");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_source_is_refused() {
    let runner = runner();
    let small = LimitOverrides::new().with(Limit::Source, 10).unwrap();
    let err = error(&runner, RunRequest::new("return 'this is longer than ten bytes'").limits(small)).await;
    assert_code(&err, ErrorCode::SourceTooLarge);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_runs_after_limits_keep_working() {
    let runner = runner();
    for round in 0..5 {
        let err = error(&runner, RunRequest::new("function f() { f() } f()")).await;
        assert_code(&err, ErrorCode::StackOverflow);
        assert_eq!(value(&runner, RunRequest::new(format!("return {round}"))).await, json!(round));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cpu_time_is_limited_but_waiting_is_not() {
    let runner = runner();
    let cpu = LimitOverrides::new().with(Limit::CpuTime, 100).unwrap().with(Limit::Timeout, 5_000).unwrap();
    let started = Instant::now();
    let err = error(&runner, RunRequest::new("try { while (true) {} } catch {}").limits(cpu)).await;
    assert_code(&err, ErrorCode::CpuTimeout);
    assert!(!err.retryable);
    assert!(started.elapsed() < Duration::from_secs(2), "{:?}", started.elapsed());
    let tools = Tools::default();
    let waiting = RunRequest::new("await tools.wait(300); return 'waited'").host(tools.host()).limits(cpu);
    assert_eq!(value(&runner, waiting).await, json!("waited"));
}
