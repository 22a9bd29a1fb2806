//! End-to-end tests of the HTTP approval service over real HTTP: each scenario starts its own
//! `resumable serve --demo` process on a fresh SQLite database, and again on a fresh PostgreSQL
//! schema when a test server is configured (and kills it at the end), talks
//! to it with a minimal HTTP/1.1 client, and counts effects in the database the server writes:
//! results, approvals and rejections, several rounds, a SIGKILLed server replaced by a new one,
//! duplicate and concurrent decisions, who may decide, bad input, event streams, cancellation.
//! The fault matrix, with kills at named points and at random, is in `faults.rs`.

#[macro_use]
mod support;

use serde_json::{Value, json};
use support::{Backend, Client, Db, Response, Server, TempDir, WAIT};

/// Reads an order, then asks to refund part of it.
const REFUND: &str = "const o = await orders.get('A-1002'); return await orders.refund(o.id, 1500);";

/// [`REFUND`], then a second or so of computation, so the automation is still running for a while
/// after its decision was delivered.
const REFUND_THEN_WORK: &str = "const o = await orders.get('A-1002');
    const r = await orders.refund(o.id, 1500);
    let x = 0;
    for (let i = 0; i < 3000000; i++) { x = (x + i) % 1000003; }
    return r;";

/// A submitter who may not decide, configured with `--keys` next to the demo keys.
const SUBMIT_ONLY_KEYS: &str =
    r#"{"keys":[{"key":"submit-only-key","actor":"bob","tenant":"acme","roles":["submitter"]}]}"#;

/// A server of its own, a client with the `demo-acme` key, and the server's database. Fields
/// drop in order: the server is killed before its directory is removed.
struct Fixture {
    server: Server,
    acme: Client,
    db: Db,
    dir: TempDir,
}

impl Fixture {
    /// Starts on a fresh database of `backend`, with `keys` (a keys file's JSON) passed as
    /// `--keys` if given; `None` on PostgreSQL when no test server is configured.
    fn start_on(backend: Backend, name: &str, keys: Option<&str>) -> Option<Fixture> {
        Some(Fixture::on(TempDir::on(backend, name)?, keys))
    }

    fn on(dir: TempDir, keys: Option<&str>) -> Fixture {
        let server = Server::start_with_keys(&dir, keys);
        Fixture { acme: server.client(Some("demo-acme")), db: Db::of(&dir), server, dir }
    }

    /// Kills the server with SIGKILL (if it still runs) and starts a new one on the same database
    /// and secret file.
    fn restart(&mut self) {
        self.server.kill();
        self.server = Server::start(&self.dir, &[]);
        self.acme = self.server.client(Some("demo-acme"));
    }
}

/// Submits `source` as `demo-acme`; the new automation's id.
async fn submit(client: &Client, source: &str) -> String {
    let response = client.post("/v1/automations", &json!({ "source": source })).await;
    assert_eq!(response.status, 202, "submit: {}", response.text());
    let id = response.json()["id"].as_str().expect("an id").to_owned();
    assert!(id.starts_with("run_"), "{id}");
    id
}

/// `GET /v1/automations/{id}`, which must succeed.
async fn view(client: &Client, id: &str) -> Value {
    let response = client.get(&format!("/v1/automations/{id}")).await;
    assert_eq!(response.status, 200, "get {id}: {}", response.text());
    response.json()
}

fn is_terminal(view: &Value) -> bool {
    matches!(view["status"].as_str(), Some("completed" | "failed" | "cancelled"))
}

