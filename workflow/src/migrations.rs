//! Schema migrations: SQL files compiled into the program, applied in order, each recorded with a
//! checksum of its text.
//!
//! Every backend keeps a table of the migrations it applied (version, name, time, checksum) and
//! asks [`plan`] what to do. A migration this build does not know (a newer release's) and one
//! whose text changed since it was applied are refused with what to do about them. A database
//! made before checksums were kept adopts them once: the checksums of the migrations it has
//! applied are recorded the first time this runner opens it. The workflow stores and the
//! application's own tables use this one runner.

use std::fmt;

#[cfg(feature = "sqlite")]
use rusqlite::{OptionalExtension as _, params};
use sha2::{Digest, Sha256};
#[cfg(feature = "postgres")]
use sqlx::Executor as _;

use crate::error::StoreError;
#[cfg(any(feature = "sqlite", feature = "postgres"))]
use crate::time::now_ms;

/// One migration, as this build carries it.
#[derive(Clone, Copy, Debug)]
pub struct Migration {
    /// Its place in the order, from 1.
    pub version: i64,
    /// A short name (the file's, without the number).
    pub name: &'static str,
    /// The SQL it runs.
    pub sql: &'static str,
}

impl Migration {
    /// A migration of `version` named `name` that runs `sql`.
    pub const fn new(version: i64, name: &'static str, sql: &'static str) -> Migration {
        Migration { version, name, sql }
    }

    /// The SHA-256 of its SQL, in hex: what a database records when it applies it.
    pub fn checksum(&self) -> String {
        Sha256::digest(self.sql.as_bytes()).iter().map(|b| format!("{b:02x}")).collect()
    }
}

/// A migration as a database recorded it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AppliedMigration {
    /// Its version.
    pub version: i64,
    /// The checksum recorded with it; `None` for one applied before checksums were kept.
    pub checksum: Option<String>,
}

/// What a database needs, by [`plan`].
#[derive(Debug)]
pub struct MigrationPlan<'a> {
    /// Applied migrations whose checksums are to be recorded now (applied before they were kept).
    pub adopt: Vec<&'a Migration>,
    /// Migrations to apply, in order.
    pub pending: Vec<&'a Migration>,
}

/// Why a database's migrations cannot go on.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum MigrationError {
    /// The database has a migration that this build does not know.
    Unknown {
        /// The table of applied migrations.
        table: &'static str,
        /// Its version.
        version: i64,
        /// The newest version this build knows.
        latest: i64,
    },
    /// A migration's SQL differs from what was applied to the database.
    Edited {
        /// The table of applied migrations.
        table: &'static str,
        /// Its version.
        version: i64,
        /// Its name.
        name: &'static str,
    },
}

impl fmt::Display for MigrationError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MigrationError::Unknown { table, version, latest } => write!(
                f,
                "the database's {table} records migration {version}, newer than this build knows (up to {latest}): \
                 a newer release migrated it; run that release, or a newer one"
            ),
            MigrationError::Edited { table, version, name } => write!(
                f,
                "migration {version} ({name}) was changed after this database applied it (by its checksum in \
                 {table}): run the release that migrated the database; a developer who edited the file puts it back \
                 and makes the change a new migration"
            ),
        }
    }
}

impl std::error::Error for MigrationError {}

/// What to do for a database that recorded `applied`, given the migrations this build `known`s
/// (in version order): adopt checksums, apply what is pending, or refuse.
pub fn plan<'a>(
    table: &'static str,
    known: &'a [Migration],
    applied: &[AppliedMigration],
) -> Result<MigrationPlan<'a>, MigrationError> {
    debug_assert!(
        known.iter().enumerate().all(|(i, m)| m.version == i as i64 + 1),
        "the migrations of {table} are numbered 1, 2, 3, … in order"
    );
    let latest = known.last().map_or(0, |m| m.version);
    let mut adopt = Vec::new();
    for record in applied {
        let Some(migration) = known.iter().find(|m| m.version == record.version) else {
            return Err(MigrationError::Unknown { table, version: record.version, latest });
        };
        match &record.checksum {
            None => adopt.push(migration),
            Some(checksum) if *checksum == migration.checksum() => {}
            Some(_) => {
                return Err(MigrationError::Edited { table, version: migration.version, name: migration.name });
            }
        }
    }
    let pending = known.iter().filter(|m| applied.iter().all(|a| a.version != m.version)).collect();
    Ok(MigrationPlan { adopt, pending })
}

