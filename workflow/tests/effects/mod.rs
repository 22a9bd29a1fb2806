//! A SQLite database of side effects for the crash tests, on rusqlite (the driver the production
//! store uses). Statements run on the blocking pool, so a busy database never stalls the engine's
//! runtime threads (and with them the leases a test is watching); only opening it runs where it
//! is called, before the engine starts. One connection per process serves all its tasks.

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rusqlite::{Connection, Params, Row};

/// One connection to `effects.db`, shared by the tasks of one process.
#[derive(Clone)]
pub struct SqliteEffects {
    conn: Arc<Mutex<Connection>>,
}

impl SqliteEffects {
    /// Opens (creating it if needed) `effects.db` in `dir`, in WAL mode; `durable` syncs every
    /// commit (`synchronous = FULL`), otherwise only at checkpoints (`NORMAL`).
    pub fn open(dir: &Path, durable: bool, busy_timeout: Duration) -> SqliteEffects {
        let conn = Connection::open(dir.join("effects.db")).expect("open the effects database");
        conn.busy_timeout(busy_timeout).expect("set the busy timeout");
        conn.pragma_update(None, "journal_mode", "WAL").expect("WAL mode");
        conn.pragma_update(None, "synchronous", if durable { "FULL" } else { "NORMAL" }).expect("synchronous");
        SqliteEffects { conn: Arc::new(Mutex::new(conn)) }
    }

    /// Runs `work` on the connection, on the blocking pool.
    async fn with<T: Send + 'static>(
        &self,
        work: impl FnOnce(&Connection) -> rusqlite::Result<T> + Send + 'static,
    ) -> rusqlite::Result<T> {
        let conn = Arc::clone(&self.conn);
        tokio::task::spawn_blocking(move || work(&conn.lock().unwrap_or_else(|e| e.into_inner())))
            .await
            .expect("the effects statement ran")
    }

    /// Executes `sql` with `params`.
    pub async fn execute<P: Params + Send + 'static>(&self, sql: &'static str, params: P) -> rusqlite::Result<()> {
        self.with(move |conn| conn.execute(sql, params).map(drop)).await
    }

    /// The rows of `sql` with `params`, each mapped by `row`.
    pub async fn query<T: Send + 'static, P: Params + Send + 'static>(
        &self,
        sql: &'static str,
        params: P,
        row: fn(&Row<'_>) -> rusqlite::Result<T>,
    ) -> rusqlite::Result<Vec<T>> {
        self.with(move |conn| conn.prepare(sql)?.query_map(params, row)?.collect()).await
    }
}
