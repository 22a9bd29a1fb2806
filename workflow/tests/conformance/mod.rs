//! The backend conformance suite: written once against the `Store` trait and the engine, run by
//! every backend's test file through `conformance_suite!`.

use std::future::{Future, poll_fn};
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::task::Poll;
use std::time::{Duration, Instant};

use resumable_workflow::store::{BoxFuture, ClaimRequest, NewRun, RunOutcome};
use resumable_workflow::{
    Engine, EngineError, EventKind, RetryPolicy, RunId, RunInfo, RunStatus, StartOptions, StepError, Store, StoreError,
    WorkflowContext, WorkflowError,
};
use serde_json::{Value, json};

mod feeds;
mod orchestration;
pub use feeds::*;
pub use orchestration::*;

/// A backend under test.
pub trait Backend: Send + Sync {
    /// Opens the database `name` of this test; opening the same name again reaches the same data.
    fn open<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Arc<dyn Store>>;
}

/// Generates one `#[tokio::test]` per conformance case for a backend expression (evaluated anew for
/// each test, so each test gets fresh databases).
#[macro_export]
macro_rules! conformance_suite {
    ($backend:expr) => {
        $crate::conformance_suite!(@cases $backend;
            three_steps_combined_and_replayed_by_a_new_engine,
            retryable_error_twice_then_success_on_attempt_three,
            fatal_error_fails_the_run_at_once,
            max_retries_zero_does_not_retry,
            hook_metadata_payloads_in_order_and_token_reuse,
            hook_conflict_names_the_owner_and_owner_completes,
            twelve_concurrent_runs_one_token_exactly_one_owner,
            resume_hook_unknown_token_is_not_found,
            sleep_is_durable_across_engines,
            ten_parallel_sleeps_finish_together,
            idempotent_start_returns_the_same_run,
            cancel_disposes_hooks,
            unknown_workflow_is_rejected,
            nondeterministic_replay_fails_the_run,
            expired_lease_is_taken_over_and_zombie_writes_are_fenced,
            store_fences_writes_by_lease_attempt,
            stream_of_100_read_from_0_and_from_50,
            stream_read_live_across_hook_waits_without_duplicates,
            shutdown_hands_in_flight_runs_back_at_once,
            interrupted_attempts_do_not_use_up_retries_but_have_a_budget,
            race_of_hook_and_timer_is_won_by_the_earlier_and_recorded,
            now_and_random_are_the_same_on_every_replay,
            child_run_result_is_awaited_durably,
            cancelling_a_parent_cancels_its_child,
            a_child_of_an_ended_run_is_refused,
            list_runs_filters_and_pages_newest_first,
            feed_interleaves_its_runs_from_any_cursor_and_follows_live,
            a_nul_character_is_stored_as_u_fffd_and_the_run_completes,
            eight_concurrent_writers_in_two_feeds_lose_and_duplicate_nothing
        );
    };
    (@cases $backend:expr; $($case:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $case() {
                let backend = $backend;
                tokio::time::timeout(std::time::Duration::from_secs(30), conformance::$case(&backend))
                    .await
                    .expect("conformance case timed out");
            }
        )*
    };
}

const WAIT: Duration = Duration::from_secs(10);

fn fast_retry(max_retries: u32) -> RetryPolicy {
    RetryPolicy::with_max_retries(max_retries).initial_backoff(Duration::from_millis(10))
}

/// Waits until every future is done, polling them all together (a minimal `join_all`).
async fn join_all<F: Future>(futures: Vec<F>) -> Vec<F::Output> {
    let mut futures: Vec<Pin<Box<F>>> = futures.into_iter().map(Box::pin).collect();
    let mut results: Vec<Option<F::Output>> = futures.iter().map(|_| None).collect();
    poll_fn(move |cx| {
        let mut pending = false;
        for (f, r) in futures.iter_mut().zip(results.iter_mut()) {
            if r.is_none() {
                match f.as_mut().poll(cx) {
                    Poll::Ready(v) => *r = Some(v),
                    Poll::Pending => pending = true,
                }
            }
        }
        if pending { Poll::Pending } else { Poll::Ready(results.iter_mut().map(|r| r.take().unwrap()).collect()) }
    })
    .await
}

async fn waiting(engine: &Engine, id: &RunId) -> RunInfo {
    engine.wait_until(id, WAIT, |r| r.status == RunStatus::Waiting).await.expect("run reaches waiting")
}

async fn finished(engine: &Engine, id: &RunId) -> RunInfo {
    engine.wait_for(id, WAIT).await.expect("run ends")
}

