use crate::common::*;
use resumable_runner::{
    ErrorCode, Limit, LimitOverrides, Outcome, Resolution, RunRequest, Runner, RunnerConfig, Suspension,
};
use serde_json::{Value, json};

async fn suspended(runner: &Runner, request: RunRequest) -> Suspension {
    match runner.run(request).await {
        Ok(Outcome::Interrupted(s)) => s,
        other => panic!("expected an interruption, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn effect_then_approval_runs_the_effect_once() {
    let runner = runner();
    let tools = Tools::default();
    let source = "await tools.effect(); return await tools.approve()";
    let first = suspended(&runner, RunRequest::new(source).host(tools.host())).await;
    assert_eq!(first.interruptions.len(), 1);
    let interruption = &first.interruptions[0];
    assert_eq!(interruption.id, "interrupt-2");
    assert_eq!(interruption.function, "tools.approve");
    assert_eq!(interruption.payload, json!({ "kind": "approval", "args": [] }));
    let resumed = RunRequest::new(source)
        .host(tools.host())
        .resume(first.continuation, [Resolution::new("interrupt-2", json!(true))]);
    assert_eq!(value(&runner, resumed).await, json!(true));
    assert_eq!(tools.count("effect"), 1);
    assert_eq!(tools.count("approve"), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_interruptions_form_one_batch_and_resolve_partially() {
    let runner = runner();
    let tools = Tools::default();
    let source = "const [a, b] = await Promise.all([tools.approve('a'), tools.approve('b')]); return {a, b}";
    let first = suspended(&runner, RunRequest::new(source).host(tools.host())).await;
    let ids: Vec<&str> = first.interruptions.iter().map(|i| i.id.as_str()).collect();
    assert_eq!(ids, ["interrupt-1", "interrupt-2"]);
    assert_eq!(first.interruptions[1].arguments, [json!("b")]);

    let partial = RunRequest::new(source)
        .host(tools.host())
        .resume(first.continuation.clone(), [Resolution::new("interrupt-2", json!("B"))]);
    let second = suspended(&runner, partial).await;
    let ids: Vec<&str> = second.interruptions.iter().map(|i| i.id.as_str()).collect();
    assert_eq!(ids, ["interrupt-1"]);
    assert_eq!(second.logical_run_id, first.logical_run_id);

    let finish = RunRequest::new(source)
        .host(tools.host())
        .resume(second.continuation, [Resolution::new("interrupt-1", json!("A"))]);
    assert_eq!(value(&runner, finish).await, json!({ "a": "A", "b": "B" }));
    assert_eq!(tools.count("approve"), 4, "each interrupted call runs twice");

    // Both at once from the first continuation works too.
    let both = RunRequest::new(source).host(tools.host()).resume(
        first.continuation,
        [Resolution::new("interrupt-1", json!(1)), Resolution::new("interrupt-2", json!(2))],
    );
    assert_eq!(value(&runner, both).await, json!({ "a": 1, "b": 2 }));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_rounds_and_rejected_calls_are_not_repeated() {
    let runner = runner();
    let tools = Tools::default();
    let source = "let f; try { await tools.fail('no') } catch (e) { f = e.message } \
                  const a = await tools.approve(1); const b = await tools.approve(2); return [a, b, f]";
    let first = suspended(&runner, RunRequest::new(source).host(tools.host())).await;
    assert_eq!(first.interruptions[0].id, "interrupt-2");
    let second = suspended(
        &runner,
        RunRequest::new(source)
            .host(tools.host())
            .resume(first.continuation, [Resolution::new("interrupt-2", json!("a"))]),
    )
    .await;
    assert_eq!(second.interruptions[0].id, "interrupt-3");
    let done = RunRequest::new(source)
        .host(tools.host())
        .resume(second.continuation, [Resolution::new("interrupt-3", json!("b"))]);
    assert_eq!(value(&runner, done).await, json!(["a", "b", "no"]));
    assert_eq!(tools.count("fail"), 1);
    assert_eq!(tools.count("approve"), 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn time_and_randomness_replay_exactly() {
    let runner = runner();
    let tools = Tools::default();
    let source = r#"
        const xs = [];
        for (let i = 0; i < 16; i++) xs.push([Date.now(), Math.random()]);
        await tools.wait(3);
        for (let i = 0; i < 16; i++) xs.push([new Date().getTime(), Math.random()]);
        await Promise.all([tools.wait(2), tools.wait(1)]);
        for (let i = 0; i < 32; i++) xs.push([Date.now(), Math.random()]);
        console.log(JSON.stringify(xs));
        await tools.approve();
        return xs"#;
    let first = suspended(&runner, RunRequest::new(source).host(tools.host())).await;
    let logged: Value = serde_json::from_str(&first.console[0].text).unwrap();
    assert_eq!(logged.as_array().unwrap().len(), 64);
    let resumed = RunRequest::new(source)
        .host(tools.host())
        .resume(first.continuation, [Resolution::new("interrupt-4", json!(true))]);
    assert_eq!(value(&runner, resumed).await, logged);
    assert_eq!(tools.count("wait"), 3, "recorded calls are not repeated");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn promise_race_replays_the_same_winner() {
    let runner = runner();
    let tools = Tools::default();
    let source = "const w = await Promise.race([tools.wait(60, 'slow'), tools.wait(5, 'fast')]); \
                  const ok = await tools.approve(); return [w, ok]";
    let first = suspended(&runner, RunRequest::new(source).host(tools.host())).await;
    assert_eq!(first.interruptions[0].id, "interrupt-3");
    let resumed = RunRequest::new(source)
        .host(tools.host())
        .resume(first.continuation, [Resolution::new("interrupt-3", json!(true))]);
    assert_eq!(value(&runner, resumed).await, json!(["fast", true]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_changed_scope_is_refused_before_any_host_call() {
    let runner = runner();
    let tools = Tools::default();
    let source = "await tools.effect(); return await tools.approve()";
    let request = || RunRequest::new(source).host(tools.host()).context(json!({"tenant": "acme"}));
    let first = suspended(&runner, request()).await;
    let resolutions = || [Resolution::new("interrupt-2", json!(true))];
    let before = tools.total();
    // (Other host functions are a matter of the functions the ledger called: see `upgrades`.)
    let attempts = [
        RunRequest::new(format!("{source};")).host(tools.host()).context(json!({"tenant": "acme"})),
        RunRequest::new(source).host(tools.host()).context(json!({"tenant": "globex"})),
        request().audience("someone-else"),
    ];
    for attempt in attempts {
        let err = error(&runner, attempt.resume(first.continuation.clone(), resolutions())).await;
        assert_code(&err, ErrorCode::ProtocolError);
    }
    for bad in [
        vec![Resolution::new("interrupt-1", json!(true))],
        vec![Resolution::new("interrupt-9", json!(true))],
        vec![Resolution::new("nope", json!(true))],
        vec![Resolution::new("interrupt-2", json!(true)), Resolution::new("interrupt-2", json!(false))],
    ] {
        let err = error(&runner, request().resume(first.continuation.clone(), bad)).await;
        assert_code(&err, ErrorCode::ProtocolError);
    }
    assert_eq!(tools.total(), before, "no host function ran");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ledger_that_disagrees_with_the_script_is_refused_before_any_host_call() {
    let runner = runner();
    let tools = Tools::default();
    let source = "const n = await tools.echo(1); await tools.effect(); return await tools.approve(n)";
    let first = suspended(&runner, RunRequest::new(source).host(tools.host())).await;
    let token = forge_replacing(&first.continuation, b"[1]", b"[2]");
    let before = tools.total();
    let err = error(
        &runner,
        RunRequest::new(source).host(tools.host()).resume(token, [Resolution::new("interrupt-3", json!(1))]),
    )
    .await;
    assert_code(&err, ErrorCode::ProtocolError);
    assert!(err.message.contains("diverged") && err.message.contains("host call 1"), "{}", err.message);
    assert_eq!(tools.total(), before);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_single_character_change_of_a_token_is_refused() {
    let runner = runner();
    let tools = Tools::default();
    let source = "await tools.effect(); return await tools.approve()";
    let first = suspended(&runner, RunRequest::new(source).host(tools.host())).await;
    let token = first.continuation;
    let alphabet: Vec<char> = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_.=".chars().collect();
    let before = tools.total();
    let mut seed = 0x2545_F491_4F6C_DD1Du64;
    let mut next = || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    let mut tried = 0;
    // Every position once, then random positions up to 1,000 mutations.
    let mut cases: Vec<(usize, char)> =
        (0..token.len()).map(|p| (p, alphabet[(next() % alphabet.len() as u64) as usize])).collect();
    while cases.len() < token.len() + 1000 {
        let p = (next() % token.len() as u64) as usize;
        cases.push((p, alphabet[(next() % alphabet.len() as u64) as usize]));
    }
    for (position, replacement) in cases {
        let mut chars: Vec<char> = token.chars().collect();
        if chars[position] == replacement {
            continue;
        }
        chars[position] = replacement;
        let mutated: String = chars.into_iter().collect();
        let request =
            RunRequest::new(source).host(tools.host()).resume(mutated, [Resolution::new("interrupt-2", json!(true))]);
        let err = error(&runner, request).await;
        assert_code(&err, ErrorCode::ProtocolError);
        tried += 1;
    }
    assert!(tried > 1000);
    assert_eq!(tools.total(), before, "no mutated token reached a host function");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn interrupting_without_a_secret_is_a_configuration_error() {
    let runner = Runner::new(RunnerConfig::new().workers(1)).unwrap();
    let tools = Tools::default();
    assert_eq!(value(&runner, RunRequest::new("return await tools.sum(1, 2)").host(tools.host())).await, json!(3));
    let err = error(&runner, RunRequest::new("return await tools.approve()").host(tools.host())).await;
    assert_code(&err, ErrorCode::ConfigurationError);
    assert!(err.message.contains("secret"), "{}", err.message);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutated_states_resigned_with_the_right_key_are_refused_before_any_host_call() {
    use resumable_runner::codec::{SignedCodec, SignedCodecConfig, compress, decompress};
    let runner = runner();
    let tools = Tools::default();
    let source = "const n = await tools.echo(1); await tools.effect(); return await tools.approve(n)";
    let first = suspended(&runner, RunRequest::new(source).host(tools.host())).await;
    let codec = SignedCodec::new(SignedCodecConfig::new(SECRET)).unwrap();
    let now = std::time::SystemTime::now();
    let (header, compressed) = codec.decode_unscoped(&first.continuation, now).unwrap();
    let state = decompress(&compressed, 1 << 20).unwrap();
    let before = tools.total();
    let mut seed = 0xD1B5_4A32_D192_ED03u64;
    for case in 0..300 {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        let mut mutated = state.clone();
        let at = (seed % mutated.len() as u64) as usize;
        mutated[at] ^= 1 << (case % 8);
        let token = codec.encode(&compress(&mutated), &header.audience, now);
        let request =
            RunRequest::new(source).host(tools.host()).resume(token, [Resolution::new("interrupt-3", json!(1))]);
        let err = error(&runner, request).await;
        assert_code(&err, ErrorCode::ProtocolError);
    }
    assert_eq!(tools.total(), before, "no mutated state reached a host function");
}

/// Forty calls with 4 KiB of random text each way: a state of about 330 KB that the runner
/// decodes frame by frame while the worker replays it.
pub const LARGE_LEDGER: &str = "let n = 0;
for (let i = 0; i < 40; i++) {
  let s = '';
  while (s.length < 4096) s += Math.random().toString(36).slice(2);
  n += (await tools.echo(s)).length;
}
return [n, await tools.approve(n)]";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_ledger_replays_while_it_is_decoded() {
    for runner in both_modes("ledger") {
        let tools = Tools::default();
        let first = suspended(&runner, RunRequest::new(LARGE_LEDGER).host(tools.host())).await;
        assert!(first.continuation.len() > 100_000, "{} bytes", first.continuation.len());
        let resolution = Resolution::new(first.interruptions[0].id.clone(), json!("yes"));
        let request = RunRequest::new(LARGE_LEDGER).host(tools.host()).resume(first.continuation, [resolution]);
        let done = value(&runner, request).await;
        assert_eq!(done[1], json!("yes"));
        assert!(done[0].as_u64().unwrap() >= 40 * 4096);
        assert_eq!((tools.count("echo"), tools.count("approve")), (40, 2), "recorded calls are not run again");
    }
}

/// A decision for a call of a large (streamed) token that did not interrupt, or for a call it
/// does not record: refused as an unknown interruption once the state is decoded, on threads
/// and in a worker process alike (where the parent checks it, not the worker), and no host
/// function runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_decision_for_a_call_that_did_not_interrupt_is_refused() {
    for runner in both_modes("undecided") {
        let tools = Tools::default();
        let first = suspended(&runner, RunRequest::new(LARGE_LEDGER).host(tools.host())).await;
        let before = tools.total();
        for id in ["interrupt-1", "interrupt-40", "interrupt-99"] {
            let request = RunRequest::new(LARGE_LEDGER)
                .host(tools.host())
                .resume(&first.continuation, [Resolution::new(id, json!(1))]);
            let err = error(&runner, request).await;
            assert_code(&err, ErrorCode::ProtocolError);
            assert!(err.message.contains("unknown interruption"), "{id}: {}", err.message);
        }
        assert_eq!(tools.total(), before, "no host function ran");
    }
}

/// Large states re-signed with the right key, wrong where only the end of decoding can tell
/// (the last recorded call, the length, the checksum), after the worker has replayed the first
/// calls: refused, and no host function runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_state_wrong_at_its_end_is_refused_before_any_host_call() {
    use resumable_runner::codec::{SignedCodec, SignedCodecConfig, compress, decompress};
    for runner in both_modes("state") {
        let tools = Tools::default();
        let first = suspended(&runner, RunRequest::new(LARGE_LEDGER).host(tools.host())).await;
        let id = first.interruptions[0].id.clone();
        let before = tools.total();
        let last_argument = |state: &mut Vec<u8>| {
            let name = b"tools.echo";
            let at = state.windows(name.len()).rposition(|w| w == name).unwrap() + name.len() + 8;
            state[at] = if state[at] == b'a' { b'b' } else { b'a' };
        };
        let bad_checksum = {
            let codec = SignedCodec::new(SignedCodecConfig::new(SECRET)).unwrap();
            let now = std::time::SystemTime::now();
            let (header, compressed) = codec.decode_unscoped(&first.continuation, now).unwrap();
            let mut state = decompress(&compressed, 1 << 24).unwrap();
            *state.last_mut().unwrap() ^= 1;
            codec.encode(&compress(&state), &header.audience, now)
        };
        let cases = [
            ("diverged", forge(&first.continuation, last_argument)),
            ("truncated", forge(&first.continuation, |state| state.truncate(state.len() - 3))),
            ("trailing", forge(&first.continuation, |state| state.push(0))),
            ("checksum", bad_checksum),
        ];
        for (expected, token) in cases {
            let request = RunRequest::new(LARGE_LEDGER)
                .host(tools.host())
                .resume(token, [Resolution::new(id.clone(), json!("yes"))]);
            let err = error(&runner, request).await;
            assert_code(&err, ErrorCode::ProtocolError);
            assert!(err.message.contains(expected), "{expected}: {}", err.message);
        }
        assert_eq!(tools.total(), before, "no wrong state reached a host function");
    }
}

/// A large token with one character changed in its first or its last chunk of state, or in a
/// digest: refused as forged, and no host function runs, although the worker may have replayed
/// the chunks before the forged one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_token_forged_in_any_chunk_is_refused_before_any_host_call() {
    for runner in both_modes("token") {
        let tools = Tools::default();
        let first = suspended(&runner, RunRequest::new(LARGE_LEDGER).host(tools.host())).await;
        let id = first.interruptions[0].id.clone();
        let before = tools.total();
        let token = first.continuation.clone();
        let (state_start, state_end) = (token.find('.').unwrap() + 1, token.rfind('.').unwrap());
        assert!(state_end - state_start > 2 * 65_536, "several chunks: {}", state_end - state_start);
        for at in [state_start + 100, state_end - 100, token.len() - 20] {
            let forged = with_char_changed(&token, at);
            let request = RunRequest::new(LARGE_LEDGER)
                .host(tools.host())
                .resume(forged, [Resolution::new(id.clone(), json!("yes"))]);
            let err = error(&runner, request).await;
            assert_code(&err, ErrorCode::ProtocolError);
            assert!(err.message.contains("bad_signature"), "at {at}: {}", err.message);
        }
        assert_eq!(tools.total(), before, "no forged state reached a host function");
    }
}

/// A large token forged in its last chunk, resumed in ways that fail for another reason while
/// its first, authentic chunks are decoded and replayed (too few host calls allowed, a
/// resolution that answers nothing, another source): refused as forged all the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forged_chunk_is_the_verdict_whatever_fails_first() {
    for runner in both_modes("chunk") {
        let tools = Tools::default();
        let first = suspended(&runner, RunRequest::new(LARGE_LEDGER).host(tools.host())).await;
        let id = first.interruptions[0].id.clone();
        let before = tools.total();
        let last_chunk = first.continuation.rfind('.').unwrap() - 100;
        let forged = with_char_changed(&first.continuation, last_chunk);
        let few_calls = LimitOverrides::new().with(Limit::HostCalls, 5).unwrap();
        let requests = [
            RunRequest::new(LARGE_LEDGER)
                .host(tools.host())
                .limits(few_calls)
                .resume(forged.clone(), [Resolution::new(id.clone(), json!("yes"))]),
            RunRequest::new(LARGE_LEDGER)
                .host(tools.host())
                .resume(forged.clone(), [Resolution::new("interrupt-0", json!(1))]),
            RunRequest::new(format!("{LARGE_LEDGER};"))
                .host(tools.host())
                .resume(forged.clone(), [Resolution::new(id.clone(), json!("yes"))]),
        ];
        for request in requests {
            let err = error(&runner, request).await;
            assert_code(&err, ErrorCode::ProtocolError);
            assert!(err.message.contains("bad_signature"), "{}", err.message);
        }
        assert_eq!(tools.total(), before, "no forged state reached a host function");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resume_that_decides_nothing_is_refused() {
    let runner = runner();
    let tools = Tools::default();
    let source = "await tools.effect(); return await tools.approve()";
    let first = suspended(&runner, RunRequest::new(source).host(tools.host())).await;
    let empty: [Resolution; 0] = [];
    let err = error(&runner, RunRequest::new(source).host(tools.host()).resume(&first.continuation, empty)).await;
    assert_code(&err, ErrorCode::ProtocolError);
    assert!(err.message.contains("at least one interruption"), "{err}");
    assert_eq!((tools.count("effect"), tools.count("approve")), (1, 1), "nothing ran again");
    // The same token still resumes with a decision.
    let decided = RunRequest::new(source)
        .host(tools.host())
        .resume(first.continuation, [Resolution::new("interrupt-2", json!("yes"))]);
    assert_eq!(value(&runner, decided).await, json!("yes"));
}
