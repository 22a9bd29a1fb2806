//! The application database: continuations, the demo order system, sessions and the audit log, on the
//! same SQLite file or PostgreSQL database as the workflow engine.
//!
//! [`AppDb`] is one small query surface over two backends. Queries are written once in the SQL
//! both understand (`$1` parameters, `ON CONFLICT`, `RETURNING`); only the schema differs per
//! backend.
//!
//! * On SQLite every statement runs on the connections of the workflow engine's own
//!   [`SqliteStore`]: writes in [`SqliteStore::write`] transactions on its one writer thread, reads
//!   in [`SqliteStore::read`]. A process so has a single SQLite writer, and the application's
//!   writes never wait on the engine's for the file's lock (nor the other way round).
//! * On PostgreSQL statements run on a sqlx connection pool of their own.
//!
//! Open both the engine's store and the application's tables with [`AppDb::open`], and hand
//! [`AppDb::store`] to the engine.

mod counted_store;
#[cfg(feature = "postgres")]
mod postgres;
mod sqlite;
mod transaction;
mod value;

pub use transaction::{Guard, Step, TxOutcome};
pub use value::{FromSqlValue, Param, Row, SqlValue};

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use resumable_workflow::migrations::Migration;
use resumable_workflow::{SqliteStore, Store, StoreError};
#[cfg(feature = "postgres")]
use sqlx::postgres::{PgPool, PgPoolOptions};

use counted_store::CountedStore;
#[cfg(feature = "postgres")]
use postgres::{pg_columns, pg_query, pg_row, pg_steps};
use sqlite::{sqlite_execute, sqlite_fetch, sqlite_migrate, sqlite_read_then_write, sqlite_transaction};

/// The application's migrations on each backend, recorded in [`MIGRATIONS_TABLE`].
const SQLITE_MIGRATIONS: &[Migration] = &[
    Migration::new(1, "app", include_str!("../../migrations/app/sqlite/0001_app.sql")),
    Migration::new(2, "sessions", include_str!("../../migrations/app/sqlite/0002_sessions.sql")),
    Migration::new(3, "approval_index", include_str!("../../migrations/app/sqlite/0003_approval_index.sql")),
    Migration::new(4, "webhooks", include_str!("../../migrations/app/sqlite/0004_webhooks.sql")),
    Migration::new(5, "audit", include_str!("../../migrations/app/sqlite/0005_audit.sql")),
    Migration::new(6, "tenant_feeds", include_str!("../../migrations/app/sqlite/0006_tenant_feeds.sql")),
];
#[cfg(feature = "postgres")]
const POSTGRES_MIGRATIONS: &[Migration] = &[
    Migration::new(1, "app", include_str!("../../migrations/app/postgres/0001_app.sql")),
    Migration::new(2, "sessions", include_str!("../../migrations/app/postgres/0002_sessions.sql")),
    Migration::new(3, "approval_index", include_str!("../../migrations/app/postgres/0003_approval_index.sql")),
    Migration::new(4, "webhooks", include_str!("../../migrations/app/postgres/0004_webhooks.sql")),
    Migration::new(5, "audit", include_str!("../../migrations/app/postgres/0005_audit.sql")),
    Migration::new(6, "tenant_feeds", include_str!("../../migrations/app/postgres/0006_tenant_feeds.sql")),
];

/// A lock id for PostgreSQL's advisory lock around migrations ("resumable-app").
#[cfg(feature = "postgres")]
const MIGRATION_LOCK: i64 = 0x7265_7375_6d61_7070;

/// The application's connections to PostgreSQL.
#[cfg(feature = "postgres")]
const POSTGRES_CONNECTIONS: u32 = 8;

/// The table of the application's applied migrations (the workflow store keeps its own).
const MIGRATIONS_TABLE: &str = "app_schema_migrations";

/// How a database's schema compares with this build's ([`AppDb::schema`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SchemaState {
    /// This build's.
    Current,
    /// Not migrated to this build's yet (which one, and how far).
    Older(String),
    /// Migrated by a later release (during a rolling upgrade, say): this build still works on it.
    Newer(String),
}

/// Which database an [`AppDb`] talks to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Backend {
    /// A SQLite file.
    Sqlite,
    /// A PostgreSQL database.
    Postgres,
}

