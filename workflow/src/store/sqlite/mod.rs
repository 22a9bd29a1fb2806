//! The SQLite backend: an embedded database file (or `sqlite::memory:`) through rusqlite, each
//! connection owned by a dedicated thread.
//!
//! Every store operation is one closure sent to a connection thread (see `sqlite_threads`): a
//! whole transaction costs one hand-off between the caller's task and that thread, however many
//! statements it runs. Writes go through a single writer connection and `BEGIN IMMEDIATE`
//! transactions, so they never fail on a lock upgrade; the writes waiting in its queue commit
//! together, each in a savepoint of its own (see `sqlite_batch`), so one fsync serves many; reads of a file database go to a separate
//! set of read-only connections (WAL readers do not block the writer). An in-memory database lives
//! in its one writer connection, which serves the reads as well. Several processes may share one
//! file: SQLite serializes their writers and the busy timeout makes them wait for each other.

use std::path::PathBuf;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use rusqlite::types::FromSql;
use rusqlite::{Connection, OpenFlags, OptionalExtension, Row, TransactionBehavior, params};
use serde_json::{Value, json};

use super::rows::{self, Columns, count_of, page, parse_json, position_of, run_info, to_json};
use super::sqlite_threads::{ConnectionPool, db};
use super::{
    BoxFuture, ClaimRequest, ClaimedRun, CreatedRun, EmitRecord, FeedEntry, Fence, HookCreation, HookPayload,
    HookRecord, HookState, NewRun, OpRecord, RunHistory, RunOutcome, StepRecord, StepState, StepUpdate, Store,
    WaitRecord, WaitResolution, WaitState,
};
use crate::error::StoreError;
use crate::event::{Event, EventKind};
use crate::hook_data::{HookInfo, ResumeReceipt};
use crate::ids::RunId;
use crate::migrations::{Migration, migrate_sqlite};
use crate::run::{RunFilter, RunInfo, RunPage, RunStatus};
use crate::time::{Millis, duration_ms, from_ms, now_ms, to_ms};

/// The version of the schema this build migrates a SQLite database to (its last migration's).
pub const SCHEMA_VERSION: i64 = MIGRATIONS[MIGRATIONS.len() - 1].version;

/// The embedded migrations, applied in order at open.
const MIGRATIONS: &[Migration] = &[
    Migration::new(1, "init", include_str!("../../../migrations/sqlite/0001_init.sql")),
    Migration::new(2, "stream_positions", include_str!("../../../migrations/sqlite/0002_stream_positions.sql")),
    Migration::new(3, "child_runs", include_str!("../../../migrations/sqlite/0003_child_runs.sql")),
    Migration::new(4, "step_failures", include_str!("../../../migrations/sqlite/0004_step_failures.sql")),
    Migration::new(5, "feeds", include_str!("../../../migrations/sqlite/0005_feeds.sql")),
];

/// The page cache of each read connection, in KiB (the writer keeps SQLite's default, 2 MiB).
const READER_CACHE_KIB: u32 = 512;

/// Prepared statements each connection keeps for reuse (the writer runs about 40 distinct ones).
const STATEMENT_CACHE: usize = 64;

/// How hard SQLite works to make a commit durable (`PRAGMA synchronous`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum Synchronous {
    /// `FULL`: a committed transaction survives a power loss (the default).
    #[default]
    Full,
    /// `NORMAL`: in WAL mode a power loss may undo the last commits, never corrupt the database.
    Normal,
    /// `OFF`: no fsync at all; for tests and throwaway databases only.
    Off,
}

impl Synchronous {
    /// The value of `PRAGMA synchronous`.
    fn pragma(self) -> &'static str {
        match self {
            Synchronous::Full => "FULL",
            Synchronous::Normal => "NORMAL",
            Synchronous::Off => "OFF",
        }
    }
}

/// Options of [`SqliteStore::open_with`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SqliteStoreOptions {
    /// Durability of commits; [`Synchronous::Full`] by default.
    pub synchronous: Synchronous,
    /// How long a writer waits for another process's write lock before failing.
    pub busy_timeout: Duration,
    /// Connections of the read pool of a file database.
    pub read_connections: u32,
}

