//! The audit trail end to end: `resumable serve --config` in front of a small axum application for
//! the connectors, an approval decided over HTTP, the tenant's log read back through
//! `GET /v1/audit`, and the log checked by the real `resumable audit verify`, before and after one
//! of its rows is edited in the database. Then appends from many connections at once.

#[macro_use]
#[allow(dead_code)]
mod support;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::process::{Command, Output};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response as AxumResponse};
use resumable::audit::{Actor, Audit, AuditEntry, AuditKind, Recorded};
use resumable::db::AppDb;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use support::{Backend, Client, Server, TempDir, WAIT};

const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

/// The SHA-256 of `bytes` in hex, as the log writes digests.
fn sha256(bytes: &[u8]) -> String {
    hex_simd::encode_to_string(Sha256::digest(bytes), hex_simd::AsciiCase::Lower)
}

/// The id the server gives an API key: the first 12 hex digits of its SHA-256.
fn key_id(key: &str) -> String {
    sha256(key.as_bytes())[..12].to_owned()
}

/// One request the application answered: its idempotency key, and the exact bytes of its body
/// and of the answer's.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Exchange {
    key: String,
    request: Vec<u8>,
    response: Vec<u8>,
}

/// The application behind the connectors: it keeps every exchange it answered, by path.
#[derive(Clone, Default)]
struct App {
    exchanges: Arc<Mutex<Vec<(String, Exchange)>>>,
    attempts: Arc<Mutex<HashMap<String, u32>>>,
}

impl App {
    fn exchanges(&self, path: &str) -> Vec<Exchange> {
        let all = self.exchanges.lock().unwrap();
        all.iter().filter(|(p, _)| p == path).map(|(_, e)| e.clone()).collect()
    }
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
    if path == "flaky" && attempt == 1 {
        return (StatusCode::SERVICE_UNAVAILABLE, "try later").into_response();
    }
    let key = headers.get("idempotency-key").and_then(|v| v.to_str().ok()).unwrap_or_default().to_owned();
    let request: Value = serde_json::from_slice(&body).unwrap();
    // The same answer for the same key, as an application keyed for idempotency gives.
    let answer = json!({ "ok": path, "key": key, "arguments": request["arguments"] }).to_string().into_bytes();
    let exchange = Exchange { key, request: body.to_vec(), response: answer.clone() };
    app.exchanges.lock().unwrap().push((path, exchange));
    ([(header::CONTENT_TYPE, "application/json")], answer).into_response()
}

async fn start_app() -> (App, SocketAddr) {
    let app = App::default();
    let router = axum::Router::new().route("/{path}", axum::routing::post(handle)).with_state(app.clone());
    let addr = support::serve_router(router).await;
    (app, addr)
}

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
key = "key-audra-0001"
actor = "audra"
tenant = "acme"
roles = ["auditor"]

[[keys]]
key = "key-gus-0001"
actor = "gus"
tenant = "globex"
roles = ["auditor"]

[functions."billing.refund"]
url = "http://{app}/refund"
params = [{{ name = "order_id", type = "string" }}, {{ name = "amount", type = "integer" }}]
secret = "{SECRET}"
approval = {{ when = "args.amount > 1000" }}
four_eyes = true

[functions."ops.flaky"]
url = "http://{app}/flaky"
secret = "{SECRET}"
retries = 3

[functions."ops.hold"]
url = "http://{app}/hold"
secret = "{SECRET}"
approval = "always"
"#
    )
}

/// A server on `dir` for the application at `app`, with `env` added to its environment.
fn serve(dir: &TempDir, app: SocketAddr, env: &[(&str, &str)]) -> Server {
    Server::start_with_config(dir, &config(app), env)
}

