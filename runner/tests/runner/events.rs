use crate::common::*;
use crate::process::process_runner;
use resumable_runner::{
    CallSettlement, ConsoleLevel, ErrorCode, EventError, Limit, LimitOverrides, Outcome, Resolution, RunEvent,
    RunRequest, Runner,
};
use serde_json::{Value, json};
use std::time::Duration;

/// Every event of a run, then its outcome.
async fn collect(runner: &Runner, request: RunRequest) -> (Vec<RunEvent>, Outcome) {
    let mut events = runner.start(request).events();
    let mut seen = Vec::new();
    while let Some(event) = events.next().await {
        seen.push(event);
    }
    let outcome = events.outcome().await.expect("the run succeeds");
    (seen, outcome)
}

fn started(index: u32, name: &str) -> RunEvent {
    RunEvent::CallStarted { index, name: name.into() }
}

fn replayed(index: u32, name: &str) -> RunEvent {
    RunEvent::CallReplayed { index, name: name.into() }
}

fn fulfilled(index: u32, name: &str, value: Value) -> RunEvent {
    let bytes = value.to_string().len();
    RunEvent::CallCompleted {
        index,
        name: name.into(),
        outcome: CallSettlement::Fulfilled { value: Some(value), bytes },
    }
}

fn log(text: &str) -> RunEvent {
    RunEvent::Console { level: ConsoleLevel::Log, text: text.into() }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn host_calls_and_console_lines_arrive_in_the_order_they_happened() {
    let runner = runner();
    let tools = Tools::default();
    let source = "console.log('start'); const a = await tools.echo('one'); \
                  console.warn('between', a); const b = await tools.wait(5, 'two'); return [a, b]";
    let (events, outcome) = collect(&runner, RunRequest::new(source).host(tools.host())).await;
    assert_eq!(
        events,
        vec![
            log("start"),
            started(1, "tools.echo"),
            fulfilled(1, "tools.echo", json!("one")),
            RunEvent::Console { level: ConsoleLevel::Warn, text: "between one".into() },
            started(2, "tools.wait"),
            fulfilled(2, "tools.wait", json!("two")),
            RunEvent::Completed { value: json!(["one", "two"]) },
        ]
    );
    assert_eq!(outcome.completed().map(|c| &c.value), Some(&json!(["one", "two"])));
}

/// The first round pauses at `tools.approve`; the resumed round serves `tools.echo`
/// from the ledger and runs `tools.approve` again, live.
async fn resume_marks_replayed_calls(runner: &Runner) {
    let tools = Tools::default();
    let source = "const a = await tools.echo('x'); const ok = await tools.approve(a); \
                  console.log('approved', ok); return [a, ok, await tools.effect()]";
    let (events, outcome) = collect(runner, RunRequest::new(source).host(tools.host())).await;
    let payload = json!({ "kind": "approval", "args": ["x"] });
    assert_eq!(
        events,
        vec![
            started(1, "tools.echo"),
            fulfilled(1, "tools.echo", json!("x")),
            started(2, "tools.approve"),
            RunEvent::CallCompleted {
                index: 2,
                name: "tools.approve".into(),
                outcome: CallSettlement::Interrupted {
                    interruption_id: "interrupt-2".into(),
                    bytes: payload.to_string().len(),
                    payload: Some(payload),
                },
            },
            RunEvent::Interrupted { interruptions: vec!["interrupt-2".into()] },
        ]
    );
    let paused = outcome.interrupted().expect("paused").clone();
    let resume = RunRequest::new(source)
        .host(tools.host())
        .resume(paused.continuation, [Resolution::new("interrupt-2", json!(true))]);
    let (events, _) = collect(runner, resume).await;
    assert_eq!(
        events,
        vec![
            replayed(1, "tools.echo"),
            started(2, "tools.approve"),
            fulfilled(2, "tools.approve", json!(true)),
            log("approved true"),
            started(3, "tools.effect"),
            fulfilled(3, "tools.effect", json!("done")),
            RunEvent::Completed { value: json!(["x", true, "done"]) },
        ]
    );
    assert_eq!((tools.count("echo"), tools.count("approve"), tools.count("effect")), (1, 2, 1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resume_reports_ledger_calls_as_replayed_and_the_resumed_call_as_live() {
    resume_marks_replayed_calls(&runner()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn worker_processes_report_the_same_events() {
    resume_marks_replayed_calls(&process_runner(1, "events")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_undecided_interruption_is_replayed_and_stays_pending() {
    let runner = runner();
    let tools = Tools::default();
    let source = "return await Promise.all([tools.approve('a'), tools.approve('b')])";
    let (_, outcome) = collect(&runner, RunRequest::new(source).host(tools.host())).await;
    let paused = outcome.interrupted().expect("paused").clone();
    let resume = RunRequest::new(source)
        .host(tools.host())
        .resume(paused.continuation, [Resolution::new("interrupt-1", json!("yes"))]);
    let (events, _) = collect(&runner, resume).await;
    assert_eq!(
        events,
        vec![
            replayed(2, "tools.approve"),
            started(1, "tools.approve"),
            fulfilled(1, "tools.approve", json!("yes")),
            RunEvent::Interrupted { interruptions: vec!["interrupt-2".into()] },
        ]
    );
    assert_eq!(tools.count("approve"), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pipe_writes_one_json_line_per_event_and_returns_the_outcome() {
    let runner = runner();
    let tools = Tools::default();
    let source = "console.log('hi'); try { await tools.fail('nope') } catch (e) {} return 7";
    let mut out = Vec::new();
    let outcome = runner.start(RunRequest::new(source).host(tools.host())).pipe(&mut out).await.unwrap();
    assert_eq!(outcome.completed().map(|c| &c.value), Some(&json!(7)));
    let text = String::from_utf8(out).unwrap();
    assert!(text.ends_with('\n'));
    let lines: Vec<Value> = text.lines().map(|line| serde_json::from_str(line).unwrap()).collect();
    assert_eq!(
        lines,
        vec![
            json!({ "type": "console", "level": "log", "text": "hi" }),
            json!({ "type": "call_started", "index": 1, "name": "tools.fail" }),
            json!({ "type": "call_completed", "index": 1, "name": "tools.fail",
                    "outcome": { "status": "rejected", "error": { "code": "RUN_HOST_FUNCTION_ERROR", "message": "nope" } } }),
            json!({ "type": "completed", "value": 7 }),
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failures_end_the_events_with_their_error() {
    let runner = runner();
    let mut events = runner.start(RunRequest::new("console.error('bad'); throw new Error('boom')")).events();
    assert_eq!(events.next().await, Some(RunEvent::Console { level: ConsoleLevel::Error, text: "bad".into() }));
    let Some(RunEvent::Failed { error: EventError { code, message } }) = events.next().await else { panic!() };
    assert_eq!(code, ErrorCode::Error);
    assert!(message.contains("boom"), "{message}");
    assert_eq!(events.next().await, None);
    assert_code(&events.outcome().await.unwrap_err(), ErrorCode::Error);

    let limits = LimitOverrides::new().with(Limit::Source, 4).unwrap();
    let (events, _) = {
        let mut events = runner.start(RunRequest::new("return 12345").limits(limits)).events();
        let first = events.next().await;
        (first, events.next().await)
    };
    assert!(matches!(events, Some(RunEvent::Failed { error: EventError { code: ErrorCode::SourceTooLarge, .. } })));
}

/// A reader that does not keep up costs at most the queue's capacity; the run
/// still finishes and the reader learns how many events it missed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_reader_misses_events_but_not_the_end() {
    let runner = runner();
    let limits = LimitOverrides::new().with(Limit::Console, 1 << 20).unwrap();
    let lines = 5_000;
    let source = format!("for (let i = 0; i < {lines}; i++) console.log(i); return 'done'");
    let mut events = runner.start(RunRequest::new(source).limits(limits)).events();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (mut printed, mut missed, mut last) = (0u64, 0u64, -1i64);
    let mut ending = None;
    while let Some(event) = events.next().await {
        match event {
            RunEvent::Console { text, .. } => {
                let n: i64 = text.parse().unwrap();
                assert!(n > last, "events stay in order");
                last = n;
                printed += 1;
            }
            RunEvent::Lagged { missed: n } => missed += n,
            other => ending = Some(other),
        }
    }
    assert_eq!(printed + missed, lines, "every line is either delivered or counted as missed");
    assert!(missed > 0 && printed <= resumable_runner::EVENT_QUEUE_CAPACITY as u64, "{printed} {missed}");
    assert_eq!(ending, Some(RunEvent::Completed { value: json!("done") }));
    let outcome = events.outcome().await.unwrap();
    assert_eq!(outcome.console().len(), lines as usize, "the outcome keeps the whole console");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_the_events_cancels_the_run() {
    let runner = runner();
    let tools = Tools::default();
    let mut events = runner.start(RunRequest::new("await tools.never()").host(tools.host())).events();
    assert_eq!(events.next().await, Some(started(1, "tools.never")));
    drop(events);
    for _ in 0..100 {
        let cancels = tools.cancels.lock().unwrap().clone();
        if !cancels.is_empty() && cancels.iter().all(|signal| signal.is_cancelled()) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("the host call was not cancelled");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outcome_of_a_handle_is_a_plain_run() {
    let runner = runner();
    let outcome = runner.start(RunRequest::new("console.log(1); return 2")).outcome().await.unwrap();
    assert_eq!(outcome.completed().map(|c| &c.value), Some(&json!(2)));
    assert_eq!(outcome.console()[0].text, "1");
}

#[test]
fn events_outside_a_tokio_runtime_fail_with_a_configuration_error() {
    let runner = runner();
    let mut events = runner.start(RunRequest::new("return 1")).events();
    let tokio = tokio::runtime::Builder::new_current_thread().build().unwrap();
    let Some(RunEvent::Failed { error }) = tokio.block_on(events.next()) else { panic!("a failed event") };
    assert_eq!(error.code, ErrorCode::ConfigurationError);
    assert_eq!(tokio.block_on(events.next()), None);
    assert_code(&tokio.block_on(events.outcome()).unwrap_err(), ErrorCode::ConfigurationError);
}
