//! Webhooks, expiry and reminders end to end: `resumable serve --config` delivering automation
//! events to a receiver (a small axum app) that verifies every signature, fails on purpose, and
//! deduplicates by `webhook-id`, across a SIGKILL of the server.

#[allow(dead_code)]
mod support;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::IntoResponse as _;
use base64::Engine as _;
use hmac::{Hmac, KeyInit, Mac};
use serde_json::{Value, json};
use sha2::Sha256;
use support::{Server, TempDir};

const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
const HOOK_SECRET: &str = "whsec_c2VjcmV0LWZvci10aGUtd2ViaG9vay1yZWNlaXZlcg==";

/// One delivery the receiver accepted.
#[derive(Clone, Debug)]
struct Delivery {
    path: String,
    id: String,
    body: Value,
}

/// The receiving application.
#[derive(Clone, Default)]
struct Receiver {
    accepted: Arc<Mutex<Vec<Delivery>>>,
    /// Every request to `/hooks`, refused ones included.
    requests: Arc<Mutex<u32>>,
    bad_signatures: Arc<Mutex<u32>>,
}

impl Receiver {
    /// The accepted deliveries of `path`, each `webhook-id` once, in arrival order.
    fn unique(&self, path: &str) -> Vec<Delivery> {
        let mut seen = std::collections::BTreeSet::new();
        let accepted = self.accepted.lock().unwrap();
        accepted.iter().filter(|d| d.path == path && seen.insert(d.id.clone())).cloned().collect()
    }
}

fn verified(headers: &HeaderMap, body: &[u8]) -> bool {
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok()).unwrap_or_default().to_owned();
    let (id, timestamp, signature) = (header("webhook-id"), header("webhook-timestamp"), header("webhook-signature"));
    let key = base64::engine::general_purpose::STANDARD.decode(HOOK_SECRET.trim_start_matches("whsec_")).unwrap();
    let mut mac = Hmac::<Sha256>::new_from_slice(&key).unwrap();
    mac.update(format!("{id}.{timestamp}.").as_bytes());
    mac.update(body);
    let expected = base64::engine::general_purpose::STANDARD.encode(mac.finalize().into_bytes());
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs();
    timestamp.parse::<u64>().is_ok_and(|t| t.abs_diff(now) < 300) && signature == format!("v1,{expected}")
}

