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

use super::sqlite_threads::{ConnectionPool, db};
use super::{
    BoxFuture, ClaimRequest, ClaimedRun, CreatedRun, EmitRecord, Fence, HookCreation, HookPayload, HookRecord,
    HookState, NewRun, OpRecord, RunHistory, RunOutcome, StepRecord, StepState, StepUpdate, Store, WaitRecord,
    WaitResolution, WaitState,
};
use crate::error::StoreError;
use crate::event::{Event, EventKind};
use crate::hook_data::{HookInfo, ResumeReceipt};
use crate::ids::RunId;
use crate::migrations::{Migration, migrate_sqlite};
use crate::run::{RunCursor, RunFilter, RunInfo, RunPage, RunStatus};
use crate::time::{Millis, duration_ms, from_ms, now_ms, to_ms};

/// The embedded migrations, applied in order at open.
const MIGRATIONS: &[Migration] = &[
    Migration::new(1, "init", include_str!("../../migrations/sqlite/0001_init.sql")),
    Migration::new(2, "stream_positions", include_str!("../../migrations/sqlite/0002_stream_positions.sql")),
    Migration::new(3, "child_runs", include_str!("../../migrations/sqlite/0003_child_runs.sql")),
    Migration::new(4, "step_failures", include_str!("../../migrations/sqlite/0004_step_failures.sql")),
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
    let bad = |why: String| StoreError::Database(format!("invalid SQLite URL: {why}"));
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

fn to_json(v: &Value) -> String {
    // Serializing a `Value` cannot fail.
    serde_json::to_string(v).unwrap_or_else(|_| "null".to_owned())
}

fn parse_json(s: &str) -> Result<Value, StoreError> {
    serde_json::from_str(s).map_err(|e| StoreError::Corrupt(format!("invalid JSON in database: {e}")))
}

fn get<T: FromSql>(row: &Row<'_>, col: &str) -> Result<T, StoreError> {
    row.get(col).map_err(db)
}

fn position_of(row: &Row<'_>) -> Result<u32, StoreError> {
    let p: i64 = get(row, "position")?;
    u32::try_from(p).map_err(|_| StoreError::Corrupt(format!("invalid position {p}")))
}

fn count_of(v: i64) -> u32 {
    u32::try_from(v).unwrap_or(u32::MAX)
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
        position_of,
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
    let status: String = get(row, "status")?;
    let output: Option<String> = get(row, "output")?;
    let started_at: Option<i64> = get(row, "started_at")?;
    let completed_at: Option<i64> = get(row, "completed_at")?;
    Ok(RunInfo {
        id: RunId::from(get::<String>(row, "id")?),
        workflow: get(row, "workflow")?,
        status: RunStatus::from_str(&status).map_err(StoreError::from)?,
        input: parse_json(&get::<String>(row, "input")?)?,
        output: output.as_deref().map(parse_json).transpose()?,
        error: get(row, "error")?,
        idempotency_key: get(row, "idempotency_key")?,
        parent_run_id: get::<Option<String>>(row, "parent_run_id")?.map(RunId::from),
        attempt: count_of(get(row, "lease_attempt")?),
        created_at: from_ms(get(row, "created_at")?),
        updated_at: from_ms(get(row, "updated_at")?),
        started_at: started_at.map(from_ms),
        completed_at: completed_at.map(from_ms),
    })
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

impl Store for SqliteStore {
    fn create_run(&self, run: NewRun) -> BoxFuture<'_, Result<CreatedRun, StoreError>> {
        Box::pin(async move {
            let id = RunId::generate();
            let input = to_json(&run.input);
            self.write_with(Commit::Durable, move |tx| {
                let now = now_ms();
                if let Some(parent) = &run.parent_run_id {
                    // A child of a run that has ended would run orphaned (writers are serialized here).
                    let status: Option<String> = tx
                        .prepare_cached("SELECT status FROM runs WHERE id = ?")
                        .and_then(|mut stmt| stmt.query_row(params![parent.as_str()], |row| row.get(0)).optional())
                        .map_err(db)?;
                    if !matches!(status.as_deref(), Some("pending" | "running" | "waiting")) {
                        return Err(StoreError::LeaseLost { run_id: parent.clone() });
                    }
                }
                let inserted = tx
                    .prepare_cached(
                        "INSERT INTO runs
                             (id, workflow, input, status, idempotency_key, parent_run_id, created_at, updated_at)
                         VALUES (?, ?, ?, 'pending', ?, ?, ?, ?) ON CONFLICT (idempotency_key) DO NOTHING",
                    )
                    .and_then(|mut stmt| {
                        stmt.execute(params![
                            id.as_str(),
                            run.workflow,
                            input,
                            run.idempotency_key.as_deref(),
                            run.parent_run_id.as_ref().map(RunId::as_str),
                            now,
                            now,
                        ])
                    })
                    .map_err(db)?;
                if inserted == 0 {
                    // The unique constraint decided: a run with this key exists.
                    let existing: String = tx
                        .prepare_cached("SELECT id FROM runs WHERE idempotency_key = ?")
                        .and_then(|mut stmt| stmt.query_row(params![run.idempotency_key.as_deref()], |row| row.get(0)))
                        .map_err(db)?;
                    return Ok(CreatedRun { run_id: RunId::from(existing), created: false });
                }
                let payload = run.created_event();
                append(tx, &id, EventKind::RunCreated, &payload, now)?;
                Ok(CreatedRun { run_id: id, created: true })
            })
            .await
        })
    }

    fn get_run<'a>(&'a self, id: &'a RunId) -> BoxFuture<'a, Result<Option<RunInfo>, StoreError>> {
        Box::pin(async move {
            let id = id.clone();
            self.read(move |conn| {
                first_row(
                    conn,
                    concat!("SELECT ", run_columns!(), " FROM runs WHERE id = ?"),
                    params![id.as_str()],
                    run_from_row,
                )
            })
            .await
        })
    }

    fn list_runs<'a>(&'a self, filter: &'a RunFilter) -> BoxFuture<'a, Result<RunPage, StoreError>> {
        Box::pin(async move {
            let statuses: Vec<&str> = filter.statuses.iter().map(|s| s.as_str()).collect();
            let statuses = serde_json::to_string(&statuses).unwrap_or_else(|_| "[]".to_owned());
            let limit = filter.page_size();
            let workflow = filter.workflow.clone();
            let parent = filter.parent_run_id.as_ref().map(|id| id.as_str().to_owned());
            let created_after = filter.created_after.map(to_ms);
            let created_before = filter.created_before.map(to_ms);
            let cursor_at = filter.cursor.as_ref().map(|c| c.created_at_ms);
            let cursor_id = filter.cursor.as_ref().map(|c| c.run_id.as_str().to_owned());
            let mut runs = self
                .read(move |conn| {
                    all_rows(
                        conn,
                        concat!(
                            "SELECT ",
                            run_columns!(),
                            " FROM runs
                             WHERE (?1 IS NULL OR workflow = ?1)
                               AND (?2 = '[]' OR status IN (SELECT value FROM json_each(?2)))
                               AND (?3 IS NULL OR parent_run_id = ?3)
                               AND (?4 IS NULL OR created_at >= ?4)
                               AND (?5 IS NULL OR created_at < ?5)
                               AND (?6 IS NULL OR created_at < ?6 OR (created_at = ?6 AND id < ?7))
                             ORDER BY created_at DESC, id DESC LIMIT ?8"
                        ),
                        params![
                            workflow,
                            statuses,
                            parent,
                            created_after,
                            created_before,
                            cursor_at,
                            cursor_id,
                            i64::from(limit) + 1
                        ],
                        run_from_row,
                    )
                })
                .await?;
            let next_cursor = if runs.len() > limit as usize {
                runs.truncate(limit as usize);
                runs.last().map(|r| RunCursor { created_at_ms: to_ms(r.created_at), run_id: r.id.clone() })
            } else {
                None
            };
            Ok(RunPage { runs, next_cursor })
        })
    }

    fn events<'a>(&'a self, id: &'a RunId) -> BoxFuture<'a, Result<Vec<Event>, StoreError>> {
        Box::pin(async move {
            let id = id.clone();
            self.read(move |conn| {
                all_rows(
                    conn,
                    "SELECT seq, kind, payload, created_at FROM events WHERE run_id = ? ORDER BY seq",
                    params![id.as_str()],
                    |row| {
                        let kind: String = get(row, "kind")?;
                        Ok(Event {
                            run_id: id.clone(),
                            seq: get::<i64>(row, "seq")?.unsigned_abs(),
                            kind: EventKind::from_str(&kind).map_err(StoreError::from)?,
                            payload: parse_json(&get::<String>(row, "payload")?)?,
                            created_at: from_ms(get(row, "created_at")?),
                        })
                    },
                )
            })
            .await
        })
    }

    fn claim<'a>(&'a self, req: &'a ClaimRequest) -> BoxFuture<'a, Result<Option<ClaimedRun>, StoreError>> {
        // An engine never takes over its own expired leases: its executions are alive while it
        // is, and a restarted engine has a new owner name.
        const RUNNABLE: &str = "SELECT id FROM runs
             WHERE workflow IN (SELECT value FROM json_each(?1))
               AND (status = 'pending'
                    OR (status = 'waiting' AND wake_at <= ?2)
                    OR (status = 'running' AND lease_expires_at <= ?2 AND lease_owner <> ?3))
             ORDER BY updated_at LIMIT 1";
        Box::pin(async move {
            let workflows = Arc::new(serde_json::to_string(&req.workflows).unwrap_or_else(|_| "[]".to_owned()));
            let owner = Arc::new(req.owner.clone());
            // Look on a reader first, so idle workers polling never take the write lock.
            let candidate = {
                let (workflows, owner) = (Arc::clone(&workflows), Arc::clone(&owner));
                self.read(move |conn| {
                    conn.prepare_cached(RUNNABLE)
                        .and_then(|mut stmt| {
                            stmt.query_row(params![workflows.as_str(), now_ms(), owner.as_str()], |row| {
                                row.get::<_, String>(0)
                            })
                            .optional()
                        })
                        .map_err(db)
                })
                .await?
            };
            if candidate.is_none() {
                return Ok(None);
            }
            let lease = duration_ms(req.lease);
            // A claim that a power loss undoes only hands the run back; what it leads to commits durably.
            self.write_with(Commit::Relaxed, move |tx| {
                // The clock is read once the write lock is held, so waiting for it never shortens a lease.
                let now = now_ms();
                let id: Option<String> = tx
                    .prepare_cached(RUNNABLE)
                    .and_then(|mut stmt| {
                        stmt.query_row(params![workflows.as_str(), now, owner.as_str()], |row| row.get(0)).optional()
                    })
                    .map_err(db)?;
                let Some(id) = id else {
                    return Ok(None);
                };
                let run_id = RunId::from(id);
                let claimed = first_row(
                    tx,
                    "UPDATE runs SET status = 'running', lease_owner = ?, lease_expires_at = ?,
                         lease_attempt = lease_attempt + 1, wake_at = NULL, wake_requested = 0,
                         started_at = COALESCE(started_at, ?)
                     WHERE id = ? RETURNING workflow, input, lease_attempt",
                    params![owner.as_str(), now.saturating_add(lease), now, run_id.as_str()],
                    |row| {
                        let attempt = count_of(get(row, "lease_attempt")?);
                        let workflow: String = get(row, "workflow")?;
                        let input = parse_json(&get::<String>(row, "input")?)?;
                        Ok((attempt, workflow, input))
                    },
                )?;
                let Some((attempt, workflow, input)) = claimed else {
                    return Err(StoreError::Database(format!("run {run_id} vanished during its claim")));
                };
                let payload = json!({ "owner": owner.as_str(), "attempt": attempt });
                append(tx, &run_id, EventKind::RunStarted, &payload, now)?;
                let history = load_history(tx, &run_id)?;
                Ok(Some(ClaimedRun { fence: Fence { run_id, attempt, token: 0 }, workflow, input, history }))
            })
            .await
        })
    }

    fn renew_lease<'a>(&'a self, fence: &'a Fence, lease: Duration) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move {
            let fence = fence.clone();
            let lease = duration_ms(lease);
            self.write_with(Commit::Durable, move |tx| {
                let expires = now_ms().saturating_add(lease);
                let done = tx
                    .prepare_cached(
                        "UPDATE runs SET lease_expires_at = ?
                         WHERE id = ? AND status = 'running' AND lease_attempt = ?",
                    )
                    .and_then(|mut stmt| {
                        stmt.execute(params![expires, fence.run_id.as_str(), i64::from(fence.attempt)])
                    })
                    .map_err(db)?;
                // Nothing was written when the lease is lost, so rolling back is the same as committing.
                if done == 1 { Ok(()) } else { Err(StoreError::LeaseLost { run_id: fence.run_id.clone() }) }
            })
            .await
        })
    }

    fn next_wake_at<'a>(&'a self, workflows: &'a [String]) -> BoxFuture<'a, Result<Option<Millis>, StoreError>> {
        Box::pin(async move {
            let workflows = serde_json::to_string(workflows).unwrap_or_else(|_| "[]".to_owned());
            self.read(move |conn| {
                conn.prepare_cached(
                    "SELECT MIN(t) FROM (
                        SELECT MIN(wake_at) AS t FROM runs
                        WHERE status = 'waiting' AND wake_at IS NOT NULL
                            AND workflow IN (SELECT value FROM json_each(?1))
                        UNION ALL
                        SELECT MIN(lease_expires_at) AS t FROM runs
                        WHERE status = 'running' AND workflow IN (SELECT value FROM json_each(?1)))",
                )
                .and_then(|mut stmt| stmt.query_row(params![workflows], |row| row.get(0)))
                .map_err(db)
            })
            .await
        })
    }

    fn start_step<'a>(
        &'a self,
        fence: &'a Fence,
        position: u32,
        name: &'a str,
    ) -> BoxFuture<'a, Result<u32, StoreError>> {
        Box::pin(async move {
            let fence = fence.clone();
            let name = name.to_owned();
            self.write_with(Commit::Relaxed, move |tx| {
                let now = now_ms();
                let seq = fenced_seq(tx, &fence, now)?;
                let attempts: Option<i64> = tx
                    .prepare_cached(
                        "INSERT INTO steps (run_id, position, name, status, attempts, created_at, updated_at)
                         VALUES (?, ?, ?, 'running', 1, ?, ?)
                         ON CONFLICT (run_id, position) DO UPDATE
                             SET attempts = attempts + 1, status = 'running', retry_at = NULL,
                                 updated_at = excluded.updated_at
                             WHERE steps.status IN ('running', 'retrying') AND steps.name = excluded.name
                         RETURNING attempts",
                    )
                    .and_then(|mut stmt| {
                        stmt.query_row(params![fence.run_id.as_str(), i64::from(position), name, now, now], |row| {
                            row.get(0)
                        })
                        .optional()
                    })
                    .map_err(db)?;
                let Some(attempt) = attempts.map(count_of) else {
                    return Err(StoreError::Corrupt(format!(
                        "step at position {position} cannot start another attempt"
                    )));
                };
                let payload = json!({ "position": position, "name": name, "attempt": attempt });
                insert_event(tx, &fence.run_id, seq, EventKind::StepStarted, &payload, now)?;
                Ok(attempt)
            })
            .await
        })
    }

    fn update_step<'a>(
        &'a self,
        fence: &'a Fence,
        position: u32,
        update: StepUpdate,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move {
            let fence = fence.clone();
            let (status, attempt, result, error, retry_at, kind, payload) = match update {
                StepUpdate::Completed { attempt, result } => {
                    let payload = json!({ "position": position, "attempt": attempt, "result": result });
                    ("completed", attempt, Some(to_json(&result)), None, None, EventKind::StepCompleted, payload)
                }
                StepUpdate::Failed { attempt, error } => {
                    let payload = json!({ "position": position, "attempt": attempt, "error": error });
                    ("failed", attempt, None, Some(error), None, EventKind::StepFailed, payload)
                }
                StepUpdate::Retrying { attempt, error, retry_at } => {
                    let payload =
                        json!({ "position": position, "attempt": attempt, "error": error, "retry_at": retry_at });
                    ("retrying", attempt, None, Some(error), Some(retry_at), EventKind::StepRetrying, payload)
                }
            };
            self.write_with(Commit::Durable, move |tx| {
                let now = now_ms();
                let seq = fenced_seq(tx, &fence, now)?;
                let done = tx
                    .prepare_cached(
                        "UPDATE steps SET status = ?1, result = ?2, error = ?3, retry_at = ?4, updated_at = ?5,
                                          failures = failures + (?1 <> 'completed')
                         WHERE run_id = ? AND position = ? AND attempts = ? AND status = 'running'",
                    )
                    .and_then(|mut stmt| {
                        stmt.execute(params![
                            status,
                            result,
                            error,
                            retry_at,
                            now,
                            fence.run_id.as_str(),
                            i64::from(position),
                            i64::from(attempt),
                        ])
                    })
                    .map_err(db)?;
                if done != 1 {
                    return Err(StoreError::Corrupt(format!(
                        "step at position {position} is not running attempt {attempt}"
                    )));
                }
                insert_event(tx, &fence.run_id, seq, kind, &payload, now)
            })
            .await
        })
    }

    fn create_hook<'a>(
        &'a self,
        fence: &'a Fence,
        position: u32,
        token: &'a str,
        metadata: &'a Value,
    ) -> BoxFuture<'a, Result<HookCreation, StoreError>> {
        Box::pin(async move {
            let fence = fence.clone();
            let token = token.to_owned();
            let metadata = metadata.clone();
            self.write_with(Commit::Durable, move |tx| {
                let now = now_ms();
                let seq = fenced_seq(tx, &fence, now)?;
                let metadata_json = to_json(&metadata);
                // The partial unique index on active tokens decides; no check-then-insert.
                let inserted = tx
                    .prepare_cached(
                        "INSERT INTO hooks (run_id, position, token, metadata, active, created_at)
                         VALUES (?, ?, ?, ?, 1, ?)
                         ON CONFLICT (token) WHERE active = 1 DO NOTHING",
                    )
                    .and_then(|mut stmt| {
                        stmt.execute(params![fence.run_id.as_str(), i64::from(position), token, metadata_json, now])
                    })
                    .map_err(db)?;
                if inserted == 1 {
                    let payload = json!({ "position": position, "metadata": metadata });
                    insert_event(tx, &fence.run_id, seq, EventKind::HookCreated, &payload, now)?;
                    return Ok(HookCreation::Created);
                }
                let owner: String = tx
                    .prepare_cached("SELECT run_id FROM hooks WHERE token = ? AND active = 1")
                    .and_then(|mut stmt| stmt.query_row(params![token], |row| row.get(0)))
                    .map_err(db)?;
                tx.prepare_cached(
                    "INSERT INTO hooks (run_id, position, token, metadata, active, conflict_run_id, created_at)
                     VALUES (?, ?, ?, ?, 0, ?, ?)",
                )
                .and_then(|mut stmt| {
                    stmt.execute(params![fence.run_id.as_str(), i64::from(position), token, metadata_json, owner, now])
                })
                .map_err(db)?;
                let payload = json!({ "position": position, "owner_run_id": owner });
                insert_event(tx, &fence.run_id, seq, EventKind::HookConflict, &payload, now)?;
                Ok(HookCreation::Conflict { owner_run_id: RunId::from(owner) })
            })
            .await
        })
    }

    fn hook_payload<'a>(
        &'a self,
        run_id: &'a RunId,
        position: u32,
        index: u64,
    ) -> BoxFuture<'a, Result<Option<HookPayload>, StoreError>> {
        Box::pin(async move {
            let run_id = run_id.clone();
            let index = i64::try_from(index).unwrap_or(i64::MAX);
            self.read(move |conn| {
                first_row(
                    conn,
                    "SELECT payload, received_at FROM hook_payloads WHERE run_id = ? AND position = ? AND seq = ?",
                    params![run_id.as_str(), i64::from(position), index],
                    |row| {
                        Ok(HookPayload {
                            value: parse_json(&get::<String>(row, "payload")?)?,
                            received_at: get(row, "received_at")?,
                        })
                    },
                )
            })
            .await
        })
    }

    fn create_wait<'a>(
        &'a self,
        fence: &'a Fence,
        position: u32,
        due_at: Millis,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move {
            let fence = fence.clone();
            self.write_with(Commit::Durable, move |tx| {
                let now = now_ms();
                let seq = fenced_seq(tx, &fence, now)?;
                tx.prepare_cached(
                    "INSERT INTO waits (run_id, position, due_at, status, created_at) VALUES (?, ?, ?, 'pending', ?)",
                )
                .and_then(|mut stmt| stmt.execute(params![fence.run_id.as_str(), i64::from(position), due_at, now]))
                .map_err(db)?;
                let payload = json!({ "position": position, "due_at": due_at });
                insert_event(tx, &fence.run_id, seq, EventKind::WaitCreated, &payload, now)
            })
            .await
        })
    }

    fn resolve_wait<'a>(
        &'a self,
        fence: &'a Fence,
        position: u32,
        resolution: WaitResolution,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move {
            let fence = fence.clone();
            self.write_with(Commit::Durable, move |tx| {
                let now = now_ms();
                check_fence(tx, &fence)?;
                let (status, fired) = match resolution {
                    WaitResolution::Fired => ("fired", true),
                    WaitResolution::Cancelled => ("cancelled", false),
                };
                let done = tx
                    .prepare_cached(
                        "UPDATE waits SET status = ?, fired_at = ?
                         WHERE run_id = ? AND position = ? AND status = 'pending'",
                    )
                    .and_then(|mut stmt| {
                        stmt.execute(params![status, fired.then_some(now), fence.run_id.as_str(), i64::from(position)])
                    })
                    .map_err(db)?;
                if done == 1 {
                    let payload = json!({ "position": position, "fired": fired });
                    append(tx, &fence.run_id, EventKind::WaitCompleted, &payload, now)?;
                }
                Ok(())
            })
            .await
        })
    }

    fn record_step<'a>(
        &'a self,
        fence: &'a Fence,
        position: u32,
        name: &'a str,
        result: &'a Value,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move {
            let fence = fence.clone();
            let name = name.to_owned();
            let result_json = to_json(result);
            let payload = json!({ "position": position, "name": name, "attempt": 1, "result": result });
            self.write_with(Commit::Durable, move |tx| {
                let now = now_ms();
                let seq = fenced_seq(tx, &fence, now)?;
                tx.prepare_cached(
                    "INSERT INTO steps (run_id, position, name, status, attempts, result, created_at, updated_at)
                     VALUES (?, ?, ?, 'completed', 1, ?, ?, ?)",
                )
                .and_then(|mut stmt| {
                    stmt.execute(params![fence.run_id.as_str(), i64::from(position), name, result_json, now, now])
                })
                .map_err(db)?;
                insert_event(tx, &fence.run_id, seq, EventKind::StepCompleted, &payload, now)
            })
            .await
        })
    }

    fn suspend_run<'a>(
        &'a self,
        fence: &'a Fence,
        wake_at: Option<Millis>,
    ) -> BoxFuture<'a, Result<RunStatus, StoreError>> {
        Box::pin(async move {
            let fence = fence.clone();
            let status = self
                .write_with(Commit::Durable, move |tx| {
                    let now = now_ms();
                    check_fence(tx, &fence)?;
                    // A payload that arrived during the execution makes the run runnable again at once.
                    let status: String = tx
                        .prepare_cached(
                            "UPDATE runs SET status = CASE WHEN wake_requested = 1 THEN 'pending' ELSE 'waiting' END,
                                 wake_at = ?, wake_requested = 0, lease_owner = NULL, lease_expires_at = NULL
                             WHERE id = ? RETURNING status",
                        )
                        .and_then(|mut stmt| stmt.query_row(params![wake_at, fence.run_id.as_str()], |row| row.get(0)))
                        .map_err(db)?;
                    let payload = json!({ "wake_at": wake_at, "status": status });
                    append(tx, &fence.run_id, EventKind::RunSuspended, &payload, now)?;
                    Ok(status)
                })
                .await?;
            RunStatus::from_str(&status).map_err(StoreError::from)
        })
    }

    fn finish_run<'a>(&'a self, fence: &'a Fence, outcome: RunOutcome) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move {
            let fence = fence.clone();
            let (status, output, error, kind, payload) = match outcome {
                RunOutcome::Completed(v) => {
                    let output = to_json(&v);
                    let payload = json!({ "output": v });
                    ("completed", Some(output), None, EventKind::RunCompleted, payload)
                }
                RunOutcome::Failed(e) => {
                    let payload = json!({ "error": e });
                    ("failed", None, Some(e), EventKind::RunFailed, payload)
                }
            };
            self.write_with(Commit::Durable, move |tx| {
                let now = now_ms();
                check_fence(tx, &fence)?;
                release_resources(tx, &fence.run_id, now)?;
                tx.prepare_cached(
                    "UPDATE runs SET status = ?, output = ?, error = ?, completed_at = ?, wake_at = NULL,
                         lease_owner = NULL, lease_expires_at = NULL
                     WHERE id = ?",
                )
                .and_then(|mut stmt| stmt.execute(params![status, output, error, now, fence.run_id.as_str()]))
                .map_err(db)?;
                append(tx, &fence.run_id, kind, &payload, now)?;
                wake_parent(tx, &fence.run_id)
            })
            .await
        })
    }

    fn cancel_run<'a>(&'a self, id: &'a RunId, reason: &'a str) -> BoxFuture<'a, Result<RunStatus, StoreError>> {
        Box::pin(async move {
            let id = id.clone();
            let reason = reason.to_owned();
            self.write_with(Commit::Durable, move |tx| {
                let now = now_ms();
                let status: Option<String> = tx
                    .prepare_cached("SELECT status FROM runs WHERE id = ?")
                    .and_then(|mut stmt| stmt.query_row(params![id.as_str()], |row| row.get(0)).optional())
                    .map_err(db)?;
                let Some(status) = status else {
                    return Err(StoreError::RunNotFound(id));
                };
                let status = RunStatus::from_str(&status).map_err(StoreError::from)?;
                if status.is_terminal() {
                    return Ok(status);
                }
                cancel_one(tx, &id, &reason, now)?;
                // Descendants that have not ended go with it, parents before children.
                let descendants: Vec<String> = all_rows(
                    tx,
                    "WITH RECURSIVE tree(id, depth) AS (
                         SELECT id, 1 FROM runs WHERE parent_run_id = ?1
                         UNION ALL
                         SELECT r.id, t.depth + 1 FROM runs r JOIN tree t ON r.parent_run_id = t.id
                     )
                     SELECT tree.id FROM tree JOIN runs ON runs.id = tree.id
                     WHERE runs.status IN ('pending', 'running', 'waiting') ORDER BY tree.depth, tree.id",
                    params![id.as_str()],
                    |row| row.get(0).map_err(db),
                )?;
                let cascade = format!("parent run {id} was cancelled");
                for child in descendants {
                    cancel_one(tx, &RunId::from(child), &cascade, now)?;
                }
                wake_parent(tx, &id)?;
                Ok(RunStatus::Cancelled)
            })
            .await
        })
    }

    fn get_hook<'a>(&'a self, token: &'a str) -> BoxFuture<'a, Result<Option<HookInfo>, StoreError>> {
        Box::pin(async move {
            let token = token.to_owned();
            self.read(move |conn| {
                first_row(
                    conn,
                    "SELECT run_id, metadata, received, created_at FROM hooks WHERE token = ? AND active = 1",
                    params![token],
                    |row| {
                        Ok(HookInfo {
                            token: token.clone(),
                            run_id: RunId::from(get::<String>(row, "run_id")?),
                            metadata: parse_json(&get::<String>(row, "metadata")?)?,
                            received: get::<i64>(row, "received")?.unsigned_abs(),
                            created_at: from_ms(get(row, "created_at")?),
                        })
                    },
                )
            })
            .await
        })
    }

    fn resume_hook<'a>(&'a self, token: &'a str, payload: Value) -> BoxFuture<'a, Result<ResumeReceipt, StoreError>> {
        Box::pin(async move {
            let token = token.to_owned();
            let payload = to_json(&payload);
            self.write_with(Commit::Durable, move |tx| {
                let now = now_ms();
                let hook = first_row(
                    tx,
                    "UPDATE hooks SET received = received + 1 WHERE token = ? AND active = 1
                     RETURNING run_id, position, received",
                    params![token],
                    |row| {
                        let run_id = RunId::from(get::<String>(row, "run_id")?);
                        Ok((run_id, position_of(row)?, get::<i64>(row, "received")? - 1))
                    },
                )?;
                let Some((run_id, position, index)) = hook else {
                    return Err(StoreError::HookNotFound(token));
                };
                tx.prepare_cached(
                    "INSERT INTO hook_payloads (run_id, position, seq, payload, received_at) VALUES (?, ?, ?, ?, ?)",
                )
                .and_then(|mut stmt| stmt.execute(params![run_id.as_str(), i64::from(position), index, payload, now]))
                .map_err(db)?;
                let event = json!({ "position": position, "index": index });
                append(tx, &run_id, EventKind::HookReceived, &event, now)?;
                wake_run(tx, run_id.as_str())?;
                Ok(ResumeReceipt { run_id, index: index.unsigned_abs() })
            })
            .await
        })
    }

    fn append_stream<'a>(
        &'a self,
        fence: &'a Fence,
        position: u32,
        event: &'a Value,
    ) -> BoxFuture<'a, Result<u64, StoreError>> {
        Box::pin(async move {
            let fence = fence.clone();
            let event = to_json(event);
            self.write_with(Commit::Durable, move |tx| {
                let now = now_ms();
                let seq = fenced_seq(tx, &fence, now)?;
                // The next index is computed inside the write transaction; the primary key (run_id, idx)
                // and the unique (run_id, position) reject any duplicate.
                let index: i64 = tx
                    .prepare_cached(
                        "INSERT INTO stream_events (run_id, idx, position, payload, created_at)
                         SELECT ?, COALESCE(MAX(idx) + 1, 0), ?, ?, ? FROM stream_events WHERE run_id = ?
                         RETURNING idx",
                    )
                    .and_then(|mut stmt| {
                        stmt.query_row(
                            params![fence.run_id.as_str(), i64::from(position), event, now, fence.run_id.as_str()],
                            |row| row.get(0),
                        )
                    })
                    .map_err(db)?;
                let payload = json!({ "position": position, "index": index });
                insert_event(tx, &fence.run_id, seq, EventKind::StreamEmitted, &payload, now)?;
                Ok(index.unsigned_abs())
            })
            .await
        })
    }

    fn read_stream<'a>(
        &'a self,
        run_id: &'a RunId,
        from: u64,
        limit: u32,
    ) -> BoxFuture<'a, Result<Vec<(u64, Value)>, StoreError>> {
        Box::pin(async move {
            let run_id = run_id.clone();
            let from = i64::try_from(from).unwrap_or(i64::MAX);
            self.read(move |conn| {
                all_rows(
                    conn,
                    "SELECT idx, payload FROM stream_events WHERE run_id = ? AND idx >= ? ORDER BY idx LIMIT ?",
                    params![run_id.as_str(), from, i64::from(limit)],
                    |row| Ok((get::<i64>(row, "idx")?.unsigned_abs(), parse_json(&get::<String>(row, "payload")?)?)),
                )
            })
            .await
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp_url() -> (std::path::PathBuf, String) {
        let dir = std::env::temp_dir().join(format!("resumable-sqlite-unit-{}", crate::ids::random_hex(8)));
        std::fs::create_dir_all(&dir).unwrap();
        let url = format!("sqlite://{}", dir.join("t.db").display());
        (dir, url)
    }

    /// Runs one query returning a single integer on `pool`.
    async fn scalar(pool: &ConnectionPool, sql: &'static str) -> i64 {
        pool.run(move |c| c.query_row(sql, [], |row| row.get(0)).map_err(db)).await.unwrap()
    }

    #[test]
    fn urls_parse_as_before() {
        let file = |path: &str| Database::File(PathBuf::from(path));
        let cases = [
            ("sqlite://path/to/file.db", file("path/to/file.db")),
            ("sqlite:///abs/file.db", file("/abs/file.db")),
            ("sqlite:relative.db", file("relative.db")),
            ("SQLite://x.db", file("x.db")),
            ("sqlite://with%20space%3F.db", file("with space?.db")),
            ("sqlite://100%.db", file("100%.db")),
            ("sqlite::memory:", Database::Memory),
            ("sqlite://:memory:", Database::Memory),
            ("sqlite://?mode=memory", Database::Memory),
            ("sqlite://named?mode=memory&cache=shared", Database::Memory),
        ];
        for (url, database) in cases {
            assert_eq!(parse_url(url).unwrap().database, database, "{url}");
        }
        let rwc = parse_url("sqlite://a.db?mode=rwc").unwrap();
        assert_eq!((rwc.read_only, rwc.shared_cache, rwc.vfs), (false, None, None));
        let ro = parse_url("sqlite://a.db?mode=ro&cache=private&vfs=unix-none").unwrap();
        assert_eq!((ro.read_only, ro.shared_cache, ro.vfs.as_deref()), (true, Some(false), Some("unix-none")));
        assert!(ro.flags(false).contains(OpenFlags::SQLITE_OPEN_READ_ONLY));
        let writer = parse_url("sqlite://a.db").unwrap().flags(false);
        assert!(writer.contains(OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_CREATE));
        assert!(!writer.contains(OpenFlags::SQLITE_OPEN_URI), "paths are never read as file: URIs");
    }

    #[test]
    fn bad_urls_are_errors() {
        for url in [
            "",
            "sqlite",
            "sqlite://",
            "sqlite:",
            "postgres://u@h/db",
            "runs.db",
            "sqlite://a.db?mode=bogus",
            "sqlite://a.db?cache=",
            "sqlite://a.db?immutable=1",
            "sqlite://a.db?journal=wal",
            "sqlite://%ff.db",
            "sqlité://a.db",
        ] {
            let parsed = parse_url(url);
            assert!(
                matches!(&parsed, Err(StoreError::Database(m)) if m.starts_with("invalid SQLite URL")),
                "{url}: {parsed:?}"
            );
        }
    }

    #[tokio::test]
    async fn opening_a_bad_url_or_an_unopenable_file_is_an_error() {
        assert!(matches!(SqliteStore::open("sqlite://a.db?mode=bogus").await, Err(StoreError::Database(_))));
        let missing = std::env::temp_dir().join(format!("resumable-missing-{}", crate::ids::random_hex(8)));
        let url = format!("sqlite://{}", missing.join("t.db").display());
        assert!(matches!(SqliteStore::open(&url).await, Err(StoreError::Database(_))));
    }

    #[tokio::test]
    async fn file_database_uses_wal_and_full_sync_and_migrates_once() {
        let (dir, url) = temp_url();
        let store = SqliteStore::open(&url).await.unwrap();
        let mode: String =
            store.writer.run(|c| c.query_row("PRAGMA journal_mode", [], |row| row.get(0)).map_err(db)).await.unwrap();
        assert_eq!((mode.as_str(), scalar(&store.writer, "PRAGMA synchronous").await), ("wal", 2));
        assert_eq!(scalar(&store.writer, "PRAGMA foreign_keys").await, 1);
        assert_eq!(scalar(&store.writer, "PRAGMA busy_timeout").await, 5000);
        // Readers: small page cache, read-only, same busy timeout.
        assert_eq!(scalar(&store.reader, "PRAGMA cache_size").await, -i64::from(READER_CACHE_KIB));
        assert_eq!(scalar(&store.reader, "PRAGMA busy_timeout").await, 5000);
        let write = store.reader.run(|c| c.execute("DELETE FROM runs", []).map_err(db)).await;
        assert!(matches!(write, Err(StoreError::Database(_))), "{write:?}");
        store.close().await;
        // Reopening applies nothing twice.
        let store = SqliteStore::open(&url).await.unwrap();
        let versions = store
            .writer
            .run(|c| all_rows(c, "SELECT version FROM schema_migrations", [], |row| row.get::<_, i64>(0).map_err(db)))
            .await
            .unwrap();
        assert_eq!(versions, vec![1, 2, 3, 4]);
        store.close().await;
        let _ = std::fs::remove_dir_all(dir);
    }

    #[tokio::test]
    async fn options_reach_every_connection() {
        let (dir, url) = temp_url();
        let options = SqliteStoreOptions {
            synchronous: Synchronous::Off,
            busy_timeout: Duration::from_millis(250),
            read_connections: 2,
        };
        let store = SqliteStore::open_with(&url, options).await.unwrap();
        assert_eq!(scalar(&store.writer, "PRAGMA synchronous").await, 0);
        assert_eq!(scalar(&store.writer, "PRAGMA busy_timeout").await, 250);
        assert_eq!(scalar(&store.reader, "PRAGMA busy_timeout").await, 250);
        // Not durable: claims and step starts leave the setting alone.
        let new = NewRun { workflow: "w".into(), input: json!(null), idempotency_key: None, parent_run_id: None };
        store.create_run(new).await.unwrap();
        let req = ClaimRequest { owner: "o".into(), workflows: vec!["w".into()], lease: Duration::from_secs(30) };
        store.claim(&req).await.unwrap().unwrap();
        assert_eq!(scalar(&store.writer, "PRAGMA synchronous").await, 0);
        store.close().await;
        let _ = std::fs::remove_dir_all(dir);
    }

    #[tokio::test]
    async fn memory_database_works_and_keeps_its_data() {
        let store = SqliteStore::open("sqlite::memory:").await.unwrap();
        let mode: String =
            store.writer.run(|c| c.query_row("PRAGMA journal_mode", [], |row| row.get(0)).map_err(db)).await.unwrap();
        assert_eq!(mode, "memory");
        let created = store
            .create_run(NewRun {
                workflow: "w".into(),
                input: json!({"a": 1}),
                idempotency_key: Some("k".into()),
                parent_run_id: None,
            })
            .await
            .unwrap();
        let again = store
            .create_run(NewRun {
                workflow: "w".into(),
                input: json!(null),
                idempotency_key: Some("k".into()),
                parent_run_id: None,
            })
            .await
            .unwrap();
        assert!(created.created && !again.created);
        assert_eq!(created.run_id, again.run_id);
        let run = store.get_run(&created.run_id).await.unwrap().unwrap();
        assert_eq!((run.status, run.input), (RunStatus::Pending, json!({"a": 1})));
        // Each in-memory store is its own database.
        let other = SqliteStore::open("sqlite::memory:").await.unwrap();
        assert_eq!(other.get_run(&created.run_id).await.unwrap(), None);
    }

    #[tokio::test]
    async fn claims_and_step_starts_skip_the_fsync() {
        let (dir, url) = temp_url();
        let store = SqliteStore::open(&url).await.unwrap();
        let new = NewRun { workflow: "w".into(), input: json!(null), idempotency_key: None, parent_run_id: None };
        store.create_run(new).await.unwrap();
        assert_eq!(scalar(&store.writer, "PRAGMA synchronous").await, 2, "FULL to begin with");
        let req = ClaimRequest { owner: "o".into(), workflows: vec!["w".into()], lease: Duration::from_secs(30) };
        let fence = store.claim(&req).await.unwrap().unwrap().fence;
        assert_eq!(scalar(&store.writer, "PRAGMA synchronous").await, 1, "NORMAL for the claim");
        assert_eq!(store.start_step(&fence, 0, "s").await.unwrap(), 1);
        assert_eq!(
            scalar(&store.writer, "PRAGMA synchronous").await,
            1,
            "NORMAL while the start record waits for the next commit"
        );
        let done = StepUpdate::Completed { attempt: 1, result: json!(1) };
        store.update_step(&fence, 0, done).await.unwrap();
        assert_eq!(scalar(&store.writer, "PRAGMA synchronous").await, 2, "FULL again for every other commit");
        // A failed durable write restores FULL all the same.
        let stale = Fence { run_id: fence.run_id.clone(), attempt: fence.attempt + 1, token: 0 };
        assert_eq!(store.start_step(&fence, 1, "t").await.unwrap(), 1);
        let lost = store.update_step(&stale, 1, StepUpdate::Completed { attempt: 1, result: json!(2) }).await;
        assert!(matches!(lost, Err(StoreError::LeaseLost { .. })), "{lost:?}");
        assert_eq!(scalar(&store.writer, "PRAGMA synchronous").await, 2);
        store.close().await;
        let _ = std::fs::remove_dir_all(dir);
    }

    /// A migration edited after it was applied is refused with what to do; a database made
    /// before checksums were kept adopts them once, and then checks them like any other.
    #[tokio::test]
    async fn applied_migrations_are_checked_against_their_checksums() {
        let (dir, url) = temp_url();
        let store = SqliteStore::open(&url).await.unwrap();
        let edit = |sql: &'static str| {
            let store = store.clone();
            async move { store.writer.run(move |c| c.execute_batch(sql).map_err(db)).await.unwrap() }
        };
        // As a build before checksums left it.
        edit("ALTER TABLE schema_migrations DROP COLUMN checksum").await;
        store.close().await;
        let store = SqliteStore::open(&url).await.unwrap();
        let checksums = store
            .writer
            .run(|c| {
                all_rows(c, "SELECT checksum FROM schema_migrations ORDER BY version", [], |row| {
                    row.get::<_, String>(0).map_err(db)
                })
            })
            .await
            .unwrap();
        let expected: Vec<String> = MIGRATIONS.iter().map(Migration::checksum).collect();
        assert_eq!(checksums, expected, "the checksums were adopted");
        // As if the file of migration 2 had been edited since.
        let edit = |sql: &'static str| {
            let store = store.clone();
            async move { store.writer.run(move |c| c.execute_batch(sql).map_err(db)).await.unwrap() }
        };
        edit("UPDATE schema_migrations SET checksum = 'edited' WHERE version = 2").await;
        store.close().await;
        let Err(StoreError::Corrupt(message)) = SqliteStore::open(&url).await else {
            panic!("an edited migration was accepted")
        };
        assert!(message.contains("migration 2 (stream_positions) was changed"), "{message}");
        let _ = std::fs::remove_dir_all(dir);
    }

    #[tokio::test]
    async fn newer_schema_is_refused() {
        let (dir, url) = temp_url();
        let store = SqliteStore::open(&url).await.unwrap();
        store
            .writer
            .run(|c| {
                c.execute("INSERT INTO schema_migrations (version, name, applied_at) VALUES (99, 'future', 0)", [])
                    .map_err(db)
            })
            .await
            .unwrap();
        store.close().await;
        assert!(matches!(SqliteStore::open(&url).await, Err(StoreError::Corrupt(_))));
        let _ = std::fs::remove_dir_all(dir);
    }

    #[tokio::test]
    async fn close_lets_pending_work_finish_and_refuses_later_work() {
        let (dir, url) = temp_url();
        let store = SqliteStore::open(&url).await.unwrap();
        let new = NewRun { workflow: "w".into(), input: json!(null), idempotency_key: None, parent_run_id: None };
        let (created, ()) = tokio::join!(store.create_run(new.clone()), store.close());
        let id = created.unwrap().run_id;
        assert!(matches!(store.get_run(&id).await, Err(StoreError::Database(_))));
        assert!(matches!(store.create_run(new).await, Err(StoreError::Database(_))));
        store.close().await;
        // Every connection is closed: the log was checkpointed into the file and removed.
        assert!(!dir.join("t.db-wal").exists());
        let store = SqliteStore::open(&url).await.unwrap();
        assert_eq!(store.get_run(&id).await.unwrap().map(|r| r.status), Some(RunStatus::Pending));
        store.close().await;
        let _ = std::fs::remove_dir_all(dir);
    }
}