fn ended(view: &Value) -> bool {
    matches!(view["status"].as_str(), Some("completed" | "failed" | "cancelled"))
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

fn decision(approval: &Value, approved: bool, reason: &str) -> Value {
    let id = &approval["requests"][0]["interruptionId"];
    json!({ "decisions": [{ "interruptionId": id, "approved": approved, "reason": reason }] })
}

/// Every entry of the caller's tenant, read a page of `limit` at a time through the cursor.
async fn audit_log(client: &Client, limit: usize) -> Vec<Value> {
    let mut entries = Vec::new();
    let mut cursor = "1".to_owned();
    loop {
        let response = client.get(&format!("/v1/audit?from={cursor}&limit={limit}")).await;
        assert_eq!(response.status, 200, "{}", response.text());
        let page = response.json();
        let got = page["entries"].as_array().unwrap().clone();
        assert!(got.len() <= limit, "{page}");
        cursor = page["next"].as_str().unwrap().to_owned();
        if got.is_empty() {
            let last = entries.last().map_or(0, |e: &Value| e["seq"].as_u64().unwrap());
            assert_eq!(page["head"]["seq"], json!(last), "the head is the last entry: {page}");
            return entries;
        }
        entries.extend(got);
    }
}

/// The entries of `kind`.
fn of_kind<'a>(entries: &'a [Value], kind: &str) -> Vec<&'a Value> {
    entries.iter().filter(|e| e["kind"] == kind).collect()
}

/// Runs `resumable audit verify --db URL` plus `extra`.
fn verify(db_url: &str, extra: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_resumable"))
        .args(["audit", "verify", "--db", db_url])
        .args(extra)
        .env_remove("RESUMABLE_DB")
        .output()
        .expect("resumable audit verify runs")
}

/// The JSON lines of `output`'s stdout.
fn lines(output: &Output) -> Vec<Value> {
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}")))
        .collect()
}

/// Changes the `data` of entry `seq` of `tenant` straight in the database, past the trigger that
/// keeps the application from doing it.
async fn edit_data(db_url: &str, tenant: &str, seq: u64, data: &str) {
    if let Some(path) = db_url.strip_prefix("sqlite://") {
        let conn = rusqlite::Connection::open(path).unwrap();
        conn.busy_timeout(WAIT).unwrap();
        let refused =
            conn.execute("UPDATE audit_entries SET data = ?1 WHERE tenant = ?2 AND seq = ?3", (data, tenant, seq));
        assert!(refused.unwrap_err().to_string().contains("append-only"));
        conn.execute_batch("DROP TRIGGER audit_entries_no_update").unwrap();
        let changed =
            conn.execute("UPDATE audit_entries SET data = ?1 WHERE tenant = ?2 AND seq = ?3", (data, tenant, seq));
        assert_eq!(changed.unwrap(), 1);
        return;
    }
    use sqlx::Connection as _;
    let mut conn = sqlx::PgConnection::connect(db_url).await.unwrap();
    let update = "UPDATE audit_entries SET data = $1 WHERE tenant = $2 AND seq = $3";
    let seq = i64::try_from(seq).unwrap();
    let refused = sqlx::query(update).bind(data).bind(tenant).bind(seq).execute(&mut conn).await;
    assert!(refused.unwrap_err().to_string().contains("append-only"));
    sqlx::query("ALTER TABLE audit_entries DISABLE TRIGGER audit_entries_append_only")
        .execute(&mut conn)
        .await
        .unwrap();
    let changed = sqlx::query(update).bind(data).bind(tenant).bind(seq).execute(&mut conn).await.unwrap();
    assert_eq!(changed.rows_affected(), 1);
    let _ = conn.close().await;
}

