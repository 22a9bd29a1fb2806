//! The golden continuations: tokens and stored states that releases made, checked in under
//! `tests/golden/<format>/`, each resumed here and completed to the value its release got, with
//! the ledger its release recorded. Every release must resume the golden files of the releases
//! before it. This test only reads them; `generate_golden_files` (ignored, run explicitly) writes
//! the files of the format this release makes, once. See `tests/golden/README.md`.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use resumable::runner::codec::{SealedCodec, SealedCodecConfig, SignedCodec, SignedCodecConfig};
use resumable::runner::{
    Clock, ContinuationCodec, ContinuationStore, MemoryContinuationStore, StoredCodec, StoredContinuation,
};
use resumable::{
    ErrorCode, HostError, HostFunctions, Interruption, Outcome, Resolution, RunRequest, Runner, RunnerConfig,
};
use serde_json::{Value, json};

/// The directory `generate_golden_files` writes: named after the state format this release makes.
const CURRENT: &str = "state-v2";

/// The secret every golden token is signed or sealed with.
const SECRET: &[u8] = b"the fixed secret of resumable's golden continuations";

/// When the golden continuations are issued: 2025-06-01T00:00:00Z.
const ISSUED_AT: u64 = 1_748_736_000;

/// How long after its issue a golden continuation is resumed (within every codec's lifetime).
const RESUMED_AFTER: Duration = Duration::from_secs(10 * 60);

const AUDIENCE: &str = "golden";
const RUN_ID: &str = "golden-run";

/// The script: a call that is fulfilled, one that is rejected, the logical clock and the seeded
/// generator, then a call that interrupts for approval.
const SOURCE: &str = r#"
const order = await shop.order("A-1");
let audit;
try { await shop.audit(); } catch (e) { audit = e.message; }
const now = Date.now();
const lucky = Math.random();
const refund = await shop.refund(order.id, 1500);
return { order, audit, now, lucky, refund };
"#;

/// The codecs, by the name of their files.
const CODECS: [&str; 3] = ["signed", "sealed", "stored"];

fn context() -> Value {
    json!({ "tenant": "acme", "policy": "golden" })
}

fn at(unix_seconds: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(unix_seconds)
}

fn golden_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden")
}

/// The host functions of the scenario; every call is recorded with what it was given.
#[derive(Clone, Default)]
struct Shop {
    calls: Arc<Mutex<Vec<Value>>>,
}

impl Shop {
    fn record(&self, function: &str, arguments: Value, ctx: &resumable::HostCallContext) {
        let resume = ctx
            .resume()
            .map(|r| json!({ "interruptionId": r.interruption_id, "payload": r.payload, "resolution": r.resolution }));
        let call =
            json!({ "function": function, "arguments": arguments, "resume": resume, "key": ctx.idempotency_key() });
        self.calls.lock().unwrap().push(call);
    }

    fn calls(&self) -> Vec<Value> {
        self.calls.lock().unwrap().clone()
    }

    fn host(&self) -> HostFunctions {
        self.builder().build().unwrap()
    }

    /// The host of a later release, with one more function.
    fn upgraded_host(&self) -> HostFunctions {
        self.builder()
            .typed("shop.cancel", ["order_id"], |_, (id,): (String,)| async move { Ok(json!(id)) })
            .build()
            .unwrap()
    }

    fn builder(&self) -> resumable::host::HostFunctionsBuilder {
        let (order, audit, refund) = (self.clone(), self.clone(), self.clone());
        HostFunctions::builder()
            .typed("shop.order", ["order_id"], move |ctx, (id,): (String,)| {
                order.record("shop.order", json!([id]), &ctx);
                async move { Ok(json!({ "id": id, "total": 5000 })) }
            })
            .function("shop.audit", move |ctx, args| {
                audit.record("shop.audit", Value::Array(args), &ctx);
                async move { Err(HostError::new("the audit log is closed").with_details(json!({ "code": "CLOSED" }))) }
            })
            .typed("shop.refund", ["order_id", "amount"], move |ctx, (id, amount): (String, u64)| {
                refund.record("shop.refund", json!([id, amount]), &ctx);
                async move {
                    match ctx.resume() {
                        None => Err(ctx.interrupt(json!({ "kind": "refund", "orderId": id, "amount": amount }))),
                        Some(resume) => Ok(json!({
                            "refunded": amount,
                            "decision": resume.resolution,
                            "key": ctx.idempotency_key(),
                        })),
                    }
                }
            })
    }
}

