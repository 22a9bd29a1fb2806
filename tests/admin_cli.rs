//! The admin commands against a live `resumable serve`: `automations list|show|cancel`,
//! `approvals list|decide`, `sessions list|show|destroy`, with `--server` and
//! `RESUMABLE_API_KEY`; and `run --secret-file` then `resume` of its signed and sealed tokens.

#[allow(dead_code)]
mod support;

use std::process::{Command, Output};
use std::time::Duration;

use serde_json::{Value, json};
use support::{Server, TempDir, WAIT};

/// Reads an order, then asks to refund part of it.
const REFUND: &str = "const o = await orders.get('A-1002'); return await orders.refund(o.id, 1500);";

/// `resumable ARGS` with the API key `key` (none when `None`).
fn resumable(args: &[&str], key: Option<&str>) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_resumable"));
    command.args(args).env_remove("RESUMABLE_API_KEY").env_remove("RESUMABLE_SERVER").env_remove("RESUMABLE_SECRET");
    if let Some(key) = key {
        command.env("RESUMABLE_API_KEY", key);
    }
    command.output().expect("resumable runs")
}

/// The one JSON line a command printed, and its exit status.
fn answer(output: &Output) -> (i32, Value) {
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(stdout.lines().count(), 1, "one line on stdout: {stdout:?}, stderr: {stderr}");
    let value = serde_json::from_str(stdout.trim()).unwrap_or_else(|e| panic!("JSON ({e}): {stdout:?}"));
    (output.status.code().expect("an exit status"), value)
}

/// `resumable ARGS --server URL` as `demo-acme`; its answer, which must be a success.
fn ok(server: &str, args: &[&str]) -> Value {
    let mut all = args.to_vec();
    all.extend(["--server", server]);
    let (status, value) = answer(&resumable(&all, Some("demo-acme")));
    assert_eq!(status, 0, "{args:?}: {value}");
    value
}

/// Runs `show` until `done` holds for the automation.
async fn shown_until(server: &str, id: &str, done: impl Fn(&Value) -> bool) -> Value {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let view = ok(server, &["automations", "show", id]);
        if done(&view) {
            return view;
        }
        assert!(tokio::time::Instant::now() < deadline, "{id}: {view}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_commands_list_show_decide_cancel_and_destroy_on_a_live_server() {
    let dir = TempDir::new("admin-cli");
    let server = Server::start(&dir, &[]);
    let url = server.url();
    let api = server.client(Some("demo-acme"));
    let (refund, other) = (api.submit(REFUND).await, api.submit(REFUND).await);
    let waiting = |v: &Value| v["status"] == "waiting" && !v["pendingApproval"].is_null();
    let view = shown_until(&url, &refund, waiting).await;
    shown_until(&url, &other, waiting).await;
    assert_eq!(view["source"], REFUND, "show has the source and the calls: {view}");
    assert_eq!(view["calls"][0]["function"], "orders.get");

    let listed = ok(&url, &["automations", "list", "--status", "waiting", "--limit", "5"]);
    let ids: Vec<&str> = listed["automations"].as_array().unwrap().iter().map(|a| a["id"].as_str().unwrap()).collect();
    assert_eq!(ids, [other.as_str(), refund.as_str()], "{listed}");
    let approvals = ok(&url, &["approvals", "list"]);
    assert_eq!(approvals["approvals"].as_array().unwrap().len(), 2, "{approvals}");

    // Decide one, cancel the other.
    let interruption = view["pendingApproval"]["requests"][0]["interruptionId"].as_str().unwrap().to_owned();
    let decided =
        ok(&url, &["approvals", "decide", &refund, "--decision", &format!("{interruption}=true"), "--reason", "ok"]);
    assert_eq!(decided["round"], 1, "{decided}");
    let done = shown_until(&url, &refund, |v| v["status"] == "completed").await;
    assert_eq!(done["result"]["refunded"], 1500);
    let again = resumable(
        &["approvals", "decide", &refund, "--decision", &format!("{interruption}=true"), "--server", &url],
        Some("demo-acme"),
    );
    let (status, refused) = answer(&again);
    assert_eq!(
        (status, &refused["error"]["code"]),
        (1, &json!("ALREADY_DECIDED")),
        "a refusal exits 1 with the answer"
    );
    let cancelled = ok(&url, &["automations", "cancel", &other]);
    assert_eq!(cancelled["status"], "cancelled", "{cancelled}");

    // Sessions.
    let response = api.post("/v1/sessions", &json!({})).await;
    assert_eq!(response.status, 201, "{}", response.text());
    let session = response.json()["id"].as_str().unwrap().to_owned();
    let sessions = ok(&url, &["sessions", "list", "--status", "live"]);
    assert_eq!(sessions["sessions"][0]["id"], session.as_str(), "{sessions}");
    assert_eq!(ok(&url, &["sessions", "show", &session])["id"], session.as_str());
    ok(&url, &["sessions", "destroy", &session]);
    let (status, gone) = answer(&resumable(&["sessions", "show", &session, "--server", &url], Some("demo-acme")));
    assert_eq!((status, &gone["error"]["code"]), (1, &json!("SESSION_GONE")));

    // Without a key, with a wrong one, and with nobody listening.
    let no_key = resumable(&["automations", "list", "--server", &url], None);
    assert_eq!(no_key.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&no_key.stderr).contains("RESUMABLE_API_KEY"), "{no_key:?}");
    let (status, bad) = answer(&resumable(&["automations", "list", "--server", &url], Some("not-a-key-at-all")));
    assert_eq!((status, &bad["error"]["code"]), (1, &json!("UNAUTHORIZED")), "{bad}");
    let nobody = resumable(&["automations", "list", "--server", "http://127.0.0.1:9"], Some("demo-acme"));
    assert_eq!(nobody.status.code(), Some(2), "{nobody:?}");
    // An id cannot reach another path: it is one percent-encoded segment.
    let (status, sneaky) =
        answer(&resumable(&["automations", "show", "../approvals", "--server", &url], Some("demo-acme")));
    assert_eq!((status, &sneaky["error"]["code"]), (1, &json!("NOT_FOUND")), "{sneaky}");
    for id in ["..", ".", ""] {
        let dots = resumable(&["automations", "cancel", id, "--server", &url], Some("demo-acme"));
        assert_eq!(dots.status.code(), Some(2), "{id:?} is refused before any request: {dots:?}");
    }
}

