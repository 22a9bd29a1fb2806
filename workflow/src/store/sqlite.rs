//! The SQLite backend: an embedded database file (or `sqlite::memory:`) through sqlx.
//!
//! Writes go through a single connection and `BEGIN IMMEDIATE` transactions, so they never fail
//! on a lock upgrade; reads of a file database use a separate pool (WAL readers do not block the
//! writer). Several processes may share one file: SQLite serializes their writers and the busy
//! timeout makes them wait for each other.

use std::str::FromStr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use serde_json::{Value, json};
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteRow, SqliteSynchronous};
use sqlx::{Row, Sqlite, SqlitePool, Transaction};

use super::{
    BoxFuture, ClaimRequest, ClaimedRun, CreatedRun, EmitRecord, Fence, HookCreation, HookPayload, HookRecord,
    HookState, NewRun, OpRecord, RunHistory, RunOutcome, StepRecord, StepState, StepUpdate, Store, WaitRecord,
    WaitResolution, WaitState,
};
use crate::error::StoreError;
use crate::event::{Event, EventKind};
use crate::hook::{HookInfo, ResumeReceipt};
use crate::ids::RunId;
use crate::run::{RunCursor, RunFilter, RunInfo, RunPage, RunStatus};
use crate::time::{Millis, duration_ms, from_ms, now_ms, to_ms};

/// The embedded migrations, applied in order at open: (version, name, SQL).
const MIGRATIONS: &[(i64, &str, &str)] = &[
    (1, "init", include_str!("../../migrations/sqlite/0001_init.sql")),
    (2, "stream_positions", include_str!("../../migrations/sqlite/0002_stream_positions.sql")),
    (3, "child_runs", include_str!("../../migrations/sqlite/0003_child_runs.sql")),
];

/// The page cache of each read connection, in KiB (the writer keeps SQLite's default, 2 MiB).
const READER_CACHE_KIB: u32 = 512;

/// How hard SQLite works to make a commit durable (`PRAGMA synchronous`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Synchronous {
    /// `FULL`: a committed transaction survives a power loss (the default).
    #[default]
    Full,
    /// `NORMAL`: in WAL mode a power loss may undo the last commits, never corrupt the database.
    Normal,
    /// `OFF`: no fsync at all; for tests and throwaway databases only.
    Off,
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
    writer: SqlitePool,
    reader: SqlitePool,
    /// Commits fsync (`synchronous = FULL` on a file database).
    durable: bool,
    /// The writer connection runs at `synchronous = NORMAL` (see [`SqliteStore::begin_relaxed`]).
    relaxed: Arc<AtomicBool>,
}

fn db(e: sqlx::Error) -> StoreError {
    StoreError::Database(e.to_string())
}

fn to_json(v: &Value) -> String {
    // Serializing a `Value` cannot fail.
    serde_json::to_string(v).unwrap_or_else(|_| "null".to_owned())
}

fn parse_json(s: &str) -> Result<Value, StoreError> {
    serde_json::from_str(s).map_err(|e| StoreError::Corrupt(format!("invalid JSON in database: {e}")))
}

fn get<'r, T: sqlx::Decode<'r, Sqlite> + sqlx::Type<Sqlite>>(row: &'r SqliteRow, col: &str) -> Result<T, StoreError> {
    row.try_get(col).map_err(db)
}

fn position_of(row: &SqliteRow) -> Result<u32, StoreError> {
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
    pub async fn open_with(url: &str, options: SqliteStoreOptions) -> Result<SqliteStore, StoreError> {
        let base = SqliteConnectOptions::from_str(url).map_err(db)?;
        let in_memory = url.contains(":memory:") || url.contains("mode=memory");
        let synchronous = match options.synchronous {
            Synchronous::Full => SqliteSynchronous::Full,
            Synchronous::Normal => SqliteSynchronous::Normal,
            Synchronous::Off => SqliteSynchronous::Off,
        };
        let base = base
            .create_if_missing(true)
            .foreign_keys(true)
            .busy_timeout(options.busy_timeout)
            .synchronous(synchronous)
            .journal_mode(if in_memory { SqliteJournalMode::Memory } else { SqliteJournalMode::Wal });
        // One writer connection: in-process writers queue here instead of contending for the lock.
        // An in-memory database lives as long as its only connection, which must never be recycled.
        let writer = SqlitePoolOptions::new()
            .test_before_acquire(false)
            .max_connections(1)
            .min_connections(1)
            .idle_timeout(None)
            .max_lifetime(None)
            .connect_with(base.clone())
            .await
            .map_err(db)?;
        migrate(&writer).await?;
        let reader = if in_memory {
            writer.clone()
        } else {
            SqlitePoolOptions::new()
                .test_before_acquire(false)
                .max_connections(options.read_connections.max(1))
                // A small page cache per reader keeps memory flat however many runs wait.
                .connect_with(base.read_only(true).pragma("cache_size", format!("-{READER_CACHE_KIB}")))
                .await
                .map_err(db)?
        };
        let durable = options.synchronous == Synchronous::Full && !in_memory;
        Ok(SqliteStore { writer, reader, durable, relaxed: Arc::new(AtomicBool::new(false)) })
    }

    /// Closes the connections; pending operations finish first.
    pub async fn close(&self) {
        self.reader.close().await;
        self.writer.close().await;
    }

    /// A write transaction whose commit is durable (fsynced when so configured).
    async fn begin(&self) -> Result<Transaction<'static, Sqlite>, StoreError> {
        let mut conn = self.writer.acquire().await.map_err(db)?;
        if self.relaxed.load(Ordering::Acquire) {
            sqlx::query("PRAGMA synchronous = FULL").execute(&mut *conn).await.map_err(db)?;
            self.relaxed.store(false, Ordering::Release);
        }
        Transaction::begin(conn, Some("BEGIN IMMEDIATE".into())).await.map_err(db)
    }

    /// A write transaction committed without its own fsync: in WAL mode its commit survives a
    /// crash of the process at once and a power loss once any later commit fsyncs the log. Used
    /// for claims and a step's start record, whose loss only hands a run back or miscounts an
    /// attempt; everything that follows them commits durably.
    async fn begin_relaxed(&self) -> Result<Transaction<'static, Sqlite>, StoreError> {
        let mut conn = self.writer.acquire().await.map_err(db)?;
        if self.durable && !self.relaxed.load(Ordering::Acquire) {
            // Flag first: if this is cancelled midway, the next `begin` restores FULL.
            self.relaxed.store(true, Ordering::Release);
            sqlx::query("PRAGMA synchronous = NORMAL").execute(&mut *conn).await.map_err(db)?;
        }
        Transaction::begin(conn, Some("BEGIN IMMEDIATE".into())).await.map_err(db)
    }
}