impl Default for SqliteStoreOptions {
    fn default() -> SqliteStoreOptions {
        SqliteStoreOptions { synchronous: Synchronous::Full, busy_timeout: Duration::from_secs(5), read_connections: 4 }
    }
}

/// A [`Store`] on SQLite.
#[derive(Clone, Debug)]
pub struct SqliteStore {
    /// The one writer connection's thread.
    writer: ConnectionPool,
    /// The read-only connections of a file database; the writer for an in-memory one.
    reader: ConnectionPool,
}

/// How a write transaction commits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Commit {
    /// Durably: fsynced when so configured.
    Durable,
    /// Without its own fsync: in WAL mode the commit survives a crash of the process at once and
    /// a power loss once any later commit fsyncs the log. Used for claims and a step's start
    /// record, whose loss only hands a run back or miscounts an attempt; everything that follows
    /// them commits durably. (Grouped with a durable write, it is fsynced with it.)
    Relaxed,
}

/// The database a URL names.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Database {
    /// A database file, created if missing.
    File(PathBuf),
    /// An in-memory database, private to the store (it lives in the writer connection).
    Memory,
}

/// A parsed `sqlite:` URL.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Target {
    /// The database.
    database: Database,
    /// `mode=ro`: connections open read-only (the store then fails as soon as it writes).
    read_only: bool,
    /// `cache=shared` (`Some(true)`) or `cache=private` (`Some(false)`) for a file database.
    shared_cache: Option<bool>,
    /// `vfs=NAME`: the SQLite VFS to open the database with.
    vfs: Option<String>,
}

impl Target {
    /// The flags to open a connection with; `reader` for the read-only connections of a file.
    fn flags(&self, reader: bool) -> OpenFlags {
        let mut flags = OpenFlags::SQLITE_OPEN_NO_MUTEX;
        flags |= if reader || self.read_only {
            OpenFlags::SQLITE_OPEN_READ_ONLY
        } else {
            OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_CREATE
        };
        match (&self.database, self.shared_cache) {
            (Database::Memory, _) => flags |= OpenFlags::SQLITE_OPEN_MEMORY,
            (Database::File(_), Some(true)) => flags |= OpenFlags::SQLITE_OPEN_SHARED_CACHE,
            (Database::File(_), Some(false)) => flags |= OpenFlags::SQLITE_OPEN_PRIVATE_CACHE,
            (Database::File(_), None) => {}
        }
        flags
    }

    /// Opens one connection (without any setting applied).
    fn connect(&self, reader: bool) -> Result<Connection, StoreError> {
        let path = match &self.database {
            Database::File(path) => path.clone(),
            Database::Memory => PathBuf::from(":memory:"),
        };
        let flags = self.flags(reader);
        match &self.vfs {
            Some(vfs) => Connection::open_with_flags_and_vfs(path, flags, vfs),
            None => Connection::open_with_flags(path, flags),
        }
        .map_err(db)
    }
}