impl Backend {
    /// The backend a database URL names, if any.
    pub fn of_url(url: &str) -> Option<Backend> {
        match resumable_workflow::store::DatabaseKind::of_url(url)? {
            resumable_workflow::store::DatabaseKind::Sqlite => Some(Backend::Sqlite),
            resumable_workflow::store::DatabaseKind::Postgres => Some(Backend::Postgres),
            _ => None,
        }
    }
}

/// Why a statement of the application failed. Messages are for operators (never a password); the
/// driver's error is the [`source`](std::error::Error::source).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DbError {
    /// The engine's store failed, or (on SQLite) a statement on its connections.
    #[error(transparent)]
    Store(StoreError),
    /// A statement on the application's PostgreSQL pool failed.
    #[cfg(feature = "postgres")]
    #[error("database error: {0}")]
    Postgres(sqlx::Error),
    /// A PostgreSQL URL, in a build without the `postgres` feature.
    #[error("this build has no PostgreSQL support: it was built without the cargo feature `postgres`")]
    NoPostgres,
    /// A row does not hold what the query's reader expects.
    #[error("unexpected row: {0}")]
    Row(String),
    /// The URL names no database this build supports.
    #[error("unsupported database URL: use sqlite://PATH or postgres://USER@HOST/DB")]
    UnsupportedUrl,
}

// Every failure of the database reaches the application's code through these two conversions,
// which count it.
impl From<StoreError> for DbError {
    fn from(e: StoreError) -> DbError {
        if matches!(e, StoreError::Database(_) | StoreError::Corrupt(_)) {
            crate::metrics::store_error("app");
        }
        DbError::Store(e)
    }
}

#[cfg(feature = "postgres")]
impl From<sqlx::Error> for DbError {
    fn from(e: sqlx::Error) -> DbError {
        crate::metrics::store_error("app");
        DbError::Postgres(e)
    }
}

/// The connections an [`AppDb`] runs its statements on.
#[derive(Clone)]
enum Conn {
    /// The workflow engine's SQLite store.
    Sqlite(SqliteStore),
    /// A PostgreSQL pool of the application's own.
    #[cfg(feature = "postgres")]
    Postgres(PgPool),
}

/// The application database: the engine's store and the application's tables, on one database.
#[derive(Clone)]
pub struct AppDb {
    /// The workflow engine's store on the same database.
    store: Arc<dyn Store>,
    /// Where the application's statements run.
    conn: Conn,
}

impl fmt::Debug for AppDb {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AppDb").field("backend", &self.backend()).finish_non_exhaustive()
    }
}

impl AppDb {
    /// Opens the database at `url` (`sqlite://file.db`, `sqlite::memory:`, `postgres://…`): the
    /// workflow engine's store (see [`AppDb::store`]) and the application's tables, applying both
    /// their pending migrations. On SQLite both share the store's connections.
    pub async fn open(url: &str) -> Result<AppDb, DbError> {
        match Backend::of_url(url) {
            Some(Backend::Sqlite) => AppDb::from_sqlite(SqliteStore::open(url).await?).await,
            #[cfg(not(feature = "postgres"))]
            Some(Backend::Postgres) => Err(DbError::NoPostgres),
            #[cfg(feature = "postgres")]
            Some(Backend::Postgres) => {
                let store = resumable_workflow::store::open(url).await?;
                let pool = PgPoolOptions::new().max_connections(POSTGRES_CONNECTIONS).connect(url).await?;
                let db = AppDb { store: Arc::new(CountedStore::new(store)), conn: Conn::Postgres(pool) };
                db.migrate().await?;
                Ok(db)
            }
            None => Err(DbError::UnsupportedUrl),
        }
    }

    /// The application database on an open SQLite store (for one opened with custom options),
    /// applying the application's pending migrations.
    pub async fn from_sqlite(store: SqliteStore) -> Result<AppDb, DbError> {
        let db = AppDb { store: Arc::new(CountedStore::new(Arc::new(store.clone()))), conn: Conn::Sqlite(store) };
        db.migrate().await?;
        Ok(db)
    }

    /// The workflow engine's store on the same database, for [`crate::automation::Automations`].
    pub fn store(&self) -> Arc<dyn Store> {
        Arc::clone(&self.store)
    }

    /// The backend.
    pub fn backend(&self) -> Backend {
        match self.conn {
            Conn::Sqlite(_) => Backend::Sqlite,
            #[cfg(feature = "postgres")]
            Conn::Postgres(_) => Backend::Postgres,
        }
    }

