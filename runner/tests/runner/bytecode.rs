use crate::common::*;
use crate::process::process_runner;
use resumable_runner::{
    BytecodeCacheConfig, ErrorCode, Limit, LimitOverrides, Limits, RunRequest, Runner, RunnerConfig, RunnerStats,
};
use serde_json::json;
use std::time::Duration;

fn one_worker(cache: BytecodeCacheConfig) -> Runner {
    Runner::new(RunnerConfig::new().workers(1).bytecode_cache(cache)).unwrap()
}

fn stats(hits: u64, misses: u64) -> RunnerStats {
    RunnerStats { bytecode_hits: hits, bytecode_misses: misses, ..RunnerStats::default() }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repeated_source_hits_and_a_changed_source_misses() {
    let runner = one_worker(BytecodeCacheConfig::new());
    assert_eq!(runner.stats(), stats(0, 0));
    for _ in 0..3 {
        assert_eq!(value(&runner, RunRequest::new("return 40 + 2")).await, json!(42));
    }
    assert_eq!(runner.stats(), stats(2, 1));
    assert_eq!(value(&runner, RunRequest::new("return 40 + 3")).await, json!(43));
    assert_eq!(runner.stats(), stats(2, 2), "a changed source is compiled");
    assert_eq!(value(&runner, RunRequest::new("return 40 + 2")).await, json!(42));
    assert_eq!(runner.stats(), stats(3, 2), "both sources stay cached");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_entry_older_than_the_max_age_is_compiled_again() {
    let runner = one_worker(BytecodeCacheConfig::new().max_age(Duration::from_millis(20)));
    assert_eq!(value(&runner, RunRequest::new("return 1")).await, json!(1));
    tokio::time::sleep(Duration::from_millis(60)).await;
    assert_eq!(value(&runner, RunRequest::new("return 1")).await, json!(1));
    assert_eq!(runner.stats(), stats(0, 2));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn worker_processes_cache_bytecode_too() {
    let runner = process_runner(1, "bytecode");
    for _ in 0..2 {
        assert_eq!(value(&runner, RunRequest::new("return 'p'")).await, json!("p"));
    }
    let one_worker_idle = RunnerStats { processes_started: 1, processes_idle: 1, ..stats(1, 1) };
    assert_eq!(runner.stats(), one_worker_idle, "both runs on one worker process");
}

#[test]
fn cache_settings_are_validated_by_the_runner() {
    for (cache, name) in [
        (BytecodeCacheConfig::new().max_age(Duration::ZERO), "max_age"),
        (BytecodeCacheConfig::new().max_entries(0), "max_entries"),
        (BytecodeCacheConfig::new().max_bytes(0), "max_bytes"),
    ] {
        let error = Runner::new(RunnerConfig::new().workers(1).bytecode_cache(cache)).unwrap_err();
        assert!(error.0.contains(name), "{error}");
    }
}

/// One warm runtime serves runs with different limits: each run's limits apply
/// to it alone (the cache hits show it is the same runtime).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_warm_runtime_takes_each_runs_limits() {
    let runner =
        Runner::new(RunnerConfig::new().workers(1).limits(Limits::default().with(Limit::Stack, 8 << 20).unwrap()))
            .unwrap();
    let source = "const f = (n) => n === 0 ? 0 : 1 + f(n - 1); const depth = f(1000); \
                  const kept = []; for (let i = 0; i < 50000; i++) kept.push({ i }); return [depth, kept.length]";
    let done = json!([1000, 50000]);
    assert_eq!(value(&runner, RunRequest::new(source)).await, done);
    let small_memory = LimitOverrides::new().with(Limit::Memory, 1 << 20).unwrap();
    assert_code(&error(&runner, RunRequest::new(source).limits(small_memory)).await, ErrorCode::MemoryLimit);
    assert_eq!(runner.stats(), stats(1, 1), "the same warm runtime ran both");
    assert_eq!(value(&runner, RunRequest::new(source)).await, done, "the next run has its own limits");
    let small_stack = LimitOverrides::new().with(Limit::Stack, 64 * 1024).unwrap();
    assert_code(&error(&runner, RunRequest::new(source).limits(small_stack)).await, ErrorCode::StackOverflow);
    assert_eq!(value(&runner, RunRequest::new(source)).await, done);
}
