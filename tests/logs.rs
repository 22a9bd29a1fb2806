//! The log end to end: `resumable serve --log-format json` with `RUST_LOG=trace`, driven through
//! its error paths (a bad API key, a failed sign-in, a connector that answers 500, one that cannot
//! be reached, a database that refuses the password or cannot be reached) and through a run that
//! makes every kind of secret the server holds (API keys, the secret file, connector and webhook
//! secrets, hook tokens, stored continuation tokens, the inbox cookie and CSRF token, request
//! signatures). Every line of every log must be JSON, every request's lines must carry its
//! request id, a round's lines its round span, and no secret may appear anywhere in any log.

#[allow(dead_code)]
mod support;

use std::net::SocketAddr;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::{Path as UrlPath, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::IntoResponse as _;
use base64::Engine as _;
use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use serde_json::{Value, json};
use support::{Backend, Db, Response, Server, TempDir, WAIT};

/// The API keys of the configuration file.
const ALICE: &str = "key-alice-LogsTest-7f3a91c2";
const BOB: &str = "key-bob-LogsTest-0b8d44e6";
/// A key the server does not know, presented as if it were one.
const BAD_KEY: &str = "key-mallory-LogsTest-c5e1d09a";
/// A key given through the environment (`key_env`).
const ENV_KEY: &str = "key-carol-LogsTest-env-92aa61f0";
/// A secret in a query string, which the log must not repeat.
const QUERY_SECRET: &str = "QuerySecretLogsTest4b1e";
/// The raw bytes of the secrets (each 32 bytes), written as `whsec_` + base64.
const CONNECTOR_SECRET: &[u8; 32] = b"logs-test-connector-secret-00001";
const ENV_CONNECTOR_SECRET: &[u8; 32] = b"logs-test-env-conn-secret-000002";
const WEBHOOK_SECRET: &[u8; 32] = b"logs-test-webhook-secret-0000003";

fn whsec(raw: &[u8]) -> String {
    format!("whsec_{}", STANDARD.encode(raw))
}

/// The receiving application: answers the connectors and the webhook deliveries, and keeps every
/// signature it was sent.
#[derive(Clone, Default)]
struct Receiver {
    signatures: Arc<Mutex<Vec<String>>>,
    requests: Arc<Mutex<Vec<String>>>,
}

async fn receive(
    State(receiver): State<Receiver>,
    UrlPath(path): UrlPath<String>,
    headers: HeaderMap,
) -> axum::response::Response {
    receiver.requests.lock().unwrap().push(path.clone());
    if let Some(signature) = headers.get("webhook-signature").and_then(|v| v.to_str().ok()) {
        receiver.signatures.lock().unwrap().push(signature.to_owned());
    }
    match path.as_str() {
        "fail" => (StatusCode::INTERNAL_SERVER_ERROR, "broken").into_response(),
        "hooks" => StatusCode::NO_CONTENT.into_response(),
        _ => axum::Json(json!({ "ok": path })).into_response(),
    }
}

async fn start_receiver() -> (Receiver, SocketAddr) {
    let receiver = Receiver::default();
    let app = axum::Router::new().route("/{path}", axum::routing::post(receive)).with_state(receiver.clone());
    (receiver, support::serve_router(app).await)
}

/// A loopback address nothing listens on.
fn unreachable_address() -> SocketAddr {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap()
}

fn config(app: SocketAddr, down: SocketAddr) -> String {
    let (connector, webhook) = (whsec(CONNECTOR_SECRET), whsec(WEBHOOK_SECRET));
    format!(
        r#"
[[keys]]
key = "{ALICE}"
actor = "alice"
tenant = "acme"
roles = ["submitter", "approver"]

[[keys]]
key = "{BOB}"
actor = "bob"
tenant = "acme"
roles = ["approver"]

[[keys]]
key_env = "LOGS_TEST_KEY"
actor = "carol"
tenant = "acme"
roles = ["submitter"]

[functions."ops.ok"]
url = "http://{app}/ok"
secret = "{connector}"
approval = "always"

[functions."ops.env"]
url = "http://{app}/env"
secret_env = "LOGS_TEST_CONNECTOR_SECRET"

[functions."ops.fail"]
url = "http://{app}/fail"
secret = "{connector}"
retries = 1

[functions."ops.down"]
url = "http://{down}/down"
secret = "{connector}"
retries = 1
timeout = "2s"

[[webhooks]]
tenant = "acme"
url = "http://{app}/hooks"
events = ["approval_requested", "decided", "completed", "failed"]
secret = "{webhook}"
"#
    )
}

/// The environment of every process the test starts.
fn log_env() -> Vec<(&'static str, String)> {
    vec![
        ("RUST_LOG", "trace".to_owned()),
        ("LOGS_TEST_KEY", ENV_KEY.to_owned()),
        ("LOGS_TEST_CONNECTOR_SECRET", whsec(ENV_CONNECTOR_SECRET)),
    ]
}

/// Every request id the server answered with, checked to be there.
fn request_id(response: &Response, ids: &mut Vec<String>) {
    let id = response.header("x-request-id").unwrap_or_else(|| panic!("no x-request-id: {:?}", response.headers));
    assert!(!id.is_empty());
    ids.push(id.to_owned());
}

/// Each line of `log`, parsed; panics with the line if one is not a JSON object.
fn json_lines(name: &str, log: &str) -> Vec<Value> {
    log.lines()
        .filter(|line| !line.trim().is_empty())
        .map(|line| match serde_json::from_str::<Value>(line) {
            Ok(value) if value.is_object() => value,
            _ => panic!("{name}: a line of the JSON log is not a JSON object: {line:?}"),
        })
        .collect()
}

/// The spans a line is in (outermost first).
fn spans(line: &Value) -> Vec<Value> {
    line["spans"].as_array().cloned().unwrap_or_default()
}

/// Panics, naming the secret and showing the line, if `log` holds any of `secrets`.
fn assert_no_secret(name: &str, log: &str, secrets: &[(String, String)]) {
    for (what, secret) in secrets {
        assert!(secret.len() >= 8, "{what} is too short to look for: {secret:?}");
        if let Some(line) = log.lines().find(|line| line.contains(secret.as_str())) {
            panic!("{name}: the log holds {what} ({secret}):\n{line}");
        }
    }
}

/// Every log file in `dir`.
fn logs_in(dir: &Path) -> Vec<(String, String)> {
    let mut logs: Vec<(String, String)> = std::fs::read_dir(dir)
        .unwrap()
        .filter_map(Result::ok)
        .map(|entry| entry.path())
        .filter(|path| path.extension().is_some_and(|e| e == "log"))
        .map(|path| (path.display().to_string(), std::fs::read_to_string(&path).unwrap()))
        .collect();
    logs.sort();
    logs
}

async fn scenario(backend: Backend) {
    let Some(dir) = TempDir::on(backend, "logs") else { return };
    let (receiver, app) = start_receiver().await;
    let config_path = dir.write_config(&config(app, unreachable_address()));
    let env = log_env();
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let mut server = Server::start_without_demo(
        &dir,
        &["--config", &config_path.display().to_string(), "--log-format", "json"],
        &env,
    );
    let mut ids = Vec::new();
    let (alice, bob) = (server.client(Some(ALICE)), server.client(Some(BOB)));

    // A bad API key, a query string with a secret, and a caller's own request id.
    let refused = server.client(Some(BAD_KEY)).get("/v1/approvals").await;
    assert_eq!(refused.status, 401, "{}", refused.text());
    request_id(&refused, &mut ids);
    let listed = alice.get(&format!("/v1/approvals?token={QUERY_SECRET}")).await;
    request_id(&listed, &mut ids);
    let own = alice.send("GET", "/v1/approvals", &[("x-request-id", "logs-test-proxy-id.1")], None).await;
    assert_eq!(own.header("x-request-id"), Some("logs-test-proxy-id.1"), "a well-formed id is kept");
    request_id(&own, &mut ids);
    let forged = alice.send("GET", "/v1/approvals", &[("x-request-id", &format!("Bearer {ALICE}"))], None).await;
    let replaced = forged.header("x-request-id").unwrap_or_default();
    assert!(!replaced.is_empty() && !replaced.contains(ALICE), "a malformed id is replaced: {replaced}");
    request_id(&forged, &mut ids);
    let carol = server.client(Some(ENV_KEY)).get("/v1/functions").await;
    assert_eq!(carol.status, 200, "{}", carol.text());
    request_id(&carol, &mut ids);

    // A run: an approval (a hook token and a stored continuation), then a signed request, a
    // connector that answers 500 and one that cannot be reached, with webhook deliveries.
    let script = "
        const ok = await ops.ok();
        const env = await ops.env();
        const failed = async (f) => { try { await f(); return null; } catch (e) { return e.message; } };
        return { ok, env, fail: await failed(() => ops.fail()), down: await failed(() => ops.down()) };";
    let submitted = alice.post("/v1/automations", &json!({ "source": script })).await;
    assert_eq!(submitted.status, 202, "{}", submitted.text());
    request_id(&submitted, &mut ids);
    let id = submitted.json()["id"].as_str().unwrap().to_owned();
    let view = alice
        .poll(&format!("/v1/automations/{id}"), |v| v["status"] == "waiting" && !v["pendingApproval"].is_null())
        .await;
    let interruption = view["pendingApproval"]["requests"][0]["interruptionId"].clone();

    // The inbox: a failed sign-in, then one that sets the session cookie, and a page with a
    // CSRF token.
    let form = [("Content-Type", "application/x-www-form-urlencoded")];
    let inbox = server.client(None);
    let failed = inbox.send("POST", "/login", &form, Some(format!("key={BAD_KEY}").as_bytes())).await;
    assert_eq!(failed.header("set-cookie"), None, "{}", failed.text());
    request_id(&failed, &mut ids);
    let signed_in = inbox.send("POST", "/login", &form, Some(format!("key={ALICE}").as_bytes())).await;
    request_id(&signed_in, &mut ids);
    let cookie = signed_in.header("set-cookie").expect("a session cookie").split(';').next().unwrap().to_owned();
    let cookie_value = cookie.split_once('=').unwrap().1.to_owned();
    let page = inbox.send("GET", "/", &[("Cookie", &cookie)], None).await;
    assert_eq!(page.status, 200, "{}", page.text());
    request_id(&page, &mut ids);
    let marker = "name=\"csrf\" value=\"";
    let text = page.text();
    let at = text.find(marker).expect("a CSRF field") + marker.len();
    let csrf = text[at..].split('"').next().unwrap().to_owned();

    let decided = bob
        .post(
            &format!("/v1/automations/{id}/decisions"),
            &json!({ "decisions": [{ "interruptionId": interruption, "approved": true, "reason": "fine" }] }),
        )
        .await;
    assert_eq!(decided.status, 202, "{}", decided.text());
    request_id(&decided, &mut ids);
    let done = alice
        .poll(&format!("/v1/automations/{id}"), |v| matches!(v["status"].as_str(), Some("completed" | "failed")))
        .await;
    assert_eq!(done["status"], "completed", "{done}");
    assert!(done["result"]["fail"].as_str().is_some_and(|m| m.contains("failed 2 times")), "{done}");
    assert!(done["result"]["down"].as_str().is_some_and(|m| m.contains("cannot connect")), "{done}");
    // The deliveries of `completed` reach the receiver soon after.
    let deadline = tokio::time::Instant::now() + WAIT;
    while receiver.requests.lock().unwrap().iter().filter(|p| *p == "hooks").count() < 3 {
        assert!(tokio::time::Instant::now() < deadline, "deliveries: {:?}", receiver.requests.lock().unwrap());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // The tokens the server keeps in its database.
    let db = Db::of(&dir);
    let hook_tokens = db.texts("SELECT token FROM hooks").await;
    assert!(hook_tokens.len() >= 2, "an approval hook and a delivery hook at least: {hook_tokens:?}");
    let hex_keys = match backend {
        Backend::Sqlite => db.texts("SELECT hex(key) FROM continuations").await,
        Backend::Postgres => db.texts("SELECT encode(key, 'hex') FROM continuations").await,
    };
    assert!(!hex_keys.is_empty(), "the approval left a stored continuation");

    assert!(server.terminate(WAIT).await.is_some_and(|s| s.success()), "the server stops gracefully");

    // The secrets, in every form the log might hold them.
    let mut secrets: Vec<(String, String)> = [
        ("an API key", ALICE),
        ("an API key", BOB),
        ("a bad API key", BAD_KEY),
        ("a key from the environment", ENV_KEY),
        ("a query string's secret", QUERY_SECRET),
    ]
    .into_iter()
    .map(|(what, s)| (what.to_owned(), s.to_owned()))
    .collect();
    for (what, raw) in [
        ("a connector secret", CONNECTOR_SECRET),
        ("a connector secret_env", ENV_CONNECTOR_SECRET),
        ("a webhook secret", WEBHOOK_SECRET),
    ] {
        secrets.push((what.to_owned(), whsec(raw)));
        secrets.push((what.to_owned(), STANDARD.encode(raw)));
        secrets.push((what.to_owned(), String::from_utf8(raw.to_vec()).unwrap()));
    }
    let secret_file = std::fs::read_to_string(dir.path().join("secret")).unwrap();
    secrets.push(("the secret file".to_owned(), secret_file.trim().to_owned()));
    for token in &hook_tokens {
        secrets.push(("a hook token".to_owned(), token.clone()));
        let mac = token.split_once('_').map_or(token.as_str(), |(_, mac)| mac);
        secrets.push(("a hook token's MAC".to_owned(), mac.to_owned()));
    }
    for hex in &hex_keys {
        let key: Vec<u8> = (0..hex.len()).step_by(2).map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap()).collect();
        secrets.push(("a stored continuation token".to_owned(), URL_SAFE_NO_PAD.encode(&key)));
        secrets.push(("a stored continuation key".to_owned(), hex.to_ascii_lowercase()));
        secrets.push(("a stored continuation key".to_owned(), hex.to_ascii_uppercase()));
    }
    secrets.push(("the inbox session cookie".to_owned(), cookie_value));
    secrets.push(("a CSRF token".to_owned(), csrf));
    let signatures = receiver.signatures.lock().unwrap().clone();
    assert!(signatures.len() >= 4, "connector requests and deliveries were signed: {signatures:?}");
    for header in signatures {
        for signature in header.split(' ') {
            secrets.push(("a request signature".to_owned(), signature.to_owned()));
            secrets.push(("a request signature".to_owned(), signature.trim_start_matches("v1,").to_owned()));
        }
    }
    if matches!(backend, Backend::Postgres) {
        let url = dir.db_url();
        let userinfo = url.split_once("://").unwrap().1.split_once('@').unwrap().0.to_owned();
        if userinfo.contains(':') {
            secrets.push(("the database's user and password".to_owned(), format!("{userinfo}@")));
        }
    }

    let logs = logs_in(dir.path());
    assert_eq!(logs.len(), 1, "{logs:?}");
    let mut seen_ids = std::collections::BTreeSet::new();
    let mut round_lines = 0;
    let mut retries = 0;
    for (name, log) in &logs {
        assert_no_secret(name, log, &secrets);
        for line in json_lines(name, log) {
            for span in spans(&line) {
                if span["name"] == "request" {
                    let id = span["request_id"].as_str().unwrap_or_default();
                    assert!(!id.is_empty(), "{name}: a request's line without its id: {line}");
                    let path = span["path"].as_str().unwrap_or_default();
                    assert!(path.starts_with('/') && !path.contains('?'), "{name}: {line}");
                    seen_ids.insert(id.to_owned());
                }
                if span["name"] == "round" {
                    assert_eq!((&span["tenant"], &span["automation"]), (&json!("acme"), &json!(id)), "{line}");
                    assert!(span["round"].as_u64().is_some_and(|r| r >= 1), "{line}");
                    round_lines += 1;
                }
            }
            if line["fields"]["message"] == "retrying a connector call" {
                let round = spans(&line).into_iter().find(|span| span["name"] == "round");
                // The decision resumed the script in round 2, where ops.fail and ops.down ran.
                assert_eq!(round.map(|span| span["round"].clone()), Some(json!(2)), "{name}: {line}");
                retries += 1;
            }
            let finished = line["fields"]["message"] == "finished processing request";
            if finished {
                let span = &line["span"];
                assert_eq!(span["name"], "request", "{line}");
                assert!(line["fields"]["status"].as_u64().is_some(), "{line}");
            }
        }
    }
    for id in &ids {
        assert!(seen_ids.contains(id), "request {id} is not in the log");
    }
    // The retries of the failing connectors are logged in their round's span.
    assert_eq!(retries, 2, "one retry of ops.fail, one of ops.down");
    assert!(round_lines >= retries, "{round_lines} lines in a round's span");
    let log = &logs[0].1;
    assert!(log.contains(&format!("/v1/automations/{id}/decisions")), "the decision's path is logged");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_secret_reaches_the_log_on_sqlite() {
    scenario(Backend::Sqlite).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_secret_reaches_the_log_on_postgres() {
    scenario(Backend::Postgres).await
}

/// Starts `resumable ARGS` with the log's environment.
fn resumable(args: &[&str], dir: &TempDir) -> std::process::Child {
    let keys = json!({ "keys": [{ "key": ALICE, "actor": "a", "tenant": "t", "roles": ["submitter"] }] });
    Command::new(env!("CARGO_BIN_EXE_resumable"))
        .args(args)
        .envs(log_env())
        .env("RESUMABLE_API_KEYS", keys.to_string())
        .current_dir(dir.path())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("resumable starts")
}

/// `serve` and `migrate` (at once: an unreachable database takes the pool's 30 s to give up) on
/// a database that refuses the connection: they exit with an error that names neither the
/// password nor the URL, and log only JSON lines.
fn assert_database_refused(dir: &TempDir, url: &str, password: &str) {
    let secret = dir.path().join("secret").display().to_string();
    let serve = ["serve", "--listen", "127.0.0.1:0", "--db", url, "--secret-file", &secret, "--log-format", "json"];
    let serve = resumable(&serve, dir);
    let migrate = resumable(&["migrate", "--db", url, "--log-format", "json"], dir);
    let outputs: Vec<(&str, Output)> =
        [("serve", serve), ("migrate", migrate)].map(|(c, child)| (c, child.wait_with_output().unwrap())).into();
    let secret_file = std::fs::read_to_string(&secret).expect("serve made its secret file");
    let secrets = [
        ("the database password".to_owned(), password.to_owned()),
        ("the database URL".to_owned(), url.to_owned()),
        ("the secret file".to_owned(), secret_file.trim().to_owned()),
        ("an API key".to_owned(), ALICE.to_owned()),
    ];
    for (command, output) in outputs {
        assert!(!output.status.success(), "{command} exits with an error");
        let log = String::from_utf8_lossy(&output.stderr).into_owned();
        let lines = json_lines(command, &log);
        let last = lines.last().unwrap_or_else(|| panic!("{command} says why it stopped"));
        assert_eq!(last["level"], "ERROR", "{command}: {last}");
        assert!(last["fields"]["error"].as_str().is_some_and(|e| e.contains("database")), "{command}: {last}");
        assert_no_secret(command, &log, &secrets);
        assert_no_secret(command, &String::from_utf8_lossy(&output.stdout), &secrets);
    }
}

#[test]
fn a_database_password_is_never_logged_when_the_database_cannot_be_reached() {
    let dir = TempDir::new("logs-db-down");
    let password = "Pw-LogsTest-unreachable-5d2c";
    let url = format!("postgres://resumable:{password}@{}/resumable_test", unreachable_address());
    assert_database_refused(&dir, &url, password);
}

#[test]
fn a_database_password_is_never_logged_when_the_database_refuses_it() {
    let Some(server) = resumable_workflow::testing::postgres_url() else { return };
    let dir = TempDir::new("logs-db-refused");
    let password = "Pw-LogsTest-refused-81e7";
    let (scheme, rest) = server.split_once("://").unwrap();
    let (userinfo, host) = rest.split_once('@').unwrap();
    let user = userinfo.split(':').next().unwrap();
    let url = format!("{scheme}://{user}:{password}@{host}");
    assert_database_refused(&dir, &url, password);
}

#[test]
fn an_invalid_filter_or_format_is_refused() {
    let dir = TempDir::new("logs-invalid");
    let output = Command::new(env!("CARGO_BIN_EXE_resumable"))
        .args(["serve", "--listen", "127.0.0.1:0"])
        .env("RUST_LOG", "resumable=loud")
        .current_dir(dir.path())
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2), "{output:?}");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("RUST_LOG=\"resumable=loud\" is not a valid log filter"), "{stderr}");
    let output = Command::new(env!("CARGO_BIN_EXE_resumable"))
        .args(["migrate", "--log-format", "xml"])
        .current_dir(dir.path())
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2), "{output:?}");
    assert!(String::from_utf8_lossy(&output.stderr).contains("invalid value 'xml'"), "{output:?}");
}