/// Applies the embedded migrations that the database has not seen, in one transaction.
// Boxed so that the future is `Send` for every lifetime (sqlx executors otherwise defeat inference).
fn migrate(pool: &SqlitePool) -> BoxFuture<'_, Result<(), StoreError>> {
    Box::pin(async move {
        sqlx::query(
            "CREATE TABLE IF NOT EXISTS schema_migrations (
            version INTEGER PRIMARY KEY NOT NULL, name TEXT NOT NULL, applied_at INTEGER NOT NULL)",
        )
        .execute(pool)
        .await
        .map_err(db)?;
        let mut tx = pool.begin_with("BEGIN IMMEDIATE").await.map_err(db)?;
        let current: i64 = sqlx::query_scalar("SELECT COALESCE(MAX(version), 0) FROM schema_migrations")
            .fetch_one(&mut *tx)
            .await
            .map_err(db)?;
        let latest = MIGRATIONS.last().map_or(0, |m| m.0);
        if current > latest {
            return Err(StoreError::Corrupt(format!(
                "database schema version {current} is newer than this build knows ({latest})"
            )));
        }
        for &(version, name, sql) in MIGRATIONS {
            if version <= current {
                continue;
            }
            sqlx::query(sql).execute(&mut *tx).await.map_err(db)?;
            sqlx::query("INSERT INTO schema_migrations (version, name, applied_at) VALUES (?, ?, ?)")
                .bind(version)
                .bind(name)
                .bind(now_ms())
                .execute(&mut *tx)
                .await
                .map_err(db)?;
        }
        tx.commit().await.map_err(db)
    })
}

/// Fails with `LeaseLost` unless the run is running under this lease attempt.
async fn check_fence(tx: &mut Transaction<'static, Sqlite>, fence: &Fence) -> Result<(), StoreError> {
    let ok: Option<i64> =
        sqlx::query_scalar("SELECT 1 FROM runs WHERE id = ? AND status = 'running' AND lease_attempt = ?")
            .bind(fence.run_id.as_str())
            .bind(i64::from(fence.attempt))
            .fetch_optional(&mut **tx)
            .await
            .map_err(db)?;
    match ok {
        Some(_) => Ok(()),
        None => Err(StoreError::LeaseLost { run_id: fence.run_id.clone() }),
    }
}

/// Checks the fence and takes the run's next event sequence number in one statement; the caller
/// must append exactly one event with it ([`insert_event`]) before any other event.
async fn fenced_seq(tx: &mut Transaction<'static, Sqlite>, fence: &Fence, now: Millis) -> Result<i64, StoreError> {
    let seq: Option<i64> = sqlx::query_scalar(
        "UPDATE runs SET last_seq = last_seq + 1, updated_at = ?
         WHERE id = ? AND status = 'running' AND lease_attempt = ? RETURNING last_seq",
    )
    .bind(now)
    .bind(fence.run_id.as_str())
    .bind(i64::from(fence.attempt))
    .fetch_optional(&mut **tx)
    .await
    .map_err(db)?;
    seq.ok_or_else(|| StoreError::LeaseLost { run_id: fence.run_id.clone() })
}

/// Inserts an event under a sequence number taken by [`fenced_seq`] or [`append`].
async fn insert_event(
    tx: &mut Transaction<'static, Sqlite>,
    run_id: &RunId,
    seq: i64,
    kind: EventKind,
    payload: Value,
    now: Millis,
) -> Result<(), StoreError> {
    sqlx::query("INSERT INTO events (run_id, seq, kind, payload, created_at) VALUES (?, ?, ?, ?, ?)")
        .bind(run_id.as_str())
        .bind(seq)
        .bind(kind.as_str())
        .bind(to_json(&payload))
        .bind(now)
        .execute(&mut **tx)
        .await
        .map_err(db)?;
    Ok(())
}

/// Appends one event to the run's log under the next sequence number, and returns that number.
async fn append(
    tx: &mut Transaction<'static, Sqlite>,
    run_id: &RunId,
    kind: EventKind,
    payload: Value,
    now: Millis,
) -> Result<i64, StoreError> {
    let seq: i64 =
        sqlx::query_scalar("UPDATE runs SET last_seq = last_seq + 1, updated_at = ? WHERE id = ? RETURNING last_seq")
            .bind(now)
            .bind(run_id.as_str())
            .fetch_one(&mut **tx)
            .await
            .map_err(db)?;
    insert_event(tx, run_id, seq, kind, payload, now).await?;
    Ok(seq)
}