on_both_backends! {
    async fn an_approved_refund_leaves_a_verifying_chain_that_an_edit_breaks(backend) {
        let Some(dir) = TempDir::on(backend, "audit-e2e") else { return };
        let (app, addr) = start_app().await;
        let server = serve(&dir, addr, &[]);
        let (alice, bob) = (server.client(Some("key-alice-0001")), server.client(Some("key-bob-0001")));
        let (audra, gus) = (server.client(Some("key-audra-0001")), server.client(Some("key-gus-0001")));

        let script = "const f = await ops.flaky(); return await billing.refund('A-1', 1500)";
        let id = alice.submit(script).await;
        let approval = pending(&alice, &id).await;
        // Refused decisions are not recorded: alice submitted it, and the function wants four eyes.
        let path = format!("/v1/automations/{id}/decisions");
        let refused = alice.post(&path, &decision(&approval, true, "mine")).await;
        assert_eq!(refused.json()["error"]["code"], "FOUR_EYES");
        let accepted = bob.post(&path, &decision(&approval, true, "checked")).await;
        assert_eq!(accepted.status, 202, "{}", accepted.text());
        let again = bob.post(&path, &decision(&approval, true, "checked")).await;
        assert_eq!(again.json()["error"]["code"], "ALREADY_DECIDED");
        let done = alice.poll(&format!("/v1/automations/{id}"), ended).await;
        assert_eq!(done["status"], "completed", "{done}");
        let held = alice.submit("return await ops.hold()").await;
        pending(&alice, &held).await;
        let cancelled = alice.post(&format!("/v1/automations/{held}/cancel"), &json!({})).await;
        assert_eq!(cancelled.status, 202, "{}", cancelled.text());

        // Only auditors read the log; a cursor must be one.
        let forbidden = alice.get("/v1/audit").await;
        assert_eq!((forbidden.status, forbidden.json()["error"]["code"].clone()), (403, json!("FORBIDDEN")));
        for query in ["from=0", "from=x", "limit=0", "limit=1001", "cursor=1"] {
            let bad = audra.get(&format!("/v1/audit?{query}")).await;
            assert_eq!((bad.status, bad.json()["error"]["code"].clone()), (400, json!("BAD_REQUEST")), "{query}");
        }
        // Another tenant's auditor sees nothing of acme's.
        assert!(audit_log(&gus, 10).await.is_empty());

        let entries = audit_log(&audra, 2).await;
        let kinds: Vec<&str> = entries.iter().map(|e| e["kind"].as_str().unwrap()).collect();
        for (i, entry) in entries.iter().enumerate() {
            assert_eq!(entry["seq"], json!(i + 1), "gap-free: {kinds:?}");
            let prev = if i == 0 { "0".repeat(64) } else { entries[i - 1]["hash"].as_str().unwrap().to_owned() };
            assert_eq!(entry["prevHash"], json!(prev), "linked: {entry}");
        }

        let submissions = of_kind(&entries, "submission");
        assert_eq!(submissions.len(), 2, "{kinds:?}");
        let first = submissions[0];
        assert_eq!(
            (&first["actor"], &first["keyId"], &first["automation"]),
            (&json!("alice"), &json!(key_id("key-alice-0001")), &json!(id))
        );
        assert_eq!(first["data"]["sourceSha256"], json!(sha256(script.as_bytes())), "{first}");

        let decisions = of_kind(&entries, "decision");
        assert_eq!(decisions.len(), 1, "one accepted batch: {kinds:?}");
        let decided = decisions[0];
        assert_eq!(
            (&decided["actor"], &decided["keyId"], &decided["automation"]),
            (&json!("bob"), &json!(key_id("key-bob-0001")), &json!(id))
        );
        let interruption = &approval["requests"][0]["interruptionId"];
        assert_eq!(
            decided["data"],
            json!({
                "round": 1,
                "decisions": [{ "interruptionId": interruption, "approved": true, "reason": "checked" }],
            })
        );

        // The refund's request and response, as digests of what the application received and sent.
        let refunds = app.exchanges("refund");
        assert_eq!(refunds.len(), 1);
        let Exchange { key: refund_key, request: refund_request, response: refund_response } = &refunds[0];
        let requests = of_kind(&entries, "connector_request");
        let refund = requests.iter().find(|e| e["data"]["function"] == "billing.refund").expect("the refund's request");
        assert_eq!(refund["data"]["requestSha256"], json!(sha256(refund_request)), "{refund}");
        assert_eq!(refund["data"]["idempotencyKey"], json!(refund_key));
        assert_eq!(
            (&refund["automation"], &refund["actor"], &refund["keyId"]),
            (&json!(id), &json!("alice"), &Value::Null)
        );
        let responses = of_kind(&entries, "connector_response");
        let answered: Vec<&&Value> =
            responses.iter().filter(|e| e["data"]["idempotencyKey"] == json!(refund_key)).collect();
        assert_eq!(answered.len(), 1, "{responses:?}");
        assert_eq!(
            (&answered[0]["data"]["status"], &answered[0]["data"]["responseSha256"]),
            (&json!(200), &json!(sha256(refund_response)))
        );
        // The flaky call: one request, two distinct outcomes (503, then 200).
        let flaky: Vec<&&Value> = responses.iter().filter(|e| e["data"]["function"] == "ops.flaky").collect();
        let outcomes: Vec<(Value, Value)> =
            flaky.iter().map(|e| (e["data"]["status"].clone(), e["data"]["attempt"].clone())).collect();
        assert_eq!(outcomes, [(json!(503), json!(1)), (json!(200), json!(2))], "{flaky:?}");
        assert_eq!(requests.len(), 2, "one request entry per call: {requests:?}");

        let cancels = of_kind(&entries, "cancel");
        assert_eq!(cancels.len(), 1, "{kinds:?}");
        assert_eq!(
            (&cancels[0]["automation"], &cancels[0]["actor"], &cancels[0]["data"]["status"]),
            (&json!(held), &json!("alice"), &json!("cancelled"))
        );

        // The real binary verifies the chains, and finds the one edited entry.
        let ok = verify(&dir.db_url(), &[]);
        assert!(ok.status.success(), "{}", String::from_utf8_lossy(&ok.stderr));
        let summary = lines(&ok).pop().unwrap();
        assert_eq!((&summary["verified"], &summary["entries"]), (&json!(true), &json!(entries.len())), "{summary}");
        drop(server);
        let seq = decided["seq"].as_u64().unwrap();
        let forged = decided["data"].to_string().replace("\"approved\":true", "\"approved\":false");
        assert_ne!(forged, decided["data"].to_string());
        edit_data(&dir.db_url(), "acme", seq, &forged).await;
        let broken = verify(&dir.db_url(), &[]);
        assert_eq!(broken.status.code(), Some(1), "{}", String::from_utf8_lossy(&broken.stderr));
        let stderr = String::from_utf8_lossy(&broken.stderr);
        assert!(
            stderr.contains(&format!("tenant \"acme\", entry {seq} does not verify (AUDIT_HASH_MISMATCH)")),
            "{stderr}"
        );
        let reports = lines(&broken);
        let acme = reports.iter().find(|r| r["tenant"] == "acme").unwrap();
        assert_eq!(
            (&acme["broken"]["seq"], &acme["broken"]["code"]),
            (&json!(seq), &json!("AUDIT_HASH_MISMATCH")),
            "{acme}"
        );
        assert_eq!(acme["verified"], json!(seq - 1));
        assert_eq!(reports.last().unwrap()["verified"], json!(false));
        // Only acme's chain is broken.
        let other = verify(&dir.db_url(), &["--tenant", "globex"]);
        assert!(other.status.success(), "{}", String::from_utf8_lossy(&other.stderr));
    }
}