/// Checks the run's log is numbered 1..=n without gaps and starts with `run_created`.
async fn assert_log(engine: &Engine, id: &RunId) -> Vec<EventKind> {
    let events = engine.events(id).await.unwrap();
    for (i, e) in events.iter().enumerate() {
        assert_eq!(e.seq, i as u64 + 1, "event log of {id} has a gap: {events:?}");
        assert_eq!(&e.run_id, id);
    }
    assert_eq!(events.first().map(|e| e.kind), Some(EventKind::RunCreated));
    events.into_iter().map(|e| e.kind).collect()
}

fn count(kinds: &[EventKind], kind: EventKind) -> usize {
    kinds.iter().filter(|k| **k == kind).count()
}

fn three_steps_engine(store: Arc<dyn Store>, calls: Arc<AtomicUsize>) -> Engine {
    Engine::builder(store)
        .register("three", move |ctx: WorkflowContext, input: Value| {
            let calls = Arc::clone(&calls);
            async move {
                let mut sum = 0;
                for (name, n) in [("a", 1), ("b", 2), ("c", 3)] {
                    let calls = Arc::clone(&calls);
                    sum += ctx
                        .step(name, move |_s| async move {
                            calls.fetch_add(1, Ordering::SeqCst);
                            Ok(n)
                        })
                        .await?;
                }
                let approval = match input["hook"].as_str() {
                    Some(token) => ctx.hook(token, json!({ "kind": "approval" })).await?.next().await?,
                    None => Value::Null,
                };
                Ok(json!({ "sum": sum, "approval": approval }))
            }
        })
        .build()
}

pub async fn three_steps_combined_and_replayed_by_a_new_engine(backend: &impl Backend) {
    let calls = Arc::new(AtomicUsize::new(0));
    let engine = three_steps_engine(backend.open("db").await, Arc::clone(&calls));
    let plain = engine.start("three", json!({}), StartOptions::default()).await.unwrap();
    let run = finished(&engine, &plain).await;
    assert_eq!(run.status, RunStatus::Completed);
    assert_eq!(run.output, Some(json!({ "sum": 6, "approval": null })));
    assert_eq!(calls.load(Ordering::SeqCst), 3);
    let kinds = assert_log(&engine, &plain).await;
    assert_eq!(count(&kinds, EventKind::StepCompleted), 3);
    assert_eq!(kinds.last(), Some(&EventKind::RunCompleted));

    // A run that waits after its steps; a new engine over the same database finishes it.
    let id = engine.start("three", json!({ "hook": "replay-token" }), StartOptions::default()).await.unwrap();
    waiting(&engine, &id).await;
    assert_eq!(calls.load(Ordering::SeqCst), 6);
    engine.shutdown().await;
    drop(engine);

    let calls2 = Arc::new(AtomicUsize::new(0));
    let engine2 = three_steps_engine(backend.open("db").await, Arc::clone(&calls2));
    engine2.resume_hook("replay-token", json!("yes")).await.unwrap();
    let run = finished(&engine2, &id).await;
    assert_eq!(run.status, RunStatus::Completed, "{run:?}");
    assert_eq!(run.output, Some(json!({ "sum": 6, "approval": "yes" })));
    assert_eq!(calls2.load(Ordering::SeqCst), 0, "replay must not execute steps again");
    let kinds = assert_log(&engine2, &id).await;
    assert_eq!(count(&kinds, EventKind::StepStarted), 3);
    assert_eq!(count(&kinds, EventKind::HookDisposed), 1);
}

fn flaky_engine(
    store: Arc<dyn Store>,
    failures: u32,
    error: StepError,
    policy: RetryPolicy,
) -> (Engine, Arc<AtomicU32>) {
    let attempts = Arc::new(AtomicU32::new(0));
    let seen = Arc::clone(&attempts);
    let engine = Engine::builder(store)
        .register("flaky", move |ctx: WorkflowContext, _input: Value| {
            let seen = Arc::clone(&seen);
            let error = error.clone();
            let policy = policy.clone();
            async move {
                let run_id = ctx.run_id().to_string();
                let out: Value = ctx
                    .step_with("call", policy, move |s| async move {
                        seen.fetch_add(1, Ordering::SeqCst);
                        assert_eq!(s.step_id, format!("{run_id}:0"), "step id is stable across attempts");
                        if s.attempt <= failures { Err(error) } else { Ok(json!({ "attempt": s.attempt })) }
                    })
                    .await?;
                Ok(out)
            }
        })
        .build();
    (engine, attempts)
}

