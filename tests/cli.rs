//! End-to-end tests of the `resumable` binary (and of the `approval_cli` example when it is built).

use serde_json::{Value, json};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// Runs `program` with `args`, feeding `stdin`.
fn run_program(program: &Path, args: &[&str], stdin: &str) -> Output {
    let mut child = Command::new(program)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the program starts");
    // The child may exit before reading stdin (usage errors); a broken pipe is fine then.
    let _ = child.stdin.take().expect("piped stdin").write_all(stdin.as_bytes());
    child.wait_with_output().expect("the program finishes")
}

/// Runs `resumable` with `args`, feeding `stdin`.
fn resumable(args: &[&str], stdin: &str) -> Output {
    run_program(Path::new(env!("CARGO_BIN_EXE_resumable")), args, stdin)
}

/// `resumable run - ARGS` with `source` on stdin.
fn run_source(source: &str, args: &[&str]) -> Output {
    let mut all = vec!["run", "-"];
    all.extend_from_slice(args);
    resumable(&all, source)
}

/// The single JSON line on stdout.
fn report(output: &Output) -> Value {
    let stdout = String::from_utf8(output.stdout.clone()).expect("utf-8 stdout");
    assert_eq!(stdout.lines().count(), 1, "exactly one line on stdout: {stdout:?}");
    assert!(stdout.ends_with('\n'));
    serde_json::from_str(&stdout).expect("stdout is JSON")
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// Asserts a failed run with `code` and exit status 1; returns the report.
fn assert_failed(output: &Output, code: &str) -> Value {
    let report = report(output);
    assert_eq!(report["status"], "failed", "{report}");
    assert_eq!(report["error"]["code"], code, "{report}");
    assert!(report["error"]["message"].is_string() && report["error"]["retryable"].is_boolean(), "{report}");
    assert_eq!(output.status.code(), Some(1));
    report
}

/// Asserts a usage error: status 2, nothing on stdout, `message` on stderr.
fn assert_usage_error(output: &Output, message: &str) {
    assert_eq!(output.status.code(), Some(2), "stderr: {}", stderr(output));
    assert!(output.stdout.is_empty(), "stdout: {}", String::from_utf8_lossy(&output.stdout));
    assert!(stderr(output).contains(message), "stderr {:?} should contain {message:?}", stderr(output));
}

fn script_file(name: &str, source: &str) -> PathBuf {
    let path = Path::new(env!("CARGO_TARGET_TMPDIR")).join(name);
    std::fs::write(&path, source).expect("write the script");
    path
}

#[test]
fn a_script_file_completes_with_its_value() {
    let path = script_file("cli-answer.js", "return 6*7");
    let output = resumable(&["run", path.to_str().unwrap()], "");
    assert_eq!(report(&output), json!({ "status": "completed", "value": 42, "console": [] }));
    assert_eq!(output.status.code(), Some(0));
    assert!(output.stderr.is_empty(), "{}", stderr(&output));
}

#[test]
fn stdin_scripts_run_with_await_and_their_console_is_captured() {
    let source = "console.log('hi', 1); console.warn('careful'); return await Promise.resolve({ ok: [true] })";
    let output = run_source(source, &[]);
    assert_eq!(
        report(&output),
        json!({
            "status": "completed",
            "value": { "ok": [true] },
            "console": [{ "level": "log", "text": "hi 1" }, { "level": "warn", "text": "careful" }],
        })
    );
    assert_eq!(output.status.code(), Some(0));
}

#[test]
fn a_throwing_script_fails_with_run_error_and_keeps_its_console() {
    let report = assert_failed(&run_source("console.log('before'); throw new Error('boom')", &[]), "RUN_ERROR");
    assert!(report["error"]["message"].as_str().unwrap().contains("boom"), "{report}");
    assert_eq!(report["error"]["retryable"], false);
    assert_eq!(report["console"], json!([{ "level": "log", "text": "before" }]));
    assert_failed(&run_source("return 1 +", &[]), "RUN_ERROR");
}

#[test]
fn an_endless_loop_times_out() {
    let started = Instant::now();
    assert_failed(&run_source("while (true) {}", &["--timeout-ms", "200"]), "RUN_TIMEOUT");
    assert!(started.elapsed() < Duration::from_secs(5), "took {:?}", started.elapsed());
}

#[test]
fn an_allocation_loop_hits_the_memory_limit() {
    let source = "const a = []; for (;;) a.push(new Array(10000).fill(1))";
    assert_failed(&run_source(source, &["--memory-bytes", "2000000", "--timeout-ms", "20000"]), "RUN_MEMORY_LIMIT");
}

#[test]
fn a_context_is_accepted_and_bad_json_is_a_usage_error() {
    let output = run_source("return 1", &["--context", r#"{"a":1}"#]);
    assert_eq!(report(&output)["value"], 1);
    assert_eq!(output.status.code(), Some(0));
    assert_usage_error(&run_source("return 1", &["--context", "{a:1"]), "--context");
}

#[test]
fn out_of_range_limits_are_usage_errors_with_the_limit_message() {
    let timeout = "limit timeout_ms must be an integer from 1 to 86400000";
    assert_usage_error(&run_source("return 1", &["--timeout-ms", "0"]), &format!("{timeout}, got 0"));
    assert_usage_error(&run_source("return 1", &["--timeout-ms", "-1"]), &format!("{timeout}, got -1"));
    assert_usage_error(&run_source("return 1", &["--timeout-ms=-1"]), &format!("{timeout}, got -1"));
    assert_usage_error(&run_source("return 1", &["--timeout-ms", "86400001"]), timeout);
    assert_usage_error(
        &run_source("return 1", &["--memory-bytes", "99999999999999"]),
        "limit memory_bytes must be an integer from 1048576 to 4294967296, got 99999999999999",
    );
    assert_usage_error(&run_source("return 1", &["--memory-bytes", "1e9"]), "not an integer");
    assert_usage_error(&run_source("return 1", &["--timeout-ms", &"9".repeat(50)]), "not an integer");
}

#[test]
fn unreadable_files_and_bad_command_lines_are_usage_errors() {
    let missing = Path::new(env!("CARGO_TARGET_TMPDIR")).join("cli-does-not-exist.js");
    assert_usage_error(&resumable(&["run", missing.to_str().unwrap()], ""), "cannot read the script");
    assert_usage_error(&resumable(&["run", env!("CARGO_TARGET_TMPDIR")], ""), "cannot read the script");
    assert_usage_error(&resumable(&["run"], ""), "<FILE>");
    assert_usage_error(&resumable(&["run", "-", "--no-such-flag"], ""), "--no-such-flag");
    assert_usage_error(&resumable(&["launch"], ""), "launch");
    assert_usage_error(&resumable(&[], ""), "Usage");
}

#[test]
fn help_describes_the_commands_and_flags() {
    let top = resumable(&["--help"], "");
    assert_eq!(top.status.code(), Some(0));
    let text = String::from_utf8(top.stdout).unwrap();
    assert!(text.contains("run") && text.contains("Usage: resumable <COMMAND>"), "{text}");

    let run = resumable(&["run", "--help"], "");
    assert_eq!(run.status.code(), Some(0));
    let text = String::from_utf8(run.stdout).unwrap();
    for needle in
        ["--timeout-ms", "--memory-bytes", "--context", "--events", "NDJSON", "<FILE>", "stdin", "Exit status"]
    {
        assert!(text.contains(needle), "run --help should mention {needle}: {text}");
    }
}

/// Every stdout line as JSON.
fn json_lines(output: &Output) -> Vec<Value> {
    let stdout = String::from_utf8(output.stdout.clone()).expect("utf-8 stdout");
    assert!(stdout.ends_with('\n'), "{stdout:?}");
    stdout.lines().map(|line| serde_json::from_str(line).expect("each line is JSON")).collect()
}

#[test]
fn events_print_as_ndjson_before_the_status_line() {
    let output = run_source("console.log('hi'); console.warn('careful', {n: 1}); return 6 * 7", &["--events"]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let console = json!([{ "level": "log", "text": "hi" }, { "level": "warn", "text": "careful {\"n\":1}" }]);
    assert_eq!(
        json_lines(&output),
        vec![
            json!({ "type": "console", "level": "log", "text": "hi" }),
            json!({ "type": "console", "level": "warn", "text": "careful {\"n\":1}" }),
            json!({ "type": "completed", "value": 42 }),
            json!({ "status": "completed", "value": 42, "console": console }),
        ]
    );

    let output = run_source("console.error('before'); throw new Error('boom')", &["--events"]);
    assert_eq!(output.status.code(), Some(1));
    let lines = json_lines(&output);
    assert_eq!(lines.len(), 3, "{lines:?}");
    assert_eq!(lines[0], json!({ "type": "console", "level": "error", "text": "before" }));
    assert_eq!((&lines[1]["type"], &lines[1]["error"]["code"]), (&json!("failed"), &json!("RUN_ERROR")));
    assert_eq!((&lines[2]["status"], &lines[2]["error"]["code"]), (&json!("failed"), &json!("RUN_ERROR")));

    let output = run_source("return 1", &["--events", "--timeout-ms", "0"]);
    assert_usage_error(&output, "timeout_ms");
}

#[test]
fn demo_events_show_two_host_calls_and_a_console_line_in_order() {
    let source = "const order = await orders.get('A-1001');
        console.log('order', order.id);
        const listed = await orders.list({ limit: 2 });
        return listed.length;";
    let output = run_source(source, &["--demo", "--events"]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let lines = json_lines(&output);
    let kinds: Vec<(&str, Value)> =
        lines.iter().map(|l| (l["type"].as_str().or(l["status"].as_str()).unwrap_or("?"), l["name"].clone())).collect();
    assert_eq!(
        kinds,
        vec![
            ("call_started", json!("orders.get")),
            ("call_completed", json!("orders.get")),
            ("console", Value::Null),
            ("call_started", json!("orders.list")),
            ("call_completed", json!("orders.list")),
            ("completed", Value::Null),
            ("completed", Value::Null),
        ],
        "{lines:?}"
    );
    assert_eq!((&lines[0]["index"], &lines[3]["index"]), (&json!(1), &json!(2)));
    assert_eq!(lines[1]["outcome"]["value"]["id"], "A-1001");
    assert_eq!(lines[2], json!({ "type": "console", "level": "log", "text": "order A-1001" }));
    assert_eq!(lines[6]["value"], 2);

    let output = run_source("return await orders.refund('A-1002', 100)", &["--demo"]);
    assert_eq!(output.status.code(), Some(3), "{}", stderr(&output));
    let report = report(&output);
    assert_eq!(report["status"], "interrupted");
    assert_eq!(report["interruptions"][0]["id"], "interrupt-1");
    assert_eq!(report["interruptions"][0]["payload"]["orderId"], "A-1002");
}

/// Drives the `approval_cli` example through its prompt. `cargo test` builds examples
/// next to the test binaries; when it is missing or older than its source (for example
/// after `cargo test --test cli`), the test says so and checks nothing.
#[test]
fn the_approval_example_sends_only_when_approved() {
    let Some(example) = built_example("approval_cli") else { return };
    let approved = run_program(&example, &[], "y\n");
    let text = String::from_utf8_lossy(&approved.stdout);
    assert!(approved.status.success(), "{text}{}", stderr(&approved));
    assert!(text.contains("Send this newsletter? [y/N]") && text.contains("sent \""), "{text}");
    assert!(text.contains(r#"result: "sent to 1280 subscribers""#), "{text}");

    for answer in ["n\n", ""] {
        let declined = run_program(&example, &[], answer);
        let text = String::from_utf8_lossy(&declined.stdout);
        assert!(declined.status.success(), "{text}{}", stderr(&declined));
        assert!(!text.contains("sent \""), "{text}");
        assert!(text.contains("not sent: the newsletter was not approved"), "{text}");
    }
}

fn built_example(name: &str) -> Option<PathBuf> {
    let deps = std::env::current_exe().ok()?.parent()?.to_path_buf();
    let binary = deps.parent()?.join("examples").join(format!("{name}{}", std::env::consts::EXE_SUFFIX));
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples").join(format!("{name}.rs"));
    let modified = |path: &Path| std::fs::metadata(path).and_then(|m| m.modified()).ok();
    match (modified(&binary), modified(&source)) {
        (Some(built), Some(written)) if built >= written => Some(binary),
        _ => {
            eprintln!("skipped: {} is not built or is older than its source", binary.display());
            None
        }
    }
}

/// A continuation paused on one `tools.approve` call, made with `codec`.
fn paused_token(codec: impl Into<resumable::runner::ContinuationCodec>) -> String {
    use resumable::{HostFunctions, RunRequest, Runner, RunnerConfig};
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
    let runner = Runner::new(RunnerConfig::new().workers(1).codec(codec)).unwrap();
    let host = HostFunctions::builder()
        .function("tools.approve", |ctx, _args| async move { Err(ctx.interrupt(serde_json::json!({ "kind": "ok?" }))) })
        .build()
        .unwrap();
    let outcome = runtime.block_on(runner.run(RunRequest::new("return await tools.approve(7)").host(host))).unwrap();
    outcome.interrupted().expect("paused").continuation.clone()
}

#[test]
fn inspect_verifies_signed_and_sealed_tokens() {
    use resumable::runner::codec::SealedCodec;
    use resumable::{SignedCodec, SignedCodecConfig};
    let secret = "an-inspection-secret-of-at-least-32-bytes";
    let signed = paused_token(SignedCodec::new(SignedCodecConfig::new(secret)).unwrap());
    let sealed = paused_token(SealedCodec::new(SignedCodecConfig::new(secret)).unwrap());
    for token in [&signed, &sealed] {
        let out = Command::new(env!("CARGO_BIN_EXE_resumable"))
            .args(["inspect", token])
            .env("RESUMABLE_SECRET", secret)
            .output()
            .unwrap();
        assert_eq!(
            out.status.code(),
            Some(0),
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(report["status"], "valid");
        let interruption = &report["continuation"]["interruptions"][0];
        assert_eq!(interruption["id"], "interrupt-1");
        assert_eq!(interruption["arguments"], serde_json::json!([7]));
        assert!(!String::from_utf8_lossy(&out.stdout).contains(secret));
    }
    let mut tampered = signed.clone();
    tampered.replace_range(5..6, if &signed[5..6] == "A" { "B" } else { "A" });
    let out = Command::new(env!("CARGO_BIN_EXE_resumable"))
        .args(["inspect", &tampered])
        .env("RESUMABLE_SECRET", secret)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["error"]["code"], "RUN_PROTOCOL_ERROR");
    let out = Command::new(env!("CARGO_BIN_EXE_resumable"))
        .args(["inspect", &signed])
        .env_remove("RESUMABLE_SECRET")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(out.stdout.is_empty());
}

/// A configuration file in a fresh directory, with mode 0600.
fn config_file(name: &str, text: &str) -> PathBuf {
    use std::os::unix::fs::PermissionsExt as _;
    let path = script_file(name, text);
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    path
}

const CONFIG: &str = r#"
[[keys]]
key_sha256 = "5e884898da28047151d0e56f8dc6292773603d0d6aabbdd62a11ef721d1542d8"
actor = "alice"
tenant = "acme"
roles = ["approver"]

[functions."billing.refund"]
url = "https://billing.example/refund"
params = [{ name = "order_id", type = "string" }, { name = "amount", type = "integer" }]
secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
approval = { when = "args.amount > 1000" }
tenants = ["acme"]
"#;

#[test]
fn config_check_and_functions_read_a_configuration_file() {
    let path = config_file("resumable.toml", CONFIG);
    let path = path.to_str().unwrap();
    let checked = resumable(&["config", "check", path], "");
    assert!(checked.status.success(), "{}", stderr(&checked));
    let summary: Value = serde_json::from_slice(&checked.stdout).unwrap();
    assert_eq!(summary, serde_json::json!({ "valid": true, "keys": 1, "functions": ["billing.refund"] }));

    let catalog = resumable(&["functions", "--config", path], "");
    assert!(catalog.status.success(), "{}", stderr(&catalog));
    let catalog: Value = serde_json::from_slice(&catalog.stdout).unwrap();
    assert_eq!(catalog["functions"][0]["approval"], serde_json::json!({ "when": "args.amount > 1000" }));
    let none = resumable(&["functions", "--config", path, "--tenant", "globex"], "");
    assert_eq!(serde_json::from_slice::<Value>(&none.stdout).unwrap()["functions"], serde_json::json!([]));
    let dts = resumable(&["functions", "--config", path, "--dts"], "");
    let dts = String::from_utf8(dts.stdout).unwrap();
    assert!(
        dts.contains("declare namespace billing") && dts.contains("refund(order_id: string, amount: number)"),
        "{dts}"
    );

    let bad = config_file("bad.toml", "[functions.\"billing.refund\"]\nurl = \"http://x\"\nretries = \"3\"\n");
    let refused = resumable(&["config", "check", bad.to_str().unwrap()], "");
    assert_eq!(refused.status.code(), Some(2));
    let message = stderr(&refused);
    assert!(message.contains("line 3") && message.contains("retries"), "{message}");
}
