//! The application database: continuations, the demo order system and the audit log, on the
//! same SQLite file or PostgreSQL database as the workflow engine.
//!
//! Queries are written once in the SQL both backends understand (`$1` parameters, `ON CONFLICT`,
//! `RETURNING`) and run through sqlx's `Any` driver; only the schema differs per backend.

use std::fmt;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use sqlx::any::{AnyPoolOptions, install_default_drivers};
use sqlx::{AnyPool, Executor};

/// The schema versions of each backend: (version, name, SQL).
const SQLITE_MIGRATIONS: &[(i64, &str, &str)] = &[(1, "app", include_str!("../migrations/app/sqlite/0001_app.sql"))];
const POSTGRES_MIGRATIONS: &[(i64, &str, &str)] =
    &[(1, "app", include_str!("../migrations/app/postgres/0001_app.sql"))];

/// A lock id for PostgreSQL's advisory lock around migrations ("resumable-app").
const MIGRATION_LOCK: i64 = 0x7265_7375_6d61_7070;

/// Which database an [`AppDb`] talks to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    /// A SQLite file.
    Sqlite,
    /// A PostgreSQL database.
    Postgres,
}

impl Backend {
    /// The backend a database URL names, if any.
    pub fn of_url(url: &str) -> Option<Backend> {
        if url.starts_with("sqlite:") {
            Some(Backend::Sqlite)
        } else if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            Some(Backend::Postgres)
        } else {
            None
        }
    }
}

/// A database error, with a message for operators (never a password).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DbError(pub String);

impl fmt::Display for DbError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "database error: {}", self.0)
    }
}

impl std::error::Error for DbError {}

impl From<sqlx::Error> for DbError {
    fn from(e: sqlx::Error) -> DbError {
        DbError(e.to_string())
    }
}

/// The application's connection pool.
#[derive(Clone, Debug)]
pub struct AppDb {
    pool: AnyPool,
    backend: Backend,
}

impl AppDb {
    /// Connects to `url` (`sqlite://file.db`, `postgres://…`) and applies pending migrations.
    pub async fn open(url: &str) -> Result<AppDb, DbError> {
        let backend = Backend::of_url(url).ok_or_else(|| {
            DbError("unsupported database URL: use sqlite://PATH or postgres://USER@HOST/DB".to_owned())
        })?;
        install_default_drivers();
        // SQLite: one connection, so the application's own writes queue here instead of
        // contending for the file's write lock (whose busy handler sleeps).
        let (url, max) = match backend {
            Backend::Sqlite if url.contains(":memory:") => (url.to_owned(), 1),
            Backend::Sqlite if url.contains('?') => (url.to_owned(), 1),
            Backend::Sqlite => (format!("{url}?mode=rwc"), 1),
            Backend::Postgres => (url.to_owned(), 8),
        };
        let mut options = AnyPoolOptions::new().max_connections(max);
        if backend == Backend::Sqlite {
            options = options.after_connect(|conn, _meta| {
                Box::pin(async move {
                    conn.execute("PRAGMA journal_mode = WAL; PRAGMA synchronous = FULL; PRAGMA busy_timeout = 30000; PRAGMA foreign_keys = ON")
                        .await?;
                    Ok(())
                })
            });
        }
        if url.contains(":memory:") {
            options = options.idle_timeout(None).max_lifetime(None).min_connections(1);
        }
        let pool = options.connect(&url).await?;
        let db = AppDb { pool, backend };
        db.migrate().await?;
        Ok(db)
    }

    /// The pool.
    pub fn pool(&self) -> &AnyPool {
        &self.pool
    }

    /// The backend.
    pub fn backend(&self) -> Backend {
        self.backend
    }

    async fn migrate(&self) -> Result<(), DbError> {
        let migrations = match self.backend {
            Backend::Sqlite => SQLITE_MIGRATIONS,
            Backend::Postgres => POSTGRES_MIGRATIONS,
        };
        let mut tx = self.pool.begin().await?;
        if self.backend == Backend::Postgres {
            // Several processes may open a fresh database at once.
            sqlx::query("SELECT pg_advisory_xact_lock($1)").bind(MIGRATION_LOCK).execute(&mut *tx).await?;
        }
        sqlx::query(
            "CREATE TABLE IF NOT EXISTS app_schema_migrations (
                 version BIGINT PRIMARY KEY NOT NULL, name TEXT NOT NULL, applied_at BIGINT NOT NULL)",
        )
        .execute(&mut *tx)
        .await?;
        let current: i64 = sqlx::query_scalar("SELECT COALESCE(MAX(version), 0) FROM app_schema_migrations")
            .fetch_one(&mut *tx)
            .await?;
        let latest = migrations.last().map_or(0, |m| m.0);
        if current > latest {
            return Err(DbError(format!("application schema version {current} is newer than this build ({latest})")));
        }
        for &(version, name, sql) in migrations.iter().filter(|m| m.0 > current) {
            tx.execute(sql).await?;
            sqlx::query("INSERT INTO app_schema_migrations (version, name, applied_at) VALUES ($1, $2, $3)")
                .bind(version)
                .bind(name)
                .bind(now_ms())
                .execute(&mut *tx)
                .await?;
        }
        tx.commit().await?;
        Ok(())
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