/// Disposes the run's active hooks and cancels its pending timers (part of ending a run).
async fn release_resources(
    tx: &mut Transaction<'static, Sqlite>,
    run_id: &RunId,
    now: Millis,
) -> Result<(), StoreError> {
    let disposed = sqlx::query(
        "UPDATE hooks SET active = 0, disposed_at = ? WHERE run_id = ? AND active = 1 RETURNING position, token",
    )
    .bind(now)
    .bind(run_id.as_str())
    .fetch_all(&mut **tx)
    .await
    .map_err(db)?;
    let mut positions = disposed.iter().map(position_of).collect::<Result<Vec<_>, _>>()?;
    positions.sort_unstable();
    for position in positions {
        append(tx, run_id, EventKind::HookDisposed, json!({ "position": position }), now).await?;
    }
    sqlx::query("UPDATE waits SET status = 'cancelled' WHERE run_id = ? AND status = 'pending'")
        .bind(run_id.as_str())
        .execute(&mut **tx)
        .await
        .map_err(db)?;
    Ok(())
}

/// Makes a run that has not ended runnable again: a waiting run becomes pending, a running one
/// remembers the request so that its suspension is not final.
async fn wake_run(tx: &mut Transaction<'static, Sqlite>, run_id: &str) -> Result<(), StoreError> {
    sqlx::query(
        "UPDATE runs SET wake_requested = 1, status = CASE WHEN status = 'waiting' THEN 'pending' ELSE status END
         WHERE id = ? AND status IN ('pending', 'running', 'waiting')",
    )
    .bind(run_id)
    .execute(&mut **tx)
    .await
    .map_err(db)?;
    Ok(())
}

/// Wakes the parent of `run_id`, if it has one (part of ending a run).
async fn wake_parent(tx: &mut Transaction<'static, Sqlite>, run_id: &RunId) -> Result<(), StoreError> {
    let parent: Option<String> = sqlx::query_scalar("SELECT parent_run_id FROM runs WHERE id = ?")
        .bind(run_id.as_str())
        .fetch_optional(&mut **tx)
        .await
        .map_err(db)?
        .flatten();
    match parent {
        Some(parent) => wake_run(tx, &parent).await,
        None => Ok(()),
    }
}

/// Cancels one run that has not ended: resources released, lease voided, event appended.
async fn cancel_one(
    tx: &mut Transaction<'static, Sqlite>,
    id: &RunId,
    reason: &str,
    now: Millis,
) -> Result<(), StoreError> {
    release_resources(tx, id, now).await?;
    sqlx::query(
        "UPDATE runs SET status = 'cancelled', error = ?, completed_at = ?, wake_at = NULL,
             lease_owner = NULL, lease_expires_at = NULL
         WHERE id = ?",
    )
    .bind(reason)
    .bind(now)
    .bind(id.as_str())
    .execute(&mut **tx)
    .await
    .map_err(db)?;
    append(tx, id, EventKind::RunCancelled, json!({ "reason": reason }), now).await?;
    Ok(())
}

