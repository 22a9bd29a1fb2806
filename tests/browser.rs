//! The approval inbox in a real browser: starts `resumable serve --demo` on a fresh SQLite
//! database and runs `node tests/browser/inbox.mjs BASE_URL`, which drives headless Chromium
//! (Debian's `/usr/bin/chromium` through `playwright-core`): sign in, see a pending refund,
//! approve it with a reason, watch the automation complete. Screenshots are kept in
//! `<target dir>/browser-artifacts/`.
//!
//! Needs `/usr/bin/chromium`, `node`, and `npm ci --prefix tests/browser`. Without them the test
//! says it was skipped, unless `CI` is set: then it fails (`.ci/run` installs them).

#[allow(dead_code)]
mod support;

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use resumable_workflow::testing::under_ci;
use support::{Server, TempDir};

const CHROMIUM: &str = "/usr/bin/chromium";

/// How long the browser script may take in all.
const BROWSER_TIMEOUT: Duration = Duration::from_secs(240);

/// What is missing to run the browser test, if anything.
fn missing_prerequisite(root: &Path) -> Option<String> {
    if !Path::new(CHROMIUM).exists() {
        return Some(format!("{CHROMIUM} is not installed (apt-get install chromium chromium-driver)"));
    }
    if !root.join("tests/browser/node_modules/playwright-core").is_dir() {
        return Some("tests/browser/node_modules is missing (npm ci --prefix tests/browser)".into());
    }
    let node = std::process::Command::new("node").arg("--version").output();
    if !node.is_ok_and(|o| o.status.success()) {
        return Some("node is not on PATH".into());
    }
    None
}

fn artifacts_dir() -> PathBuf {
    let tmp = Path::new(env!("CARGO_TARGET_TMPDIR"));
    tmp.parent().unwrap_or(tmp).join("browser-artifacts")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_approver_decides_a_refund_in_headless_chromium() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    if let Some(missing) = missing_prerequisite(root) {
        assert!(!under_ci(), "CI must run the browser test, but {missing}");
        eprintln!("skipped: the browser test cannot run: {missing}");
        return;
    }
    let dir = TempDir::new("browser");
    let server = Server::start(&dir, &[]);
    let artifacts = artifacts_dir();
    for name in ["inbox-pending.png", "inbox-approved.png", "inbox-failure.png"] {
        let _ = std::fs::remove_file(artifacts.join(name));
    }
    let child = tokio::process::Command::new("node")
        .arg(root.join("tests/browser/inbox.mjs"))
        .arg(server.url())
        .current_dir(root)
        .env("BROWSER_ARTIFACTS", &artifacts)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("node starts");
    let output = match tokio::time::timeout(BROWSER_TIMEOUT, child.wait_with_output()).await {
        Ok(output) => output.expect("the browser script's output"),
        Err(_) => {
            panic!("the browser script did not finish within {BROWSER_TIMEOUT:?}; server log:\n{}", server.log_text())
        }
    };
    let (stdout, stderr) = (String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    assert!(
        output.status.success(),
        "the browser script failed ({}):\n{stdout}\n{stderr}\nserver log:\n{}",
        output.status,
        server.log_text()
    );
    assert!(stdout.contains("\"ok\":true"), "{stdout}");
    for name in ["inbox-pending.png", "inbox-approved.png"] {
        let size = std::fs::metadata(artifacts.join(name)).map(|m| m.len()).unwrap_or(0);
        assert!(size > 1000, "the screenshot {name} is saved in {}", artifacts.display());
    }
}
