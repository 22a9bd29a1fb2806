//! Paused runs across upgrades of their host: a continuation is bound to the functions its
//! ledger called, with their signatures, not to every host function there is. Each test runs on
//! worker threads and worker processes, with a signed token (whose state streams into the
//! replay) and a stored one (decoded whole).

use crate::common::*;
use resumable_runner::codec::{SignedCodec, SignedCodecConfig};
use resumable_runner::host::{HostFunctions, Signature};
use resumable_runner::process::ProcessConfig;
use resumable_runner::{
    ErrorCode, MemoryContinuationStore, Outcome, Resolution, RunRequest, Runner, RunnerConfig, StoredCodec,
};
use serde_json::{Value, json};
use std::sync::Arc;

const WORKER: &str = env!("CARGO_BIN_EXE_resumable-worker");

/// A fulfilled call of an untyped function, one of a typed function, then an interruption.
const SOURCE: &str = "await tools.effect(); const r = await orders.refund('A-1', 5); return [r, await tools.approve()]";

/// Every way of running and pausing, by name.
fn runners(tag: &str) -> Vec<(&'static str, Runner)> {
    let signed = || SignedCodec::new(SignedCodecConfig::new(SECRET)).unwrap();
    let stored = || StoredCodec::new(Arc::new(MemoryContinuationStore::new()));
    let processes = || ProcessConfig::new(WORKER).arg(format!("--tag={tag}"));
    vec![
        ("signed, threads", Runner::new(RunnerConfig::new().workers(1).codec(signed())).unwrap()),
        ("stored, threads", Runner::new(RunnerConfig::new().workers(1).codec(stored())).unwrap()),
        (
            "signed, processes",
            Runner::new(RunnerConfig::new().workers(1).codec(signed()).processes(processes())).unwrap(),
        ),
        (
            "stored, processes",
            Runner::new(RunnerConfig::new().workers(1).codec(stored()).processes(processes())).unwrap(),
        ),
    ]
}

/// `host` rebuilt: the functions `keep` keeps, each with the signature `signature` gives it, and
/// `extra`.
fn rebuilt(
    host: &HostFunctions,
    keep: impl Fn(&str) -> bool,
    signature: impl Fn(&str, &Signature) -> Signature,
    extra: &[&str],
) -> HostFunctions {
    let mut builder = HostFunctions::builder();
    for (name, old) in host.signatures().filter(|(name, _)| keep(name)) {
        let (inner, owned) = (host.clone(), name.to_owned());
        builder =
            builder.function_with_signature(name, signature(name, old), move |ctx, args| inner.call(&owned, ctx, args));
    }
    for name in extra {
        builder = builder.typed(name, ["x"], |_, (x,): (Value,)| async move { Ok(x) });
    }
    builder.build().unwrap()
}

async fn paused(runner: &Runner, tools: &Tools) -> String {
    match runner.run(RunRequest::new(SOURCE).host(tools.host())).await {
        Ok(Outcome::Interrupted(s)) => {
            assert_eq!(s.interruptions[0].id, "interrupt-3");
            s.continuation
        }
        other => panic!("expected an interruption, got {other:?}"),
    }
}

fn resume(host: HostFunctions, token: &str) -> RunRequest {
    RunRequest::new(SOURCE).host(host).resume(token, [Resolution::new("interrupt-3", json!("yes"))])
}

fn done() -> Value {
    json!([{ "refunded": "A-1", "amount": 5 }, "yes"])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_run_resumes_after_functions_are_added_and_unused_ones_removed() {
    for (mode, runner) in runners("upgrade-added") {
        let tools = Tools::default();
        let token = paused(&runner, &tools).await;
        let called = ["tools.effect", "orders.refund", "tools.approve"];
        let upgraded =
            rebuilt(&tools.host(), |name| called.contains(&name), |_, old| old.clone(), &["extra.added", "tools.more"]);
        assert!(!upgraded.contains("tools.sum") && upgraded.contains("extra.added"));
        assert_eq!(value(&runner, resume(upgraded, &token)).await, done(), "{mode}");
        assert_eq!(
            (tools.count("effect"), tools.count("approve")),
            (1, 2),
            "{mode}: only the interrupted call ran again"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_removed_function_that_the_ledger_called_fails_the_resume_naming_it() {
    for (mode, runner) in runners("upgrade-removed") {
        let tools = Tools::default();
        let token = paused(&runner, &tools).await;
        let before = tools.total();
        for gone in ["orders.refund", "tools.approve"] {
            let host = rebuilt(&tools.host(), |name| name != gone, |_, old| old.clone(), &[]);
            let err = error(&runner, resume(host, &token)).await;
            assert_code(&err, ErrorCode::FunctionRemoved);
            assert_eq!(err.code.as_str(), "RUN_FUNCTION_REMOVED");
            assert!(err.message.contains(gone) && !err.retryable, "{mode}: {err}");
        }
        assert_eq!(tools.total(), before, "{mode}: no host function ran");
        // A stored token is given back, not used up: with the functions back, it resumes.
        assert_eq!(value(&runner, resume(tools.host(), &token)).await, done(), "{mode}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn changed_parameters_of_a_function_that_the_ledger_called_fail_the_resume_naming_it() {
    for (mode, runner) in runners("upgrade-changed") {
        let tools = Tools::default();
        let token = paused(&runner, &tools).await;
        let before = tools.total();
        let changes = [
            ("orders.refund", Signature::named(&["order_id", "amount", "currency"])),
            ("tools.approve", Signature::named(&["reason"])),
        ];
        for (changed, signature) in changes {
            let host = rebuilt(
                &tools.host(),
                |_| true,
                |name, old| if name == changed { signature.clone() } else { old.clone() },
                &[],
            );
            let err = error(&runner, resume(host, &token)).await;
            assert_code(&err, ErrorCode::FunctionChanged);
            assert_eq!(err.code.as_str(), "RUN_FUNCTION_CHANGED");
            assert!(err.message.contains(&format!("parameters of {changed} changed")), "{mode}: {err}");
        }
        // A function the ledger did not call may change as it likes.
        let host = rebuilt(
            &tools.host(),
            |_| true,
            |name, old| if name == "tools.sum" { Signature::named(&["a", "b"]) } else { old.clone() },
            &[],
        );
        assert_eq!(value(&runner, resume(host, &token)).await, done(), "{mode}");
        assert_eq!(tools.total(), before + 1, "{mode}: only the resumed call ran");
    }
}
