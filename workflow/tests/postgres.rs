//! The conformance suite on the PostgreSQL backend, against the server at `RESUMABLE_TEST_PG_URL`
//! (a role that may create schemas). Each test gets its own schemas, dropped at its end.
//!
//! Without `RESUMABLE_TEST_PG_URL` every test is skipped (and says so), except under CI (`CI`
//! set), where a missing server fails them.

mod conformance;

use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use resumable_workflow::store::BoxFuture;
use resumable_workflow::{PgStore, PgStoreOptions, Store};
use sqlx::Connection;

/// Schemas older than this (by the time in their name) are left over from killed test processes.
const STALE_AFTER: Duration = Duration::from_secs(3600);

fn server_url() -> Option<String> {
    resumable_workflow::testing::postgres_url()
}

/// One test's databases: a schema per name, `rt_<unix seconds>_<random>_<name>`, each with its
/// own notification channel; dropped (best effort) with the backend.
struct PgSchemas {
    url: String,
    prefix: String,
    created: Mutex<Vec<String>>,
}

impl PgSchemas {
    fn new(url: String) -> PgSchemas {
        let mut bytes = [0u8; 6];
        getrandom::fill(&mut bytes).unwrap();
        let random: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
        let secs = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs();
        PgSchemas { url, prefix: format!("rt_{secs}_{random}"), created: Mutex::new(Vec::new()) }
    }

    fn from_env() -> Option<PgSchemas> {
        server_url().map(PgSchemas::new)
    }
}

impl conformance::Backend for PgSchemas {
    fn open<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Arc<dyn Store>> {
        Box::pin(async move {
            let schema = format!("{}_{}", self.prefix, name.to_ascii_lowercase());
            {
                let mut created = self.created.lock().unwrap();
                if !created.contains(&schema) {
                    created.push(schema.clone());
                }
            }
            // A warm pool: tests with short leases must not wait for connections (each new one
            // costs a password handshake, slow in debug builds).
            let options = PgStoreOptions {
                max_connections: 6,
                min_connections: 6,
                schema: Some(schema.clone()),
                notify_channel: schema,
                ..PgStoreOptions::default()
            };
            let store: Arc<dyn Store> =
                Arc::new(PgStore::open_with(&self.url, options).await.expect("open PostgreSQL store"));
            store
        })
    }
}

impl Drop for PgSchemas {
    fn drop(&mut self) {
        let schemas = std::mem::take(&mut *self.created.lock().unwrap_or_else(|p| p.into_inner()));
        let url = self.url.clone();
        // Drop runs inside the test's runtime: clean up on a thread of its own.
        let cleanup = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            runtime.block_on(drop_schemas(&url, schemas));
        });
        let _ = cleanup.join();
    }
}

/// Drops `schemas` and the stale test schemas of earlier runs; failures are ignored.
async fn drop_schemas(url: &str, mut schemas: Vec<String>) {
    let Ok(Ok(mut conn)) = tokio::time::timeout(Duration::from_secs(5), sqlx::PgConnection::connect(url)).await else {
        return;
    };
    // Do not wait long for a store of the test that is still in a transaction.
    let _ = sqlx::query("SET lock_timeout = '5s'").execute(&mut conn).await;
    let existing: Vec<String> =
        sqlx::query_scalar("SELECT nspname::text FROM pg_namespace WHERE nspname LIKE 'rt\\_%'")
            .fetch_all(&mut conn)
            .await
            .unwrap_or_default();
    let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs();
    for schema in existing {
        let created = schema.split('_').nth(1).and_then(|s| s.parse::<u64>().ok());
        if created.is_some_and(|t| now.saturating_sub(t) > STALE_AFTER.as_secs()) && !schemas.contains(&schema) {
            schemas.push(schema);
        }
    }
    for schema in schemas {
        // Test schema names are plain identifiers.
        let _ = sqlx::Executor::execute(&mut conn, format!("DROP SCHEMA IF EXISTS {schema} CASCADE").as_str()).await;
    }
    let _ = conn.close().await;
}

conformance_suite!(match PgSchemas::from_env() {
    Some(backend) => backend,
    None => return,
});