/// Parses a `sqlite:` URL as sqlx did: `sqlite://path/to/file.db`, `sqlite:relative.db`,
/// `sqlite:///absolute.db`, `sqlite::memory:` (or `sqlite://:memory:`), with optional query
/// parameters `mode` (`rwc`, `rw`, `ro` or `memory`), `cache` (`shared` or `private`),
/// `immutable` (false only) and `vfs`. The path is percent-decoded; a file is created if missing
/// whatever the mode but `ro`.
fn parse_url(url: &str) -> Result<Target, StoreError> {
    let bad = |why: String| StoreError::database(format!("invalid SQLite URL: {why}"));
    let rest = match url.get(..7) {
        Some(scheme) if scheme.eq_ignore_ascii_case("sqlite:") => &url[7..],
        _ => return Err(bad("expected sqlite://PATH, sqlite:PATH or sqlite::memory:".to_owned())),
    };
    let rest = rest.strip_prefix("//").unwrap_or(rest);
    let (database, query) = match rest.split_once('?') {
        Some((database, query)) => (database, Some(query)),
        None => (rest, None),
    };
    let mut memory = database == ":memory:";
    let mut read_only = false;
    let mut shared_cache = None;
    let mut vfs = None;
    for pair in query.unwrap_or_default().split('&').filter(|p| !p.is_empty()) {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        let value = percent_decode(value).ok_or_else(|| bad(format!("`{key}` is not UTF-8")))?;
        match (key, value.as_str()) {
            ("mode", "rwc" | "rw") => read_only = false,
            ("mode", "ro") => read_only = true,
            ("mode", "memory") => memory = true,
            ("cache", "shared") => shared_cache = Some(true),
            ("cache", "private") => shared_cache = Some(false),
            ("immutable", "false" | "0") => {}
            ("vfs", name) if !name.is_empty() => vfs = Some(name.to_owned()),
            ("mode" | "cache" | "immutable" | "vfs", value) => {
                return Err(bad(format!("unsupported value {value:?} for `{key}`")));
            }
            _ => return Err(bad(format!("unknown query parameter `{key}`"))),
        }
    }
    let database = if memory {
        Database::Memory
    } else {
        let path = percent_decode(database).ok_or_else(|| bad("the path is not UTF-8".to_owned()))?;
        if path.is_empty() {
            return Err(bad("no database file named".to_owned()));
        }
        Database::File(PathBuf::from(path))
    };
    Ok(Target { database, read_only, shared_cache, vfs })
}

/// Decodes `%XX` escapes (a `%` not followed by two hex digits stays as it is); `None` if the
/// result is not UTF-8.
fn percent_decode(s: &str) -> Option<String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let escaped = match bytes.get(i..i + 3) {
            Some(&[b'%', hi, lo]) => hex_digit(hi).zip(hex_digit(lo)).map(|(hi, lo)| hi * 16 + lo),
            _ => None,
        };
        match escaped {
            Some(byte) => {
                out.push(byte);
                i += 3;
            }
            None => {
                out.push(bytes[i]);
                i += 1;
            }
        }
    }
    String::from_utf8(out).ok()
}

/// The value of an ASCII hex digit.
fn hex_digit(c: u8) -> Option<u8> {
    char::from(c).to_digit(16).and_then(|d| u8::try_from(d).ok())
}

/// Turns off SQLite's memory statistics, once per process and before SQLite starts: they
/// take one process-wide mutex on every allocation of every connection (the writer and the
/// readers contend for it), and nothing here reads them. If SQLite already started (another
/// library used it first), the call is refused and nothing changes.
fn skip_memory_statistics() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // SAFETY: SQLITE_CONFIG_MEMSTATUS takes one int; sqlite3_config refuses (SQLITE_MISUSE)
        // rather than misbehaves once SQLite is initialized.
        let _ = unsafe { rusqlite::ffi::sqlite3_config(rusqlite::ffi::SQLITE_CONFIG_MEMSTATUS, 0) };
    });
}

/// Opens the writer connection: busy timeout, foreign keys, durability (the journal mode is set
/// by [`prepare_writer`], on the writer's thread, since it may wait for a lock).
fn open_writer(target: &Target, options: &SqliteStoreOptions) -> Result<Connection, StoreError> {
    let conn = target.connect(false)?;
    conn.set_prepared_statement_cache_capacity(STATEMENT_CACHE);
    conn.busy_timeout(options.busy_timeout).map_err(db)?;
    conn.pragma_update(None, "foreign_keys", "ON").map_err(db)?;
    conn.pragma_update(None, "synchronous", options.synchronous.pragma()).map_err(db)?;
    Ok(conn)
}

/// Opens a read-only connection of a file database, with a small page cache: it keeps memory
/// flat however many runs wait.
fn open_reader(target: &Target, options: &SqliteStoreOptions) -> Result<Connection, StoreError> {
    let conn = target.connect(true)?;
    conn.set_prepared_statement_cache_capacity(STATEMENT_CACHE);
    conn.busy_timeout(options.busy_timeout).map_err(db)?;
    conn.pragma_update(None, "foreign_keys", "ON").map_err(db)?;
    conn.pragma_update(None, "synchronous", options.synchronous.pragma()).map_err(db)?;
    conn.pragma_update(None, "cache_size", -i64::from(READER_CACHE_KIB)).map_err(db)?;
    Ok(conn)
}

