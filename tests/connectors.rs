//! HTTP connectors end to end: `resumable serve --config` in front of a separate HTTP
//! application (a small axum app on a loopback port) that verifies every Standard Webhooks
//! signature and counts requests by idempotency key.

#[allow(dead_code)]
mod support;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::os::unix::fs::PermissionsExt as _;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Json;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response as AxumResponse};
use base64::Engine as _;
use hmac::{Hmac, KeyInit, Mac};
use serde_json::{Value, json};
use sha2::Sha256;
use support::{Client, Server, TempDir, WAIT};

const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

/// One request the application accepted: its path, idempotency key and body.
#[derive(Clone, Debug)]
struct Received {
    path: String,
    key: String,
    body: Value,
}

/// The system of record.
#[derive(Clone, Default)]
struct App {
    received: Arc<Mutex<Vec<Received>>>,
    /// Attempts per path, bad signatures included.
    attempts: Arc<Mutex<HashMap<String, u32>>>,
    bad_signatures: Arc<Mutex<u32>>,
}

impl App {
    fn received(&self, path: &str) -> Vec<Received> {
        self.received.lock().unwrap().iter().filter(|r| r.path == path).cloned().collect()
    }

    fn attempts(&self, path: &str) -> u32 {
        self.attempts.lock().unwrap().get(path).copied().unwrap_or(0)
    }
}

/// Verifies a Standard Webhooks signature the way a receiving application would.
fn verified(headers: &HeaderMap, body: &[u8]) -> bool {
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok()).unwrap_or_default().to_owned();
    let (id, timestamp, signature) = (header("webhook-id"), header("webhook-timestamp"), header("webhook-signature"));
    let key = base64::engine::general_purpose::STANDARD.decode(SECRET.trim_start_matches("whsec_")).unwrap();
    let mut mac = Hmac::<Sha256>::new_from_slice(&key).unwrap();
    mac.update(format!("{id}.{timestamp}.").as_bytes());
    mac.update(body);
    let expected = base64::engine::general_purpose::STANDARD.encode(mac.finalize().into_bytes());
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs();
    let fresh = timestamp.parse::<u64>().is_ok_and(|t| t.abs_diff(now) < 300);
    fresh && signature.split(' ').any(|s| s == format!("v1,{expected}"))
}