/// Polls until `done` holds for the automation's view, which it returns.
async fn poll(client: &Client, id: &str, what: &str, done: impl Fn(&Value) -> bool) -> Value {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let view = view(client, id).await;
        if done(&view) {
            return view;
        }
        assert!(tokio::time::Instant::now() < deadline, "{id} never {what}: {view}");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

/// Waits until the automation waits for a decision (its status `waiting`, not just its pending
/// approval recorded: the view shows that a moment before the run is suspended) or has ended.
async fn settled(client: &Client, id: &str) -> Value {
    poll(client, id, "settled", |v| (v["status"] == "waiting" && !v["pendingApproval"].is_null()) || is_terminal(v))
        .await
}

/// Waits until the automation waits for a decision; returns the pending approval.
async fn pending(client: &Client, id: &str) -> Value {
    let view = settled(client, id).await;
    assert_eq!(view["status"], "waiting", "{view}");
    view["pendingApproval"].clone()
}

/// Waits until the automation has ended.
async fn finished(client: &Client, id: &str) -> Value {
    poll(client, id, "ended", is_terminal).await
}

/// A decision request deciding every pending request of `approval` the same way.
fn decide_all(approval: &Value, approved: bool) -> Value {
    let requests = approval["requests"].as_array().expect("requests");
    let decisions: Vec<Value> = requests
        .iter()
        .map(|r| json!({ "interruptionId": r["interruptionId"], "approved": approved, "reason": "checked" }))
        .collect();
    json!({ "decisions": decisions })
}

async fn decide(client: &Client, id: &str, body: &Value) -> Response {
    client.post(&format!("/v1/automations/{id}/decisions"), body).await
}

/// Asserts an error response: this status and `{"error": {"code", "message"}}` with this code.
#[track_caller]
fn assert_error(response: &Response, status: u16, code: &str) {
    assert_eq!(response.status, status, "{}", response.text());
    assert_eq!(response.header("content-type"), Some("application/json"), "{:?}", response.headers);
    let body = response.json();
    assert_eq!(body["error"]["code"], code, "{body}");
    assert!(body["error"]["message"].as_str().is_some_and(|m| !m.is_empty()), "{body}");
    assert_eq!(body.as_object().map(|o| o.len()), Some(1), "{body}");
}

/// Asserts that the automation still waits with exactly this pending approval.
async fn assert_still_waiting(client: &Client, id: &str, approval: &Value) {
    let view = view(client, id).await;
    assert_eq!(view["status"], "waiting", "{view}");
    assert_eq!(&view["pendingApproval"], approval, "{view}");
}

/// The whole event stream of `id` from `from`, after it ended.
async fn events(client: &Client, id: &str, from: u64) -> Vec<Value> {
    let (head, mut lines) = client.stream(&format!("/v1/automations/{id}/events?from={from}")).await;
    assert_eq!(head.status, 200, "{head:?}");
    lines.rest().await
}

fn indexes_and_types(events: &[Value]) -> Vec<(u64, String)> {
    events
        .iter()
        .map(|e| (e["index"].as_u64().expect("index"), e["event"]["type"].as_str().expect("type").to_owned()))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_server_says_how_its_worker_processes_are_confined() {
    let dir = TempDir::new("confined");
    let server = Server::start(&dir, &[]);
    let log = server.log_text();
    let line = log.lines().find(|l| l.contains("worker processes are confined")).unwrap_or_default();
    assert!(line.contains("seccomp allow-list") && line.contains("no new privileges"), "{log}");
    assert!(line.contains("3 open descriptors"), "{log}");
}

on_both_backends! {
    async fn a_plain_script_completes_with_its_result(backend) {
        let Some(f) = Fixture::start_on(backend, "plain", None) else { return };
        let id = submit(&f.acme, "return 6*7").await;
        let view = finished(&f.acme, &id).await;
        assert_eq!(view["status"], "completed", "{view}");
        assert_eq!(view["result"], 42);
        assert_eq!((&view["error"], &view["pendingApproval"], &view["rounds"]), (&Value::Null, &Value::Null, &json!(0)));
        assert_eq!((&view["id"], &view["tenant"], &view["submittedBy"]), (&json!(id), &json!("acme"), &json!("acme-demo")));
        assert!(view["completedAt"].is_u64(), "{view}");
        let all = events(&f.acme, &id, 0).await;
        assert_eq!(indexes_and_types(&all), [(0, "completed".to_owned())]);
        assert_eq!(all[0]["event"]["value"], 42);
    }
}

on_both_backends! {
    async fn a_submission_with_an_idempotency_key_starts_one_automation(backend) {
        let Some(f) = Fixture::start_on(backend, "idempotent", None) else { return };
        let body = json!({ "source": "return 6*7", "idempotencyKey": "order-42" }).to_string();
        let mut prepared = Vec::new();
        for _ in 0..16 {
            prepared.push(f.acme.prepare("POST", "/v1/automations", Some(body.as_bytes())).await);
        }
        let tasks: Vec<_> = prepared.into_iter().map(|p| tokio::spawn(p.send())).collect();
        let mut ids = Vec::new();
        for task in tasks {
            let response = task.await.expect("the request task");
            assert_eq!(response.status, 202, "{}", response.text());
            ids.push(response.json()["id"].clone());
        }
        ids.dedup();
        assert_eq!(ids.len(), 1, "{ids:?}");
        let id = ids[0].as_str().expect("an id");
        assert_eq!(finished(&f.acme, id).await["result"], 42);
        let other = submit(&f.acme, "return 6*7").await;
        assert_ne!(other, id, "without the key it is another automation");
        // The same key for another script is a conflict, not that script's id.
        let reused = f.acme.post("/v1/automations", &json!({ "source": "return 1", "idempotencyKey": "order-42" })).await;
        assert_eq!((reused.status, reused.json()["error"]["code"].clone()), (409, json!("IDEMPOTENCY_CONFLICT")));
    }
}

on_both_backends! {
    async fn an_approved_refund_happens_once_and_the_read_is_not_repeated(backend) {
        let Some(f) = Fixture::start_on(backend, "approve", None) else { return };
        let id = submit(&f.acme, REFUND).await;
        let approval = pending(&f.acme, &id).await;
        assert_eq!((&approval["automationId"], &approval["round"]), (&json!(id), &json!(1)));
        let requests = approval["requests"].as_array().expect("requests");
        assert_eq!(requests.len(), 1, "{approval}");
        assert_eq!(requests[0]["function"], "orders.refund");
        assert_eq!(requests[0]["request"], json!({ "kind": "refund-approval", "orderId": "A-1002", "amount": 1500 }));
        assert!(f.db.refunds("acme").await.is_empty(), "nothing refunded before the approval");

        // The approval is listed for acme's approvers only.
        let listed = f.acme.get("/v1/approvals").await;
        assert_eq!(listed.status, 200, "{}", listed.text());
        assert_eq!(listed.json()["approvals"], json!([approval]));
        let globex = f.server.client(Some("demo-globex")).get("/v1/approvals").await;
        assert_eq!(globex.json()["approvals"], json!([]), "{}", globex.text());

        let decided = decide(&f.acme, &id, &decide_all(&approval, true)).await;
        assert_eq!(decided.status, 202, "{}", decided.text());
        assert_eq!(decided.json(), json!({ "id": id, "round": 1 }));
        let view = finished(&f.acme, &id).await;
        assert_eq!(view["status"], "completed", "{view}");
        assert_eq!(view["rounds"], 1);
        assert_eq!(view["pendingApproval"], Value::Null);
        let result = &view["result"];
        assert_eq!(
            (&result["approved"], &result["orderId"], &result["refunded"]),
            (&json!(true), &json!("A-1002"), &json!(1500))
        );
        assert_eq!(f.db.refunds("acme").await, [("A-1002".to_owned(), 1500)]);
        assert_eq!(f.db.refunded_cents("acme", "A-1002").await, 1500);
        assert_eq!(f.db.host_calls(&id, "orders.get").await, 1, "orders.get was replayed, not run again");
        assert_eq!(f.acme.get("/v1/approvals").await.json()["approvals"], json!([]));
    }
}

on_both_backends! {
    async fn a_rejected_refund_changes_nothing_and_the_script_sees_why(backend) {
        let Some(f) = Fixture::start_on(backend, "reject", None) else { return };
        let id = submit(&f.acme, REFUND).await;
        let approval = pending(&f.acme, &id).await;
        let decided = decide(&f.acme, &id, &decide_all(&approval, false)).await;
        assert_eq!(decided.status, 202, "{}", decided.text());
        let view = finished(&f.acme, &id).await;
        assert_eq!(view["status"], "completed", "{view}");
        assert_eq!(view["result"], json!({ "approved": false, "orderId": "A-1002", "reason": "checked" }));
        assert!(f.db.refunds("acme").await.is_empty());
        assert_eq!(f.db.refunded_cents("acme", "A-1002").await, 0);
        assert_eq!(f.db.host_calls(&id, "orders.get").await, 1);
    }
}

on_both_backends! {
    async fn two_rounds_the_first_a_parallel_batch_decided_in_one_request(backend) {
        let Some(f) = Fixture::start_on(backend, "rounds", None) else { return };
        let source = "const both = await Promise.all([orders.refund('A-1001', 100), orders.refund('A-1003', 200)]);
            const last = await orders.refund('A-1004', 300);
            return [both.map(r => r.refunded), last.refunded];";
        let id = submit(&f.acme, source).await;
        let first = pending(&f.acme, &id).await;
        assert_eq!(first["round"], 1);
        let orders: Vec<&Value> = first["requests"].as_array().expect("requests").iter().map(|r| &r["request"]).collect();
        assert_eq!(
            orders,
            [
                &json!({ "kind": "refund-approval", "orderId": "A-1001", "amount": 100 }),
                &json!({ "kind": "refund-approval", "orderId": "A-1003", "amount": 200 }),
            ],
            "both refunds wait in one batch"
        );

        // A batch decides each request at most once, and decides at least one.
        let ids: Vec<Value> =
            first["requests"].as_array().expect("requests").iter().map(|r| r["interruptionId"].clone()).collect();
        let twice = json!({ "decisions": [
            { "interruptionId": ids[0], "approved": true },
            { "interruptionId": ids[0], "approved": true },
            { "interruptionId": ids[1], "approved": true },
        ] });
        assert_error(&decide(&f.acme, &id, &twice).await, 422, "INVALID_DECISIONS");
        assert_error(&decide(&f.acme, &id, &json!({ "decisions": [] })).await, 422, "INVALID_DECISIONS");
        assert_still_waiting(&f.acme, &id, &first).await;

        // A batch may decide some of the requests: the round waits for the rest, and nothing
        // resumes until then.
        let only_one = json!({ "decisions": [{ "interruptionId": ids[0], "approved": true }] });
        let decided = decide(&f.acme, &id, &only_one).await;
        assert_eq!(decided.json(), json!({ "id": id, "round": 1 }), "{}", decided.text());
        assert_error(&decide(&f.acme, &id, &only_one).await, 409, "ALREADY_DECIDED");
        let partly = view(&f.acme, &id).await;
        assert_eq!(partly["pendingApproval"]["progress"][0]["approvedBy"], json!(["acme-demo"]), "{partly}");
        assert_eq!(partly["pendingApproval"]["progress"][1]["approvedBy"], json!([]), "{partly}");
        assert!(f.db.refunds("acme").await.is_empty());
        let the_other = json!({ "decisions": [{ "interruptionId": ids[1], "approved": true }] });
        let decided = decide(&f.acme, &id, &the_other).await;
        assert_eq!(decided.json(), json!({ "id": id, "round": 1 }), "{}", decided.text());
        let second = pending(&f.acme, &id).await;
        assert_eq!(second["round"], 2, "{second}");
        assert_eq!(second["requests"].as_array().map(Vec::len), Some(1));
        assert_eq!(second["requests"][0]["request"]["orderId"], "A-1004");
        assert_eq!(f.db.refunds("acme").await.len(), 2, "the first batch is applied before the second round");

        // Round 1's batch again: refused, and round 2 is still open. (Today this is 422: a decision
        // request names no round, so a late duplicate is judged against round 2's requests.)
        let again = decide(&f.acme, &id, &decide_all(&first, true)).await;
        assert!(matches!(again.status, 409 | 422), "{} {}", again.status, again.text());
        assert_still_waiting(&f.acme, &id, &second).await;

        let decided = decide(&f.acme, &id, &decide_all(&second, true)).await;
        assert_eq!(decided.json(), json!({ "id": id, "round": 2 }), "{}", decided.text());
        let view = finished(&f.acme, &id).await;
        assert_eq!(view["status"], "completed", "{view}");
        assert_eq!((&view["result"], &view["rounds"]), (&json!([[100, 200], 300]), &json!(2)));
        let mut refunds = f.db.refunds("acme").await;
        refunds.sort();
        assert_eq!(refunds, [("A-1001".to_owned(), 100), ("A-1003".to_owned(), 200), ("A-1004".to_owned(), 300)]);
        let types = indexes_and_types(&events(&f.acme, &id, 0).await);
        let expected = ["approval_requested", "decided", "approval_requested", "decided", "completed"];
        assert_eq!(types, expected.iter().enumerate().map(|(i, t)| (i as u64, t.to_string())).collect::<Vec<_>>());
    }
}

on_both_backends! {
    async fn a_server_killed_while_waiting_is_replaced_and_the_automation_finishes_once(backend) {
        let Some(mut f) = Fixture::start_on(backend, "restart", None) else { return };
        let id = submit(&f.acme, REFUND).await;
        let approval = pending(&f.acme, &id).await;
        assert_eq!(f.db.host_calls(&id, "orders.get").await, 1);

        f.restart();
        assert_still_waiting(&f.acme, &id, &approval).await;
        let decided = decide(&f.acme, &id, &decide_all(&approval, true)).await;
        assert_eq!(decided.status, 202, "{}", decided.text());
        let view = finished(&f.acme, &id).await;
        assert_eq!(view["status"], "completed", "{view}\n{}", f.server.log_text());
        assert_eq!(view["result"]["refunded"], 1500, "{view}");
        assert_eq!(f.db.refunds("acme").await, [("A-1002".to_owned(), 1500)]);
        assert_eq!(f.db.host_calls(&id, "orders.get").await, 1, "orders.get did not run again after the restart");
    }
}

on_both_backends! {
    async fn sigterm_stops_the_server_gracefully_and_a_new_one_finishes_the_automation(backend) {
        let Some(mut f) = Fixture::start_on(backend, "sigterm", None) else { return };
        let id = submit(&f.acme, REFUND).await;
        let approval = pending(&f.acme, &id).await;
        let status = f.server.terminate(WAIT).await.expect("the server stops on SIGTERM");
        assert!(status.success(), "{status:?}\n{}", f.server.log_text());
        f.restart();
        assert_still_waiting(&f.acme, &id, &approval).await;
        assert_eq!(decide(&f.acme, &id, &decide_all(&approval, true)).await.status, 202);
        assert_eq!(finished(&f.acme, &id).await["result"]["refunded"], 1500);
        assert_eq!(f.db.refunds("acme").await.len(), 1);
        assert_eq!(f.db.host_calls(&id, "orders.get").await, 1);
    }
}

on_both_backends! {
    /// A live event stream of an automation that waits does not hold the server up on SIGTERM:
    /// graceful shutdown ends the stream instead of waiting for the automation to end.
    async fn sigterm_ends_live_event_streams(backend) {
        let Some(mut f) = Fixture::start_on(backend, "sigterm_stream", None) else { return };
        let id = submit(&f.acme, REFUND).await;
        pending(&f.acme, &id).await;
        let (head, mut live) = f.acme.stream(&format!("/v1/automations/{id}/events?from=0")).await;
        assert_eq!(head.status, 200);
        assert_eq!(live.next_json().await.expect("an event")["index"], 0);
        let status = f.server.terminate(std::time::Duration::from_secs(15)).await;
        assert!(status.is_some(), "the server still runs 15 s after SIGTERM, held by an open event stream");
        assert_eq!(live.next_line().await, None, "the stream ends");
    }
}

on_both_backends! {
    /// A server SIGKILLed while the approved round runs, after its refund was applied, is
    /// replaced (a 1 s lease lets it take over soon); the round runs again from its continuation
    /// and the refund is not applied twice.
    async fn a_server_killed_while_the_approved_round_runs_refunds_once(backend) {
        let Some(dir) = TempDir::on(backend, "crash_mid_round") else { return };
        let server = Server::start(&dir, &["--lease-secs", "1"]);
        let mut f = Fixture { acme: server.client(Some("demo-acme")), db: Db::of(&dir), server, dir };
        let id = submit(&f.acme, REFUND_THEN_WORK).await;
        let approval = pending(&f.acme, &id).await;
        assert_eq!(decide(&f.acme, &id, &decide_all(&approval, true)).await.status, 202);
        let deadline = tokio::time::Instant::now() + WAIT;
        while f.db.refunds("acme").await.is_empty() {
            assert!(tokio::time::Instant::now() < deadline, "the refund was never applied");
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        f.server.kill();
        f.server = Server::start(&f.dir, &["--lease-secs", "1"]);
        f.acme = f.server.client(Some("demo-acme"));
        let before = view(&f.acme, &id).await;
        assert!(!is_terminal(&before), "killed too late to test anything: {before}");
        let view = poll(&f.acme, &id, "ended", is_terminal).await;
        assert_eq!(view["status"], "completed", "{view}\n{}", f.server.log_text());
        assert_eq!(view["result"]["refunded"], 1500, "{view}");
        assert_eq!(f.db.refunds("acme").await, [("A-1002".to_owned(), 1500)]);
        assert_eq!(f.db.refunded_cents("acme", "A-1002").await, 1500);
        assert_eq!(f.db.host_calls(&id, "orders.get").await, 1);
    }
}

/// Two rounds: a refund of A-1004, then one of A-1002.
const TWO_REFUNDS: &str =
    "const a = await orders.refund('A-1004', 100); const b = await orders.refund('A-1002', 50); return [a, b];";

/// Three concurrent copies of one decision.
async fn three_at_once(client: &Client, id: &str, body: &Value) -> Vec<Response> {
    let path = format!("/v1/automations/{id}/decisions");
    let mut prepared = Vec::new();
    for _ in 0..3 {
        prepared.push(client.prepare("POST", &path, Some(body.to_string().as_bytes())).await);
    }
    let tasks: Vec<_> = prepared.into_iter().map(|p| tokio::spawn(p.send())).collect();
    let mut responses = Vec::new();
    for task in tasks {
        responses.push(task.await.expect("the request task"));
    }
    responses
}

on_both_backends! {
    /// A decided interruption is 409 ALREADY_DECIDED whenever it is decided again: concurrently,
    /// after its round moved on, after the automation ended, repeating or contradicting the
    /// decision; 410 only for ids that were never decided in an automation that ended.
    async fn a_repeated_decision_is_a_conflict_whenever_it_arrives(backend) {
        let Some(f) = Fixture::start_on(backend, "twice", None) else { return };
        let id = submit(&f.acme, TWO_REFUNDS).await;
        let first = pending(&f.acme, &id).await;
        let (approve, reject) = (decide_all(&first, true), decide_all(&first, false));
        let responses = three_at_once(&f.acme, &id, &approve).await;
        let statuses: Vec<u16> = responses.iter().map(|r| r.status).collect();
        assert_eq!(statuses.iter().filter(|&&s| s == 202).count(), 1, "{statuses:?}");
        for response in responses.iter().filter(|r| r.status != 202) {
            assert_error(response, 409, "ALREADY_DECIDED");
        }
        // The round moved on: round 2 waits for its own decision.
        let second = poll(&f.acme, &id, "asked again", |v| v["pendingApproval"]["round"] == 2).await;
        let second = second["pendingApproval"].clone();
        assert_error(&decide(&f.acme, &id, &approve).await, 409, "ALREADY_DECIDED");
        assert_error(&decide(&f.acme, &id, &reject).await, 409, "ALREADY_DECIDED");
        assert_eq!(decide(&f.acme, &id, &decide_all(&second, false)).await.status, 202);
        let view = finished(&f.acme, &id).await;
        assert_eq!(view["status"], "completed", "{view}");
        for body in [&approve, &reject, &decide_all(&second, false), &decide_all(&second, true)] {
            assert_error(&decide(&f.acme, &id, body).await, 409, "ALREADY_DECIDED");
        }
        let never = json!({ "decisions": [{ "interruptionId": "interrupt-9", "approved": true }] });
        assert_error(&decide(&f.acme, &id, &never).await, 410, "ENDED");
        assert_eq!(f.db.refunds("acme").await, [("A-1004".to_owned(), 100)]);
    }
}

on_both_backends! {
    async fn of_32_concurrent_decisions_exactly_one_is_accepted(backend) {
        let Some(f) = Fixture::start_on(backend, "concurrent", None) else { return };
        let id = submit(&f.acme, REFUND_THEN_WORK).await;
        let approval = pending(&f.acme, &id).await;
        let path = format!("/v1/automations/{id}/decisions");
        let mut prepared = Vec::new();
        for i in 0..32 {
            let body = decide_all(&approval, i % 2 == 0).to_string();
            prepared.push(f.acme.prepare("POST", &path, Some(body.as_bytes())).await);
        }
        let tasks: Vec<_> = prepared.into_iter().map(|p| tokio::spawn(p.send())).collect();
        let mut responses = Vec::new();
        for task in tasks {
            responses.push(task.await.expect("the request task"));
        }
        let statuses: Vec<u16> = responses.iter().map(|r| r.status).collect();
        assert_eq!(statuses.iter().filter(|&&s| s == 202).count(), 1, "{statuses:?}");
        for response in responses.iter().filter(|r| r.status != 202) {
            assert_error(response, 409, "ALREADY_DECIDED");
        }
        let view = finished(&f.acme, &id).await;
        assert_eq!(view["status"], "completed", "{view}");
        let approved = view["result"]["approved"].as_bool().expect("the refund's answer");
        assert_eq!(f.db.refunds("acme").await.len(), usize::from(approved), "{view}");
        let decided: Vec<Value> =
            events(&f.acme, &id, 0).await.into_iter().filter(|e| e["event"]["type"] == "decided").collect();
        assert_eq!(decided.len(), 1, "{decided:?}");
    }
}

on_both_backends! {
    async fn callers_that_may_not_decide_resume_nothing(backend) {
        let Some(f) = Fixture::start_on(backend, "authz", Some(SUBMIT_ONLY_KEYS)) else { return };
        let id = submit(&f.acme, REFUND).await;
        let approval = pending(&f.acme, &id).await;
        let body = decide_all(&approval, true);
        let path = format!("/v1/automations/{id}/decisions");

        // No key, an unknown key, another scheme.
        assert_error(&decide(&f.server.client(None), &id, &body).await, 401, "UNAUTHORIZED");
        assert_error(&decide(&f.server.client(Some("not-a-configured-key")), &id, &body).await, 401, "UNAUTHORIZED");
        assert_error(&f.server.client(None).get("/v1/approvals").await, 401, "UNAUTHORIZED");
        assert_error(&f.server.client(None).get(&format!("/v1/automations/{id}")).await, 401, "UNAUTHORIZED");

        // Another tenant's approver can neither decide nor read acme's automation.
        let globex = f.server.client(Some("demo-globex"));
        assert_error(&decide(&globex, &id, &body).await, 403, "FORBIDDEN");
        assert_error(&globex.get(&format!("/v1/automations/{id}")).await, 403, "FORBIDDEN");
        assert_error(&globex.get(&format!("/v1/automations/{id}/events")).await, 403, "FORBIDDEN");
        assert_error(&globex.post(&format!("/v1/automations/{id}/cancel"), &json!({})).await, 403, "FORBIDDEN");

        // A submitter of the same tenant (from --keys, next to the demo keys) may submit and read,
        // not decide or list approvals.
        let bob = f.server.client(Some("submit-only-key"));
        assert_error(&bob.post_raw(&path, body.to_string().as_bytes()).await, 403, "NOT_APPROVER");
        assert_error(&bob.get("/v1/approvals").await, 403, "FORBIDDEN");
        assert_eq!(view(&bob, &id).await["pendingApproval"], approval);
        let bobs = submit(&bob, "return 'bob'").await;
        assert_eq!(finished(&bob, &bobs).await["submittedBy"], "bob");

        // A decision for an interruption that is not pending.
        let unknown = json!({ "decisions": [{ "interruptionId": "interrupt-99", "approved": true }] });
        assert_error(&decide(&f.acme, &id, &unknown).await, 422, "INVALID_DECISIONS");
        let not_an_id = json!({ "decisions": [{ "interruptionId": "refund", "approved": true }] });
        assert_error(&decide(&f.acme, &id, &not_an_id).await, 422, "INVALID_DECISIONS");

        assert_still_waiting(&f.acme, &id, &approval).await;
        assert!(f.db.refunds("acme").await.is_empty());
        let (_, mut live) = f.acme.stream(&format!("/v1/automations/{id}/events?from=0")).await;
        let first = live.next_json().await.expect("an event");
        assert_eq!((&first["index"], &first["event"]["type"]), (&json!(0), &json!("approval_requested")));

        // The rightful approver still can; the next event is its decision.
        assert_eq!(decide(&f.acme, &id, &body).await.status, 202);
        let next = live.next_json().await.expect("an event");
        assert_eq!((&next["index"], &next["event"]["type"]), (&json!(1), &json!("decided")), "nothing was decided before");
        assert_eq!(finished(&f.acme, &id).await["status"], "completed");
        assert_eq!(f.db.refunds("acme").await.len(), 1);
    }
}

on_both_backends! {
    async fn bad_input_is_refused_with_an_error_body_and_the_server_keeps_answering(backend) {
        let Some(mut f) = Fixture::start_on(backend, "input", None) else { return };
        let submit_path = "/v1/automations";
        let bad_submissions: &[(&[u8], u16, &str)] = &[
            (b"{\"source\": ", 400, "BAD_REQUEST"),
            (b"not json at all", 400, "BAD_REQUEST"),
            (b"", 400, "BAD_REQUEST"),
            (b"[]", 400, "BAD_REQUEST"),
            (b"{}", 400, "BAD_REQUEST"),
            (b"{\"source\": \"return 1\", \"extra\": true}", 400, "BAD_REQUEST"),
            (b"{\"source\": 42}", 400, "BAD_REQUEST"),
            (b"{\"source\": \"return 1\", \"idempotencyKey\": 5}", 400, "BAD_REQUEST"),
            (b"{\"source\": \"return 1\", \"idempotencyKey\": \"\"}", 400, "BAD_REQUEST"),
            (b"{\"source\": \"\xff\xfe\"}", 400, "BAD_REQUEST"),
        ];
        for (body, status, code) in bad_submissions {
            let response = f.acme.post_raw(submit_path, body).await;
            assert_error(&response, *status, code);
        }

        // A script of exactly 256 KiB is accepted; one byte more is too large; so is a body over 1 MiB.
        let mut limit = "return 1; //".to_owned();
        limit.push_str(&"x".repeat(256 * 1024 - limit.len()));
        let at_limit = submit(&f.acme, &limit).await;
        assert_eq!(finished(&f.acme, &at_limit).await["result"], 1);
        let big = format!("{limit}x");
        assert_error(&f.acme.post(submit_path, &json!({ "source": big })).await, 413, "TOO_LARGE");
        let huge = format!("return 1; // {}", "x".repeat(1024 * 1024));
        assert_error(&f.acme.post(submit_path, &json!({ "source": huge })).await, 413, "TOO_LARGE");

        // Decisions and queries are just as strict.
        let id = submit(&f.acme, REFUND).await;
        let approval = pending(&f.acme, &id).await;
        let interruption = approval["requests"][0]["interruptionId"].as_str().expect("an id").to_owned();
        let decisions = format!("/v1/automations/{id}/decisions");
        let bad_decisions = [
            "{\"decisions\": [".to_owned(),
            "{\"decisions\": {}}".to_owned(),
            "{\"decision\": []}".to_owned(),
            format!("{{\"decisions\": [{{\"interruptionId\": \"{interruption}\", \"approved\": \"yes\"}}]}}"),
            format!("{{\"decisions\": [{{\"interruptionId\": \"{interruption}\", \"approved\": true, \"extra\": 1}}]}}"),
            format!("{{\"decisions\": [{{\"interruptionId\": \"{interruption}\"}}]}}"),
            format!(
                "{{\"decisions\": [{{\"interruptionId\": \"{interruption}\", \"approved\": true}}], \"actor\": \"x\"}}"
            ),
        ];
        for body in &bad_decisions {
            assert_error(&f.acme.post_raw(&decisions, body.as_bytes()).await, 400, "BAD_REQUEST");
        }
        let long_reason =
            json!({ "decisions": [{ "interruptionId": interruption, "approved": true, "reason": "r".repeat(1001) }] });
        assert_error(&decide(&f.acme, &id, &long_reason).await, 422, "INVALID_DECISIONS");
        for query in ["from=abc", "from=-1", "from=1.5", "since=0"] {
            let response = f.acme.get(&format!("/v1/automations/{id}/events?{query}")).await;
            assert_error(&response, 400, "BAD_REQUEST");
        }
        assert_error(&f.acme.get("/v1/nothing-here").await, 404, "NOT_FOUND");
        assert_error(&f.acme.request("DELETE", "/v1/automations", None).await, 405, "METHOD_NOT_ALLOWED");
        assert_still_waiting(&f.acme, &id, &approval).await;

        // Still serving, and still working.
        assert!(f.server.is_running(), "{}", f.server.log_text());
        let health = f.acme.get("/healthz").await;
        assert_eq!((health.status, health.json()), (200, json!({ "ok": true })));
        assert_eq!(decide(&f.acme, &id, &decide_all(&approval, true)).await.status, 202);
        assert_eq!(finished(&f.acme, &id).await["result"]["refunded"], 1500);
        let plain = submit(&f.acme, "return 6*7").await;
        assert_eq!(finished(&f.acme, &plain).await["result"], 42);
    }
}

on_both_backends! {
    async fn event_streams_are_complete_resumable_from_the_middle_and_live(backend) {
        let Some(f) = Fixture::start_on(backend, "events", None) else { return };
        let id = submit(&f.acme, REFUND).await;
        let approval = pending(&f.acme, &id).await;

        // Two live readers, one from the start and one from the middle, opened while it waits.
        let (head, mut live) = f.acme.stream(&format!("/v1/automations/{id}/events?from=0")).await;
        assert_eq!(head.status, 200, "{head:?}");
        assert_eq!(head.header("content-type"), Some("application/x-ndjson"));
        let (head, mut middle) = f.acme.stream(&format!("/v1/automations/{id}/events?from=1")).await;
        assert_eq!(head.status, 200, "{head:?}");
        let first = live.next_json().await.expect("the first event");
        assert_eq!(first["index"], 0);
        assert_eq!(first["event"]["type"], "approval_requested");
        assert_eq!(first["event"]["pending"], approval["requests"]);

        assert_eq!(decide(&f.acme, &id, &decide_all(&approval, true)).await.status, 202);
        let rest = live.rest().await;
        assert_eq!(indexes_and_types(&rest), [(1, "decided".to_owned()), (2, "completed".to_owned())], "{rest:?}");
        assert_eq!(rest[0]["event"]["actor"], "acme-demo");
        assert_eq!(rest[0]["event"]["decisions"][0]["approved"], true);
        assert_eq!(rest[1]["event"]["value"]["refunded"], 1500);
        assert_eq!(middle.rest().await, rest, "the reader from the middle got the same events");
        assert_eq!(finished(&f.acme, &id).await["status"], "completed");

        // After the end: all of it from 0, the rest from the middle, nothing from the end on.
        let all = events(&f.acme, &id, 0).await;
        assert_eq!(all[0], first);
        assert_eq!(&all[1..], &rest[..]);
        assert_eq!(events(&f.acme, &id, 1).await, rest);
        assert_eq!(events(&f.acme, &id, 2).await, rest[1..]);
        assert_eq!(events(&f.acme, &id, 3).await, Vec::<Value>::new());
        assert_eq!(events(&f.acme, &id, 1000).await, Vec::<Value>::new());
        // `from` defaults to 0.
        assert_eq!(f.acme.get(&format!("/v1/automations/{id}/events")).await.body_lines(), all);
    }
}

on_both_backends! {
    async fn unknown_automations_are_not_found_and_cancelled_ones_are_gone(backend) {
        let Some(f) = Fixture::start_on(backend, "cancel", None) else { return };
        for path in [
            "/v1/automations/run_0123456789abcdef0123456789abcdef",
            "/v1/automations/run_0123456789abcdef0123456789abcdef/events",
            "/v1/automations/not-an-id",
            "/v1/automations/run_xyz/events",
        ] {
            assert_error(&f.acme.get(path).await, 404, "NOT_FOUND");
        }
        let unknown = "run_0123456789abcdef0123456789abcdef";
        let body = json!({ "decisions": [{ "interruptionId": "interrupt-1", "approved": true }] });
        assert_error(&decide(&f.acme, unknown, &body).await, 404, "NOT_FOUND");
        assert_error(&f.acme.post(&format!("/v1/automations/{unknown}/cancel"), &json!({})).await, 404, "NOT_FOUND");

        let id = submit(&f.acme, REFUND).await;
        let approval = pending(&f.acme, &id).await;
        let (head, mut live) = f.acme.stream(&format!("/v1/automations/{id}/events?from=0")).await;
        assert_eq!(head.status, 200);
        let cancel_path = format!("/v1/automations/{id}/cancel");
        let cancelled = f.acme.post_raw(&cancel_path, b"").await;
        assert_eq!(cancelled.status, 202, "{}", cancelled.text());
        assert_eq!(cancelled.json()["id"], id.as_str());
        let view = finished(&f.acme, &id).await;
        assert_eq!(view["status"], "cancelled", "{view}");
        assert_eq!(view["error"]["code"], "AUTOMATION_CANCELLED", "{view}");
        assert_eq!((&view["pendingApproval"], &view["result"]), (&Value::Null, &Value::Null));

        assert_error(&decide(&f.acme, &id, &decide_all(&approval, true)).await, 410, "ENDED");
        assert_error(&f.acme.post_raw(&cancel_path, b"").await, 410, "ENDED");
        assert!(f.db.refunds("acme").await.is_empty());
        // A live reader of a cancelled automation is not left hanging.
        let events = live.rest().await;
        assert_eq!(events.first().map(|e| &e["event"]["type"]), Some(&json!("approval_requested")), "{events:?}");
        assert!(events.iter().all(|e| e["event"]["type"] != "decided"), "{events:?}");
    }
}

/// The lines of a complete NDJSON response, parsed.
trait BodyLines {
    fn body_lines(&self) -> Vec<Value>;
}

impl BodyLines for Response {
    fn body_lines(&self) -> Vec<Value> {
        assert_eq!(self.status, 200, "{}", self.text());
        self.text().lines().map(|l| serde_json::from_str(l).expect("a JSON line")).collect()
    }
}

/// A client that presents many unknown keys is refused for a while, whatever key it sends next.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_guessing_keys_is_refused_for_a_while() {
    let Some(fixture) = Fixture::start_on(Backend::Sqlite, "throttle", None) else { return };
    let guesser = fixture.server.client(Some("guessed-key"));
    for _ in 0..20 {
        assert_error(&guesser.get("/v1/approvals").await, 401, "UNAUTHORIZED");
    }
    let refused = guesser.get("/v1/approvals").await;
    assert_error(&refused, 429, "TOO_MANY_FAILURES");
    // The same address with a good key waits too: keys cannot be tried in turn.
    assert_error(&fixture.acme.get("/v1/approvals").await, 429, "TOO_MANY_FAILURES");
}
