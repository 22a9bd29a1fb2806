//! Conformance cases for races of hooks against timers, the deterministic clock and random
//! numbers, child runs, and listing runs.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use resumable_workflow::{
    Engine, EventKind, RunFilter, RunId, RunStatus, StartOptions, Store, WorkflowContext, WorkflowError,
};
use serde_json::{Value, json};

use super::{Backend, WAIT, assert_log, count, finished, waiting};

/// `race`: the hook `input.token` raced against a 200 ms timer; then a second hook
/// (`input.token` + "-after") keeps the run alive so that a replay happens after both the payload
/// and the due time.
fn race_engine(store: Arc<dyn Store>) -> Engine {
    Engine::builder(store)
        .register("race", |ctx: WorkflowContext, input: Value| async move {
            let token = input["token"].as_str().unwrap_or_default().to_owned();
            let hook = ctx.hook(&token, json!({})).await?;
            let first = hook.next_within(Duration::from_millis(200)).await?;
            let winner = if first.is_some() { "hook" } else { "timer" };
            if input["linger"].as_bool() == Some(true) {
                ctx.hook(&format!("{token}-after"), json!({})).await?.next().await?;
            }
            Ok(json!({ "winner": winner, "payload": first }))
        })
        .build()
}

/// The `fired` flags of the run's `wait_completed` events.
async fn timer_outcomes(engine: &Engine, id: &RunId) -> Vec<Value> {
    let events = engine.events(id).await.unwrap();
    events.iter().filter(|e| e.kind == EventKind::WaitCompleted).map(|e| e.payload["fired"].clone()).collect()
}

pub async fn race_of_hook_and_timer_is_won_by_the_earlier_and_recorded(backend: &impl Backend) {
    let engine = race_engine(backend.open("db").await);

    // Nobody answers: the timer wins after 200 ms.
    let started = Instant::now();
    let id = engine.start("race", json!({ "token": "quiet" }), StartOptions::default()).await.unwrap();
    let run = finished(&engine, &id).await;
    assert!(started.elapsed() >= Duration::from_millis(200), "{:?}", started.elapsed());
    assert_eq!(run.output, Some(json!({ "winner": "timer", "payload": null })));
    assert_eq!(timer_outcomes(&engine, &id).await, vec![json!(true)]);

    // A payload at 50 ms wins; the timer is cancelled, not fired.
    let started = Instant::now();
    let id = engine.start("race", json!({ "token": "prompt" }), StartOptions::default()).await.unwrap();
    waiting(&engine, &id).await;
    tokio::time::sleep(Duration::from_millis(50).saturating_sub(started.elapsed())).await;
    engine.resume_hook("prompt", json!("approve")).await.unwrap();
    let run = finished(&engine, &id).await;
    assert_eq!(run.output, Some(json!({ "winner": "hook", "payload": "approve" })));
    assert_eq!(timer_outcomes(&engine, &id).await, vec![json!(false)]);

    // The timer won; a payload that arrives afterwards does not change the replayed decision.
    let id = engine.start("race", json!({ "token": "late", "linger": true }), StartOptions::default()).await.unwrap();
    let deadline = Instant::now() + WAIT;
    while timer_outcomes(&engine, &id).await.is_empty() {
        assert!(Instant::now() < deadline, "the timer never fired");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    waiting(&engine, &id).await;
    engine.resume_hook("late", json!("too late")).await.unwrap();
    engine.resume_hook("late-after", json!("go")).await.unwrap();
    let run = finished(&engine, &id).await;
    assert_eq!(run.output, Some(json!({ "winner": "timer", "payload": null })));
    assert_eq!(timer_outcomes(&engine, &id).await, vec![json!(true)]);
}

pub async fn now_and_random_are_the_same_on_every_replay(backend: &impl Backend) {
    let seen: Arc<Mutex<Vec<(SystemTime, f64, f64)>>> = Arc::default();
    let record = Arc::clone(&seen);
    let engine = Engine::builder(backend.open("db").await)
        .register("clock", move |ctx: WorkflowContext, _input: Value| {
            let record = Arc::clone(&record);
            async move {
                let t = ctx.now().await;
                let (a, b) = (ctx.random(), ctx.random());
                record.lock().unwrap().push((t, a, b));
                ctx.hook(&format!("clock-{}", ctx.run_id()), json!({})).await?.next().await?;
                let later = ctx.now().await;
                let ms = |t: SystemTime| t.duration_since(SystemTime::UNIX_EPOCH).unwrap().as_millis() as u64;
                Ok(json!({ "t": ms(t), "later": ms(later), "a": a, "b": b }))
            }
        })
        .build();
    let before = SystemTime::now();
    let id = engine.start("clock", json!(null), StartOptions::default()).await.unwrap();
    waiting(&engine, &id).await;
    tokio::time::sleep(Duration::from_millis(30)).await;
    engine.resume_hook(&format!("clock-{id}"), json!(1)).await.unwrap();
    let run = finished(&engine, &id).await;
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 2, "one execution before the hook, one after");
    assert_eq!(seen[0], seen[1], "the replay sees the recorded time and the same random numbers");
    let (t, a, b) = seen[0];
    assert!(t >= before - Duration::from_millis(5) && t <= SystemTime::now());
    assert!(a != b && (0.0..1.0).contains(&a) && (0.0..1.0).contains(&b));
    let out = run.output.unwrap();
    assert!(out["later"].as_u64() >= Some(out["t"].as_u64().unwrap() + 30), "{out}");
    assert_eq!(count(&assert_log(&engine, &id).await, EventKind::StepCompleted), 2);
}

