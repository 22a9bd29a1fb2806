//! Throwaway databases for the facade's unit tests.

use std::path::PathBuf;

use crate::db::AppDb;

/// A SQLite database file in its own temporary directory, removed on drop.
pub(crate) struct TempDb {
    dir: PathBuf,
}

impl TempDb {
    /// A new, empty database.
    pub(crate) async fn sqlite() -> TempDb {
        let mut bytes = [0u8; 8];
        getrandom::fill(&mut bytes).expect("randomness");
        let name: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
        let dir = std::env::temp_dir().join(format!("resumable-app-test-{name}"));
        std::fs::create_dir_all(&dir).expect("create a temporary directory");
        TempDb { dir }
    }

    /// Its URL.
    pub(crate) fn url(&self) -> String {
        format!("sqlite://{}", self.dir.join("app.db").display())
    }

    /// Opens (and migrates) it.
    pub(crate) async fn open(&self) -> AppDb {
        AppDb::open(&self.url()).await.expect("open the test database")
    }
}

impl Drop for TempDb {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
