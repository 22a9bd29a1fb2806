//! The conformance suite on the SQLite backend (a fresh directory of database files per test).

mod conformance;

use std::path::PathBuf;
use std::sync::Arc;

use resumable_workflow::store::BoxFuture;
use resumable_workflow::{SqliteStore, Store};

/// SQLite databases as files in a temporary directory, removed on drop.
struct SqliteFiles {
    dir: PathBuf,
}

impl SqliteFiles {
    fn new() -> SqliteFiles {
        let mut bytes = [0u8; 8];
        getrandom::fill(&mut bytes).unwrap();
        let name: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
        let dir = std::env::temp_dir().join(format!("resumable-workflow-test-{name}"));
        std::fs::create_dir_all(&dir).unwrap();
        SqliteFiles { dir }
    }
}

impl Drop for SqliteFiles {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl conformance::Backend for SqliteFiles {
    fn open<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Arc<dyn Store>> {
        Box::pin(async move {
            let url = format!("sqlite://{}", self.dir.join(format!("{name}.db")).display());
            let store: Arc<dyn Store> = Arc::new(SqliteStore::open(&url).await.expect("open SQLite store"));
            store
        })
    }
}

conformance_suite!(SqliteFiles::new());
