//! What the engine's background work could not do is reported in the log: a database that
//! refuses every claim is reported once (not once per attempt), and so is its recovery.

use std::io::Write;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use resumable_workflow::{Engine, SqliteStore, StartOptions, WorkflowContext, WorkflowError};
use serde_json::{Value, json};
use tracing_subscriber::fmt::MakeWriter;

/// Log lines written through the subscriber, kept for the test to read.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Captured {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}

impl Write for Captured {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> MakeWriter<'a> for Captured {
    type Writer = Captured;

    fn make_writer(&'a self) -> Captured {
        self.clone()
    }
}

async fn echo(_ctx: WorkflowContext, input: Value) -> Result<Value, WorkflowError> {
    Ok(input)
}

fn temp_dir() -> PathBuf {
    let dir =
        std::env::temp_dir().join(format!("resumable-failure-log-{}", resumable_workflow::testing::random_suffix()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Waits until `condition` holds on the captured log, for at most five seconds.
async fn logged(log: &Captured, condition: impl Fn(&str) -> bool) -> String {
    for _ in 0..500 {
        let text = log.text();
        if condition(&text) {
            return text;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("not logged in time; the log so far:\n{}", log.text());
}

#[tokio::test]
async fn claims_refused_by_the_database_are_reported_once_and_so_is_the_recovery() {
    let log = Captured::default();
    let subscriber = tracing_subscriber::fmt().with_writer(log.clone()).with_ansi(false).finish();
    let _default = tracing::subscriber::set_default(subscriber);

    let dir = temp_dir();
    let path = dir.join("runs.db");
    let store = SqliteStore::open(&format!("sqlite://{}", path.display())).await.unwrap();
    // The table every claim reads goes away under the engine's feet.
    let sabotage = rusqlite::Connection::open(&path).unwrap();
    sabotage.execute_batch("ALTER TABLE runs RENAME TO runs_elsewhere").unwrap();
    let engine = Engine::builder(Arc::new(store)).register("echo", echo).workers(3).build();

    let failing = logged(&log, |text| text.contains("claiming runs failed")).await;
    assert!(failing.contains("WARN"), "{failing}");
    assert!(failing.contains("runs"), "the database's own message names the missing table: {failing}");
    // Three workers retry every half second: a second second of failures adds no report.
    tokio::time::sleep(Duration::from_millis(1_200)).await;
    assert_eq!(log.text().lines().filter(|line| line.contains("WARN")).count(), 1, "{}", log.text());

    sabotage.execute_batch("ALTER TABLE runs_elsewhere RENAME TO runs").unwrap();
    let recovered = logged(&log, |text| text.contains("claiming runs works again")).await;
    assert!(recovered.contains("INFO"), "{recovered}");
    let run = engine.start("echo", json!({ "after": "recovery" }), StartOptions::default()).await.unwrap();
    let info = engine.wait_for(&run, Duration::from_secs(5)).await.unwrap();
    assert_eq!(info.output, Some(json!({ "after": "recovery" })));

    engine.shutdown().await;
    drop(sabotage);
    let _ = std::fs::remove_dir_all(dir);
}
