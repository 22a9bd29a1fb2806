//! Per-tenant quotas from the configuration file, end to end: past `max_automations` automations
//! under way or `max_sessions` live sessions, a submission or a session start is refused with 429
//! `QUOTA_EXCEEDED` and nothing starts; other tenants are not affected; ending one makes room.

#[allow(dead_code)]
mod support;

use serde_json::{Value, json};
use support::{Server, TempDir};

/// Reads an order, then asks to refund part of it: it waits for approval.
const REFUND: &str = "const o = await orders.get('A-1002'); return await orders.refund(o.id, 1500);";

const CONFIG: &str = r#"
[[keys]]
key = "key-globex-submitter"
actor = "gus"
tenant = "globex"
roles = ["submitter"]

[tenants.acme]
max_automations = 2
max_sessions = 1
"#;

fn assert_quota(response: &support::Response) {
    assert_eq!(response.status, 429, "{}", response.text());
    let body = response.json();
    assert_eq!(body["error"]["code"], "QUOTA_EXCEEDED", "{body}");
    assert!(body["error"]["message"].as_str().unwrap().contains("quota is"), "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_past_its_quota_is_refused_and_others_are_not() {
    let dir = TempDir::new("quotas");
    let config = dir.write_config(CONFIG);
    let server = Server::start(&dir, &["--config", config.to_str().unwrap()]);
    let (acme, globex) = (server.client(Some("demo-acme")), server.client(Some("key-globex-submitter")));
    let first = acme.submit(REFUND).await;
    acme.submit(REFUND).await;
    let waiting = acme.poll(&format!("/v1/automations/{first}"), |v| !v["pendingApproval"].is_null()).await;
    assert_quota(&acme.post("/v1/automations", &json!({ "source": "return 1" })).await);
    let listed = acme.get("/v1/automations").await.json();
    assert_eq!(listed["automations"].as_array().unwrap().len(), 2, "nothing started: {listed}");
    for _ in 0..3 {
        globex.submit("return 1").await;
    }

    // Deciding one ends it, which makes room.
    let decisions: Vec<Value> = waiting["pendingApproval"]["requests"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| json!({ "interruptionId": r["interruptionId"], "approved": true }))
        .collect();
    let decided = acme.post(&format!("/v1/automations/{first}/decisions"), &json!({ "decisions": decisions })).await;
    assert_eq!(decided.status, 202, "{}", decided.text());
    acme.poll(&format!("/v1/automations/{first}"), |v| v["status"] == "completed").await;
    let third = acme.submit("return 3").await;
    assert_eq!(acme.poll(&format!("/v1/automations/{third}"), |v| v["status"] == "completed").await["result"], 3);

    // Sessions.
    let session = acme.post("/v1/sessions", &json!({})).await;
    assert_eq!(session.status, 201, "{}", session.text());
    assert_quota(&acme.post("/v1/sessions", &json!({})).await);
    let id = session.json()["id"].as_str().unwrap().to_owned();
    assert!(acme.request("DELETE", &format!("/v1/sessions/{id}"), None).await.status < 300);
    let deadline = tokio::time::Instant::now() + support::WAIT;
    loop {
        let again = acme.post("/v1/sessions", &json!({})).await;
        if again.status == 201 {
            break;
        }
        assert_quota(&again);
        assert!(tokio::time::Instant::now() < deadline, "the destroyed session never made room");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}