/// A runner with the codec named `codec`, whose continuations are issued and checked at `now`;
/// the stored codec keeps its states in `store`.
fn runner(codec: &str, now: SystemTime, store: &Arc<MemoryContinuationStore>) -> Runner {
    let codec: ContinuationCodec = match codec {
        "signed" => SignedCodec::new(SignedCodecConfig::new(SECRET)).unwrap().into(),
        "sealed" => SealedCodec::new(SealedCodecConfig::new(SECRET)).unwrap().into(),
        "stored" => StoredCodec::new(Arc::clone(store) as Arc<dyn ContinuationStore>).into(),
        other => panic!("no codec {other}"),
    };
    Runner::new(RunnerConfig::new().workers(1).codec(codec).clock(Clock::fixed(now))).unwrap()
}

fn request(host: HostFunctions) -> RunRequest {
    RunRequest::new(SOURCE).host(host).context(context()).audience(AUDIENCE)
}

fn resolutions() -> [Resolution; 1] {
    [Resolution::new("interrupt-3", json!({ "approved": true, "by": "bob" }))]
}

/// The interruption every golden continuation waits on.
fn pending() -> Interruption {
    Interruption {
        id: "interrupt-3".into(),
        function: "shop.refund".into(),
        arguments: vec![json!("A-1"), json!(1500)],
        payload: json!({ "kind": "refund", "orderId": "A-1", "amount": 1500 }),
    }
}

/// The host calls a resume makes: the interrupted one alone, again, with the decision.
fn resumed_calls() -> Vec<Value> {
    vec![json!({
        "function": "shop.refund",
        "arguments": ["A-1", 1500],
        "resume": { "interruptionId": "interrupt-3", "payload": pending().payload, "resolution": resolutions()[0].value },
        "key": format!("{RUN_ID}:interrupt-3"),
    })]
}

fn read(dir: &Path, name: &str) -> Vec<u8> {
    std::fs::read(dir.join(name)).unwrap_or_else(|e| panic!("{}: {e}", dir.join(name).display()))
}

fn read_text(dir: &Path, name: &str) -> String {
    String::from_utf8(read(dir, name)).unwrap().trim().to_owned()
}

/// Puts the stored row of `dir` into `store`; answers its token.
async fn restore_row(dir: &Path, store: &MemoryContinuationStore) -> String {
    let token = read_text(dir, "stored.token");
    let row: Value = serde_json::from_slice(&read(dir, "stored.row.json")).unwrap();
    let key: [u8; 32] = URL_SAFE_NO_PAD.decode(&token).unwrap().try_into().unwrap();
    let record = StoredContinuation {
        audience: row["audience"].as_str().unwrap().to_owned(),
        expires_at: UNIX_EPOCH + Duration::from_millis(row["expiresAtMs"].as_u64().unwrap()),
        state: read(dir, "stored.state"),
    };
    store.set(key, record).await.unwrap();
    token
}

/// Resumes the golden continuation of `codec` in `dir` with `host`, checking what it waits on.
async fn resume(dir: &Path, codec: &str, host: HostFunctions) -> Result<Value, resumable::RunError> {
    let manifest: Value = serde_json::from_slice(&read(dir, "manifest.json")).unwrap();
    let now = at(manifest["issuedAt"].as_u64().unwrap()) + RESUMED_AFTER;
    let store = Arc::new(MemoryContinuationStore::with_clock(Clock::fixed(now)));
    let token = match codec {
        "stored" => restore_row(dir, &store).await,
        _ => read_text(dir, &format!("{codec}.token")),
    };
    let runner = runner(codec, now, &store);
    let inspection = runner.inspect(&token).await.unwrap_or_else(|e| panic!("{}/{codec}: {e:?}", dir.display()));
    assert_eq!((inspection.logical_run_id.as_str(), inspection.audience.as_str()), (RUN_ID, AUDIENCE));
    assert_eq!(inspection.interruptions, [pending()], "{}/{codec}", dir.display());
    match runner.run(request(host).resume(token, resolutions())).await? {
        Outcome::Completed(done) => Ok(done.value),
        other => panic!("{}/{codec}: expected completion, got {other:?}", dir.display()),
    }
}