async fn handle(
    State(app): State<App>,
    Path(path): Path<String>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> AxumResponse {
    let attempt = {
        let mut attempts = app.attempts.lock().unwrap();
        let n = attempts.entry(path.clone()).or_default();
        *n += 1;
        *n
    };
    if !verified(&headers, &body) {
        *app.bad_signatures.lock().unwrap() += 1;
        return (StatusCode::UNAUTHORIZED, "bad signature").into_response();
    }
    let body: Value = serde_json::from_slice(&body).unwrap();
    let key = headers.get("idempotency-key").and_then(|v| v.to_str().ok()).unwrap_or_default().to_owned();
    let arguments = body["arguments"].clone();
    match path.as_str() {
        "flaky" if attempt <= 2 => return (StatusCode::SERVICE_UNAVAILABLE, "try later").into_response(),
        "busy" if attempt == 1 => {
            return (StatusCode::TOO_MANY_REQUESTS, [("retry-after", "1")], "slow down").into_response();
        }
        "slow" if attempt == 1 => tokio::time::sleep(Duration::from_secs(3)).await,
        "closed" => {
            let refusal = json!({ "code": "ORDER_CLOSED", "message": "order A-1 is closed" });
            return (StatusCode::BAD_REQUEST, Json(refusal)).into_response();
        }
        "big" => return "x".repeat(4096).into_response(),
        "text" => return "not json".into_response(),
        _ => {}
    }
    app.received.lock().unwrap().push(Received { path: path.clone(), key: key.clone(), body: body.clone() });
    match path.as_str() {
        "order" => Json(json!({ "id": arguments["order_id"], "total": 5000 })).into_response(),
        "refund" => Json(json!({ "refunded": arguments["amount"], "orderId": arguments["order_id"], "key": key }))
            .into_response(),
        _ => Json(json!({ "ok": path, "attempt": attempt })).into_response(),
    }
}

/// Starts the application on a free loopback port.
async fn start_app() -> (App, SocketAddr) {
    let app = App::default();
    let router = axum::Router::new().route("/{path}", axum::routing::post(handle)).with_state(app.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
    (app, addr)
}

/// The acceptance sample, pointed at the application, plus the functions the other tests use.
fn config(app: SocketAddr) -> String {
    format!(
        r#"
[[keys]]
key = "key-alice-0001"
actor = "alice"
tenant = "acme"
roles = ["submitter", "approver"]

[[keys]]
key = "key-bob-0001"
actor = "bob"
tenant = "acme"
roles = ["approver"]

[[keys]]
key = "key-carol-0001"
actor = "carol"
tenant = "acme"
roles = ["finance"]

[functions."billing.refund"]
url = "http://{app}/refund"
params = [{{ name = "order_id", type = "string" }}, {{ name = "amount", type = "integer" }}]
secret = "{SECRET}"
timeout = "5s"
retries = 3
approval = {{ when = "args.amount > 1000" }}
approvers = ["approver"]
four_eyes = true
summary = "Refund {{amount}} on order {{order_id}}"

[functions."billing.order"]
url = "http://{app}/order"
params = [{{ name = "order_id", type = "string" }}]
secret = "{SECRET}"
approval = "never"

[functions."ops.flaky"]
url = "http://{app}/flaky"
secret = "{SECRET}"
retries = 3

[functions."ops.busy"]
url = "http://{app}/busy"
secret = "{SECRET}"

[functions."ops.slow"]
url = "http://{app}/slow"
secret = "{SECRET}"
timeout = "500ms"
retries = 1

[functions."ops.closed"]
url = "http://{app}/closed"
secret = "{SECRET}"
retries = 3

[functions."ops.big"]
url = "http://{app}/big"
secret = "{SECRET}"
max_response_bytes = 1000

[functions."ops.text"]
url = "http://{app}/text"
secret = "{SECRET}"

[functions."ops.payout"]
url = "http://{app}/payout"
params = [{{ name = "amount", type = {{ type = "integer", minimum = 1 }} }}]
secret = "{SECRET}"
approval = "always"
approvers = ["finance"]

[functions."ops.throws"]
url = "http://{app}/throws"
params = [{{ name = "x", type = "object" }}]
secret = "{SECRET}"
approval = {{ when = "args.x.y.z > 1" }}

[functions."ops.loops"]
url = "http://{app}/loops"
secret = "{SECRET}"
approval = {{ when = "(() => {{ for (;;) {{}} }})()" }}
"#
    )
}

/// A server on `dir` with the configuration for `app`, written with mode 0600.
fn serve(dir: &TempDir, app: SocketAddr) -> Server {
    let path = dir.path().join("resumable.toml");
    std::fs::write(&path, config(app)).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    Server::start(dir, &["--config", &path.display().to_string()])
}

async fn submit(client: &Client, source: &str) -> String {
    let response = client.post("/v1/automations", &json!({ "source": source })).await;
    assert_eq!(response.status, 202, "submit: {}", response.text());
    response.json()["id"].as_str().unwrap().to_owned()
}

/// Polls the automation until `done` holds.
async fn poll(client: &Client, id: &str, done: impl Fn(&Value) -> bool) -> Value {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let view = client.get(&format!("/v1/automations/{id}")).await.json();
        if done(&view) {
            return view;
        }
        assert!(tokio::time::Instant::now() < deadline, "{id}: {view}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn pending(client: &Client, id: &str) -> Value {
    let view = poll(client, id, |v| (v["status"] == "waiting" && !v["pendingApproval"].is_null()) || ended(v)).await;
    assert_eq!(view["status"], "waiting", "{view}");
    view["pendingApproval"].clone()
}

fn ended(view: &Value) -> bool {
    matches!(view["status"].as_str(), Some("completed" | "failed" | "cancelled"))
}

async fn finished(client: &Client, id: &str) -> Value {
    poll(client, id, ended).await
}

fn decision(approval: &Value, approved: bool) -> Value {
    let id = &approval["requests"][0]["interruptionId"];
    json!({ "decisions": [{ "interruptionId": id, "approved": approved, "reason": "checked" }] })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_acceptance_sample_holds() {
    let (app, addr) = start_app().await;
    let dir = TempDir::new("connector-sample");
    let server = serve(&dir, addr);
    let (alice, bob) = (server.client(Some("key-alice-0001")), server.client(Some("key-bob-0001")));

    let script = "const o = await billing.order('A-1'); return await billing.refund(o.id, 1500)";
    let id = submit(&alice, script).await;
    let approval = pending(&alice, &id).await;
    // The order was read at once, with one signed request; nothing was refunded.
    assert_eq!(app.received("order").len(), 1);
    assert_eq!(app.attempts("refund"), 0);
    let request = &approval["requests"][0];
    assert_eq!(request["function"], "billing.refund");
    assert_eq!(request["request"]["summary"], "Refund 1500 on order A-1");
    assert_eq!(request["request"]["arguments"], json!({ "order_id": "A-1", "amount": 1500 }));

    // Alice submitted it: she may not decide it, although she holds the approver role.
    let refused = alice.post(&format!("/v1/automations/{id}/decisions"), &decision(&approval, true)).await;
    assert_eq!(refused.status, 403, "{}", refused.text());
    assert_eq!(refused.json()["error"]["code"], "FOUR_EYES");
    let still = alice.get(&format!("/v1/automations/{id}")).await.json();
    assert_eq!(still["status"], "waiting", "nothing was decided: {still}");

    let accepted = bob.post(&format!("/v1/automations/{id}/decisions"), &decision(&approval, true)).await;
    assert_eq!(accepted.status, 202, "{}", accepted.text());
    let done = finished(&alice, &id).await;
    assert_eq!(done["status"], "completed", "{done}");
    let refunds = app.received("refund");
    assert_eq!(refunds.len(), 1, "exactly one request to /refund: {refunds:?}");
    let refund = &refunds[0];
    assert!(!refund.key.is_empty(), "an Idempotency-Key header");
    assert_eq!(refund.body["decision"]["approved"], true, "{}", refund.body);
    assert_eq!(refund.body["decision"]["decidedBy"], json!(["bob"]));
    assert_eq!(refund.body["arguments"], json!({ "order_id": "A-1", "amount": 1500 }));
    assert_eq!((refund.body["tenant"].as_str(), refund.body["actor"].as_str()), (Some("acme"), Some("alice")));
    assert_eq!(refund.body["automation"], json!(id));
    assert_eq!(done["result"], json!({ "refunded": 1500, "orderId": "A-1", "key": refund.key }), "{done}");
    assert!(app.received("order")[0].body.get("decision").is_none(), "no decision on a call that needed none");

    // The same script for 500 needs no approval.
    let small = submit(&alice, "const o = await billing.order('A-2'); return await billing.refund(o.id, 500)").await;
    let done = finished(&alice, &small).await;
    assert_eq!(done["status"], "completed", "{done}");
    assert_eq!(done["result"]["refunded"], 500);
    assert_eq!(*app.bad_signatures.lock().unwrap(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retries_refusals_and_bad_responses() {
    let (app, addr) = start_app().await;
    let dir = TempDir::new("connector-retries");
    let server = serve(&dir, addr);
    let alice = server.client(Some("key-alice-0001"));
    let script = "
        const outcome = async (f) => {
            try { return { value: await f() }; }
            catch (e) { return { code: e.details && e.details.code, message: e.message }; }
        };
        return {
            flaky: await outcome(() => ops.flaky()),
            busy: await outcome(() => ops.busy()),
            slow: await outcome(() => ops.slow()),
            closed: await outcome(() => ops.closed()),
            big: await outcome(() => ops.big()),
            text: await outcome(() => ops.text()),
            badArgument: await outcome(() => billing.order(42)),
        };";
    let id = submit(&alice, script).await;
    let done = finished(&alice, &id).await;
    assert_eq!(done["status"], "completed", "{done}");
    let value = &done["result"];
    // 503 twice, then 200: one result.
    assert_eq!(value["flaky"]["value"]["attempt"], 3, "{value}");
    assert_eq!(app.received("flaky").len(), 1);
    // 429 with Retry-After, then 200.
    assert_eq!(value["busy"]["value"]["attempt"], 2, "{value}");
    // A timeout is retried.
    assert_eq!(value["slow"]["value"]["attempt"], 2, "{value}");
    // A 4xx is never retried: a catchable error with the body's code.
    assert_eq!(value["closed"]["code"], "ORDER_CLOSED", "{value}");
    assert!(value["closed"]["message"].as_str().unwrap().contains("order A-1 is closed"), "{value}");
    assert_eq!(app.attempts("closed"), 1);
    assert_eq!(value["big"]["code"], "CONNECTOR_RESPONSE_TOO_LARGE", "{value}");
    assert_eq!(value["text"]["code"], "CONNECTOR_RESPONSE_NOT_JSON", "{value}");
    // Arguments are validated before any request is sent.
    assert_eq!(value["badArgument"]["code"], "CONNECTOR_INVALID_ARGUMENT", "{value}");
    assert_eq!(app.attempts("order"), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn approver_roles_are_checked_and_predicates_fail_closed() {
    let (app, addr) = start_app().await;
    let dir = TempDir::new("connector-policies");
    let server = serve(&dir, addr);
    let (alice, bob, carol) = (
        server.client(Some("key-alice-0001")),
        server.client(Some("key-bob-0001")),
        server.client(Some("key-carol-0001")),
    );

    // Only the finance role may decide a payout.
    let id = submit(&alice, "return await ops.payout(100)").await;
    let approval = pending(&alice, &id).await;
    let refused = bob.post(&format!("/v1/automations/{id}/decisions"), &decision(&approval, true)).await;
    assert_eq!(refused.status, 403, "{}", refused.text());
    assert_eq!(refused.json()["error"]["code"], "NOT_APPROVER");
    // A rejection sends nothing: the script gets the decision.
    let rejected = carol.post(&format!("/v1/automations/{id}/decisions"), &decision(&approval, false)).await;
    assert_eq!(rejected.status, 202, "{}", rejected.text());
    let done = finished(&alice, &id).await;
    assert_eq!(done["result"], json!({ "approved": false, "reason": "checked", "decidedBy": ["carol"] }));
    assert_eq!(app.attempts("payout"), 0);

    // A predicate that throws, and one that never ends, require approval.
    for script in ["return await ops.throws({})", "return await ops.loops()"] {
        let id = submit(&alice, script).await;
        let approval = pending(&alice, &id).await;
        assert_eq!(approval["requests"].as_array().unwrap().len(), 1, "{script}: {approval}");
    }
    assert_eq!(app.attempts("throws") + app.attempts("loops"), 0);
}