pub async fn retryable_error_twice_then_success_on_attempt_three(backend: &impl Backend) {
    let (engine, attempts) = flaky_engine(backend.open("db").await, 2, StepError::retryable("busy"), fast_retry(3));
    let id = engine.start("flaky", json!(null), StartOptions::default()).await.unwrap();
    let run = finished(&engine, &id).await;
    assert_eq!(run.status, RunStatus::Completed, "{run:?}");
    assert_eq!(run.output, Some(json!({ "attempt": 3 })));
    assert_eq!(attempts.load(Ordering::SeqCst), 3);
    let kinds = assert_log(&engine, &id).await;
    assert_eq!(count(&kinds, EventKind::StepRetrying), 2);
    assert_eq!(count(&kinds, EventKind::StepStarted), 3);
    assert_eq!(count(&kinds, EventKind::StepCompleted), 1);
}

pub async fn fatal_error_fails_the_run_at_once(backend: &impl Backend) {
    let (engine, attempts) =
        flaky_engine(backend.open("db").await, 5, StepError::fatal("card declined"), fast_retry(3));
    let id = engine.start("flaky", json!(null), StartOptions::default()).await.unwrap();
    let run = finished(&engine, &id).await;
    assert_eq!(run.status, RunStatus::Failed);
    assert!(run.error.as_deref().unwrap().contains("card declined"), "{run:?}");
    assert_eq!(attempts.load(Ordering::SeqCst), 1);
    let kinds = assert_log(&engine, &id).await;
    assert_eq!(count(&kinds, EventKind::StepFailed), 1);
    assert_eq!(count(&kinds, EventKind::StepRetrying), 0);
    assert_eq!(kinds.last(), Some(&EventKind::RunFailed));
}

pub async fn max_retries_zero_does_not_retry(backend: &impl Backend) {
    let (engine, attempts) = flaky_engine(backend.open("db").await, 5, StepError::retryable("busy"), fast_retry(0));
    let id = engine.start("flaky", json!(null), StartOptions::default()).await.unwrap();
    let run = finished(&engine, &id).await;
    assert_eq!(run.status, RunStatus::Failed);
    assert!(run.error.as_deref().unwrap().contains("busy"));
    assert_eq!(attempts.load(Ordering::SeqCst), 1);
}

/// A workflow that takes the hook `input.token` and collects `input.count` payloads, or returns
/// the conflict's owner.
fn hook_engine(store: Arc<dyn Store>, workers: usize) -> Engine {
    Engine::builder(store)
        .workers(workers)
        .register("collect", |ctx: WorkflowContext, input: Value| async move {
            let token = input["token"].as_str().unwrap_or_default().to_owned();
            let hook = match ctx.hook(&token, json!({ "tenant": "acme", "run": ctx.run_id() })).await {
                Ok(hook) => hook,
                Err(WorkflowError::HookConflict { owner_run_id, .. }) => {
                    return Ok(json!({ "conflict": owner_run_id }));
                }
                Err(e) => return Err(e),
            };
            let mut got = Vec::new();
            for _ in 0..input["count"].as_u64().unwrap_or(1) {
                got.push(hook.next().await?);
            }
            Ok(json!({ "payloads": got }))
        })
        .build()
}

pub async fn hook_metadata_payloads_in_order_and_token_reuse(backend: &impl Backend) {
    let engine = hook_engine(backend.open("db").await, 2);
    let input = json!({ "token": "order-42", "count": 3 });
    let id = engine.start("collect", input.clone(), StartOptions::default()).await.unwrap();
    waiting(&engine, &id).await;
    let hook = engine.get_hook("order-42").await.unwrap().expect("hook is active");
    assert_eq!(hook.run_id, id);
    assert_eq!(hook.metadata, json!({ "tenant": "acme", "run": id }));
    for (i, p) in ["first", "second", "third"].into_iter().enumerate() {
        let receipt = engine.resume_hook("order-42", json!(p)).await.unwrap();
        assert_eq!((receipt.run_id.clone(), receipt.index), (id.clone(), i as u64));
    }
    let run = finished(&engine, &id).await;
    assert_eq!(run.output, Some(json!({ "payloads": ["first", "second", "third"] })));
    assert_eq!(engine.get_hook("order-42").await.unwrap(), None, "hook disposed when the run ended");
    assert_eq!(engine.resume_hook("order-42", json!(1)).await, Err(EngineError::HookNotFound));
    let kinds = assert_log(&engine, &id).await;
    // The input names the token (this test's choice); nothing the engine writes does.
    let log = format!("{:?}", &engine.events(&id).await.unwrap()[1..]);
    assert!(!log.contains("order-42"), "a hook token is a capability and never logged: {log}");
    assert_eq!(count(&kinds, EventKind::HookReceived), 3);
    assert_eq!(count(&kinds, EventKind::HookDisposed), 1);

    // The token is free again.
    let second = engine.start("collect", json!({ "token": "order-42" }), StartOptions::default()).await.unwrap();
    waiting(&engine, &second).await;
    assert_eq!(engine.get_hook("order-42").await.unwrap().map(|h| h.run_id), Some(second.clone()));
    engine.resume_hook("order-42", json!("again")).await.unwrap();
    assert_eq!(finished(&engine, &second).await.output, Some(json!({ "payloads": ["again"] })));
}

