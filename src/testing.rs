//! Throwaway databases for the facade's unit tests.

use std::path::PathBuf;

use crate::db::AppDb;

/// A SQLite database file in its own temporary directory, or a fresh schema of the PostgreSQL
/// test server; removed on drop.
pub(crate) struct TempDb {
    dir: PathBuf,
    /// The PostgreSQL server's URL and the schema's name.
    postgres: Option<(String, String)>,
}

#[cfg(feature = "postgres")]
use resumable_workflow::testing::postgres_execute as pg_execute;
use resumable_workflow::testing::random_suffix as random_name;

impl TempDb {
    /// A new, empty database.
    pub(crate) async fn sqlite() -> TempDb {
        let dir = std::env::temp_dir().join(format!("resumable-app-test-{}", random_name()));
        std::fs::create_dir_all(&dir).expect("create a temporary directory");
        TempDb { dir, postgres: None }
    }

    /// A new, empty schema of the PostgreSQL test server (`RESUMABLE_TEST_PG_URL`), if one is
    /// configured (never in a build without PostgreSQL).
    #[cfg(not(feature = "postgres"))]
    pub(crate) async fn postgres() -> Option<TempDb> {
        eprintln!("skipped on PostgreSQL: this build has no postgres feature");
        None
    }

    /// A new, empty schema of the PostgreSQL test server (`RESUMABLE_TEST_PG_URL`), if one is
    /// configured.
    #[cfg(feature = "postgres")]
    pub(crate) async fn postgres() -> Option<TempDb> {
        let server = resumable_workflow::testing::postgres_url()?;
        let schema = format!("app_test_{}", random_name());
        pg_execute(&server, &format!("CREATE SCHEMA {schema}"));
        let mut db = TempDb::sqlite().await;
        db.postgres = Some((server, schema));
        Some(db)
    }

    /// Its URL.
    pub(crate) fn url(&self) -> String {
        match &self.postgres {
            Some((server, schema)) => {
                let sep = if server.contains('?') { '&' } else { '?' };
                format!("{server}{sep}options=-c%20search_path%3D{schema}")
            }
            None => format!("sqlite://{}", self.dir.join("app.db").display()),
        }
    }

    /// Opens (and migrates) it.
    pub(crate) async fn open(&self) -> AppDb {
        AppDb::open(&self.url()).await.expect("open the test database")
    }
}

impl Drop for TempDb {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
        #[cfg(feature = "postgres")]
        if let Some((server, schema)) = &self.postgres {
            pg_execute(server, &format!("DROP SCHEMA IF EXISTS {schema} CASCADE"));
        }
    }
}