impl From<MigrationError> for StoreError {
    fn from(e: MigrationError) -> StoreError {
        StoreError::Corrupt(e.to_string())
    }
}

#[cfg(feature = "sqlite")]
fn sqlite(e: rusqlite::Error) -> StoreError {
    StoreError::driver(e)
}

#[cfg(feature = "postgres")]
fn postgres(e: sqlx::Error) -> StoreError {
    StoreError::driver(e)
}

#[cfg(feature = "sqlite")]
/// Brings the SQLite database of `conn` up to `known`, recording them in `table`; call it inside
/// the transaction that should hold the change.
pub fn migrate_sqlite(conn: &rusqlite::Connection, table: &'static str, known: &[Migration]) -> Result<(), StoreError> {
    conn.execute_batch(&format!(
        "CREATE TABLE IF NOT EXISTS {table} (
             version INTEGER PRIMARY KEY NOT NULL, name TEXT NOT NULL, applied_at INTEGER NOT NULL, checksum TEXT)"
    ))
    .map_err(sqlite)?;
    // A table made before checksums were kept gets the column.
    let has_checksum: Option<i64> = conn
        .query_row(&format!("SELECT 1 FROM pragma_table_info('{table}') WHERE name = 'checksum'"), [], |row| row.get(0))
        .optional()
        .map_err(sqlite)?;
    if has_checksum.is_none() {
        conn.execute_batch(&format!("ALTER TABLE {table} ADD COLUMN checksum TEXT")).map_err(sqlite)?;
    }
    let mut select =
        conn.prepare(&format!("SELECT version, checksum FROM {table} ORDER BY version")).map_err(sqlite)?;
    let applied = select
        .query_map([], |row| Ok(AppliedMigration { version: row.get(0)?, checksum: row.get(1)? }))
        .map_err(sqlite)?
        .collect::<Result<Vec<_>, _>>()
        .map_err(sqlite)?;
    let plan = plan(table, known, &applied)?;
    for migration in plan.adopt {
        conn.execute(
            &format!("UPDATE {table} SET checksum = ?1 WHERE version = ?2"),
            params![migration.checksum(), migration.version],
        )
        .map_err(sqlite)?;
    }
    for migration in plan.pending {
        conn.execute_batch(migration.sql).map_err(sqlite)?;
        conn.execute(
            &format!("INSERT INTO {table} (version, name, applied_at, checksum) VALUES (?1, ?2, ?3, ?4)"),
            params![migration.version, migration.name, now_ms(), migration.checksum()],
        )
        .map_err(sqlite)?;
    }
    Ok(())
}