pub async fn hook_conflict_names_the_owner_and_owner_completes(backend: &impl Backend) {
    let engine = hook_engine(backend.open("db").await, 2);
    let first = engine.start("collect", json!({ "token": "t" }), StartOptions::default()).await.unwrap();
    waiting(&engine, &first).await;
    let second = engine.start("collect", json!({ "token": "t" }), StartOptions::default()).await.unwrap();
    let run = finished(&engine, &second).await;
    assert_eq!(run.output, Some(json!({ "conflict": first })));
    assert_eq!(count(&assert_log(&engine, &second).await, EventKind::HookConflict), 1);
    engine.resume_hook("t", json!("done")).await.unwrap();
    let run = finished(&engine, &first).await;
    assert_eq!(run.status, RunStatus::Completed);
    assert_eq!(run.output, Some(json!({ "payloads": ["done"] })));
}

pub async fn twelve_concurrent_runs_one_token_exactly_one_owner(backend: &impl Backend) {
    let engine = hook_engine(backend.open("db").await, 6);
    let starts = (0..12).map(|_| engine.start("collect", json!({ "token": "shared" }), StartOptions::default()));
    let ids: Vec<RunId> = join_all(starts.collect()).await.into_iter().map(Result::unwrap).collect();
    let mut owners = Vec::new();
    let mut conflicts = Vec::new();
    for id in &ids {
        let run = engine.wait_until(id, WAIT, |r| r.status != RunStatus::Pending && r.status != RunStatus::Running);
        let run = run.await.unwrap();
        match run.status {
            RunStatus::Waiting => owners.push(id.clone()),
            RunStatus::Completed => conflicts.push(run.output.unwrap()["conflict"].clone()),
            other => panic!("unexpected status {other}"),
        }
    }
    assert_eq!(owners.len(), 1, "exactly one run owns the token");
    assert_eq!(conflicts.len(), 11);
    assert!(conflicts.iter().all(|c| c == &json!(owners[0])), "every conflict names the owner");
    assert_eq!(engine.get_hook("shared").await.unwrap().map(|h| h.run_id), Some(owners[0].clone()));
}

pub async fn resume_hook_unknown_token_is_not_found(backend: &impl Backend) {
    let engine = hook_engine(backend.open("db").await, 1);
    let err = engine.resume_hook("no-such-token", json!(1)).await.unwrap_err();
    assert_eq!(err, EngineError::HookNotFound);
    assert!(err.to_string().contains("not found"));
    assert!(!err.to_string().contains("no-such-token"), "the token is not echoed");
    assert_eq!(engine.get_hook("no-such-token").await.unwrap(), None);
}

fn sleeper_engine(store: Arc<dyn Store>) -> Engine {
    Engine::builder(store)
        .register("nap", |ctx: WorkflowContext, input: Value| async move {
            let ms = input["ms"].as_u64().unwrap_or(0);
            let parallel = input["parallel"].as_u64().unwrap_or(1);
            join_all((0..parallel).map(|_| ctx.sleep(Duration::from_millis(ms))).collect()).await;
            Ok(json!("rested"))
        })
        .build()
}

pub async fn sleep_is_durable_across_engines(backend: &impl Backend) {
    let engine = sleeper_engine(backend.open("db").await);
    let started = Instant::now();
    let id = engine.start("nap", json!({ "ms": 400 }), StartOptions::default()).await.unwrap();
    waiting(&engine, &id).await;
    engine.shutdown().await;
    drop(engine);
    // The timer lives in the database: a new engine fires it.
    let engine = sleeper_engine(backend.open("db").await);
    let run = finished(&engine, &id).await;
    assert_eq!(run.output, Some(json!("rested")));
    assert!(started.elapsed() >= Duration::from_millis(400));
    let kinds = assert_log(&engine, &id).await;
    assert_eq!(count(&kinds, EventKind::WaitCreated), 1);
    assert_eq!(count(&kinds, EventKind::WaitCompleted), 1);
}