on_both_backends! {
    async fn eight_appenders_on_two_tenants_make_gap_free_verifying_chains(backend) {
        let Some(dir) = TempDir::on(backend, "audit-concurrent") else { return };
        // On PostgreSQL each appender has a connection pool of its own, as servers do; on SQLite
        // one process's appenders share its one writer.
        let shared = AppDb::open(&dir.db_url()).await.unwrap();
        let mut appenders = Vec::new();
        for n in 0..8u32 {
            let db = match backend {
                Backend::Postgres => AppDb::open(&dir.db_url()).await.unwrap(),
                Backend::Sqlite => shared.clone(),
            };
            let audit = Audit::new(db);
            appenders.push(tokio::spawn(async move {
                let tenant = if n % 2 == 0 { "acme" } else { "globex" };
                for i in 0..25u32 {
                    let actor = Actor::new(format!("appender-{n}"));
                    let entry =
                        AuditEntry::new(AuditKind::Cancel, actor, json!({ "i": i })).dedup_key(format!("{n}:{i}"));
                    assert!(matches!(audit.record(tenant, entry.clone()).await.unwrap(), Recorded::Appended { .. }));
                    // A repeat adds nothing.
                    if i % 5 == 0 {
                        assert_eq!(audit.record(tenant, entry).await.unwrap(), Recorded::AlreadyRecorded);
                    }
                }
            }));
        }
        for appender in appenders {
            appender.await.unwrap();
        }
        let audit = Audit::new(shared);
        for tenant in ["acme", "globex"] {
            let page = audit.page(tenant, 1, 1000).await.unwrap();
            let seqs: Vec<u64> = page.entries.iter().map(|e| e.seq).collect();
            assert_eq!(seqs, (1..=100).collect::<Vec<u64>>(), "{tenant}: gap-free");
            assert_eq!(page.head_seq, 100);
        }
        let ok = verify(&dir.db_url(), &[]);
        assert!(ok.status.success(), "{}", String::from_utf8_lossy(&ok.stderr));
        let reports = lines(&ok);
        assert_eq!(reports.len(), 3, "two tenants and the summary: {reports:?}");
        assert_eq!(reports[2], json!({ "verified": true, "tenants": 2, "brokenTenants": 0, "entries": 200 }));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_retried_after_a_crash_is_recorded_once() {
    let (app, addr) = start_app().await;
    let dir = TempDir::new("audit-retry");
    // Dies right after the approved call returned, before the round is recorded; its claim on the
    // automation lasts 2 s.
    let mut server = serve(&dir, addr, &[("RESUMABLE_FAULT", "after-host-call"), ("RESUMABLE_LEASE_SECS", "2")]);
    let alice = server.client(Some("key-alice-0001"));
    let id = alice.submit("return await billing.refund('A-7', 2500)").await;
    let approval = pending(&alice, &id).await;
    let body = decision(&approval, true, "ok").to_string();
    let bob = server.client(Some("key-bob-0001"));
    let _ = bob.try_send("POST", &format!("/v1/automations/{id}/decisions"), &[], Some(body.as_bytes())).await;
    assert!(server.exited_within(WAIT), "the server never reached its fault point");

    let server = serve(&dir, addr, &[]);
    let done = server.client(Some("key-alice-0001")).poll(&format!("/v1/automations/{id}"), ended).await;
    assert_eq!(done["status"], "completed", "{done}");
    let refunds = app.exchanges("refund");
    assert_eq!(refunds.len(), 2, "the call was sent again, with the same key and body");
    assert_eq!(refunds[0], refunds[1]);

    let entries = audit_log(&server.client(Some("key-audra-0001")), 100).await;
    let of_refund = |kind: &str| {
        of_kind(&entries, kind).into_iter().filter(|e| e["data"]["idempotencyKey"] == json!(refunds[0].key)).count()
    };
    assert_eq!((of_refund("connector_request"), of_refund("connector_response")), (1, 1), "{entries:?}");
    drop(server);
    let ok = verify(&dir.db_url(), &["--tenant", "acme"]);
    assert!(ok.status.success(), "{}", String::from_utf8_lossy(&ok.stderr));
    // A database that is not there is not created empty and declared whole.
    let missing = dir.path().join("missing.db");
    let refused = verify(&format!("sqlite://{}", missing.display()), &[]);
    assert_eq!(refused.status.code(), Some(2), "{}", String::from_utf8_lossy(&refused.stderr));
    assert!(String::from_utf8_lossy(&refused.stderr).contains("there is no database file"));
    assert!(!missing.exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_commands_cancels_and_destroys_are_recorded() {
    let (_app, addr) = start_app().await;
    let dir = TempDir::new("audit-sessions");
    let server = serve(&dir, addr, &[]);
    let alice = server.client(Some("key-alice-0001"));
    let started = alice.post("/v1/sessions", &json!({})).await;
    assert_eq!(started.status, 201, "{}", started.text());
    let session = started.json()["id"].as_str().unwrap().to_owned();
    let source = "return 1";
    for source in [source, "return await ops.hold()"] {
        let command = alice.post(&format!("/v1/sessions/{session}/commands"), &json!({ "source": source })).await;
        assert_eq!(command.status, 202, "{}", command.text());
    }
    // The second command waits for an approval: cancel it.
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let view = alice.get(&format!("/v1/sessions/{session}")).await.json();
        if view["running"]["command"] == 2 {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "{view}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let cancelled = alice.post(&format!("/v1/sessions/{session}/cancel"), &json!({})).await;
    assert_eq!(cancelled.status, 202, "{}", cancelled.text());
    let destroyed = alice.request("DELETE", &format!("/v1/sessions/{session}"), None).await;
    assert_eq!(destroyed.status, 202, "{}", destroyed.text());

    let entries = audit_log(&server.client(Some("key-audra-0001")), 100).await;
    let kinds: Vec<&str> = entries.iter().map(|e| e["kind"].as_str().unwrap()).collect();
    assert_eq!(kinds, ["session_start", "session_command", "session_command", "session_cancel", "session_destroy"]);
    let alice_key = json!(key_id("key-alice-0001"));
    assert!(entries.iter().all(|e| e["automation"] == json!(session) && e["keyId"] == alice_key), "{entries:?}");
    assert_eq!(
        entries[1]["data"],
        json!({ "command": 1, "sourceBytes": source.len(), "sourceSha256": sha256(source.as_bytes()) })
    );
    assert_eq!(entries[3]["data"], json!({ "command": 2 }));
    drop(server);
    let ok = verify(&dir.db_url(), &[]);
    assert!(ok.status.success(), "{}", String::from_utf8_lossy(&ok.stderr));
}