/// Sets the writer's journal mode (WAL for a file, in memory otherwise) and migrates the database.
fn prepare_writer(conn: &mut Connection, memory: bool) -> Result<(), StoreError> {
    let mode = if memory { "MEMORY" } else { "WAL" };
    let _: String = conn.pragma_update_and_check(None, "journal_mode", mode, |row| row.get(0)).map_err(db)?;
    migrate(conn)
}

/// Applies the embedded migrations that the database has not seen, in one transaction.
fn migrate(conn: &mut Connection) -> Result<(), StoreError> {
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate).map_err(db)?;
    migrate_sqlite(&tx, "schema_migrations", MIGRATIONS)?;
    tx.commit().map_err(db)
}

fn get<T: FromSql>(row: &Row<'_>, col: &str) -> Result<T, StoreError> {
    row.get(col).map_err(db)
}

impl SqliteStore {
    /// Opens (creating if missing) the database at `url` with default options and migrates it.
    ///
    /// `url` is `sqlite://path/to/file.db`, `sqlite:relative.db` or `sqlite::memory:`.
    pub async fn open(url: &str) -> Result<SqliteStore, StoreError> {
        SqliteStore::open_with(url, SqliteStoreOptions::default()).await
    }

    /// Opens (creating if missing) the database at `url` and applies the pending migrations.
    ///
    /// Starts one thread for the writer connection and, for a file database, one per read
    /// connection; they stop when the last clone of the store is dropped or at [`SqliteStore::close`].
    pub async fn open_with(url: &str, options: SqliteStoreOptions) -> Result<SqliteStore, StoreError> {
        skip_memory_statistics();
        let target = Arc::new(parse_url(url)?);
        let memory = target.database == Database::Memory;
        // One writer connection: in-process writers queue here instead of contending for the lock.
        // An in-memory database lives as long as this connection, which is never replaced.
        let durable = options.synchronous == Synchronous::Full && !memory;
        let writer = {
            let (target, options) = (Arc::clone(&target), options.clone());
            ConnectionPool::open_writer("sqlite-writer", durable, move || open_writer(&target, &options))?
        };
        if let Err(e) = writer.run(move |conn| prepare_writer(conn, memory)).await {
            writer.close().await;
            return Err(e);
        }
        let reader = if memory {
            writer.clone()
        } else {
            let (target, options) = (Arc::clone(&target), options.clone());
            let size = usize::try_from(options.read_connections.max(1)).unwrap_or(1);
            match ConnectionPool::open("sqlite-reader", size, move || open_reader(&target, &options)) {
                Ok(reader) => reader,
                Err(e) => {
                    writer.close().await;
                    return Err(e);
                }
            }
        };
        Ok(SqliteStore { writer, reader })
    }

    /// Closes the connections; pending operations finish first, later ones fail.
    pub async fn close(&self) {
        self.reader.close().await;
        self.writer.close().await;
    }

    /// Runs `work` in a write transaction on the store's writer connection, in turn with the
    /// store's own writes and committed durably like them (one commit, and so one fsync, may
    /// cover several writers' work). An error rolls back `work`'s changes and nothing else.
    ///
    /// For an application's own tables in the same database file, so that its writes and the
    /// engine's never wait on each other for the file's lock.
    pub async fn write<R, F>(&self, work: F) -> Result<R, StoreError>
    where
        R: Send + 'static,
        F: FnOnce(&Connection) -> Result<R, StoreError> + Send + 'static,
    {
        self.write_with(Commit::Durable, work).await
    }

    /// Runs `work` as a write of the writer connection, with the durability `commit` asks for.
    async fn write_with<R, F>(&self, commit: Commit, work: F) -> Result<R, StoreError>
    where
        R: Send + 'static,
        F: FnOnce(&Connection) -> Result<R, StoreError> + Send + 'static,
    {
        self.writer.write(commit == Commit::Relaxed, work).await
    }

