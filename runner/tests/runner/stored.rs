use crate::common::*;
use resumable_runner::{
    ErrorCode, MemoryContinuationStore, Outcome, Resolution, RunRequest, Runner, RunnerConfig, StoredCodec,
};
use serde_json::json;
use std::sync::Arc;

fn stored_runner(store: &Arc<MemoryContinuationStore>) -> Runner {
    Runner::new(RunnerConfig::new().workers(2).codec(StoredCodec::new(store.clone()))).unwrap()
}

const SOURCE: &str = "await tools.effect(); return await tools.approve()";

async fn first_token(runner: &Runner, tools: &Tools) -> String {
    match runner.run(RunRequest::new(SOURCE).host(tools.host())).await {
        Ok(Outcome::Interrupted(s)) => {
            assert_eq!(s.continuation.len(), 43, "a stored token is a 32-byte key");
            s.continuation
        }
        other => panic!("expected an interruption, got {other:?}"),
    }
}

fn resume(tools: &Tools, token: &str) -> RunRequest {
    RunRequest::new(SOURCE).host(tools.host()).resume(token, [Resolution::new("interrupt-2", json!(true))])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stored_token_resumes_exactly_once_across_runners() {
    let store = Arc::new(MemoryContinuationStore::new());
    let (one, two) = (stored_runner(&store), stored_runner(&store));
    let tools = Tools::default();
    let token = first_token(&one, &tools).await;
    assert_eq!(value(&two, resume(&tools, &token)).await, json!(true));
    let err = error(&one, resume(&tools, &token)).await;
    assert_code(&err, ErrorCode::ProtocolError);
    assert!(err.message.contains("used already"), "{}", err.message);
    assert_eq!(tools.count("effect"), 1);
    assert_eq!(tools.count("approve"), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn of_32_concurrent_resumes_exactly_one_proceeds() {
    let store = Arc::new(MemoryContinuationStore::new());
    let runner = stored_runner(&store);
    let tools = Tools::default();
    let token = first_token(&runner, &tools).await;
    let attempts: Vec<_> = (0..32)
        .map(|_| {
            let (runner, request) = (runner.clone(), resume(&tools, &token));
            tokio::spawn(async move { runner.run(request).await })
        })
        .collect();
    let mut completed = 0;
    for attempt in attempts {
        match attempt.await.unwrap() {
            Ok(Outcome::Completed(done)) => {
                assert_eq!(done.value, json!(true));
                completed += 1;
            }
            Err(e) => assert_code(&e, ErrorCode::ProtocolError),
            Ok(other) => panic!("{other:?}"),
        }
    }
    assert_eq!(completed, 1);
    assert_eq!(tools.count("approve"), 2, "the approval ran once on the first run and once on the one resume");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_resume_does_not_burn_the_token() {
    let store = Arc::new(MemoryContinuationStore::new());
    let runner = stored_runner(&store);
    let tools = Tools::default();
    let token = first_token(&runner, &tools).await;
    // Refused before anything runs: unknown interruption, other audience, other source.
    let bad = RunRequest::new(SOURCE).host(tools.host()).resume(&token, [Resolution::new("interrupt-9", json!(true))]);
    assert_code(&error(&runner, bad).await, ErrorCode::ProtocolError);
    assert_code(&error(&runner, resume(&tools, &token).audience("other")).await, ErrorCode::ProtocolError);
    let other_source = RunRequest::new(format!("{SOURCE};"))
        .host(tools.host())
        .resume(&token, [Resolution::new("interrupt-2", json!(1))]);
    assert_code(&error(&runner, other_source).await, ErrorCode::ProtocolError);
    // Aborted before the replay finished: the claim is released too.
    let cancel = resumable_runner::host::CancelSignal::new();
    cancel.cancel();
    assert_code(&error(&runner, resume(&tools, &token).cancel(cancel)).await, ErrorCode::Aborted);
    // Malformed keys never reach the store.
    for bad in ["", "short", &"A".repeat(44), &format!("{}!", &token[..42])] {
        assert_code(&error(&runner, resume(&tools, bad)).await, ErrorCode::ProtocolError);
    }
    let before = tools.count("approve");
    assert_eq!(value(&runner, resume(&tools, &token)).await, json!(true));
    assert_eq!(tools.count("approve"), before + 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspection_describes_without_consuming() {
    let store = Arc::new(MemoryContinuationStore::new());
    let runner = stored_runner(&store);
    let tools = Tools::default();
    let token = first_token(&runner, &tools).await;
    let seen = runner.inspect(&token).await.unwrap();
    assert_eq!(seen.interruptions.len(), 1);
    assert_eq!(seen.interruptions[0].id, "interrupt-2");
    assert_eq!(seen.audience, "default");
    assert!(seen.logical_run_id.starts_with("run_"));
    assert_eq!(value(&runner, resume(&tools, &token)).await, json!(true), "still resumable after inspection");
    assert_code(&runner.inspect(&token).await.unwrap_err(), ErrorCode::ProtocolError);

    let signed = runner_signed();
    let first = signed.run(RunRequest::new(SOURCE).host(tools.host())).await.unwrap();
    let token = first.interrupted().unwrap().continuation.clone();
    let seen = signed.inspect(&token).await.unwrap();
    assert_eq!(seen.interruptions[0].function, "tools.approve");
    assert!(seen.expires_at > seen.issued_at.unwrap());
    let mut tampered = token.clone();
    tampered.replace_range(10..11, if &token[10..11] == "A" { "B" } else { "A" });
    assert_code(&signed.inspect(&tampered).await.unwrap_err(), ErrorCode::ProtocolError);
}

fn runner_signed() -> Runner {
    runner()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutated_and_truncated_stored_tokens_are_refused() {
    let store = Arc::new(MemoryContinuationStore::new());
    let runner = stored_runner(&store);
    let tools = Tools::default();
    let token = first_token(&runner, &tools).await;
    let alphabet: Vec<char> = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_.= ".chars().collect();
    let mut seed = 0x2545_F491_4F6C_DD1Du64;
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    let before = tools.total();
    let mut tried = 0;
    for case in 0..2000 {
        let candidate: String = if case < 1000 {
            let mut chars: Vec<char> = token.chars().collect();
            let at = (next() % chars.len() as u64) as usize;
            let replacement = alphabet[(next() % alphabet.len() as u64) as usize];
            if chars[at] == replacement {
                continue;
            }
            chars[at] = replacement;
            chars.into_iter().collect()
        } else if case % 2 == 0 {
            token[..(next() % token.len() as u64) as usize].to_string()
        } else {
            format!("{token}{}", alphabet[(next() % alphabet.len() as u64) as usize])
        };
        let err = error(&runner, resume(&tools, &candidate)).await;
        assert_code(&err, ErrorCode::ProtocolError);
        tried += 1;
    }
    assert!(tried > 1900);
    assert_eq!(tools.total(), before);
    assert_eq!(value(&runner, resume(&tools, &token)).await, json!(true), "the real token still works");
}