#[test]
fn run_prints_a_token_that_resume_continues_signed_or_sealed() {
    let dir = TempDir::new("resume-cli");
    let secret = dir.path().join("secret");
    std::fs::write(&secret, "a secret of more than thirty-two bytes for the tokens\n").unwrap();
    let script = dir.path().join("refund.js");
    std::fs::write(&script, REFUND).unwrap();
    let (secret, script) = (secret.to_str().unwrap(), script.to_str().unwrap());
    for seal in [false, true] {
        let mut args = vec!["run", "--demo", "--secret-file", secret, script];
        if seal {
            args.push("--seal");
        }
        let (status, paused) = answer(&resumable(&args, None));
        assert_eq!((status, &paused["status"]), (3, &json!("interrupted")), "{paused}");
        let token = paused["continuation"].as_str().expect("the token is printed").to_owned();
        assert_eq!(token.split('.').count(), if seal { 2 } else { 3 }, "{token}");
        let id = paused["interruptions"][0]["id"].as_str().unwrap().to_owned();
        let resume = |decision: &str, secret: &str| {
            resumable(
                &[
                    "resume",
                    &token,
                    script,
                    "--demo",
                    "--secret-file",
                    secret,
                    "--decision",
                    decision,
                    "--reason",
                    "fine",
                ],
                None,
            )
        };
        // The token from stdin, out of the process list.
        let mut piped = Command::new(env!("CARGO_BIN_EXE_resumable"))
            .args(["resume", "-", script, "--demo", "--secret-file", secret, "--decision", &format!("{id}=true")])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        std::io::Write::write_all(&mut piped.stdin.take().unwrap(), token.as_bytes()).unwrap();
        let (status, from_stdin) = answer(&piped.wait_with_output().unwrap());
        assert_eq!((status, &from_stdin["value"]["refunded"]), (0, &json!(1500)), "{from_stdin}");
        let (status, done) = answer(&resume(&format!("{id}=true"), secret));
        assert_eq!((status, &done["status"]), (0, &json!("completed")), "{done}");
        assert_eq!(done["value"]["refunded"], 1500, "{done}");
        let (status, rejected) = answer(&resume(&format!("{id}=false"), secret));
        assert_eq!((status, &rejected["value"]["approved"]), (0, &json!(false)), "{rejected}");
        assert_eq!(rejected["value"]["reason"], "fine");
        // Another secret: the token is refused, nothing runs.
        let other = dir.path().join("other");
        std::fs::write(&other, "another secret of more than thirty-two bytes here").unwrap();
        let (status, refused) = answer(&resume(&format!("{id}=true"), other.to_str().unwrap()));
        assert_eq!((status, &refused["error"]["code"]), (2, &json!("RUN_PROTOCOL_ERROR")), "{refused}");
    }
    // Without --secret-file no token is printed: it could not be resumed.
    let (status, paused) = answer(&resumable(&["run", "--demo", script], None));
    assert_eq!(status, 3);
    assert!(paused.get("continuation").is_none(), "{paused}");
    let seal_alone = resumable(&["run", "--seal", script], None);
    assert_eq!(seal_alone.status.code(), Some(2), "--seal needs --secret-file");
}