    /// Runs `work` on a read connection (the writer's, for an in-memory database). It sees what
    /// was committed before it started.
    pub async fn read<R, F>(&self, work: F) -> Result<R, StoreError>
    where
        R: Send + 'static,
        F: FnOnce(&Connection) -> Result<R, StoreError> + Send + 'static,
    {
        self.reader.run(move |conn| work(conn)).await
    }
}

/// Fails with `LeaseLost` unless the run is running under this lease attempt.
fn check_fence(tx: &Connection, fence: &Fence) -> Result<(), StoreError> {
    let ok: Option<i64> = tx
        .prepare_cached("SELECT 1 FROM runs WHERE id = ? AND status = 'running' AND lease_attempt = ?")
        .and_then(|mut stmt| {
            stmt.query_row(params![fence.run_id.as_str(), i64::from(fence.attempt)], |row| row.get(0)).optional()
        })
        .map_err(db)?;
    match ok {
        Some(_) => Ok(()),
        None => Err(StoreError::LeaseLost { run_id: fence.run_id.clone() }),
    }
}

/// Checks the fence and takes the run's next event sequence number in one statement; the caller
/// must append exactly one event with it ([`insert_event`]) before any other event.
fn fenced_seq(tx: &Connection, fence: &Fence, now: Millis) -> Result<i64, StoreError> {
    let seq: Option<i64> = tx
        .prepare_cached(
            "UPDATE runs SET last_seq = last_seq + 1, updated_at = ?
             WHERE id = ? AND status = 'running' AND lease_attempt = ? RETURNING last_seq",
        )
        .and_then(|mut stmt| {
            stmt.query_row(params![now, fence.run_id.as_str(), i64::from(fence.attempt)], |row| row.get(0)).optional()
        })
        .map_err(db)?;
    seq.ok_or_else(|| StoreError::LeaseLost { run_id: fence.run_id.clone() })
}

/// Inserts an event under a sequence number taken by [`fenced_seq`] or [`append`].
fn insert_event(
    tx: &Connection,
    run_id: &RunId,
    seq: i64,
    kind: EventKind,
    payload: &Value,
    now: Millis,
) -> Result<(), StoreError> {
    tx.prepare_cached("INSERT INTO events (run_id, seq, kind, payload, created_at) VALUES (?, ?, ?, ?, ?)")
        .and_then(|mut stmt| stmt.execute(params![run_id.as_str(), seq, kind.as_str(), to_json(payload), now]))
        .map_err(db)?;
    Ok(())
}

/// Appends one event to the run's log under the next sequence number, and returns that number.
fn append(tx: &Connection, run_id: &RunId, kind: EventKind, payload: &Value, now: Millis) -> Result<i64, StoreError> {
    let seq: i64 = tx
        .prepare_cached("UPDATE runs SET last_seq = last_seq + 1, updated_at = ? WHERE id = ? RETURNING last_seq")
        .and_then(|mut stmt| stmt.query_row(params![now, run_id.as_str()], |row| row.get(0)))
        .map_err(db)?;
    insert_event(tx, run_id, seq, kind, payload, now)?;
    Ok(seq)
}

/// Disposes the run's active hooks and cancels its pending timers (part of ending a run).
fn release_resources(tx: &Connection, run_id: &RunId, now: Millis) -> Result<(), StoreError> {
    let mut positions = all_rows(
        tx,
        "UPDATE hooks SET active = 0, disposed_at = ? WHERE run_id = ? AND active = 1 RETURNING position, token",
        params![now, run_id.as_str()],
        |row| position_of(row),
    )?;
    positions.sort_unstable();
    for position in positions {
        append(tx, run_id, EventKind::HookDisposed, &json!({ "position": position }), now)?;
    }
    tx.prepare_cached("UPDATE waits SET status = 'cancelled' WHERE run_id = ? AND status = 'pending'")
        .and_then(|mut stmt| stmt.execute(params![run_id.as_str()]))
        .map_err(db)?;
    Ok(())
}