    /// Runs one statement and returns how many rows it affected.
    pub async fn execute(&self, sql: &'static str, params: Vec<Param>) -> Result<u64, DbError> {
        match &self.conn {
            Conn::Sqlite(store) => Ok(store.write(move |conn| sqlite_execute(conn, sql, &params)).await?),
            #[cfg(feature = "postgres")]
            Conn::Postgres(pool) => Ok(pg_query(sql, &params).execute(pool).await?.rows_affected()),
        }
    }

    /// Runs one statement and returns its first row, if any. A `SELECT` reads committed data on a
    /// read connection; any other statement (`UPDATE … RETURNING`) runs as a write.
    pub async fn fetch_optional(&self, sql: &'static str, params: Vec<Param>) -> Result<Option<Row>, DbError> {
        match &self.conn {
            Conn::Sqlite(store) => Ok(sqlite_fetch(store, sql, params).await?.into_iter().next()),
            #[cfg(feature = "postgres")]
            Conn::Postgres(pool) => {
                let row = pg_query(sql, &params).fetch_optional(pool).await?;
                row.map(|row| pg_row(&row, &pg_columns(&row))).transpose()
            }
        }
    }

    /// Runs one statement and returns its first row, failing if there is none.
    pub async fn fetch_one(&self, sql: &'static str, params: Vec<Param>) -> Result<Row, DbError> {
        self.fetch_optional(sql, params).await?.ok_or_else(|| DbError::Row("the query returned no row".to_owned()))
    }

    /// Runs one statement and returns all its rows (routed as [`AppDb::fetch_optional`] does).
    pub async fn fetch_all(&self, sql: &'static str, params: Vec<Param>) -> Result<Vec<Row>, DbError> {
        match &self.conn {
            Conn::Sqlite(store) => sqlite_fetch(store, sql, params).await,
            #[cfg(feature = "postgres")]
            Conn::Postgres(pool) => {
                let rows = pg_query(sql, &params).fetch_all(pool).await?;
                let Some(first) = rows.first() else { return Ok(Vec::new()) };
                let columns = pg_columns(first);
                rows.iter().map(|row| pg_row(row, &columns)).collect()
            }
        }
    }

    /// Runs `steps` in order in one transaction, each followed by what its [`Guard`] decides:
    /// all committed, or (on a refusal or an error) none.
    pub async fn transaction(&self, steps: Vec<Step>) -> Result<TxOutcome, DbError> {
        match &self.conn {
            Conn::Sqlite(store) => Ok(store.write(move |conn| sqlite_transaction(conn, &steps)).await?),
            #[cfg(feature = "postgres")]
            Conn::Postgres(pool) => {
                let mut tx = pool.begin().await?;
                let outcome = pg_steps(&mut tx, &steps).await?;
                match outcome {
                    TxOutcome::Committed => tx.commit().await?,
                    TxOutcome::Refused(_) => tx.rollback().await?,
                }
                Ok(outcome)
            }
        }
    }

