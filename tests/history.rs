//! The run history end to end, `GET /v1/automations` and `GET /v1/sessions`, on SQLite and (when
//! a test server is configured) PostgreSQL: newest first, the caller's tenant only, filtered by
//! status, paged with a cursor that neither skips nor repeats, and bad queries refused.

#[macro_use]
#[allow(dead_code)]
mod support;

use std::time::Duration;

use serde_json::{Value, json};
use support::{Backend, Client, Server, TempDir};

/// Reads an order, then asks to refund part of it: it waits for approval.
const REFUND: &str = "const o = await orders.get('A-1002'); return await orders.refund(o.id, 1500);";

const KEYS: &str = r#"{"keys":[
    {"key":"auditor-key","actor":"carol","tenant":"acme","roles":["auditor"]},
    {"key":"globex-key","actor":"gus","tenant":"globex","roles":["submitter"]}
]}"#;

async fn list(client: &Client, path: &str) -> Value {
    let response = client.get(path).await;
    assert_eq!(response.status, 200, "{path}: {}", response.text());
    response.json()
}

fn ids(page: &Value, key: &str) -> Vec<String> {
    page[key].as_array().unwrap().iter().map(|a| a["id"].as_str().unwrap().to_owned()).collect()
}

fn assert_bad_request(response: &support::Response) {
    assert_eq!(
        (response.status, &response.json()["error"]["code"]),
        (400, &json!("BAD_REQUEST")),
        "{}",
        response.text()
    );
}