async fn receive(
    State(receiver): State<Receiver>,
    Path(path): Path<String>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> axum::response::Response {
    let n = {
        let mut requests = receiver.requests.lock().unwrap();
        *requests += u32::from(path == "hooks");
        *requests
    };
    if path != "connector" && path != "slack" && !verified(&headers, &body) {
        *receiver.bad_signatures.lock().unwrap() += 1;
        return StatusCode::UNAUTHORIZED.into_response();
    }
    if path == "connector" {
        return (StatusCode::OK, axum::Json(json!({ "ok": true }))).into_response();
    }
    // The first three deliveries fail.
    if path == "hooks" && n <= 3 {
        return StatusCode::INTERNAL_SERVER_ERROR.into_response();
    }
    let id = headers.get("webhook-id").and_then(|v| v.to_str().ok()).unwrap_or_default().to_owned();
    let body: Value = serde_json::from_slice(&body).unwrap();
    receiver.accepted.lock().unwrap().push(Delivery { path, id, body });
    StatusCode::NO_CONTENT.into_response()
}

async fn start_receiver() -> (Receiver, SocketAddr) {
    let receiver = Receiver::default();
    let app = axum::Router::new().route("/{path}", axum::routing::post(receive)).with_state(receiver.clone());
    (receiver, support::serve_router(app).await)
}

fn config(app: SocketAddr) -> String {
    format!(
        r#"
public_url = "https://inbox.example/"

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

[tenants.acme]
remind_after = "1s"

[functions."billing.refund"]
url = "http://{app}/connector"
params = [{{ name = "order_id", type = "string" }}, {{ name = "amount", type = "integer" }}]
secret = "{SECRET}"
approval = "always"
summary = "Refund {{amount}} on order {{order_id}} <!channel>"
remind_after = "1h"

[functions."ops.expiring"]
url = "http://{app}/connector"
secret = "{SECRET}"
approval = "always"
expires_after = "2s"

[functions."ops.strict"]
url = "http://{app}/connector"
secret = "{SECRET}"
approval = "always"
expires_after = "1s"
on_expiry = "fail"

[[webhooks]]
tenant = "acme"
url = "http://{app}/hooks"
events = ["approval_requested", "reminder", "decided", "expired", "completed", "failed"]
secret = "{HOOK_SECRET}"

[[webhooks]]
name = "channel"
tenant = "acme"
url = "http://{app}/slack"
events = ["approval_requested"]
format = "slack"
"#
    )
}

fn serve(dir: &TempDir, app: SocketAddr) -> Server {
    Server::start_with_config(dir, &config(app), &[])
}

/// Waits until `check` holds of the receiver (for up to a minute: deliveries back off).
async fn eventually(receiver: &Receiver, what: &str, check: impl Fn(&Receiver) -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while !check(receiver) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{what}; accepted: {:#?}",
            receiver.accepted.lock().unwrap().iter().map(|d| (&d.path, &d.body["type"])).collect::<Vec<_>>()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn types_of(deliveries: &[Delivery], automation: &str) -> Vec<String> {
    deliveries
        .iter()
        .filter(|d| d.body["automation"] == automation)
        .map(|d| d.body["type"].as_str().unwrap().to_owned())
        .collect()
}

const REFUND: &str =
    r#"const r = await billing.refund("A-1", 1500); return r.approved === false ? "rejected" : "refunded";"#;

#[tokio::test]
async fn every_event_arrives_once_in_order_despite_failures_and_a_killed_server() {
    let (receiver, app) = start_receiver().await;
    let dir = TempDir::new("webhooks-delivery");
    let mut server = serve(&dir, app);
    let alice = server.client(Some("key-alice-0001"));
    let (first, second) = (alice.submit(REFUND).await, alice.submit(REFUND).await);
    for id in [&first, &second] {
        alice.poll(&format!("/v1/automations/{id}"), |v| !v["pendingApproval"].is_null()).await;
    }
    // The first three deliveries fail, and the server dies while it backs off from them.
    eventually(&receiver, "three refused deliveries", |r| *r.requests.lock().unwrap() >= 3).await;
    server.kill();
    let server = serve(&dir, app);
    let (alice, bob) = (server.client(Some("key-alice-0001")), server.client(Some("key-bob-0001")));
    for id in [&first, &second] {
        let pending = alice.get(&format!("/v1/automations/{id}")).await.json()["pendingApproval"].clone();
        let interruption = pending["requests"][0]["interruptionId"].clone();
        let batch = json!({ "decisions": [{ "interruptionId": interruption, "approved": true }] });
        let response = bob.post(&format!("/v1/automations/{id}/decisions"), &batch).await;
        assert_eq!(response.status, 202, "{}", response.text());
    }
    for id in [&first, &second] {
        let view = alice.poll(&format!("/v1/automations/{id}"), |v| v["status"] == "completed").await;
        assert_eq!(view["result"], "refunded");
    }
    let complete = |r: &Receiver| {
        let unique = r.unique("hooks");
        [&first, &second].iter().all(|id| types_of(&unique, id).contains(&"completed".to_owned()))
    };
    eventually(&receiver, "every event of both automations", complete).await;
    let unique = receiver.unique("hooks");
    for id in [&first, &second] {
        assert_eq!(types_of(&unique, id), ["approval_requested", "decided", "completed"], "{id}");
    }
    assert_eq!(*receiver.bad_signatures.lock().unwrap(), 0);
    let requested = unique.iter().find(|d| d.body["type"] == "approval_requested").unwrap();
    assert_eq!(requested.body["tenant"], "acme");
    assert_eq!(requested.body["round"], 1);
    assert!(requested.body["at"].as_str().unwrap().ends_with('Z'));
    assert_eq!(requested.body["requests"][0]["summary"], "Refund 1500 on order A-1 <!channel>");
    let automation = requested.body["automation"].as_str().unwrap();
    assert_eq!(requested.body["inboxUrl"], format!("https://inbox.example/automations/{automation}"));

    // Slack: the incoming-webhook shape, with what the script controls escaped.
    let slack = receiver.unique("slack");
    assert_eq!(slack.len(), 2, "{slack:?}");
    for message in &slack {
        let text = message.body["text"].as_str().unwrap();
        assert!(text.contains("Refund 1500 on order A-1 &lt;!channel&gt;") && !text.contains("<!channel>"), "{text}");
        assert!(text.contains("amount 1500"), "{text}");
        assert_eq!(message.body["blocks"][0]["type"], "section");
        assert_eq!(message.body["blocks"][0]["text"]["type"], "mrkdwn");
        let link = message.body["blocks"][1]["elements"][0]["text"].as_str().unwrap();
        assert!(link.starts_with("<https://inbox.example/automations/run_") && link.ends_with("|Open in the inbox>"));
    }

    // The attempts are on record, the refused ones with their status.
    let attempts = alice.get("/v1/webhooks/deliveries?limit=100").await.json();
    let attempts = attempts["deliveries"].as_array().unwrap().clone();
    assert!(
        attempts.iter().filter(|a| a["outcome"] == "failed" && a["httpStatus"] == 500).count() >= 3,
        "{attempts:?}"
    );
    assert!(attempts.iter().any(|a| a["outcome"] == "delivered" && a["subscription"] == "channel"), "{attempts:?}");
}

#[tokio::test]
async fn an_undecided_request_is_reminded_then_expires_across_a_restart() {
    let (receiver, app) = start_receiver().await;
    let dir = TempDir::new("webhooks-expiry");
    let mut server = serve(&dir, app);
    let alice = server.client(Some("key-alice-0001"));
    let id = alice.submit("return await ops.expiring();").await;
    alice.poll(&format!("/v1/automations/{id}"), |v| !v["pendingApproval"].is_null()).await;
    server.kill();
    let server = serve(&dir, app);
    let (alice, bob) = (server.client(Some("key-alice-0001")), server.client(Some("key-bob-0001")));
    let view = alice.poll(&format!("/v1/automations/{id}"), |v| v["status"] == "completed").await;
    assert_eq!(view["result"]["approved"], false, "{view}");
    assert_eq!(view["result"]["reason"], "expired", "{view}");
    assert_eq!(view["result"]["decidedBy"], json!(["system"]), "{view}");
    let lines = alice.stream(&format!("/v1/automations/{id}/events")).await.1.rest().await;
    let events: Vec<Value> = lines.iter().map(|line| line["event"].clone()).collect();
    // A decision that comes too late is refused, as one on a decided request.
    let interruption = events[0]["pending"][0]["interruptionId"].clone();
    let batch = json!({ "decisions": [{ "interruptionId": interruption, "approved": true }] });
    let late = bob.post(&format!("/v1/automations/{id}/decisions"), &batch).await;
    assert_eq!(late.status, 409, "{}", late.text());
    let types: Vec<&str> = events.iter().filter_map(|e| e["type"].as_str()).collect();
    let (reminder, expired) = (types.iter().position(|t| *t == "reminder"), types.iter().position(|t| *t == "expired"));
    assert!(reminder.is_some() && reminder < expired, "{types:?}");
    let decided = events.iter().find(|e| e["type"] == "decided").unwrap();
    assert_eq!(decided["actor"], "system");
    assert_eq!(decided["decisions"][0]["reason"], "expired");
    // The reminder went out as a webhook event, before the expiry.
    let arrived = |r: &Receiver| types_of(&r.unique("hooks"), &id).contains(&"completed".to_owned());
    eventually(&receiver, "the automation's events", arrived).await;
    let delivered = types_of(&receiver.unique("hooks"), &id);
    let position = |t: &str| delivered.iter().position(|d| d == t);
    assert!(position("reminder").is_some() && position("reminder") < position("expired"), "{delivered:?}");
    assert!(position("expired") < position("completed"), "{delivered:?}");
}

#[tokio::test]
async fn an_expiry_that_fails_fails_the_automation() {
    let (_receiver, app) = start_receiver().await;
    let dir = TempDir::new("webhooks-expiry-fail");
    let server = serve(&dir, app);
    let alice = server.client(Some("key-alice-0001"));
    let id = alice.submit("return await ops.strict();").await;
    let view = alice.poll(&format!("/v1/automations/{id}"), |v| v["status"] == "failed").await;
    assert_eq!(view["error"]["code"], "APPROVAL_EXPIRED", "{view}");
}