/// Makes a run that has not ended runnable again: a waiting run becomes pending, a running one
/// remembers the request so that its suspension is not final.
fn wake_run(tx: &Connection, run_id: &str) -> Result<(), StoreError> {
    tx.prepare_cached(
        "UPDATE runs SET wake_requested = 1, status = CASE WHEN status = 'waiting' THEN 'pending' ELSE status END
         WHERE id = ? AND status IN ('pending', 'running', 'waiting')",
    )
    .and_then(|mut stmt| stmt.execute(params![run_id]))
    .map_err(db)?;
    Ok(())
}

/// Wakes the parent of `run_id`, if it has one (part of ending a run).
fn wake_parent(tx: &Connection, run_id: &RunId) -> Result<(), StoreError> {
    let parent: Option<String> = tx
        .prepare_cached("SELECT parent_run_id FROM runs WHERE id = ?")
        .and_then(|mut stmt| stmt.query_row(params![run_id.as_str()], |row| row.get(0)).optional())
        .map_err(db)?
        .flatten();
    match parent {
        Some(parent) => wake_run(tx, &parent),
        None => Ok(()),
    }
}

/// Cancels one run that has not ended: resources released, lease voided, event appended.
fn cancel_one(tx: &Connection, id: &RunId, reason: &str, now: Millis) -> Result<(), StoreError> {
    release_resources(tx, id, now)?;
    tx.prepare_cached(
        "UPDATE runs SET status = 'cancelled', error = ?, completed_at = ?, wake_at = NULL,
             lease_owner = NULL, lease_expires_at = NULL
         WHERE id = ?",
    )
    .and_then(|mut stmt| stmt.execute(params![reason, now, id.as_str()]))
    .map_err(db)?;
    append(tx, id, EventKind::RunCancelled, &json!({ "reason": reason }), now)?;
    Ok(())
}

fn run_from_row(row: &Row<'_>) -> Result<RunInfo, StoreError> {
    run_info(row)
}

impl Columns for Row<'_> {
    fn text(&self, column: &str) -> Result<String, StoreError> {
        self.get(column).map_err(db)
    }

    fn optional_text(&self, column: &str) -> Result<Option<String>, StoreError> {
        self.get(column).map_err(db)
    }

    fn int(&self, column: &str) -> Result<i64, StoreError> {
        self.get(column).map_err(db)
    }

    fn optional_int(&self, column: &str) -> Result<Option<i64>, StoreError> {
        self.get(column).map_err(db)
    }
}

/// The columns [`run_from_row`] reads (a macro, so that queries are `concat!`ed at compile time).
macro_rules! run_columns {
    () => {
        "id, workflow, input, status, output, error, idempotency_key, parent_run_id, lease_attempt, \
         created_at, updated_at, started_at, completed_at"
    };
}

