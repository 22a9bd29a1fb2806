//! HTTP connectors end to end: `resumable serve --config` in front of a separate HTTP
//! application (a small axum app on a loopback port) that verifies every Standard Webhooks
//! signature and counts requests by idempotency key.

#[allow(dead_code)]
mod support;

use std::collections::HashMap;
use std::net::SocketAddr;
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
    let addr = support::serve_router(router).await;
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

[functions."ops.wire"]
url = "http://{app}/wire"
secret = "{SECRET}"
approval = "always"
quorum = 2

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

/// A server on `dir` with the configuration for `app`.
fn serve(dir: &TempDir, app: SocketAddr) -> Server {
    serve_with_env(dir, app, &[])
}

/// Like [`serve`], with `env` added to the server's environment.
fn serve_with_env(dir: &TempDir, app: SocketAddr, env: &[(&str, &str)]) -> Server {
    Server::start_with_config(dir, &config(app), env)
}

async fn pending(client: &Client, id: &str) -> Value {
    let view = client
        .poll(&format!("/v1/automations/{id}"), |v| {
            (v["status"] == "waiting" && !v["pendingApproval"].is_null()) || ended(v)
        })
        .await;
    assert_eq!(view["status"], "waiting", "{view}");
    view["pendingApproval"].clone()
}

fn ended(view: &Value) -> bool {
    matches!(view["status"].as_str(), Some("completed" | "failed" | "cancelled"))
}