/// `parent` starts `child` with `input` and returns its result (or the error's text); `child`
/// waits for a payload on the hook `child-{n}` and returns `n` times the payload, or fails when
/// the payload is a string.
fn family_engine(store: Arc<dyn Store>) -> Engine {
    Engine::builder(store)
        .register("parent", |ctx: WorkflowContext, input: Value| async move {
            let child = ctx.start_child("child", input).await?;
            match child.result().await {
                Ok(v) => Ok(json!({ "child": child.run_id(), "result": v })),
                Err(e @ WorkflowError::ChildFailed { .. }) => {
                    Ok(json!({ "child": child.run_id(), "error": e.to_string() }))
                }
                Err(e) => Err(e),
            }
        })
        .register("child", |ctx: WorkflowContext, input: Value| async move {
            let n = input["n"].as_i64().unwrap_or(1);
            let payload = ctx.hook(&format!("child-{n}"), json!({})).await?.next().await?;
            match payload.as_i64() {
                Some(x) => Ok(json!(n * x)),
                None => Err(WorkflowError::msg(format!("bad payload {payload}"))),
            }
        })
        .build()
}

/// The only child of `parent`, once it exists.
async fn only_child(engine: &Engine, parent: &RunId) -> RunId {
    let deadline = Instant::now() + WAIT;
    loop {
        let filter = RunFilter { parent_run_id: Some(parent.clone()), ..RunFilter::default() };
        let page = engine.list_runs(&filter).await.unwrap();
        if let [child] = page.runs.as_slice() {
            assert_eq!(child.parent_run_id.as_ref(), Some(parent));
            return child.id.clone();
        }
        assert!(page.runs.is_empty(), "a parent started more than one child: {page:?}");
        assert!(Instant::now() < deadline, "no child was started");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

pub async fn child_run_result_is_awaited_durably(backend: &impl Backend) {
    let engine = family_engine(backend.open("db").await);
    let parent = engine.start("parent", json!({ "n": 7 }), StartOptions::default()).await.unwrap();
    let child = only_child(&engine, &parent).await;
    waiting(&engine, &child).await;
    waiting(&engine, &parent).await;
    engine.resume_hook("child-7", json!(6)).await.unwrap();
    let run = finished(&engine, &parent).await;
    assert_eq!(run.output, Some(json!({ "child": child, "result": 42 })));
    assert_eq!(engine.get_run(&child).await.unwrap().status, RunStatus::Completed);

    // A failing child is an error the parent sees (and may handle).
    let parent = engine.start("parent", json!({ "n": 3 }), StartOptions::default()).await.unwrap();
    let child = only_child(&engine, &parent).await;
    waiting(&engine, &child).await;
    engine.resume_hook("child-3", json!("nope")).await.unwrap();
    let out = finished(&engine, &parent).await.output.unwrap();
    let error = out["error"].as_str().unwrap();
    assert!(error.contains(child.as_str()) && error.contains("failed") && error.contains("bad payload"), "{out}");
}

pub async fn cancelling_a_parent_cancels_its_child(backend: &impl Backend) {
    let engine = family_engine(backend.open("db").await);
    let parent = engine.start("parent", json!({ "n": 5 }), StartOptions::default()).await.unwrap();
    let child = only_child(&engine, &parent).await;
    waiting(&engine, &child).await;
    waiting(&engine, &parent).await;
    assert_eq!(engine.cancel(&parent).await.unwrap(), RunStatus::Cancelled);
    let child_run = engine.get_run(&child).await.unwrap();
    assert_eq!(child_run.status, RunStatus::Cancelled);
    assert!(child_run.error.unwrap().contains(parent.as_str()));
    assert_eq!(engine.get_hook("child-5").await.unwrap(), None, "the child's hook is disposed");

    // Cancelling a child wakes its parent with the failure.
    let parent = engine.start("parent", json!({ "n": 9 }), StartOptions::default()).await.unwrap();
    let child = only_child(&engine, &parent).await;
    waiting(&engine, &child).await;
    engine.cancel(&child).await.unwrap();
    let out = finished(&engine, &parent).await.output.unwrap();
    assert!(out["error"].as_str().unwrap().contains("cancelled"), "{out}");
}

pub async fn a_child_of_an_ended_run_is_refused(backend: &impl Backend) {
    use resumable_workflow::StoreError;
    use resumable_workflow::store::NewRun;
    let store = backend.open("db").await;
    let new = |parent: Option<RunId>| NewRun {
        workflow: "w".into(),
        input: json!(null),
        idempotency_key: None,
        parent_run_id: parent,
        feed: None,
    };
    let parent = store.create_run(new(None)).await.unwrap().run_id;
    let child = store.create_run(new(Some(parent.clone()))).await.unwrap().run_id;
    assert_eq!(store.get_run(&child).await.unwrap().unwrap().parent_run_id, Some(parent.clone()));
    store.cancel_run(&parent, "stop").await.unwrap();
    assert_eq!(store.get_run(&child).await.unwrap().unwrap().status, RunStatus::Cancelled, "cancel cascades");
    let refused = store.create_run(new(Some(parent.clone()))).await;
    assert_eq!(refused, Err(StoreError::LeaseLost { run_id: parent }));
}

pub async fn list_runs_filters_and_pages_newest_first(backend: &impl Backend) {
    // Runs that wait on a hook and nothing else: no timer moves them while they are listed.
    let engine = Engine::builder(backend.open("db").await)
        .register("hold", |ctx: WorkflowContext, input: Value| async move {
            let token = input["token"].as_str().unwrap_or_default().to_owned();
            ctx.hook(&token, json!({})).await?.next().await
        })
        .build();
    let mut waiting_ids = Vec::new();
    for i in 0..5 {
        let input = json!({ "token": format!("list-{i}") });
        waiting_ids.push(engine.start("hold", input, StartOptions::default()).await.unwrap());
    }
    let done = engine.start("hold", json!({ "token": "list-done" }), StartOptions::default()).await.unwrap();
    waiting(&engine, &done).await;
    engine.resume_hook("list-done", json!(1)).await.unwrap();
    finished(&engine, &done).await;
    for id in &waiting_ids {
        engine.wait_until(id, WAIT, |r| r.status == RunStatus::Waiting).await.unwrap();
    }

    let all = engine.list_runs(&RunFilter::default().workflow("hold")).await.unwrap();
    assert_eq!(all.runs.len(), 6);
    assert_eq!(all.next_cursor, None);
    assert!(all.runs.windows(2).all(|w| w[0].created_at >= w[1].created_at), "newest first");

    let completed = engine.list_runs(&RunFilter::default().status(RunStatus::Completed)).await.unwrap();
    assert_eq!(completed.runs.iter().map(|r| r.id.clone()).collect::<Vec<_>>(), vec![done.clone()]);
    let either = RunFilter::default().status(RunStatus::Completed).status(RunStatus::Waiting);
    assert_eq!(engine.list_runs(&either).await.unwrap().runs.len(), 6);
    assert!(engine.list_runs(&RunFilter::default().workflow("other")).await.unwrap().runs.is_empty());
    let future = RunFilter { created_after: Some(SystemTime::now() + Duration::from_secs(60)), ..RunFilter::default() };
    assert!(engine.list_runs(&future).await.unwrap().runs.is_empty());

    // Pages of 2 cover every waiting run exactly once, in the same order as one big page.
    let mut filter = RunFilter::default().status(RunStatus::Waiting).limit(2);
    let mut paged = Vec::new();
    loop {
        let page = engine.list_runs(&filter).await.unwrap();
        assert!(page.runs.len() <= 2);
        paged.extend(page.runs.into_iter().map(|r| r.id));
        match page.next_cursor {
            Some(cursor) => filter.cursor = Some(cursor),
            None => break,
        }
    }
    let expected: Vec<RunId> =
        all.runs.iter().filter(|r| r.status == RunStatus::Waiting).map(|r| r.id.clone()).collect();
    assert_eq!(paged, expected);
    let mut sorted = paged.clone();
    sorted.sort();
    waiting_ids.sort();
    assert_eq!(sorted, waiting_ids);
}