#[cfg(feature = "postgres")]
/// Brings the PostgreSQL database of `conn` up to `known`, recording them in `table`; call it
/// inside the transaction (holding the advisory lock) that should hold the change.
pub async fn migrate_postgres(
    conn: &mut sqlx::PgConnection,
    table: &'static str,
    known: &[Migration],
) -> Result<(), StoreError> {
    let create = format!(
        "CREATE TABLE IF NOT EXISTS {table} (
             version BIGINT PRIMARY KEY, name TEXT NOT NULL, applied_at BIGINT NOT NULL, checksum TEXT)"
    );
    conn.execute(create.as_str()).await.map_err(postgres)?;
    // A table made before checksums were kept gets the column. Only then is it altered: altering
    // needs the table's owner, and a server may connect as a role with row privileges only.
    let has_checksum: Option<i32> = sqlx::query_scalar(
        "SELECT 1 FROM pg_attribute WHERE attrelid = to_regclass($1) AND attname = 'checksum' AND NOT attisdropped",
    )
    .bind(table)
    .fetch_optional(&mut *conn)
    .await
    .map_err(postgres)?;
    if has_checksum.is_none() {
        conn.execute(format!("ALTER TABLE {table} ADD COLUMN checksum TEXT").as_str()).await.map_err(postgres)?;
    }
    let rows: Vec<(i64, Option<String>)> =
        sqlx::query_as(&format!("SELECT version::BIGINT, checksum FROM {table} ORDER BY version"))
            .fetch_all(&mut *conn)
            .await
            .map_err(postgres)?;
    let applied: Vec<AppliedMigration> =
        rows.into_iter().map(|(version, checksum)| AppliedMigration { version, checksum }).collect();
    let plan = plan(table, known, &applied)?;
    for migration in plan.adopt {
        sqlx::query(&format!("UPDATE {table} SET checksum = $1 WHERE version = $2"))
            .bind(migration.checksum())
            .bind(migration.version)
            .execute(&mut *conn)
            .await
            .map_err(postgres)?;
    }
    for migration in plan.pending {
        // Several statements, sent as one simple query.
        conn.execute(migration.sql).await.map_err(postgres)?;
        sqlx::query(&format!("INSERT INTO {table} (version, name, applied_at, checksum) VALUES ($1, $2, $3, $4)"))
            .bind(migration.version)
            .bind(migration.name)
            .bind(now_ms())
            .bind(migration.checksum())
            .execute(&mut *conn)
            .await
            .map_err(postgres)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const KNOWN: &[Migration] =
        &[Migration::new(1, "init", "CREATE TABLE a (x INT);"), Migration::new(2, "more", "ALTER TABLE a ADD y INT;")];

    fn applied(version: i64, checksum: Option<String>) -> AppliedMigration {
        AppliedMigration { version, checksum }
    }

    #[test]
    fn a_new_database_applies_everything_and_an_up_to_date_one_nothing() {
        let fresh = plan("t", KNOWN, &[]).unwrap();
        assert_eq!(fresh.pending.iter().map(|m| m.version).collect::<Vec<_>>(), [1, 2]);
        assert!(fresh.adopt.is_empty());
        let current = [applied(1, Some(KNOWN[0].checksum())), applied(2, Some(KNOWN[1].checksum()))];
        let done = plan("t", KNOWN, &current).unwrap();
        assert!(done.pending.is_empty() && done.adopt.is_empty());
    }

    #[test]
    fn a_database_without_checksums_adopts_them_once() {
        let plan = plan("t", KNOWN, &[applied(1, None)]).unwrap();
        assert_eq!(plan.adopt.iter().map(|m| m.version).collect::<Vec<_>>(), [1]);
        assert_eq!(plan.pending.iter().map(|m| m.version).collect::<Vec<_>>(), [2]);
    }

    #[test]
    fn an_edited_or_unknown_migration_is_refused_with_what_to_do() {
        let edited = plan("t", KNOWN, &[applied(1, Some("0".repeat(64)))]).unwrap_err();
        assert_eq!(edited, MigrationError::Edited { table: "t", version: 1, name: "init" });
        assert!(edited.to_string().contains("run the release that migrated the database"), "{edited}");
        let unknown = plan("t", KNOWN, &[applied(1, None), applied(3, None)]).unwrap_err();
        assert_eq!(unknown, MigrationError::Unknown { table: "t", version: 3, latest: 2 });
        assert!(unknown.to_string().contains("newer than this build"), "{unknown}");
    }

    #[test]
    fn the_checksum_is_the_sha256_of_the_sql() {
        assert_eq!(
            Migration::new(1, "x", "").checksum(),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
    }
}