async fn finished(client: &Client, id: &str) -> Value {
    client.poll(&format!("/v1/automations/{id}"), ended).await
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
    let id = alice.submit(script).await;
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
    let small = alice.submit("const o = await billing.order('A-2'); return await billing.refund(o.id, 500)").await;
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
    let id = alice.submit(script).await;
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
    let id = alice.submit("return await ops.payout(100)").await;
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
        let id = alice.submit(script).await;
        let approval = pending(&alice, &id).await;
        assert_eq!(approval["requests"].as_array().unwrap().len(), 1, "{script}: {approval}");
    }
    assert_eq!(app.attempts("throws") + app.attempts("loops"), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quorum_needs_two_distinct_approvers_and_one_reject_ends_it() {
    let (app, addr) = start_app().await;
    let dir = TempDir::new("connector-quorum");
    let server = serve(&dir, addr);
    let (alice, bob) = (server.client(Some("key-alice-0001")), server.client(Some("key-bob-0001")));
    let path = |id: &str| format!("/v1/automations/{id}/decisions");

    let id = alice.submit("return await ops.wire()").await;
    let approval = pending(&alice, &id).await;
    let first = bob.post(&path(&id), &decision(&approval, true)).await;
    assert_eq!(first.status, 202, "{}", first.text());
    // Still pending, as 1 of 2 (the run wakes for the batch, counts it and waits again).
    let view = pending(&alice, &id).await;
    let progress = &view["progress"][0];
    assert_eq!((&progress["approvedBy"], &progress["quorum"]), (&json!(["bob"]), &json!(2)), "{view}");
    // The same approver again is a repeat.
    let again = bob.post(&path(&id), &decision(&approval, true)).await;
    assert_eq!(again.status, 409, "{}", again.text());
    assert_eq!(again.json()["error"]["code"], "ALREADY_DECIDED");
    assert_eq!(app.attempts("wire"), 0);
    // A second, distinct approver completes it.
    let second = alice.post(&path(&id), &decision(&approval, true)).await;
    assert_eq!(second.status, 202, "{}", second.text());
    let done = finished(&alice, &id).await;
    assert_eq!(done["status"], "completed", "{done}");
    let wires = app.received("wire");
    assert_eq!(wires.len(), 1, "{wires:?}");
    assert_eq!(wires[0].body["decision"]["decidedBy"], json!(["bob", "alice"]));

    // One reject rejects, whatever the quorum.
    let id = alice.submit("return await ops.wire()").await;
    let approval = pending(&alice, &id).await;
    assert_eq!(bob.post(&path(&id), &decision(&approval, true)).await.status, 202);
    assert_eq!(alice.post(&path(&id), &decision(&approval, false)).await.status, 202);
    let done = finished(&alice, &id).await;
    assert_eq!(done["result"], json!({ "approved": false, "reason": "checked", "decidedBy": ["alice"] }), "{done}");
    assert_eq!(app.attempts("wire"), 1, "a rejected call is never sent");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_killed_after_the_application_received_the_call_retries_it_with_the_same_key() {
    let (app, addr) = start_app().await;
    let dir = TempDir::new("connector-kill");
    // Dies right after the approved call returned, before the round is recorded.
    let mut server = serve_with_env(&dir, addr, &[("RESUMABLE_FAULT", "after-host-call")]);
    let alice = server.client(Some("key-alice-0001"));
    let id = alice.submit("const o = await billing.order('A-7'); return await billing.refund(o.id, 2500)").await;
    let approval = pending(&alice, &id).await;
    let body = decision(&approval, true).to_string();
    let bob = server.client(Some("key-bob-0001"));
    // The server may die before or after it answers: the decision is durable either way.
    let _ = bob.try_send("POST", &format!("/v1/automations/{id}/decisions"), &[], Some(body.as_bytes())).await;
    assert!(server.exited_within(WAIT), "the server never reached its fault point");
    assert_eq!(app.received("refund").len(), 1, "the application received the call before the kill");

    let server = serve(&dir, addr);
    let alice = server.client(Some("key-alice-0001"));
    let done = finished(&alice, &id).await;
    assert_eq!(done["status"], "completed", "{done}");
    let refunds = app.received("refund");
    assert_eq!(refunds.len(), 2, "the call was retried once: {refunds:?}");
    assert_eq!(refunds[0].key, refunds[1].key, "with the same idempotency key");
    assert_eq!(refunds[0].body, refunds[1].body, "and the same request");
    assert_eq!(done["result"]["key"], json!(refunds[0].key), "the application sees one effect: {done}");
    assert_eq!(app.received("order").len(), 1, "the order read was recorded before the kill");
}

/// The names `GET /v1/functions` lists for `client`'s tenant.
async fn function_names(client: &Client) -> Vec<String> {
    let catalog = client.get("/v1/functions").await.json();
    catalog["functions"].as_array().unwrap().iter().map(|f| f["name"].as_str().unwrap().to_owned()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hangup_reloads_functions_and_keys_while_a_pending_approval_completes() {
    let (app, addr) = start_app().await;
    let dir = TempDir::new("connector-reload");
    let mut server = serve(&dir, addr);
    let (alice, bob) = (server.client(Some("key-alice-0001")), server.client(Some("key-bob-0001")));
    let waiting = alice.submit("return await billing.refund('A-9', 5000)").await;
    let approval = pending(&alice, &waiting).await;
    assert!(!function_names(&alice).await.contains(&"ops.added".to_owned()));

    // A file that fails its checks changes nothing.
    dir.write_config(&format!("{}\n[functions.\"ops.added\"]\nurl = \"ftp://nowhere\"\n", config(addr)));
    let hangup = |pid: u32| {
        // SAFETY: kill(2) with a child's pid and a valid signal number has no memory effects.
        assert_eq!(unsafe { libc::kill(i32::try_from(pid).unwrap(), libc::SIGHUP) }, 0);
    };
    hangup(server.pid());
    let deadline = tokio::time::Instant::now() + WAIT;
    while !server.log_text().contains("configuration not reloaded") {
        assert!(tokio::time::Instant::now() < deadline, "{}", server.log_text());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(server.is_running());

    // A good one adds a function and a key and drops another function, at once.
    let text_block = format!("[functions.\"ops.text\"]\nurl = \"http://{addr}/text\"\nsecret = \"{SECRET}\"\n");
    assert!(config(addr).contains(&text_block));
    let added = format!(
        "{}\n[functions.\"ops.added\"]\nurl = \"http://{addr}/added\"\nsecret = \"{SECRET}\"\n\n\
         [[keys]]\nkey = \"key-dave-0001\"\nactor = \"dave\"\ntenant = \"acme\"\nroles = [\"submitter\"]\n",
        config(addr).replace(&text_block, "")
    );
    dir.write_config(&added);
    hangup(server.pid());
    let deadline = tokio::time::Instant::now() + WAIT;
    while !function_names(&alice).await.contains(&"ops.added".to_owned()) {
        assert!(tokio::time::Instant::now() < deadline, "{}", server.log_text());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let dave = server.client(Some("key-dave-0001"));
    let id = dave.submit("return await ops.added()").await;
    let done = finished(&dave, &id).await;
    assert_eq!(done["result"]["ok"], "added", "{done}");

    // The automation that waited through both reloads completes: a function it never called is
    // gone, another was added, and its continuation needs only the one it called.
    let accepted = bob.post(&format!("/v1/automations/{waiting}/decisions"), &decision(&approval, true)).await;
    assert_eq!(accepted.status, 202, "{}", accepted.text());
    let done = finished(&alice, &waiting).await;
    assert_eq!(done["result"]["refunded"], 5000, "{done}");
    assert_eq!(app.received("refund").len(), 1);
}

/// The configuration of `config(app)` without the function `name`.
fn config_without(app: SocketAddr, name: &str) -> String {
    let text = config(app);
    let start = text.find(&format!("[functions.\"{name}\"]")).unwrap();
    let end = text[start + 1..].find("\n[").map_or(text.len(), |at| start + 1 + at + 1);
    format!("{}{}", &text[..start], &text[end..])
}

/// Restarts the server of `dir` with `text` as its configuration.
async fn restart(mut server: Server, dir: &TempDir, text: &str) -> Server {
    server.terminate(WAIT).await.expect("the server stops");
    Server::start_with_config(dir, text, &[])
}

/// The inbox page of automation `id`, as `key`'s holder sees it once signed in.
async fn inbox_page(server: &Server, key: &str, id: &str) -> String {
    let browser = server.client(None);
    let form = format!("key={key}");
    let headers = [("Content-Type", "application/x-www-form-urlencoded")];
    let login = browser.send("POST", "/login", &headers, Some(form.as_bytes())).await;
    assert_eq!(login.status, 303, "{}", login.text());
    let cookie = login.header("set-cookie").unwrap().split(';').next().unwrap().to_owned();
    let page = browser.send("GET", &format!("/automations/{id}"), &[("Cookie", cookie.as_str())], None).await;
    assert_eq!(page.status, 200, "{}", page.text());
    page.text()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pending_approval_survives_a_restart_with_another_function_and_a_new_url() {
    let ((old_app, old_addr), (new_app, new_addr)) = (start_app().await, start_app().await);
    let dir = TempDir::new("connector-upgrade");
    let server = serve(&dir, old_addr);
    let alice = server.client(Some("key-alice-0001"));
    let id = alice.submit("const o = await billing.order('A-5'); return await billing.refund(o.id, 2500)").await;
    let approval = pending(&alice, &id).await;
    assert_eq!((old_app.received("order").len(), old_app.attempts("refund")), (1, 0));

    // The next release: every connector at another address, the refund's timeout and summary
    // changed, and one more function.
    let refund_block = config(new_addr);
    assert!(refund_block.contains("timeout = \"5s\"") && refund_block.contains("Refund {amount} on order"));
    let upgraded = format!(
        "{}\n[functions.\"ops.added\"]\nurl = \"http://{new_addr}/added\"\nsecret = \"{SECRET}\"\n",
        refund_block
            .replace("timeout = \"5s\"", "timeout = \"8s\"")
            .replace("Refund {amount} on order", "Refund {amount} cents on")
    );
    let server = restart(server, &dir, &upgraded).await;
    let (alice, bob) = (server.client(Some("key-alice-0001")), server.client(Some("key-bob-0001")));
    assert!(function_names(&alice).await.contains(&"ops.added".to_owned()));

    let accepted = bob.post(&format!("/v1/automations/{id}/decisions"), &decision(&approval, true)).await;
    assert_eq!(accepted.status, 202, "{}", accepted.text());
    let done = finished(&alice, &id).await;
    assert_eq!((&done["status"], &done["result"]["refunded"]), (&json!("completed"), &json!(2500)), "{done}");
    let refunds = new_app.received("refund");
    assert_eq!(refunds.len(), 1, "one refund, at the new address: {refunds:?}");
    assert_eq!(refunds[0].key, format!("{id}:interrupt-2"));
    assert_eq!(refunds[0].body["arguments"], json!({ "order_id": "A-5", "amount": 2500 }));
    assert_eq!(old_app.attempts("refund"), 0, "nothing was sent to the old address");
    assert_eq!((old_app.received("order").len(), new_app.attempts("order")), (1, 0), "the order read was replayed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pending_approval_whose_function_was_removed_fails_naming_it() {
    let (app, addr) = start_app().await;
    let dir = TempDir::new("connector-removed");
    let server = serve(&dir, addr);
    let alice = server.client(Some("key-alice-0001"));
    let id = alice.submit("const o = await billing.order('A-6'); return await billing.refund(o.id, 2500)").await;
    let approval = pending(&alice, &id).await;

    let without = config_without(addr, "billing.refund");
    assert!(!without.contains("billing.refund") && without.contains("[functions.\"billing.order\"]"));
    let server = restart(server, &dir, &without).await;
    let (alice, bob) = (server.client(Some("key-alice-0001")), server.client(Some("key-bob-0001")));
    let accepted = bob.post(&format!("/v1/automations/{id}/decisions"), &decision(&approval, true)).await;
    assert_eq!(accepted.status, 202, "{}", accepted.text());
    let done = finished(&alice, &id).await;
    assert_eq!(done["status"], "failed", "{done}");
    assert_eq!(done["error"]["code"], "RUN_FUNCTION_REMOVED", "{done}");
    let message = done["error"]["message"].as_str().unwrap();
    assert!(message.contains("billing.refund"), "{message}");
    assert_eq!(app.attempts("refund"), 0, "nothing was sent");
    let page = inbox_page(&server, "key-alice-0001", &id).await;
    assert!(page.contains("<code>RUN_FUNCTION_REMOVED</code>") && page.contains("billing.refund"), "{page}");

    // Another automation of the same server is unaffected.
    let other = alice.submit("return await billing.order('A-7')").await;
    assert_eq!(finished(&alice, &other).await["result"]["total"], 5000);
}

/// `tsc` from `tests/typescript/node_modules` (`npm ci --prefix tests/typescript`), or why not.
fn tsc() -> Result<std::path::PathBuf, String> {
    let tsc = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/typescript/node_modules/.bin/tsc");
    if tsc.is_file() {
        Ok(tsc)
    } else {
        Err("tests/typescript/node_modules is missing (npm ci --prefix tests/typescript)".into())
    }
}

/// Type-checks `script`, wrapped as the body of an async function, against `declaration`.
fn type_checks(dir: &TempDir, tsc: &std::path::Path, declaration: &str, script: &str) -> Result<(), String> {
    std::fs::write(dir.path().join("functions.d.ts"), declaration).unwrap();
    std::fs::write(dir.path().join("script.ts"), format!("async function script() {{\n{script}\n}}\n")).unwrap();
    let output = std::process::Command::new(tsc)
        .args(["--noEmit", "--strict", "--target", "es2022", "--lib", "es2022"])
        .arg(dir.path().join("functions.d.ts"))
        .arg(dir.path().join("script.ts"))
        .output()
        .expect("tsc runs");
    if output.status.success() { Ok(()) } else { Err(String::from_utf8_lossy(&output.stdout).into_owned()) }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_catalog_lists_the_functions_and_its_declaration_type_checks_scripts() {
    let tsc = match tsc() {
        Ok(tsc) => tsc,
        Err(why) if std::env::var_os("CI").is_some() => panic!("{why}"),
        Err(why) => return eprintln!("skipped: {why}"),
    };
    let (_app, addr) = start_app().await;
    let dir = TempDir::new("connector-catalog");
    let server = serve(&dir, addr);
    let alice = server.client(Some("key-alice-0001"));
    let catalog = alice.get("/v1/functions").await.json();
    let refund =
        catalog["functions"].as_array().unwrap().iter().find(|f| f["name"] == "billing.refund").unwrap().clone();
    assert_eq!(refund["namespace"], "billing");
    assert_eq!(
        refund["params"],
        json!([{ "name": "order_id", "schema": { "type": "string" } }, { "name": "amount", "schema": { "type": "integer" } }])
    );
    assert_eq!(refund["approval"], json!({ "when": "args.amount > 1000" }));
    assert_eq!((&refund["fourEyes"], &refund["approvers"]), (&json!(true), &json!(["approver"])));

    let response = alice.get("/v1/functions.d.ts").await;
    assert_eq!(response.status, 200);
    let declaration = response.text();
    assert!(declaration.contains("function refund(order_id: string, amount: number)"), "{declaration}");
    let good = "const o = await billing.order('A-1'); return await billing.refund(o.id, 1500);";
    type_checks(&dir, &tsc, &declaration, good).unwrap_or_else(|e| panic!("{e}\n{declaration}"));
    let bad = "const o = await billing.order(42); return await billing.refund(o.id, 1500);";
    let refused = type_checks(&dir, &tsc, &declaration, bad).expect_err("a number as order_id");
    assert!(refused.contains("not assignable to parameter of type 'string'"), "{refused}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_demo_refunds_through_its_connector_with_a_policy_a_signature_and_a_key() {
    let dir = TempDir::new("connector-demo");
    let server = Server::start(&dir, &[]);
    let acme = server.client(Some("demo-acme"));
    // The README's quickstart script.
    let id = acme.submit("const o = await billing.order(\"A-1002\"); return await billing.refund(o.id, 1500)").await;
    let approval = pending(&acme, &id).await;
    assert_eq!(approval["requests"][0]["request"]["summary"], "Refund 1500 cents on order A-1002", "{approval}");
    let db = support::Db::of(&dir);
    assert!(db.refunds("acme").await.is_empty(), "nothing refunded before the approval");
    let decided = acme.post(&format!("/v1/automations/{id}/decisions"), &decision(&approval, true)).await;
    assert_eq!(decided.status, 202, "{}", decided.text());
    let done = finished(&acme, &id).await;
    assert_eq!((&done["status"], &done["result"]["refunded"]), (&json!("completed"), &json!(1500)), "{done}");
    let keys = db.refund_keys("acme").await;
    assert_eq!(keys, [(format!("{id}:interrupt-2"), "A-1002".to_owned(), 1500)], "one refund, under the call's key");

    // Under the policy's threshold, no approval.
    let small = acme.submit("return await billing.refund('A-1001', 500)").await;
    let done = finished(&acme, &small).await;
    assert_eq!(done["result"]["refunded"], 500, "{done}");
    // The application refuses what the server did not sign, and says so in its own words.
    let forged =
        serde_json::to_vec(&json!({ "tenant": "acme", "arguments": { "order_id": "A-1001", "amount": 100 } })).unwrap();
    let refused =
        acme.send("POST", "/demo/billing/refund", &[("content-type", "application/json")], Some(&forged)).await;
    assert_eq!(refused.status, 401, "{}", refused.text());
    assert_eq!(db.refunds("acme").await.len(), 2);
    // A refund the order cannot take is the application's refusal, catchable with its code.
    let over = acme
        .submit("try { await billing.refund('Z-9', 5); return 'refunded'; } catch (e) { return e.details.code }")
        .await;
    let done = finished(&acme, &over).await;
    assert_eq!(done["result"], "REFUND_REFUSED", "{done}");
}