pub async fn ten_parallel_sleeps_finish_together(backend: &impl Backend) {
    let engine = sleeper_engine(backend.open("db").await);
    let started = Instant::now();
    let id = engine.start("nap", json!({ "ms": 1000, "parallel": 10 }), StartOptions::default()).await.unwrap();
    let run = finished(&engine, &id).await;
    let elapsed = started.elapsed();
    assert_eq!(run.status, RunStatus::Completed);
    assert!(elapsed >= Duration::from_millis(1000), "{elapsed:?}");
    assert!(elapsed < Duration::from_millis(1800), "parallel sleeps took {elapsed:?}");
    let kinds = assert_log(&engine, &id).await;
    assert_eq!(count(&kinds, EventKind::WaitCreated), 10);
    assert_eq!(count(&kinds, EventKind::WaitCompleted), 10);
}

pub async fn idempotent_start_returns_the_same_run(backend: &impl Backend) {
    let engine = hook_engine(backend.open("db").await, 2);
    let input = json!({ "token": "idem" });
    let a = engine.start("collect", input.clone(), StartOptions::with_idempotency_key("order-7")).await.unwrap();
    let b = engine.start("collect", input.clone(), StartOptions::with_idempotency_key("order-7")).await.unwrap();
    let c = engine.start("collect", json!({ "token": "other" }), StartOptions::with_idempotency_key("order-8")).await;
    assert_eq!(a, b);
    assert_ne!(a, c.unwrap());
    let run = engine.get_run(&a).await.unwrap();
    assert_eq!(run.idempotency_key.as_deref(), Some("order-7"));
    // Concurrent starts with one key agree too.
    let starts = (0..8).map(|_| engine.start("collect", input.clone(), StartOptions::with_idempotency_key("k")));
    let ids: Vec<RunId> = join_all(starts.collect()).await.into_iter().map(Result::unwrap).collect();
    assert!(ids.iter().all(|id| id == &ids[0]));
    assert_eq!(count(&assert_log(&engine, &a).await, EventKind::RunCreated), 1);
}

pub async fn cancel_disposes_hooks(backend: &impl Backend) {
    let engine = hook_engine(backend.open("db").await, 2);
    let id = engine.start("collect", json!({ "token": "cancel-me" }), StartOptions::default()).await.unwrap();
    waiting(&engine, &id).await;
    assert_eq!(engine.cancel(&id).await.unwrap(), RunStatus::Cancelled);
    let run = engine.get_run(&id).await.unwrap();
    assert_eq!(run.status, RunStatus::Cancelled);
    assert!(run.completed_at.is_some());
    assert_eq!(engine.get_hook("cancel-me").await.unwrap(), None);
    assert_eq!(engine.resume_hook("cancel-me", json!(1)).await, Err(EngineError::HookNotFound));
    let kinds = assert_log(&engine, &id).await;
    assert_eq!(count(&kinds, EventKind::HookDisposed), 1);
    assert_eq!(kinds.last(), Some(&EventKind::RunCancelled));
    // Cancelling an ended run changes nothing; an unknown run is reported.
    assert_eq!(engine.cancel(&id).await.unwrap(), RunStatus::Cancelled);
    assert_eq!(assert_log(&engine, &id).await.len(), kinds.len());
    let ghost = RunId::from("run_ghost");
    assert_eq!(engine.cancel(&ghost).await, Err(EngineError::RunNotFound(ghost)));
    // The token is free again.
    let next = engine.start("collect", json!({ "token": "cancel-me" }), StartOptions::default()).await.unwrap();
    waiting(&engine, &next).await;
    assert_eq!(engine.get_hook("cancel-me").await.unwrap().map(|h| h.run_id), Some(next));
}

pub async fn unknown_workflow_is_rejected(backend: &impl Backend) {
    let engine = hook_engine(backend.open("db").await, 0);
    let err = engine.start("nope", json!(null), StartOptions::default()).await.unwrap_err();
    assert_eq!(err, EngineError::UnknownWorkflow("nope".to_owned()));
    let ghost = RunId::from("run_ghost");
    assert_eq!(engine.get_run(&ghost).await, Err(EngineError::RunNotFound(ghost)));
}