    /// Runs `sql` (a statement that returns rows, usually one that also locks or writes them:
    /// `INSERT … ON CONFLICT … DO UPDATE … RETURNING`, `SELECT … FOR UPDATE`), then the steps
    /// `then` builds from its rows, all in one transaction: the steps run as
    /// [`AppDb::transaction`]'s do, and a refusal, an error, or an error of `then` rolls back the
    /// first statement too.
    ///
    /// For a write that depends on what the database holds, with no other writer in between: on
    /// PostgreSQL the first statement's row locks hold until the end; on SQLite the store's one
    /// writer runs the whole.
    pub async fn read_then_write<F>(&self, sql: &'static str, params: Vec<Param>, then: F) -> Result<TxOutcome, DbError>
    where
        F: FnOnce(Vec<Row>) -> Result<Vec<Step>, DbError> + Send + 'static,
    {
        match &self.conn {
            Conn::Sqlite(store) => store.write(move |conn| sqlite_read_then_write(conn, sql, &params, then)).await?,
            #[cfg(feature = "postgres")]
            Conn::Postgres(pool) => {
                let mut tx = pool.begin().await?;
                let rows = pg_query(sql, &params).fetch_all(&mut *tx).await?;
                let rows = match rows.first() {
                    Some(first) => {
                        let columns = pg_columns(first);
                        rows.iter().map(|row| pg_row(row, &columns)).collect::<Result<Vec<_>, _>>()?
                    }
                    None => Vec::new(),
                };
                // An error drops the transaction, which rolls it back.
                let steps = then(rows)?;
                let outcome = pg_steps(&mut tx, &steps).await?;
                match outcome {
                    TxOutcome::Committed => tx.commit().await?,
                    TxOutcome::Refused(_) => tx.rollback().await?,
                }
                Ok(outcome)
            }
        }
    }

    /// How the database's schema compares with the one this build migrates to, the engine's and
    /// the application's both.
    pub async fn schema(&self) -> Result<SchemaState, DbError> {
        let (engine, app) = match self.backend() {
            Backend::Sqlite => (resumable_workflow::store::sqlite::SCHEMA_VERSION, SQLITE_MIGRATIONS.len()),
            #[cfg(feature = "postgres")]
            Backend::Postgres => (resumable_workflow::store::postgres::SCHEMA_VERSION, POSTGRES_MIGRATIONS.len()),
            #[cfg(not(feature = "postgres"))]
            Backend::Postgres => return Err(DbError::NoPostgres),
        };
        let tables = [
            ("schema_migrations", "SELECT MAX(version) AS v FROM schema_migrations", engine),
            (MIGRATIONS_TABLE, "SELECT MAX(version) AS v FROM app_schema_migrations", app as i64),
        ];
        let mut state = SchemaState::Current;
        for (table, sql, expected) in tables {
            let found: Option<i64> = self.fetch_one(sql, vec![]).await?.get("v")?;
            let what = || {
                let found = found.map_or("none".to_owned(), |v| v.to_string());
                format!("{table} is at version {found}, this build's is {expected}")
            };
            match found {
                Some(v) if v == expected => {}
                Some(v) if v > expected => state = SchemaState::Newer(what()),
                _ => return Ok(SchemaState::Older(what())),
            }
        }
        Ok(state)
    }

    /// Applies the application's pending migrations in one transaction; refuses a schema newer
    /// than this build's.
    async fn migrate(&self) -> Result<(), DbError> {
        match &self.conn {
            Conn::Sqlite(store) => Ok(store.write(sqlite_migrate).await?),
            #[cfg(feature = "postgres")]
            Conn::Postgres(pool) => {
                let mut tx = pool.begin().await?;
                // Several processes may open a fresh database at once.
                sqlx::query("SELECT pg_advisory_xact_lock($1)").bind(MIGRATION_LOCK).execute(&mut *tx).await?;
                resumable_workflow::migrations::migrate_postgres(&mut tx, MIGRATIONS_TABLE, POSTGRES_MIGRATIONS)
                    .await?;
                tx.commit().await?;
                Ok(())
            }
        }
    }
}

/// The current time in milliseconds since the Unix epoch.
pub(crate) fn now_ms() -> i64 {
    to_ms(SystemTime::now())
}

/// A time in milliseconds since the Unix epoch (0 before it).
pub(crate) fn to_ms(t: SystemTime) -> i64 {
    t.duration_since(UNIX_EPOCH).map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// A duration in whole milliseconds (saturating).
pub(crate) fn duration_ms(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// The time `ms` milliseconds after the Unix epoch.
pub(crate) fn from_ms(ms: i64) -> SystemTime {
    UNIX_EPOCH + Duration::from_millis(ms.max(0).unsigned_abs())
}

#[cfg(test)]
mod tests {
    use super::sqlite::is_select;
    use super::*;
    use crate::testing::TempDb;

    /// A test table of `db`'s backend.
    async fn create_table(db: &AppDb) {
        let sql = match db.backend() {
            Backend::Sqlite => "CREATE TABLE t (k TEXT PRIMARY KEY NOT NULL, n BIGINT NOT NULL, b BLOB)",
            Backend::Postgres => "CREATE TABLE t (k TEXT PRIMARY KEY NOT NULL, n BIGINT NOT NULL, b BYTEA)",
        };
        db.execute(sql, vec![]).await.unwrap();
    }

    /// Runs `check` on a fresh SQLite database and, if a test server is configured, a fresh
    /// PostgreSQL schema.
    async fn on_both<F: AsyncFn(&AppDb)>(check: F) {
        let temp = TempDb::sqlite().await;
        check(&temp.open().await).await;
        if let Some(temp) = TempDb::postgres().await {
            check(&temp.open().await).await;
        }
    }

    #[test]
    fn selects_are_recognized() {
        assert!(is_select("  select 1"));
        assert!(is_select("SELECT x FROM t"));
        assert!(!is_select("UPDATE t SET x = 1 RETURNING x"));
        assert!(!is_select("SEL"));
    }

    #[tokio::test]
    async fn parameters_bind_by_number_whatever_their_order_of_appearance() {
        on_both(async |db: &AppDb| {
            create_table(db).await;
            let params = vec!["a".into(), 7.into(), None::<Vec<u8>>.into()];
            assert_eq!(db.execute("INSERT INTO t (n, k, b) VALUES ($2, $1, $3)", params).await.unwrap(), 1);
            let row = db.fetch_one("SELECT k, n, b FROM t WHERE n = $2 AND k = $1", vec!["a".into(), 7.into()]);
            let row = row.await.unwrap();
            assert_eq!(row.get::<String>("k").unwrap(), "a");
            assert_eq!(row.get::<i64>("n").unwrap(), 7);
            assert_eq!(row.get::<Option<Vec<u8>>>("b").unwrap(), None);
            assert!(row.get::<String>("n").is_err(), "an integer is not text");
            assert!(row.get::<i64>("missing").is_err());
            let updated =
                db.fetch_optional("UPDATE t SET b = $1 WHERE k = $2 RETURNING b", vec![vec![1u8].into(), "a".into()]);
            assert_eq!(updated.await.unwrap().unwrap().get::<Vec<u8>>("b").unwrap(), vec![1u8]);
            let wrong = db.execute("INSERT INTO t (k, n) VALUES ($1, $2)", vec!["b".into()]).await;
            assert!(wrong.is_err(), "a missing parameter is an error, not a NULL");
            assert!(db.fetch_all("SELECT k FROM t WHERE k = $1", vec!["none".into()]).await.unwrap().is_empty());
        })
        .await;
    }

    #[tokio::test]
    async fn a_transaction_stops_commits_or_refuses_as_its_guards_say() {
        on_both(async |db: &AppDb| {
            create_table(db).await;
            let insert =
                |k: &str| Step::new("INSERT INTO t (k, n) VALUES ($1, 0) ON CONFLICT (k) DO NOTHING", vec![k.into()]);
            let bump = |k: &str| Step::new("UPDATE t SET n = n + 1 WHERE k = $1 AND n < 1", vec![k.into()]);
            let refuse = || Guard::RefuseUnless(1, "too many".into());
            let tx = vec![insert("a").guard(Guard::StopUnless(1)), bump("a").guard(refuse())];
            assert_eq!(db.transaction(tx.clone()).await.unwrap(), TxOutcome::Committed);
            // The insert affects nothing: stop, and the bump does not run.
            assert_eq!(db.transaction(tx).await.unwrap(), TxOutcome::Committed);
            // The insert of `b` happens, the bump of `a` is refused: both roll back.
            let tx = vec![insert("b"), bump("a").guard(refuse())];
            assert_eq!(db.transaction(tx).await.unwrap(), TxOutcome::Refused("too many".into()));
            let rows = db.fetch_all("SELECT k, n FROM t ORDER BY k", vec![]).await.unwrap();
            assert_eq!(rows.len(), 1);
            assert_eq!(rows[0].get::<i64>("n").unwrap(), 1);
            // An error rolls back the steps before it.
            let tx = vec![insert("c"), Step::new("INSERT INTO t (k, n) VALUES ('a', 0)", vec![])];
            assert!(db.transaction(tx).await.is_err());
            assert_eq!(db.fetch_all("SELECT k FROM t", vec![]).await.unwrap().len(), 1);
        })
        .await;
    }

    /// The application's tables go through the same migration runner as the workflow store's: an
    /// edited migration is refused with what to do.
    #[tokio::test]
    async fn an_edited_migration_is_refused() {
        let temp = TempDb::sqlite().await;
        let db = temp.open().await;
        db.execute("UPDATE app_schema_migrations SET checksum = 'edited' WHERE version = 1", vec![]).await.unwrap();
        drop(db);
        let err = AppDb::open(&temp.url()).await.unwrap_err();
        assert!(err.to_string().contains("migration 1 (app) was changed"), "{err}");
    }

    #[tokio::test]
    async fn a_newer_schema_is_refused() {
        let temp = TempDb::sqlite().await;
        let db = temp.open().await;
        let future = "INSERT INTO app_schema_migrations (version, name, applied_at) VALUES (99, 'future', 0)";
        db.execute(future, vec![]).await.unwrap();
        drop(db);
        let err = AppDb::open(&temp.url()).await.unwrap_err();
        assert!(err.to_string().contains("newer than this build"), "{err}");
    }
}