/// Runs the cached statement `sql` and calls `each` with every row it returns.
fn for_each_row<P: rusqlite::Params>(
    conn: &Connection,
    sql: &str,
    params: P,
    mut each: impl FnMut(&Row<'_>) -> Result<(), StoreError>,
) -> Result<(), StoreError> {
    let mut stmt = conn.prepare_cached(sql).map_err(db)?;
    let mut rows = stmt.query(params).map_err(db)?;
    while let Some(row) = rows.next().map_err(db)? {
        each(row)?;
    }
    Ok(())
}

/// Runs the cached statement `sql` and decodes every row it returns with `decode`.
fn all_rows<T, P: rusqlite::Params>(
    conn: &Connection,
    sql: &str,
    params: P,
    mut decode: impl FnMut(&Row<'_>) -> Result<T, StoreError>,
) -> Result<Vec<T>, StoreError> {
    let mut all = Vec::new();
    for_each_row(conn, sql, params, |row| {
        all.push(decode(row)?);
        Ok(())
    })?;
    Ok(all)
}

/// Runs the cached statement `sql` and decodes its first row, if any, with `decode`.
fn first_row<T, P: rusqlite::Params>(
    conn: &Connection,
    sql: &str,
    params: P,
    decode: impl FnOnce(&Row<'_>) -> Result<T, StoreError>,
) -> Result<Option<T>, StoreError> {
    let mut stmt = conn.prepare_cached(sql).map_err(db)?;
    let mut rows = stmt.query(params).map_err(db)?;
    match rows.next().map_err(db)? {
        Some(row) => decode(row).map(Some),
        None => Ok(None),
    }
}

/// Loads everything earlier executions of a run recorded.
fn load_history(tx: &Connection, run_id: &RunId) -> Result<RunHistory, StoreError> {
    let mut history = RunHistory::default();
    let ops = &mut history.ops;
    for_each_row(
        tx,
        "SELECT position, name, status, attempts, failures, result, error, retry_at FROM steps WHERE run_id = ?",
        params![run_id.as_str()],
        |row| {
            let status: String = get(row, "status")?;
            let error: Option<String> = get(row, "error")?;
            let state = match status.as_str() {
                "running" => StepState::Running,
                "retrying" => StepState::Retrying {
                    retry_at: get::<Option<i64>>(row, "retry_at")?.unwrap_or(0),
                    error: error.unwrap_or_default(),
                },
                "completed" => {
                    StepState::Completed(parse_json(&get::<Option<String>>(row, "result")?.unwrap_or_default())?)
                }
                "failed" => StepState::Failed(error.unwrap_or_default()),
                other => return Err(StoreError::Corrupt(format!("unknown step status {other:?}"))),
            };
            let record = StepRecord {
                name: get(row, "name")?,
                attempts: count_of(get(row, "attempts")?),
                failures: count_of(get(row, "failures")?),
                state,
            };
            ops.insert(position_of(row)?, OpRecord::Step(record));
            Ok(())
        },
    )?;
    for_each_row(
        tx,
        "SELECT position, token, metadata, active, conflict_run_id FROM hooks WHERE run_id = ?",
        params![run_id.as_str()],
        |row| {
            let active: i64 = get(row, "active")?;
            let conflict: Option<String> = get(row, "conflict_run_id")?;
            let state = match (active, conflict) {
                (1, _) => HookState::Active,
                (_, Some(owner)) => HookState::Conflict { owner_run_id: RunId::from(owner) },
                _ => HookState::Disposed,
            };
            let record = HookRecord {
                token: get(row, "token")?,
                metadata: parse_json(&get::<String>(row, "metadata")?)?,
                state,
                payloads: Vec::new(),
            };
            ops.insert(position_of(row)?, OpRecord::Hook(record));
            Ok(())
        },
    )?;
    for_each_row(
        tx,
        "SELECT position, payload, received_at FROM hook_payloads WHERE run_id = ? ORDER BY position, seq",
        params![run_id.as_str()],
        |row| {
            if let Some(OpRecord::Hook(h)) = ops.get_mut(&position_of(row)?) {
                let value = parse_json(&get::<String>(row, "payload")?)?;
                h.payloads.push(HookPayload { value, received_at: get(row, "received_at")? });
            }
            Ok(())
        },
    )?;
    for_each_row(tx, "SELECT position, due_at, status FROM waits WHERE run_id = ?", params![run_id.as_str()], |row| {
        let status: String = get(row, "status")?;
        let state = match status.as_str() {
            "pending" => WaitState::Pending,
            "fired" => WaitState::Fired,
            "cancelled" => WaitState::Cancelled,
            other => return Err(StoreError::Corrupt(format!("unknown wait status {other:?}"))),
        };
        ops.insert(position_of(row)?, OpRecord::Wait(WaitRecord { due_at: get(row, "due_at")?, state }));
        Ok(())
    })?;
    for_each_row(tx, "SELECT position, idx FROM stream_events WHERE run_id = ?", params![run_id.as_str()], |row| {
        let index = get::<i64>(row, "idx")?.unsigned_abs();
        ops.insert(position_of(row)?, OpRecord::Emit(EmitRecord { index }));
        Ok(())
    })?;
    Ok(history)
}

mod transactions;

#[cfg(test)]
mod tests;