pub async fn nondeterministic_replay_fails_the_run(backend: &impl Backend) {
    let flips = Arc::new(AtomicUsize::new(0));
    let engine = Engine::builder(backend.open("db").await)
        .register("flip", move |ctx: WorkflowContext, _input: Value| {
            let flips = Arc::clone(&flips);
            async move {
                // A different step name on the second execution: not deterministic.
                let name = if flips.fetch_add(1, Ordering::SeqCst) == 0 { "one" } else { "two" };
                ctx.step(name, |_s| async { Ok(1) }).await?;
                ctx.hook("flip-token", json!(null)).await?.next().await?;
                Ok(json!(null))
            }
        })
        .build();
    let id = engine.start("flip", json!(null), StartOptions::default()).await.unwrap();
    waiting(&engine, &id).await;
    engine.resume_hook("flip-token", json!(1)).await.unwrap();
    let run = finished(&engine, &id).await;
    assert_eq!(run.status, RunStatus::Failed);
    assert!(run.error.as_deref().unwrap().contains("nondeterministic"), "{run:?}");
    assert_eq!(engine.get_hook("flip-token").await.unwrap(), None);
}

pub async fn expired_lease_is_taken_over_and_zombie_writes_are_fenced(backend: &impl Backend) {
    // Engine A hangs inside attempt 1 of a step; it stops without releasing its lease (like a
    // crash). Engine B takes the run over once the lease expires and completes attempt 2.
    let attempts = Arc::new(AtomicU32::new(0));
    let build = |store: Arc<dyn Store>| {
        let attempts = Arc::clone(&attempts);
        Engine::builder(store).lease(Duration::from_millis(300)).register(
            "hang",
            move |ctx: WorkflowContext, _input: Value| {
                let attempts = Arc::clone(&attempts);
                async move {
                    let n: u32 = ctx
                        .step("effect", move |s| async move {
                            attempts.fetch_add(1, Ordering::SeqCst);
                            if s.attempt == 1 {
                                std::future::pending::<()>().await;
                            }
                            Ok(s.attempt)
                        })
                        .await?;
                    Ok(json!(n))
                }
            },
        )
    };
    let a = build(backend.open("db").await).build();
    let id = a.start("hang", json!(null), StartOptions::default()).await.unwrap();
    while attempts.load(Ordering::SeqCst) == 0 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    a.shutdown().await;
    let b = build(backend.open("db").await).build();
    let run = finished(&b, &id).await;
    assert_eq!(run.status, RunStatus::Completed, "{run:?}");
    assert_eq!(run.output, Some(json!(2)));
    assert_eq!(run.attempt, 2, "claimed twice");
    assert_eq!(attempts.load(Ordering::SeqCst), 2);
}

pub async fn store_fences_writes_by_lease_attempt(backend: &impl Backend) {
    let store = backend.open("db").await;
    let created = store
        .create_run(NewRun {
            workflow: "w".into(),
            input: json!(1),
            idempotency_key: None,
            parent_run_id: None,
            feed: None,
        })
        .await
        .unwrap();
    let req = |owner: &str| ClaimRequest {
        owner: owner.into(),
        workflows: vec!["w".into()],
        lease: Duration::from_millis(50),
    };
    let other = ClaimRequest { workflows: vec!["other".into()], ..req("x") };
    assert!(store.claim(&other).await.unwrap().is_none(), "claims are filtered by workflow");
    let first = store.claim(&req("a")).await.unwrap().expect("pending run is claimable");
    assert_eq!(first.fence.run_id, created.run_id);
    assert!(store.claim(&req("b")).await.unwrap().is_none(), "a live lease is exclusive");
    tokio::time::sleep(Duration::from_millis(80)).await;
    let second = store.claim(&req("b")).await.unwrap().expect("an expired lease is taken over");
    assert_eq!(second.fence.attempt, first.fence.attempt + 1);
    let zombie = store.finish_run(&first.fence, RunOutcome::Completed(json!("zombie"))).await;
    assert!(matches!(zombie, Err(StoreError::LeaseLost { .. })), "{zombie:?}");
    assert!(matches!(store.start_step(&first.fence, 0, "s").await, Err(StoreError::LeaseLost { .. })));
    assert!(matches!(store.renew_lease(&first.fence, Duration::from_secs(1)).await, Err(StoreError::LeaseLost { .. })));
    store.finish_run(&second.fence, RunOutcome::Completed(json!("ok"))).await.unwrap();
    let run = store.get_run(&created.run_id).await.unwrap().unwrap();
    assert_eq!((run.status, run.output), (RunStatus::Completed, Some(json!("ok"))));
    assert!(store.claim(&req("c")).await.unwrap().is_none(), "terminal runs are not claimable");
}

