//! A runner and a set of instrumented host functions shared by the tests.

use resumable_runner::codec::{SignedCodec, SignedCodecConfig};
use resumable_runner::host::{CancelSignal, HostError, HostFunctions};
use resumable_runner::{ErrorCode, Limit, LimitOverrides, Outcome, RunError, RunRequest, Runner, RunnerConfig};
use serde_json::{Value, json};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

pub const SECRET: &[u8] = b"an-example-secret-of-at-least-32-bytes!!";

pub fn runner() -> Runner {
    let codec = SignedCodec::new(SignedCodecConfig::new(SECRET)).unwrap();
    Runner::new(RunnerConfig::new().workers(2).codec(codec)).unwrap()
}

/// A runner on worker threads and one on worker processes (whose workers carry `tag`), for the
/// tests that both must pass.
pub fn both_modes(tag: &str) -> [Runner; 2] {
    [runner(), crate::process::process_runner(2, tag)]
}

/// Host functions that count their calls.
#[derive(Clone, Default)]
pub struct Tools {
    pub calls: Arc<Mutex<HashMap<String, usize>>>,
    pub cancels: Arc<Mutex<Vec<CancelSignal>>>,
}

impl Tools {
    pub fn count(&self, name: &str) -> usize {
        self.calls.lock().unwrap().get(name).copied().unwrap_or(0)
    }

    pub fn total(&self) -> usize {
        self.calls.lock().unwrap().values().sum()
    }

    fn hit(&self, name: &str) {
        *self.calls.lock().unwrap().entry(name.to_string()).or_default() += 1;
    }

    pub fn host(&self) -> HostFunctions {
        let t = self.clone();
        let builder = HostFunctions::builder();
        let tc = t.clone();
        let builder = builder.function("tools.sum", move |_ctx, args| {
            tc.hit("sum");
            async move { Ok(json!(args.iter().filter_map(Value::as_f64).sum::<f64>())) }
        });
        let tc = t.clone();
        let builder = builder.function("tools.echo", move |_ctx, args| {
            tc.hit("echo");
            async move { Ok(args.into_iter().next().unwrap_or(Value::Null)) }
        });
        let tc = t.clone();
        let builder = builder.function("tools.effect", move |_ctx, _args| {
            tc.hit("effect");
            async move { Ok(json!("done")) }
        });
        let tc = t.clone();
        let builder = builder.function("tools.approve", move |ctx, args| {
            tc.hit("approve");
            async move {
                match ctx.resume() {
                    None => Err(ctx.interrupt(json!({ "kind": "approval", "args": args }))),
                    Some(resume) => Ok(resume.resolution.clone()),
                }
            }
        });
        let tc = t.clone();
        let builder = builder.function("tools.fail", move |_ctx, args| {
            tc.hit("fail");
            async move { Err(HostError::new(args.first().and_then(Value::as_str).unwrap_or("failed").to_string())) }
        });
        let tc = t.clone();
        let builder = builder.function("tools.wait", move |_ctx, args| {
            tc.hit("wait");
            async move {
                let ms = args.first().and_then(Value::as_u64).unwrap_or(0);
                tokio::time::sleep(Duration::from_millis(ms)).await;
                Ok(args.get(1).cloned().unwrap_or(Value::Null))
            }
        });
        let tc = t.clone();
        let builder = builder.function("tools.index", move |ctx, _args| {
            tc.hit("index");
            async move {
                tokio::time::sleep(Duration::from_millis(5)).await;
                Ok(json!({ "index": ctx.index(), "function": ctx.function(), "run": ctx.logical_run_id() }))
            }
        });
        let tc = t.clone();
        let builder = builder.function("tools.never", move |ctx, _args| {
            tc.hit("never");
            tc.cancels.lock().unwrap().push(ctx.cancel_signal().clone());
            async move { std::future::pending::<Result<Value, HostError>>().await }
        });
        builder
            .typed("orders.refund", ["order_id", "amount"], |_ctx, (id, amount): (String, u64)| async move {
                Ok(json!({ "refunded": id, "amount": amount }))
            })
            .build()
            .unwrap()
    }
}

pub async fn run(runner: &Runner, request: RunRequest) -> Result<Outcome, RunError> {
    runner.run(request).await
}

pub async fn value(runner: &Runner, request: RunRequest) -> Value {
    match runner.run(request).await {
        Ok(Outcome::Completed(c)) => c.value,
        other => panic!("expected completion, got {other:?}"),
    }
}

pub async fn error(runner: &Runner, request: RunRequest) -> RunError {
    match runner.run(request).await {
        Err(e) => e,
        other => panic!("expected an error, got {other:?}"),
    }
}

pub fn timeout_ms(ms: i128) -> LimitOverrides {
    LimitOverrides::new().with(Limit::Timeout, ms).unwrap()
}

pub fn assert_code(error: &RunError, code: ErrorCode) {
    assert_eq!(error.code, code, "{error}");
}

/// Decodes a signed continuation's state, lets `edit` change it, fixes its
/// checksum and signs it again: what a holder of the secret could forge.
pub fn forge(token: &str, edit: impl FnOnce(&mut Vec<u8>)) -> String {
    use resumable_runner::codec::{compress, decompress};
    let codec = SignedCodec::new(SignedCodecConfig::new(SECRET)).unwrap();
    let now = std::time::SystemTime::now();
    let (header, compressed) = codec.decode_unscoped(token, now).unwrap();
    let mut state = decompress(&compressed, 1 << 24).unwrap();
    state.truncate(state.len() - 4);
    edit(&mut state);
    let checksum = crc32fast::hash(&state);
    state.extend_from_slice(&checksum.to_le_bytes());
    codec.encode(&compress(&state), &header.audience, now)
}

/// `token` with its character at `at` changed (to another base64url character): what anyone
/// could forge, without the secret.
pub fn with_char_changed(token: &str, at: usize) -> String {
    let mut bytes = token.as_bytes().to_vec();
    bytes[at] = if bytes[at] == b'A' { b'B' } else { b'A' };
    String::from_utf8(bytes).expect("base64url stays ASCII")
}

/// [`forge`] replacing the first occurrence of `from` with `to`.
pub fn forge_replacing(token: &str, from: &[u8], to: &[u8]) -> String {
    forge(token, |state| {
        let at = state.windows(from.len()).position(|w| w == from).expect("the bytes to rewrite");
        state.splice(at..at + from.len(), to.iter().copied());
    })
}