on_both_backends! {
    async fn the_history_lists_a_tenants_runs_newest_first_by_status_and_page(backend) {
        let Some(dir) = TempDir::on(backend, "history") else { return };
        let server = Server::start_with_keys(&dir, Some(KEYS));
        let (acme, globex) = (server.client(Some("demo-acme")), server.client(Some("globex-key")));
        let theirs = globex.submit("return 0").await;
        let mut submitted = Vec::new();
        for source in ["return 1", "throw new Error('no')", REFUND, "return 2", "return 3"] {
            submitted.push(acme.submit(source).await);
            // Distinct creation times, so "newest first" is the order of submission reversed.
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let newest_first: Vec<String> = submitted.iter().rev().cloned().collect();
        let all = acme.poll("/v1/automations", |page| {
            let settled = |a: &Value| matches!(a["status"].as_str(), Some("completed" | "failed" | "waiting"));
            page["automations"].as_array().is_some_and(|a| a.len() == 5 && a.iter().all(settled))
        })
        .await;
        assert_eq!(ids(&all, "automations"), newest_first, "newest first, only the tenant's: {all}");
        assert_eq!(all["next"], Value::Null);
        let first = &all["automations"][0];
        assert_eq!((&first["status"], &first["result"], &first["submittedBy"]), (&json!("completed"), &json!(3), &json!("acme-demo")));
        assert!(first["createdAt"].as_i64().is_some() && first["completedAt"].as_i64().is_some(), "{first}");
        let failed = &all["automations"][3];
        assert_eq!((&failed["status"], &failed["error"]["code"]), (&json!("failed"), &json!("RUN_ERROR")), "{failed}");
        let keys: Vec<&String> = first.as_object().unwrap().keys().collect();
        assert_eq!(keys, ["completedAt", "createdAt", "error", "id", "result", "session", "status", "submittedBy", "updatedAt"]);

        // By status: one, or several.
        let waiting = list(&acme, "/v1/automations?status=waiting").await;
        assert_eq!(ids(&waiting, "automations"), [submitted[2].clone()]);
        let ended = list(&acme, "/v1/automations?status=completed,failed").await;
        assert_eq!(ids(&ended, "automations"), [&submitted[4], &submitted[3], &submitted[1], &submitted[0]].map(|s| s.clone()));

        // A page at a time: every automation once, in order.
        let mut paged = Vec::new();
        let mut path = "/v1/automations?limit=2".to_owned();
        loop {
            let page = list(&acme, &path).await;
            assert!(page["automations"].as_array().unwrap().len() <= 2);
            paged.extend(ids(&page, "automations"));
            match page["next"].as_str() {
                Some(next) => path = format!("/v1/automations?limit=2&cursor={next}"),
                None => break,
            }
        }
        assert_eq!(paged, newest_first);
        let waiting_pages = list(&acme, "/v1/automations?status=completed&limit=1").await;
        assert_eq!(ids(&waiting_pages, "automations"), [submitted[4].clone()]);
        let next = waiting_pages["next"].as_str().expect("more completed ones");
        let rest = list(&acme, &format!("/v1/automations?status=completed&limit=5&cursor={next}")).await;
        assert_eq!(ids(&rest, "automations"), [submitted[3].clone(), submitted[0].clone()]);

        // The other tenant sees its own only.
        assert_eq!(ids(&list(&globex, "/v1/automations").await, "automations"), [theirs]);

        // Sessions, and the automations their commands run.
        let mut sessions = Vec::new();
        for _ in 0..2 {
            let response = acme.post("/v1/sessions", &json!({})).await;
            assert_eq!(response.status, 201, "{}", response.text());
            sessions.push(response.json()["id"].as_str().unwrap().to_owned());
        }
        let response = acme.post(&format!("/v1/sessions/{}/commands", sessions[0]), &json!({ "source": "return 7" })).await;
        assert_eq!(response.status, 202, "{}", response.text());
        let with_command = acme.poll("/v1/automations?limit=1", |page| page["automations"][0]["session"] == sessions[0].as_str()).await;
        assert_eq!(acme.poll("/v1/automations?limit=1", |p| p["automations"][0]["status"] == "completed").await["automations"][0]["result"], 7, "{with_command}");
        let response = acme.request("DELETE", &format!("/v1/sessions/{}", sessions[1]), None).await;
        assert!(response.status < 300, "{}", response.text());
        let all_sessions = list(&acme, "/v1/sessions").await;
        assert_eq!(ids(&all_sessions, "sessions"), [sessions[1].clone(), sessions[0].clone()]);
        assert_eq!(all_sessions["sessions"][1]["createdBy"], "acme-demo");
        let ended = acme.poll("/v1/sessions?status=ended", |p| !p["sessions"].as_array().unwrap().is_empty()).await;
        assert_eq!(ids(&ended, "sessions"), [sessions[1].clone()]);
        assert_eq!(ended["sessions"][0]["live"], false);
        assert_eq!(ids(&list(&acme, "/v1/sessions?status=live").await, "sessions"), [sessions[0].clone()]);
        assert!(list(&globex, "/v1/sessions").await["sessions"].as_array().unwrap().is_empty());

        // Bad queries, and a key with no role that reads automations.
        for query in ["limit=0", "limit=201", "limit=x", "cursor=nope", "cursor=12.run_zz", "status=done", "status=waiting,", "since=1"] {
            assert_bad_request(&acme.get(&format!("/v1/automations?{query}")).await);
        }
        for query in ["status=waiting", "cursor=1.2", "limit=-1"] {
            assert_bad_request(&acme.get(&format!("/v1/sessions?{query}")).await);
        }
        for path in ["/v1/automations", "/v1/sessions"] {
            let response = server.client(Some("auditor-key")).get(path).await;
            assert_eq!((response.status, &response.json()["error"]["code"]), (403, &json!("FORBIDDEN")));
        }
        for path in [format!("/v1/automations/{}/events", submitted[2]), format!("/v1/sessions/{}/events", sessions[0]), format!("/v1/sessions/{}", sessions[0])] {
            let response = server.client(Some("auditor-key")).get(&path).await;
            assert_eq!((response.status, &response.json()["error"]["code"]), (403, &json!("FORBIDDEN")), "{path}");
        }
        // A NUL in a keyed submission is kept as U+FFFD, and the repeat is the same submission.
        let body = json!({ "source": "return automation.context()", "context": { "x": "a\u{0}b" }, "idempotencyKey": "nul" });
        let (first, again) = (acme.post("/v1/automations", &body).await, acme.post("/v1/automations", &body).await);
        assert_eq!((first.status, again.status), (202, 202), "{} {}", first.text(), again.text());
        assert_eq!(first.json()["id"], again.json()["id"]);
        let nul_key = json!({ "source": "return 1", "idempotencyKey": "a\u{0}" });
        assert_bad_request(&acme.post("/v1/automations", &nul_key).await);
        // An auditor reads an automation's status, not its script or its host calls.
        let audited = server.client(Some("auditor-key")).get(&format!("/v1/automations/{}", submitted[2])).await.json();
        assert_eq!((&audited["source"], &audited["calls"], &audited["status"]), (&Value::Null, &Value::Null, &json!("waiting")));
        let full = list(&acme, &format!("/v1/automations/{}", submitted[2])).await;
        assert_eq!(full["source"], REFUND);
        assert_eq!(full["calls"][0]["function"], "orders.get");
    }
}