/// Emits `count` events `{ "n": i }` for i in `from..from + count`, yielding now and then so that
/// readers interleave; returns the index of the last one.
async fn emit_range(ctx: &WorkflowContext, from: u64, count: u64) -> Result<Option<u64>, WorkflowError> {
    let mut last = None;
    for i in from..from + count {
        last = Some(ctx.emit(&json!({ "n": i })).await?);
        if i % 10 == 0 {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }
    Ok(last)
}

fn expected_events(range: std::ops::Range<u64>) -> Vec<(u64, Value)> {
    range.map(|i| (i, json!({ "n": i }))).collect()
}

pub async fn stream_of_100_read_from_0_and_from_50(backend: &impl Backend) {
    let engine = Engine::builder(backend.open("db").await)
        .register("emit100", |ctx: WorkflowContext, _input: Value| async move {
            let last = emit_range(&ctx, 0, 100).await?;
            Ok(json!({ "last": last }))
        })
        .build();
    let id = engine.start("emit100", json!({}), StartOptions::default()).await.unwrap();
    let run = finished(&engine, &id).await;
    assert_eq!((run.status, run.output), (RunStatus::Completed, Some(json!({ "last": 99 }))));

    let all = engine.read_stream(&id, 0).await.unwrap().collect().await.unwrap();
    assert_eq!(all, expected_events(0..100));
    let tail = engine.read_stream(&id, 50).await.unwrap().collect().await.unwrap();
    assert_eq!(tail, expected_events(50..100));
    // A reader that reconnects with the next index gets nothing more and ends.
    let mut past_end = engine.read_stream(&id, 100).await.unwrap();
    assert!(past_end.next().await.is_none());
    assert!(past_end.next().await.is_none(), "an ended reader stays ended");

    let kinds = assert_log(&engine, &id).await;
    assert_eq!(count(&kinds, EventKind::StreamEmitted), 100);

    // The store reads in batches from any index.
    let store = engine.store();
    let batch = store.read_stream(&id, 10, 5).await.unwrap();
    assert_eq!(batch, expected_events(10..15));

    let unknown = RunId::from("no-such-run".to_owned());
    assert_eq!(engine.read_stream(&unknown, 0).await.unwrap_err(), EngineError::RunNotFound(unknown));
}

pub async fn stream_read_live_across_hook_waits_without_duplicates(backend: &impl Backend) {
    let engine = Engine::builder(backend.open("db").await)
        .register("live", |ctx: WorkflowContext, _input: Value| async move {
            ctx.hook("stream-go", json!(null)).await?.next().await?;
            let first = emit_range(&ctx, 0, 50).await?;
            // Every emit above is replayed (not appended again) when this hook's payload wakes the run.
            ctx.hook("stream-more", json!(null)).await?.next().await?;
            let last = emit_range(&ctx, 50, 50).await?;
            Ok(json!({ "first_half_last": first, "last": last }))
        })
        .build();
    let id = engine.start("live", json!({}), StartOptions::default()).await.unwrap();
    waiting(&engine, &id).await;
    // The reader starts before anything was emitted.
    let mut reader = engine.read_stream(&id, 0).await.unwrap();
    assert_eq!(reader.run_id(), &id);
    let reading = tokio::spawn(async move {
        let mut got = Vec::new();
        for _ in 0..50 {
            got.push(reader.next().await.expect("stream is live").expect("read"));
        }
        (reader, got)
    });
    tokio::time::sleep(Duration::from_millis(20)).await;
    engine.resume_hook("stream-go", json!(1)).await.unwrap();
    let (mut reader, mut got) = reading.await.unwrap();
    assert_eq!(got, expected_events(0..50));
    assert_eq!(reader.next_index(), 50);

    // The run now waits on the second hook: the reader waits too, without ending.
    engine.wait_until(&id, WAIT, |r| r.status == RunStatus::Waiting).await.unwrap();
    let idle = tokio::time::timeout(Duration::from_millis(150), reader.next()).await;
    assert!(idle.is_err(), "reader of a waiting run neither ends nor yields: {idle:?}");

    let resume = {
        let engine = engine.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(20)).await;
            engine.resume_hook("stream-more", json!(2)).await.unwrap();
        })
    };
    while let Some(item) = reader.next().await {
        got.push(item.unwrap());
    }
    resume.await.unwrap();
    assert_eq!(got, expected_events(0..100), "live reader gets every event once, in order, then ends");

    let run = finished(&engine, &id).await;
    assert_eq!(run.status, RunStatus::Completed);
    assert_eq!(run.output, Some(json!({ "first_half_last": 49, "last": 99 })));
    // Replays of the first 50 emits appended nothing.
    assert_eq!(engine.read_stream(&id, 0).await.unwrap().collect().await.unwrap(), expected_events(0..100));
    let kinds = assert_log(&engine, &id).await;
    assert_eq!(count(&kinds, EventKind::StreamEmitted), 100);
    assert!(count(&kinds, EventKind::RunStarted) >= 3, "the run was replayed after each hook: {kinds:?}");
}