fn run_from_row(row: &SqliteRow) -> Result<RunInfo, StoreError> {
    let status: String = get(row, "status")?;
    let output: Option<String> = get(row, "output")?;
    let started_at: Option<i64> = get(row, "started_at")?;
    let completed_at: Option<i64> = get(row, "completed_at")?;
    Ok(RunInfo {
        id: RunId::from(get::<String>(row, "id")?),
        workflow: get(row, "workflow")?,
        status: RunStatus::from_str(&status).map_err(StoreError::Corrupt)?,
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

const RUN_COLUMNS: &str = "id, workflow, input, status, output, error, idempotency_key, parent_run_id, lease_attempt, \
                           created_at, updated_at, started_at, completed_at";

/// Loads everything earlier executions of a run recorded.
async fn load_history(tx: &mut Transaction<'static, Sqlite>, run_id: &RunId) -> Result<RunHistory, StoreError> {
    let mut history = RunHistory::default();
    let steps =
        sqlx::query("SELECT position, name, status, attempts, result, error, retry_at FROM steps WHERE run_id = ?")
            .bind(run_id.as_str())
            .fetch_all(&mut **tx)
            .await
            .map_err(db)?;
    for row in &steps {
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
        let record = StepRecord { name: get(row, "name")?, attempts: count_of(get(row, "attempts")?), state };
        history.ops.insert(position_of(row)?, OpRecord::Step(record));
    }
    let hooks = sqlx::query("SELECT position, token, metadata, active, conflict_run_id FROM hooks WHERE run_id = ?")
        .bind(run_id.as_str())
        .fetch_all(&mut **tx)
        .await
        .map_err(db)?;
    for row in &hooks {
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
        history.ops.insert(position_of(row)?, OpRecord::Hook(record));
    }
    let payloads =
        sqlx::query("SELECT position, payload, received_at FROM hook_payloads WHERE run_id = ? ORDER BY position, seq")
            .bind(run_id.as_str())
            .fetch_all(&mut **tx)
            .await
            .map_err(db)?;
    for row in &payloads {
        if let Some(OpRecord::Hook(h)) = history.ops.get_mut(&position_of(row)?) {
            let value = parse_json(&get::<String>(row, "payload")?)?;
            h.payloads.push(HookPayload { value, received_at: get(row, "received_at")? });
        }
    }
    let waits = sqlx::query("SELECT position, due_at, status FROM waits WHERE run_id = ?")
        .bind(run_id.as_str())
        .fetch_all(&mut **tx)
        .await
        .map_err(db)?;
    for row in &waits {
        let status: String = get(row, "status")?;
        let state = match status.as_str() {
            "pending" => WaitState::Pending,
            "fired" => WaitState::Fired,
            "cancelled" => WaitState::Cancelled,
            other => return Err(StoreError::Corrupt(format!("unknown wait status {other:?}"))),
        };
        history.ops.insert(position_of(row)?, OpRecord::Wait(WaitRecord { due_at: get(row, "due_at")?, state }));
    }
    let emits = sqlx::query("SELECT position, idx FROM stream_events WHERE run_id = ?")
        .bind(run_id.as_str())
        .fetch_all(&mut **tx)
        .await
        .map_err(db)?;
    for row in &emits {
        let index = get::<i64>(row, "idx")?.unsigned_abs();
        history.ops.insert(position_of(row)?, OpRecord::Emit(EmitRecord { index }));
    }
    Ok(history)
}

impl Store for SqliteStore {
    fn create_run(&self, run: NewRun) -> BoxFuture<'_, Result<CreatedRun, StoreError>> {
        Box::pin(async move {
            let now = now_ms();
            let id = RunId::generate();
            let mut tx = self.begin().await?;
            if let Some(parent) = &run.parent_run_id {
                // A child of a run that has ended would run orphaned (writers are serialized here).
                let status: Option<String> = sqlx::query_scalar("SELECT status FROM runs WHERE id = ?")
                    .bind(parent.as_str())
                    .fetch_optional(&mut *tx)
                    .await
                    .map_err(db)?;
                if !matches!(status.as_deref(), Some("pending" | "running" | "waiting")) {
                    return Err(StoreError::LeaseLost { run_id: parent.clone() });
                }
            }
            let inserted = sqlx::query(
                "INSERT INTO runs (id, workflow, input, status, idempotency_key, parent_run_id, created_at, updated_at)
                 VALUES (?, ?, ?, 'pending', ?, ?, ?, ?) ON CONFLICT (idempotency_key) DO NOTHING",
            )
            .bind(id.as_str())
            .bind(&run.workflow)
            .bind(to_json(&run.input))
            .bind(run.idempotency_key.as_deref())
            .bind(run.parent_run_id.as_ref().map(RunId::as_str))
            .bind(now)
            .bind(now)
            .execute(&mut *tx)
            .await
            .map_err(db)?;
            if inserted.rows_affected() == 0 {
                // The unique constraint decided: a run with this key exists.
                let existing: String = sqlx::query_scalar("SELECT id FROM runs WHERE idempotency_key = ?")
                    .bind(run.idempotency_key.as_deref())
                    .fetch_one(&mut *tx)
                    .await
                    .map_err(db)?;
                tx.commit().await.map_err(db)?;
                return Ok(CreatedRun { run_id: RunId::from(existing), created: false });
            }
            let payload = json!({
                "workflow": run.workflow,
                "input": run.input,
                "idempotency_key": run.idempotency_key,
                "parent_run_id": run.parent_run_id,
            });
            append(&mut tx, &id, EventKind::RunCreated, payload, now).await?;
            tx.commit().await.map_err(db)?;
            Ok(CreatedRun { run_id: id, created: true })
        })
    }

    fn get_run<'a>(&'a self, id: &'a RunId) -> BoxFuture<'a, Result<Option<RunInfo>, StoreError>> {
        Box::pin(async move {
            let row = sqlx::query(&format!("SELECT {RUN_COLUMNS} FROM runs WHERE id = ?"))
                .bind(id.as_str())
                .fetch_optional(&self.reader)
                .await
                .map_err(db)?;
            row.as_ref().map(run_from_row).transpose()
        })
    }

    fn list_runs<'a>(&'a self, filter: &'a RunFilter) -> BoxFuture<'a, Result<RunPage, StoreError>> {
        Box::pin(async move {
            let statuses: Vec<&str> = filter.statuses.iter().map(|s| s.as_str()).collect();
            let limit = filter.page_size();
            let rows = sqlx::query(&format!(
                "SELECT {RUN_COLUMNS} FROM runs
                 WHERE (?1 IS NULL OR workflow = ?1)
                   AND (?2 = '[]' OR status IN (SELECT value FROM json_each(?2)))
                   AND (?3 IS NULL OR parent_run_id = ?3)
                   AND (?4 IS NULL OR created_at >= ?4)
                   AND (?5 IS NULL OR created_at < ?5)
                   AND (?6 IS NULL OR created_at < ?6 OR (created_at = ?6 AND id < ?7))
                 ORDER BY created_at DESC, id DESC LIMIT ?8"
            ))
            .bind(filter.workflow.as_deref())
            .bind(serde_json::to_string(&statuses).unwrap_or_else(|_| "[]".to_owned()))
            .bind(filter.parent_run_id.as_ref().map(RunId::as_str))
            .bind(filter.created_after.map(to_ms))
            .bind(filter.created_before.map(to_ms))
            .bind(filter.cursor.as_ref().map(|c| c.created_at_ms))
            .bind(filter.cursor.as_ref().map(|c| c.run_id.as_str()))
            .bind(i64::from(limit) + 1)
            .fetch_all(&self.reader)
            .await
            .map_err(db)?;
            let mut runs = rows.iter().map(run_from_row).collect::<Result<Vec<_>, _>>()?;
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
            let rows = sqlx::query("SELECT seq, kind, payload, created_at FROM events WHERE run_id = ? ORDER BY seq")
                .bind(id.as_str())
                .fetch_all(&self.reader)
                .await
                .map_err(db)?;
            rows.iter()
                .map(|row| {
                    let kind: String = get(row, "kind")?;
                    Ok(Event {
                        run_id: id.clone(),
                        seq: get::<i64>(row, "seq")?.unsigned_abs(),
                        kind: EventKind::from_str(&kind).map_err(StoreError::Corrupt)?,
                        payload: parse_json(&get::<String>(row, "payload")?)?,
                        created_at: from_ms(get(row, "created_at")?),
                    })
                })
                .collect()
        })
    }

    fn claim<'a>(&'a self, req: &'a ClaimRequest) -> BoxFuture<'a, Result<Option<ClaimedRun>, StoreError>> {
        Box::pin(async move {
            let workflows = serde_json::to_string(&req.workflows).unwrap_or_else(|_| "[]".to_owned());
            // An engine never takes over its own expired leases: its executions are alive while it
            // is, and a restarted engine has a new owner name.
            let runnable = "SELECT id FROM runs
                 WHERE workflow IN (SELECT value FROM json_each(?1))
                   AND (status = 'pending'
                        OR (status = 'waiting' AND wake_at <= ?2)
                        OR (status = 'running' AND lease_expires_at <= ?2 AND lease_owner <> ?3))
                 ORDER BY updated_at LIMIT 1";
            // Look on a reader first, so idle workers polling never take the write lock.
            let candidate: Option<String> = sqlx::query_scalar(runnable)
                .bind(&workflows)
                .bind(now_ms())
                .bind(&req.owner)
                .fetch_optional(&self.reader)
                .await
                .map_err(db)?;
            if candidate.is_none() {
                return Ok(None);
            }
            // A claim that a power loss undoes only hands the run back; what it leads to commits durably.
            let mut tx = self.begin_relaxed().await?;
            // The clock is read once the write lock is held, so waiting for it never shortens a lease.
            let now = now_ms();
            let id: Option<String> = sqlx::query_scalar(runnable)
                .bind(&workflows)
                .bind(now)
                .bind(&req.owner)
                .fetch_optional(&mut *tx)
                .await
                .map_err(db)?;
            let Some(id) = id else {
                return Ok(None);
            };
            let run_id = RunId::from(id);
            let row = sqlx::query(
                "UPDATE runs SET status = 'running', lease_owner = ?, lease_expires_at = ?,
                     lease_attempt = lease_attempt + 1, wake_at = NULL, wake_requested = 0,
                     started_at = COALESCE(started_at, ?)
                 WHERE id = ? RETURNING workflow, input, lease_attempt",
            )
            .bind(&req.owner)
            .bind(now.saturating_add(duration_ms(req.lease)))
            .bind(now)
            .bind(run_id.as_str())
            .fetch_one(&mut *tx)
            .await
            .map_err(db)?;
            let attempt = count_of(get(&row, "lease_attempt")?);
            let workflow: String = get(&row, "workflow")?;
            let input = parse_json(&get::<String>(&row, "input")?)?;
            append(&mut tx, &run_id, EventKind::RunStarted, json!({ "owner": req.owner, "attempt": attempt }), now)
                .await?;
            let history = load_history(&mut tx, &run_id).await?;
            tx.commit().await.map_err(db)?;
            Ok(Some(ClaimedRun { fence: Fence { run_id, attempt }, workflow, input, history }))
        })
    }

    fn renew_lease<'a>(&'a self, fence: &'a Fence, lease: Duration) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move {
            let mut tx = self.begin().await?;
            let expires = now_ms().saturating_add(duration_ms(lease));
            let done = sqlx::query(
                "UPDATE runs SET lease_expires_at = ? WHERE id = ? AND status = 'running' AND lease_attempt = ?",
            )
            .bind(expires)
            .bind(fence.run_id.as_str())
            .bind(i64::from(fence.attempt))
            .execute(&mut *tx)
            .await
            .map_err(db)?;
            tx.commit().await.map_err(db)?;
            if done.rows_affected() == 1 { Ok(()) } else { Err(StoreError::LeaseLost { run_id: fence.run_id.clone() }) }
        })
    }

    fn next_wake_at<'a>(&'a self, workflows: &'a [String]) -> BoxFuture<'a, Result<Option<Millis>, StoreError>> {
        Box::pin(async move {
            let workflows = serde_json::to_string(workflows).unwrap_or_else(|_| "[]".to_owned());
            sqlx::query_scalar(
                "SELECT MIN(t) FROM (
                    SELECT MIN(wake_at) AS t FROM runs
                    WHERE status = 'waiting' AND wake_at IS NOT NULL AND workflow IN (SELECT value FROM json_each(?1))
                    UNION ALL
                    SELECT MIN(lease_expires_at) AS t FROM runs
                    WHERE status = 'running' AND workflow IN (SELECT value FROM json_each(?1)))",
            )
            .bind(&workflows)
            .fetch_one(&self.reader)
            .await
            .map_err(db)
        })
    }

    fn start_step<'a>(
        &'a self,
        fence: &'a Fence,
        position: u32,
        name: &'a str,
    ) -> BoxFuture<'a, Result<u32, StoreError>> {
        Box::pin(async move {
            let mut tx = self.begin_relaxed().await?;
            let now = now_ms();
            let seq = fenced_seq(&mut tx, fence, now).await?;
            let attempts: Option<i64> = sqlx::query_scalar(
                "INSERT INTO steps (run_id, position, name, status, attempts, created_at, updated_at)
                 VALUES (?, ?, ?, 'running', 1, ?, ?)
                 ON CONFLICT (run_id, position) DO UPDATE
                     SET attempts = attempts + 1, status = 'running', retry_at = NULL, updated_at = excluded.updated_at
                     WHERE steps.status IN ('running', 'retrying') AND steps.name = excluded.name
                 RETURNING attempts",
            )
            .bind(fence.run_id.as_str())
            .bind(i64::from(position))
            .bind(name)
            .bind(now)
            .bind(now)
            .fetch_optional(&mut *tx)
            .await
            .map_err(db)?;
            let Some(attempt) = attempts.map(count_of) else {
                return Err(StoreError::Corrupt(format!("step at position {position} cannot start another attempt")));
            };
            let payload = json!({ "position": position, "name": name, "attempt": attempt });
            insert_event(&mut tx, &fence.run_id, seq, EventKind::StepStarted, payload, now).await?;
            tx.commit().await.map_err(db)?;
            Ok(attempt)
        })
    }

    fn update_step<'a>(
        &'a self,
        fence: &'a Fence,
        position: u32,
        update: StepUpdate,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move {
            let mut tx = self.begin().await?;
            let now = now_ms();
            let seq = fenced_seq(&mut tx, fence, now).await?;
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
            let done = sqlx::query(
                "UPDATE steps SET status = ?, result = ?, error = ?, retry_at = ?, updated_at = ?
                 WHERE run_id = ? AND position = ? AND attempts = ? AND status = 'running'",
            )
            .bind(status)
            .bind(result)
            .bind(error)
            .bind(retry_at)
            .bind(now)
            .bind(fence.run_id.as_str())
            .bind(i64::from(position))
            .bind(i64::from(attempt))
            .execute(&mut *tx)
            .await
            .map_err(db)?;
            if done.rows_affected() != 1 {
                return Err(StoreError::Corrupt(format!(
                    "step at position {position} is not running attempt {attempt}"
                )));
            }
            insert_event(&mut tx, &fence.run_id, seq, kind, payload, now).await?;
            tx.commit().await.map_err(db)
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
            let mut tx = self.begin().await?;
            let now = now_ms();
            let seq = fenced_seq(&mut tx, fence, now).await?;
            // The partial unique index on active tokens decides; no check-then-insert.
            let inserted = sqlx::query(
                "INSERT INTO hooks (run_id, position, token, metadata, active, created_at) VALUES (?, ?, ?, ?, 1, ?)
                 ON CONFLICT (token) WHERE active = 1 DO NOTHING",
            )
            .bind(fence.run_id.as_str())
            .bind(i64::from(position))
            .bind(token)
            .bind(to_json(metadata))
            .bind(now)
            .execute(&mut *tx)
            .await
            .map_err(db)?;
            let creation = if inserted.rows_affected() == 1 {
                let payload = json!({ "position": position, "metadata": metadata });
                insert_event(&mut tx, &fence.run_id, seq, EventKind::HookCreated, payload, now).await?;
                HookCreation::Created
            } else {
                let owner: String = sqlx::query_scalar("SELECT run_id FROM hooks WHERE token = ? AND active = 1")
                    .bind(token)
                    .fetch_one(&mut *tx)
                    .await
                    .map_err(db)?;
                sqlx::query(
                    "INSERT INTO hooks (run_id, position, token, metadata, active, conflict_run_id, created_at)
                     VALUES (?, ?, ?, ?, 0, ?, ?)",
                )
                .bind(fence.run_id.as_str())
                .bind(i64::from(position))
                .bind(token)
                .bind(to_json(metadata))
                .bind(&owner)
                .bind(now)
                .execute(&mut *tx)
                .await
                .map_err(db)?;
                let payload = json!({ "position": position, "owner_run_id": owner });
                insert_event(&mut tx, &fence.run_id, seq, EventKind::HookConflict, payload, now).await?;
                HookCreation::Conflict { owner_run_id: RunId::from(owner) }
            };
            tx.commit().await.map_err(db)?;
            Ok(creation)
        })
    }

    fn hook_payload<'a>(
        &'a self,
        run_id: &'a RunId,
        position: u32,
        index: u64,
    ) -> BoxFuture<'a, Result<Option<HookPayload>, StoreError>> {
        Box::pin(async move {
            let row = sqlx::query(
                "SELECT payload, received_at FROM hook_payloads WHERE run_id = ? AND position = ? AND seq = ?",
            )
            .bind(run_id.as_str())
            .bind(i64::from(position))
            .bind(i64::try_from(index).unwrap_or(i64::MAX))
            .fetch_optional(&self.reader)
            .await
            .map_err(db)?;
            let Some(row) = row else {
                return Ok(None);
            };
            Ok(Some(HookPayload {
                value: parse_json(&get::<String>(&row, "payload")?)?,
                received_at: get(&row, "received_at")?,
            }))
        })
    }

    fn create_wait<'a>(
        &'a self,
        fence: &'a Fence,
        position: u32,
        due_at: Millis,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move {
            let mut tx = self.begin().await?;
            let now = now_ms();
            let seq = fenced_seq(&mut tx, fence, now).await?;
            sqlx::query(
                "INSERT INTO waits (run_id, position, due_at, status, created_at) VALUES (?, ?, ?, 'pending', ?)",
            )
            .bind(fence.run_id.as_str())
            .bind(i64::from(position))
            .bind(due_at)
            .bind(now)
            .execute(&mut *tx)
            .await
            .map_err(db)?;
            let payload = json!({ "position": position, "due_at": due_at });
            insert_event(&mut tx, &fence.run_id, seq, EventKind::WaitCreated, payload, now).await?;
            tx.commit().await.map_err(db)
        })
    }

    fn resolve_wait<'a>(
        &'a self,
        fence: &'a Fence,
        position: u32,
        resolution: WaitResolution,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move {
            let mut tx = self.begin().await?;
            let now = now_ms();
            check_fence(&mut tx, fence).await?;
            let (status, fired) = match resolution {
                WaitResolution::Fired => ("fired", true),
                WaitResolution::Cancelled => ("cancelled", false),
            };
            let done = sqlx::query(
                "UPDATE waits SET status = ?, fired_at = ? WHERE run_id = ? AND position = ? AND status = 'pending'",
            )
            .bind(status)
            .bind(fired.then_some(now))
            .bind(fence.run_id.as_str())
            .bind(i64::from(position))
            .execute(&mut *tx)
            .await
            .map_err(db)?;
            if done.rows_affected() == 1 {
                let payload = json!({ "position": position, "fired": fired });
                append(&mut tx, &fence.run_id, EventKind::WaitCompleted, payload, now).await?;
            }
            tx.commit().await.map_err(db)
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
            let mut tx = self.begin().await?;
            let now = now_ms();
            let seq = fenced_seq(&mut tx, fence, now).await?;
            sqlx::query(
                "INSERT INTO steps (run_id, position, name, status, attempts, result, created_at, updated_at)
                 VALUES (?, ?, ?, 'completed', 1, ?, ?, ?)",
            )
            .bind(fence.run_id.as_str())
            .bind(i64::from(position))
            .bind(name)
            .bind(to_json(result))
            .bind(now)
            .bind(now)
            .execute(&mut *tx)
            .await
            .map_err(db)?;
            let payload = json!({ "position": position, "name": name, "attempt": 1, "result": result });
            insert_event(&mut tx, &fence.run_id, seq, EventKind::StepCompleted, payload, now).await?;
            tx.commit().await.map_err(db)
        })
    }

    fn suspend_run<'a>(
        &'a self,
        fence: &'a Fence,
        wake_at: Option<Millis>,
    ) -> BoxFuture<'a, Result<RunStatus, StoreError>> {
        Box::pin(async move {
            let mut tx = self.begin().await?;
            let now = now_ms();
            check_fence(&mut tx, fence).await?;
            // A payload that arrived during the execution makes the run runnable again at once.
            let status: String = sqlx::query_scalar(
                "UPDATE runs SET status = CASE WHEN wake_requested = 1 THEN 'pending' ELSE 'waiting' END,
                     wake_at = ?, wake_requested = 0, lease_owner = NULL, lease_expires_at = NULL
                 WHERE id = ? RETURNING status",
            )
            .bind(wake_at)
            .bind(fence.run_id.as_str())
            .fetch_one(&mut *tx)
            .await
            .map_err(db)?;
            append(
                &mut tx,
                &fence.run_id,
                EventKind::RunSuspended,
                json!({ "wake_at": wake_at, "status": status }),
                now,
            )
            .await?;
            tx.commit().await.map_err(db)?;
            RunStatus::from_str(&status).map_err(StoreError::Corrupt)
        })
    }

    fn finish_run<'a>(&'a self, fence: &'a Fence, outcome: RunOutcome) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move {
            let mut tx = self.begin().await?;
            let now = now_ms();
            check_fence(&mut tx, fence).await?;
            release_resources(&mut tx, &fence.run_id, now).await?;
            let (status, output, error, kind, payload) = match outcome {
                RunOutcome::Completed(v) => {
                    let payload = json!({ "output": v });
                    ("completed", Some(to_json(&v)), None, EventKind::RunCompleted, payload)
                }
                RunOutcome::Failed(e) => {
                    let payload = json!({ "error": e });
                    ("failed", None, Some(e), EventKind::RunFailed, payload)
                }
            };
            sqlx::query(
                "UPDATE runs SET status = ?, output = ?, error = ?, completed_at = ?, wake_at = NULL,
                     lease_owner = NULL, lease_expires_at = NULL
                 WHERE id = ?",
            )
            .bind(status)
            .bind(output)
            .bind(error)
            .bind(now)
            .bind(fence.run_id.as_str())
            .execute(&mut *tx)
            .await
            .map_err(db)?;
            append(&mut tx, &fence.run_id, kind, payload, now).await?;
            wake_parent(&mut tx, &fence.run_id).await?;
            tx.commit().await.map_err(db)
        })
    }

    fn cancel_run<'a>(&'a self, id: &'a RunId, reason: &'a str) -> BoxFuture<'a, Result<RunStatus, StoreError>> {
        Box::pin(async move {
            let mut tx = self.begin().await?;
            let now = now_ms();
            let status: Option<String> = sqlx::query_scalar("SELECT status FROM runs WHERE id = ?")
                .bind(id.as_str())
                .fetch_optional(&mut *tx)
                .await
                .map_err(db)?;
            let Some(status) = status else {
                return Err(StoreError::RunNotFound(id.clone()));
            };
            let status = RunStatus::from_str(&status).map_err(StoreError::Corrupt)?;
            if status.is_terminal() {
                return Ok(status);
            }
            cancel_one(&mut tx, id, reason, now).await?;
            // Descendants that have not ended go with it, parents before children.
            let descendants: Vec<String> = sqlx::query_scalar(
                "WITH RECURSIVE tree(id, depth) AS (
                     SELECT id, 1 FROM runs WHERE parent_run_id = ?1
                     UNION ALL
                     SELECT r.id, t.depth + 1 FROM runs r JOIN tree t ON r.parent_run_id = t.id
                 )
                 SELECT tree.id FROM tree JOIN runs ON runs.id = tree.id
                 WHERE runs.status IN ('pending', 'running', 'waiting') ORDER BY tree.depth, tree.id",
            )
            .bind(id.as_str())
            .fetch_all(&mut *tx)
            .await
            .map_err(db)?;
            let cascade = format!("parent run {id} was cancelled");
            for child in descendants {
                cancel_one(&mut tx, &RunId::from(child), &cascade, now).await?;
            }
            wake_parent(&mut tx, id).await?;
            tx.commit().await.map_err(db)?;
            Ok(RunStatus::Cancelled)
        })
    }

    fn get_hook<'a>(&'a self, token: &'a str) -> BoxFuture<'a, Result<Option<HookInfo>, StoreError>> {
        Box::pin(async move {
            let row =
                sqlx::query("SELECT run_id, metadata, received, created_at FROM hooks WHERE token = ? AND active = 1")
                    .bind(token)
                    .fetch_optional(&self.reader)
                    .await
                    .map_err(db)?;
            let Some(row) = row else {
                return Ok(None);
            };
            Ok(Some(HookInfo {
                token: token.to_owned(),
                run_id: RunId::from(get::<String>(&row, "run_id")?),
                metadata: parse_json(&get::<String>(&row, "metadata")?)?,
                received: get::<i64>(&row, "received")?.unsigned_abs(),
                created_at: from_ms(get(&row, "created_at")?),
            }))
        })
    }

    fn resume_hook<'a>(&'a self, token: &'a str, payload: Value) -> BoxFuture<'a, Result<ResumeReceipt, StoreError>> {
        Box::pin(async move {
            let mut tx = self.begin().await?;
            let now = now_ms();
            let row = sqlx::query(
                "UPDATE hooks SET received = received + 1 WHERE token = ? AND active = 1 RETURNING run_id, position, received",
            )
            .bind(token)
            .fetch_optional(&mut *tx)
            .await
            .map_err(db)?;
            let Some(row) = row else {
                return Err(StoreError::HookNotFound(token.to_owned()));
            };
            let run_id = RunId::from(get::<String>(&row, "run_id")?);
            let position = position_of(&row)?;
            let index = get::<i64>(&row, "received")? - 1;
            sqlx::query(
                "INSERT INTO hook_payloads (run_id, position, seq, payload, received_at) VALUES (?, ?, ?, ?, ?)",
            )
            .bind(run_id.as_str())
            .bind(i64::from(position))
            .bind(index)
            .bind(to_json(&payload))
            .bind(now)
            .execute(&mut *tx)
            .await
            .map_err(db)?;
            append(&mut tx, &run_id, EventKind::HookReceived, json!({ "position": position, "index": index }), now)
                .await?;
            wake_run(&mut tx, run_id.as_str()).await?;
            tx.commit().await.map_err(db)?;
            Ok(ResumeReceipt { run_id, index: index.unsigned_abs() })
        })
    }

    fn append_stream<'a>(
        &'a self,
        fence: &'a Fence,
        position: u32,
        event: &'a Value,
    ) -> BoxFuture<'a, Result<u64, StoreError>> {
        Box::pin(async move {
            let mut tx = self.begin().await?;
            let now = now_ms();
            let seq = fenced_seq(&mut tx, fence, now).await?;
            // The next index is computed inside the write transaction; the primary key (run_id, idx)
            // and the unique (run_id, position) reject any duplicate.
            let index: i64 = sqlx::query_scalar(
                "INSERT INTO stream_events (run_id, idx, position, payload, created_at)
                 SELECT ?, COALESCE(MAX(idx) + 1, 0), ?, ?, ? FROM stream_events WHERE run_id = ?
                 RETURNING idx",
            )
            .bind(fence.run_id.as_str())
            .bind(i64::from(position))
            .bind(to_json(event))
            .bind(now)
            .bind(fence.run_id.as_str())
            .fetch_one(&mut *tx)
            .await
            .map_err(db)?;
            let payload = json!({ "position": position, "index": index });
            insert_event(&mut tx, &fence.run_id, seq, EventKind::StreamEmitted, payload, now).await?;
            tx.commit().await.map_err(db)?;
            Ok(index.unsigned_abs())
        })
    }

    fn read_stream<'a>(
        &'a self,
        run_id: &'a RunId,
        from: u64,
        limit: u32,
    ) -> BoxFuture<'a, Result<Vec<(u64, Value)>, StoreError>> {
        Box::pin(async move {
            let rows = sqlx::query(
                "SELECT idx, payload FROM stream_events WHERE run_id = ? AND idx >= ? ORDER BY idx LIMIT ?",
            )
            .bind(run_id.as_str())
            .bind(i64::try_from(from).unwrap_or(i64::MAX))
            .bind(i64::from(limit))
            .fetch_all(&self.reader)
            .await
            .map_err(db)?;
            rows.iter()
                .map(|row| Ok((get::<i64>(row, "idx")?.unsigned_abs(), parse_json(&get::<String>(row, "payload")?)?)))
                .collect()
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

    #[tokio::test]
    async fn file_database_uses_wal_and_full_sync_and_migrates_once() {
        let (dir, url) = temp_url();
        let store = SqliteStore::open(&url).await.unwrap();
        let mode: String = sqlx::query_scalar("PRAGMA journal_mode").fetch_one(&store.writer).await.unwrap();
        let sync: i64 = sqlx::query_scalar("PRAGMA synchronous").fetch_one(&store.writer).await.unwrap();
        assert_eq!((mode.as_str(), sync), ("wal", 2));
        store.close().await;
        // Reopening applies nothing twice.
        let store = SqliteStore::open(&url).await.unwrap();
        let versions: Vec<i64> =
            sqlx::query_scalar("SELECT version FROM schema_migrations").fetch_all(&store.writer).await.unwrap();
        assert_eq!(versions, vec![1, 2, 3]);
        store.close().await;
        let _ = std::fs::remove_dir_all(dir);
    }

    #[tokio::test]
    async fn memory_database_works_and_keeps_its_data() {
        let store = SqliteStore::open("sqlite::memory:").await.unwrap();
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
    }

    #[tokio::test]
    async fn claims_and_step_starts_skip_the_fsync() {
        let (dir, url) = temp_url();
        let store = SqliteStore::open(&url).await.unwrap();
        let sync =
            || async { sqlx::query_scalar::<_, i64>("PRAGMA synchronous").fetch_one(&store.writer).await.unwrap() };
        let new = NewRun { workflow: "w".into(), input: json!(null), idempotency_key: None, parent_run_id: None };
        store.create_run(new).await.unwrap();
        let req = ClaimRequest { owner: "o".into(), workflows: vec!["w".into()], lease: Duration::from_secs(30) };
        let fence = store.claim(&req).await.unwrap().unwrap().fence;
        assert_eq!(store.start_step(&fence, 0, "s").await.unwrap(), 1);
        assert_eq!(sync().await, 1, "NORMAL while the start record waits for the next commit");
        let done = StepUpdate::Completed { attempt: 1, result: json!(1) };
        store.update_step(&fence, 0, done).await.unwrap();
        assert_eq!(sync().await, 2, "FULL again for every other commit");
        store.close().await;
        let _ = std::fs::remove_dir_all(dir);
    }

    #[tokio::test]
    async fn newer_schema_is_refused() {
        let (dir, url) = temp_url();
        let store = SqliteStore::open(&url).await.unwrap();
        sqlx::query("INSERT INTO schema_migrations (version, name, applied_at) VALUES (99, 'future', 0)")
            .execute(&store.writer)
            .await
            .unwrap();
        store.close().await;
        assert!(matches!(SqliteStore::open(&url).await, Err(StoreError::Corrupt(_))));
        let _ = std::fs::remove_dir_all(dir);
    }
}