/// The directories of golden files, one per format that a release made.
fn formats() -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(golden_dir())
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.join("manifest.json").is_file())
        .collect();
    dirs.sort();
    dirs
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_golden_continuation_resumes_to_its_value_calling_only_the_interrupted_function() {
    let dirs = formats();
    assert!(dirs.iter().any(|dir| dir.ends_with(CURRENT)), "no golden files of this release's format {CURRENT}");
    for dir in dirs {
        let manifest: Value = serde_json::from_slice(&read(&dir, "manifest.json")).unwrap();
        for codec in CODECS {
            let shop = Shop::default();
            let value = resume(&dir, codec, shop.host())
                .await
                .unwrap_or_else(|e| panic!("{}/{codec} did not resume: {e:?}", dir.display()));
            assert_eq!(value, manifest["values"][codec], "{}/{codec}", dir.display());
            assert_eq!(shop.calls(), resumed_calls(), "{}/{codec}: the ledger served the other calls", dir.display());
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn golden_continuations_from_state_format_2_on_resume_where_a_function_was_added() {
    for dir in formats() {
        let manifest: Value = serde_json::from_slice(&read(&dir, "manifest.json")).unwrap();
        for codec in CODECS {
            let shop = Shop::default();
            let resumed = resume(&dir, codec, shop.upgraded_host()).await;
            if dir.ends_with("state-v1") {
                // Format 1 bound every host-function name: it resumes only with the same names.
                assert_eq!(resumed.unwrap_err().code, ErrorCode::ProtocolError, "{}/{codec}", dir.display());
                assert!(shop.calls().is_empty(), "{}/{codec}", dir.display());
            } else {
                let value = resumed.unwrap_or_else(|e| panic!("{}/{codec} did not resume: {e:?}", dir.display()));
                assert_eq!(value, manifest["values"][codec], "{}/{codec}", dir.display());
                assert_eq!(shop.calls(), resumed_calls(), "{}/{codec}", dir.display());
            }
        }
    }
}

/// Writes the golden files of this release's format into `tests/golden/<CURRENT>/`, which must
/// not exist: files a release made are never made again. Run it explicitly:
/// `cargo test --test golden -- --ignored generate_golden_files`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "writes the golden files; run explicitly once per new format"]
async fn generate_golden_files() {
    let dir = golden_dir().join(CURRENT);
    assert!(!dir.exists(), "{} exists: golden files are never regenerated", dir.display());
    let staging = golden_dir().join(format!(".{CURRENT}.partial"));
    let _ = std::fs::remove_dir_all(&staging);
    std::fs::create_dir_all(&staging).unwrap();
    let issued = at(ISSUED_AT);
    let mut values = serde_json::Map::new();
    for codec in CODECS {
        let store = Arc::new(MemoryContinuationStore::with_clock(Clock::fixed(issued)));
        let runner = runner(codec, issued, &store);
        let shop = Shop::default();
        let Outcome::Interrupted(paused) = runner.run(request(shop.host()).logical_run_id(RUN_ID)).await.unwrap()
        else {
            panic!("the scenario did not interrupt")
        };
        assert_eq!(paused.interruptions, [pending()]);
        let token = paused.continuation;
        if codec == "stored" {
            let key: [u8; 32] = URL_SAFE_NO_PAD.decode(&token).unwrap().try_into().unwrap();
            let record = store.peek(key).await.unwrap();
            let expires_ms = record.expires_at.duration_since(UNIX_EPOCH).unwrap().as_millis() as u64;
            let row = json!({ "audience": record.audience, "expiresAtMs": expires_ms });
            std::fs::write(staging.join("stored.row.json"), serde_json::to_string_pretty(&row).unwrap()).unwrap();
            std::fs::write(staging.join("stored.state"), &record.state).unwrap();
        }
        std::fs::write(staging.join(format!("{codec}.token")), &token).unwrap();
        let resumed = Shop::default();
        let Outcome::Completed(done) = runner.run(request(resumed.host()).resume(token, resolutions())).await.unwrap()
        else {
            panic!("the scenario did not complete")
        };
        assert_eq!(resumed.calls(), resumed_calls());
        values.insert(codec.to_owned(), done.value);
    }
    let manifest = json!({ "format": CURRENT, "issuedAt": ISSUED_AT, "values": values });
    std::fs::write(staging.join("manifest.json"), serde_json::to_string_pretty(&manifest).unwrap() + "\n").unwrap();
    std::fs::rename(&staging, &dir).unwrap();
}