/// A step whose first `interruptions` attempts are each cut off by a shutdown of their engine
/// (which hands the run back at once, although the lease is 60 s), under `policy`: how the run
/// ended.
async fn interrupted_step(backend: &impl Backend, interruptions: u32, policy: RetryPolicy) -> RunInfo {
    let engine_with = |store: Arc<dyn Store>, started: Arc<tokio::sync::Notify>| {
        let policy = policy.clone();
        Engine::builder(store)
            .lease(Duration::from_secs(60))
            .register("interrupted", move |ctx: WorkflowContext, _input: Value| {
                let (started, policy) = (Arc::clone(&started), policy.clone());
                async move {
                    let attempt = ctx
                        .step_with("slow", policy, move |s| async move {
                            if s.attempt <= interruptions {
                                started.notify_one();
                                tokio::time::sleep(Duration::from_secs(600)).await;
                            }
                            Ok(s.attempt)
                        })
                        .await?;
                    Ok(json!(attempt))
                }
            })
            .build()
    };
    let mut id = None;
    for _ in 0..interruptions {
        let started = Arc::new(tokio::sync::Notify::new());
        let engine = engine_with(backend.open("db").await, Arc::clone(&started));
        if id.is_none() {
            id = Some(engine.start("interrupted", json!(null), StartOptions::default()).await.unwrap());
        }
        started.notified().await;
        engine.shutdown().await;
        let run = engine.get_run(id.as_ref().unwrap()).await.unwrap();
        assert_ne!(run.status, RunStatus::Running, "the lease was handed back: {run:?}");
    }
    let engine = engine_with(backend.open("db").await, Arc::new(tokio::sync::Notify::new()));
    let id = match id {
        Some(id) => id,
        None => engine.start("interrupted", json!(null), StartOptions::default()).await.unwrap(),
    };
    engine.wait_for(&id, WAIT).await.unwrap()
}

pub async fn interrupted_attempts_do_not_use_up_retries_but_have_a_budget(backend: &impl Backend) {
    // Four interruptions of a step that may not retry at all: attempt 5 completes.
    let run = interrupted_step(backend, 4, fast_retry(0)).await;
    assert_eq!(run.status, RunStatus::Completed, "{run:?}");
    assert_eq!(run.output, Some(json!(5)), "{run:?}");
    // One interruption more than allowed fails the step, saying why.
    let run = interrupted_step(backend, 3, fast_retry(3).max_interruptions(2)).await;
    assert_eq!(run.status, RunStatus::Failed, "{run:?}");
    let error = run.error.unwrap_or_default();
    assert!(error.contains("attempt 3 was interrupted") && error.contains("more than the 2 allowed"), "{error}");
}

pub async fn shutdown_hands_in_flight_runs_back_at_once(backend: &impl Backend) {
    // The lease is 60 s: only a hand-back at shutdown lets the next engine in within 10 s.
    let begun = Instant::now();
    let run = interrupted_step(backend, 1, RetryPolicy::default()).await;
    assert_eq!(run.output, Some(json!(2)), "attempt 1 was interrupted; attempt 2 completes: {run:?}");
    assert!(begun.elapsed() < Duration::from_secs(10));
}

pub async fn a_nul_character_is_stored_as_u_fffd_and_the_run_completes(backend: &impl Backend) {
    let engine = Engine::builder(backend.open("db").await)
        .register("nul", |ctx: WorkflowContext, _input: Value| async move {
            let value: Value = ctx.step("nul", |_s| async move { Ok(json!({ "a\u{0}key": "x\u{0}y" })) }).await?;
            ctx.emit(&json!(["e\u{0}"])).await?;
            Ok(value)
        })
        .build();
    let id = engine.start("nul", json!("in\u{0}put"), StartOptions::default()).await.unwrap();
    let run = finished(&engine, &id).await;
    // PostgreSQL's jsonb cannot hold U+0000: every backend stores U+FFFD, and the run completes.
    assert_eq!((run.status, run.output), (RunStatus::Completed, Some(json!({ "a\u{FFFD}key": "x\u{FFFD}y" }))));
    assert_eq!(run.input, json!("in\u{FFFD}put"));
    let events = engine.read_stream(&id, 0).await.unwrap().collect().await.unwrap();
    assert_eq!(events, [(0, json!(["e\u{FFFD}"]))]);
}
