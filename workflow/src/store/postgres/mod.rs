//! The PostgreSQL backend, through sqlx: a pool of connections shared by many engines and processes.
//!
//! Every state change is one READ COMMITTED transaction. Writes of an execution first lock their
//! run's row (`SELECT ... FOR NO KEY UPDATE`) and check the lease attempt, so they serialize
//! against claims and cancellation of that run. Transactions that lock several runs take them
//! ancestors first (a parent before its children), and a run before its hooks, so they cannot
//! deadlock each other; a deadlock or serialization failure that happens anyway is retried.
//!
//! A claim is one statement: it takes `FOR NO KEY UPDATE SKIP LOCKED` the due run with the
//! smallest `ready_at` (a generated column: when a run is or becomes claimable), stamps the lease
//! and appends `run_started`; the history is read after it. No transaction stays open while a
//! workflow runs. Times are the engines' clocks (milliseconds), as on SQLite, so engines on
//! several hosts need synchronized clocks.
//!
//! Transactions that make a run runnable, suspend it or end it send a `NOTIFY` (delivered at
//! commit) on a channel; each store listens on it and bumps its [`Store::wake_signal`], so engines
//! in other processes wake at once. Step records and stream appends send none (stream readers
//! poll), which keeps notifications off the hot path.
//!
//! PostgreSQL text cannot hold the character U+0000: error messages have it replaced by U+FFFD;
//! JSON values, names and tokens that contain it are refused with [`StoreError::Database`].

use std::borrow::Cow;
use std::future::Future;
use std::str::FromStr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Value, json};
use sqlx::postgres::{PgConnectOptions, PgListener, PgPoolOptions, PgRow};
use sqlx::{Executor, PgConnection, PgPool, Postgres, QueryBuilder, Row};
use tokio::sync::{broadcast, oneshot, watch};
use tokio::task::JoinHandle;

use super::rows::{self, Columns, count_of, page, parse_json, position_of, run_info, to_json};
use super::{
    BoxFuture, ClaimRequest, ClaimedRun, CreatedRun, EmitRecord, FeedEntry, Fence, HookCreation, HookPayload,
    HookRecord, HookState, NewRun, OpRecord, RunHistory, RunOutcome, StepRecord, StepState, StepUpdate, Store,
    WaitRecord, WaitResolution, WaitState, WakeHints,
};
use crate::error::StoreError;
use crate::event::{Event, EventKind};
use crate::hook_data::{HookInfo, ResumeReceipt};
use crate::ids::RunId;
use crate::migrations::{Migration, migrate_postgres};
use crate::run::{RunFilter, RunInfo, RunPage, RunStatus};
use crate::time::{Millis, duration_ms, from_ms, now_ms, to_ms};

/// The version of the schema this build migrates a PostgreSQL database to (its last migration's).
pub const SCHEMA_VERSION: i64 = MIGRATIONS[MIGRATIONS.len() - 1].version;

/// The embedded migrations, applied in order at open.
const MIGRATIONS: &[Migration] = &[
    Migration::new(1, "init", include_str!("../../../migrations/postgres/0001_init.sql")),
    Migration::new(2, "step_functions", include_str!("../../../migrations/postgres/0002_step_functions.sql")),
    Migration::new(3, "more_functions", include_str!("../../../migrations/postgres/0003_more_functions.sql")),
    Migration::new(4, "finish_run_function", include_str!("../../../migrations/postgres/0004_finish_run_function.sql")),
    Migration::new(5, "step_failures", include_str!("../../../migrations/postgres/0005_step_failures.sql")),
    Migration::new(6, "feeds", include_str!("../../../migrations/postgres/0006_feeds.sql")),
];

/// The advisory lock that serializes migrations of all stores opening one database.
const MIGRATION_LOCK: i64 = 0x7265_7375_6d61_626c;

/// How often a transaction that hit a deadlock or a serialization failure is tried in all.
const TRANSACTION_TRIES: u32 = 5;

/// A notification is one or more entries separated by spaces (one notification per transaction).
/// This entry announces a run that may have become runnable: `work:<run id>`, or `work` alone
/// when the run is not named.
const WORK: &str = "work";
/// The entry that announces a change no worker needs to claim (a run that ended without
/// waking another, or that waits for nothing but an outside event): `changed:<run id>`, or
/// `changed` alone.
const CHANGED: &str = "changed";
/// How many named changes the listener buffers for engines that have not read them yet; an engine
/// that falls further behind wakes all its waiters instead.
const CHANGED_RUNS_BUFFER: usize = 1024;
/// The most runs one transaction announces by name; more are announced as one unnamed change.
const MAX_NAMED_CHANGES: usize = 16;

/// The longest PostgreSQL identifier (schema and channel names), in bytes.
const MAX_IDENTIFIER: usize = 63;

/// Options of [`PgStore::open_with`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PgStoreOptions {
    /// Connections of the pool (8 by default), besides the one that listens for wake-ups. The
    /// engine's workers take turns on them, so several engine processes sharing one server do
    /// best with a few each, about two to four times the server's cores in all: more backends
    /// than that only contend on the server (see the `bench_processes` example).
    pub max_connections: u32,
    /// Connections opened at once and kept open while idle (2 by default, at most
    /// `max_connections`), so that leases are renewed without waiting for a new connection.
    pub min_connections: u32,
    /// How long an operation waits for a free connection before failing (30 s by default).
    pub acquire_timeout: Duration,
    /// The schema holding the store's tables, created if missing: lowercase ASCII letters, digits
    /// and `_`, not starting with a digit, at most 63 bytes. `None` (the default) uses the
    /// connection's own `search_path` (normally `public`).
    pub schema: Option<String>,
    /// Whether to send and listen for wake-up notifications (`LISTEN`/`NOTIFY`; true by default).
    /// Turn it off behind a pooler that does not support `LISTEN`; engines then rely on polling.
    pub notifications: bool,
    /// The notification channel (`resumable_wake` by default), at most 63 bytes. Stores sharing
    /// a database but not a schema should use different channels to spare each other needless
    /// wake-ups.
    pub notify_channel: String,
}

impl Default for PgStoreOptions {
    fn default() -> PgStoreOptions {
        PgStoreOptions {
            max_connections: 8,
            min_connections: 2,
            acquire_timeout: Duration::from_secs(30),
            schema: None,
            notifications: true,
            notify_channel: "resumable_wake".to_owned(),
        }
    }
}

/// A [`Store`] on PostgreSQL. Cheap to clone; the wake-up listener stops when the last clone is
/// dropped or on [`close`](PgStore::close).
#[derive(Clone, Debug)]
pub struct PgStore {
    pool: PgPool,
    /// The notification channel, or `None` when notifications are off.
    channel: Option<Arc<str>>,
    wake: Option<watch::Receiver<WakeHints>>,
    /// Runs named by notifications, for engines to subscribe to.
    changed: Option<broadcast::Sender<RunId>>,
    listener: Arc<ListenerHandle>,
}

/// Stops the listener task when dropped (its stop channel closes).
#[derive(Debug, Default)]
struct ListenerHandle {
    stop: Mutex<Option<oneshot::Sender<()>>>,
    task: Mutex<Option<JoinHandle<()>>>,
}

/// Why a transaction failed: for good, or in a way that trying it again may fix.
#[derive(Debug)]
enum Failure {
    Store(StoreError),
    /// A deadlock or serialization failure: the transaction was rolled back and may be retried.
    Transient(StoreError),
}

impl From<StoreError> for Failure {
    fn from(e: StoreError) -> Failure {
        Failure::Store(e)
    }
}

impl From<sqlx::Error> for Failure {
    fn from(e: sqlx::Error) -> Failure {
        let transient = match &e {
            // deadlock_detected, serialization_failure
            sqlx::Error::Database(d) => matches!(d.code().as_deref(), Some("40P01" | "40001")),
            _ => false,
        };
        if transient { Failure::Transient(db(e)) } else { Failure::Store(db(e)) }
    }
}

impl From<Failure> for StoreError {
    fn from(f: Failure) -> StoreError {
        match f {
            Failure::Store(e) => e,
            Failure::Transient(e) => e,
        }
    }
}

/// The result of one transaction attempt.
type Tx<T> = Result<T, Failure>;

fn db(e: sqlx::Error) -> StoreError {
    StoreError::driver(e)
}

/// Runs `attempt` until it succeeds, fails for good, or has hit a deadlock [`TRANSACTION_TRIES`] times.
async fn retrying<T, F, Fut>(mut attempt: F) -> Result<T, StoreError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Tx<T>>,
{
    let mut tries = 1;
    loop {
        match attempt().await {
            Err(Failure::Transient(_)) if tries < TRANSACTION_TRIES => {
                tokio::time::sleep(Duration::from_millis(u64::from(tries) * 5)).await;
                tries += 1;
            }
            other => return other.map_err(StoreError::from),
        }
    }
}

/// A message as PostgreSQL text can store it: U+0000 becomes U+FFFD.
fn message(s: &str) -> Cow<'_, str> {
    if s.contains('\0') { Cow::Owned(s.replace('\0', "\u{FFFD}")) } else { Cow::Borrowed(s) }
}

fn get<'r, T: sqlx::Decode<'r, Postgres> + sqlx::Type<Postgres>>(row: &'r PgRow, col: &str) -> Result<T, StoreError> {
    row.try_get(col).map_err(db)
}

/// Checks that a schema or channel name is a plain identifier that needs no quoting.
fn check_identifier(what: &str, name: &str) -> Result<(), StoreError> {
    let plain = !name.is_empty()
        && name.len() <= MAX_IDENTIFIER
        && !name.starts_with(|c: char| c.is_ascii_digit())
        && name.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
    if plain {
        Ok(())
    } else {
        Err(StoreError::database(format!(
            "invalid {what} name {name:?}: use lowercase ASCII letters, digits and '_', at most {MAX_IDENTIFIER} bytes"
        )))
    }
}

impl PgStore {
    /// Connects to the database at `url` (`postgres://user:password@host:port/database`) with
    /// default options and migrates it.
    pub async fn open(url: &str) -> Result<PgStore, StoreError> {
        PgStore::open_with(url, PgStoreOptions::default()).await
    }

    /// Connects to the database at `url`, applies the pending migrations and, unless
    /// notifications are off, starts listening for wake-ups.
    pub async fn open_with(url: &str, options: PgStoreOptions) -> Result<PgStore, StoreError> {
        let mut connect = PgConnectOptions::from_str(url).map_err(db)?;
        if let Some(schema) = &options.schema {
            check_identifier("schema", schema)?;
            connect = connect.options([("search_path", schema.as_str())]);
        }
        let notifications = options.notifications;
        if notifications && options.notify_channel.len() > MAX_IDENTIFIER {
            return Err(StoreError::database(format!(
                "notification channel name is longer than {MAX_IDENTIFIER} bytes"
            )));
        }
        let max_connections = options.max_connections.max(1);
        let pool = PgPoolOptions::new()
            // No ping per checkout: a broken connection fails its statement, which is retried.
            .test_before_acquire(false)
            .max_connections(max_connections)
            .min_connections(options.min_connections.min(max_connections))
            .acquire_timeout(options.acquire_timeout)
            .connect_with(connect.clone())
            .await
            .map_err(db)?;
        migrate(&pool, options.schema.as_deref()).await?;
        let mut store = PgStore { pool, channel: None, wake: None, changed: None, listener: Arc::default() };
        if notifications {
            let channel = options.notify_channel.clone();
            // A pool of one connection that the listener (re)connects through.
            let listen_pool = PgPoolOptions::new()
                .max_connections(1)
                .acquire_timeout(Duration::from_secs(5))
                .idle_timeout(None)
                .max_lifetime(None)
                .connect_with(connect)
                .await
                .map_err(db)?;
            // Listening before `open` returns: no notification sent after it is missed.
            let listener = listen(&listen_pool, &channel).await.map_err(db)?;
            let (bump, wake) = watch::channel(WakeHints::default());
            let (changed, _) = broadcast::channel(CHANGED_RUNS_BUFFER);
            let (stop, stopped) = oneshot::channel();
            let announced = Announced { hints: bump, runs: changed.clone() };
            let task = tokio::spawn(listen_loop(listen_pool, channel.clone(), listener, announced, stopped));
            store.channel = Some(Arc::from(channel));
            store.wake = Some(wake);
            store.changed = Some(changed);
            store.listener = Arc::new(ListenerHandle { stop: Mutex::new(Some(stop)), task: Mutex::new(Some(task)) });
        }
        Ok(store)
    }

    /// Stops the wake-up listener and closes the connections; pending operations finish first.
    pub async fn close(&self) {
        let stop = self.listener.stop.lock().unwrap_or_else(|p| p.into_inner()).take();
        drop(stop);
        let task = self.listener.task.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(task) = task {
            let _ = task.await;
        }
        self.pool.close().await;
    }

    async fn begin(&self) -> Result<sqlx::Transaction<'static, Postgres>, Failure> {
        Ok(self.pool.begin().await?)
    }

    /// Queues the transaction's one notification, delivered at commit: its entries, each a kind
    /// ([`WORK`] or [`CHANGED`]) about a run or about no run in particular, separated by spaces.
    async fn announce(&self, conn: &mut PgConnection, entries: &[(&str, Option<&str>)]) -> Tx<()> {
        if let Some(channel) = &self.channel {
            let payload: Vec<String> = entries
                .iter()
                .map(|(kind, run)| match run {
                    Some(run) => format!("{kind}:{run}"),
                    None => (*kind).to_owned(),
                })
                .collect();
            sqlx::query("SELECT pg_notify($1, $2)").bind(&**channel).bind(payload.join(" ")).execute(conn).await?;
        }
        Ok(())
    }
}

/// A listener connected through `pool` and listening on `channel`.
fn listen<'a>(pool: &'a PgPool, channel: &'a str) -> BoxFuture<'a, Result<PgListener, sqlx::Error>> {
    Box::pin(async move {
        let mut listener = PgListener::connect_with(pool).await?;
        listener.listen(channel).await?;
        Ok(listener)
    })
}

/// Bumps the counters of `bump` on every notification until `stop` fires or is dropped: a
/// [`CHANGED`] notification counts as a change, any other as work. A lost connection is
/// re-established (with backoff) and followed by one bump of both: notifications may have been
/// missed.
/// Where the listener passes on what it heard.
struct Announced {
    hints: watch::Sender<WakeHints>,
    runs: broadcast::Sender<RunId>,
}

impl Announced {
    /// Passes on a group of notifications received together: the counters first, then the named
    /// runs (so whoever hears of a run also sees what the group did to the counters).
    fn tell<'a>(&self, payloads: impl IntoIterator<Item = &'a str>) {
        let (mut work, mut unnamed, mut named) = (false, false, Vec::new());
        for payload in payloads.into_iter().flat_map(str::split_whitespace) {
            let (kind, run) = match payload.split_once(':') {
                Some((kind, run)) => (kind, Some(run)),
                None => (payload, None),
            };
            work |= kind != CHANGED;
            match run {
                Some(run) => named.push(RunId::from(run)),
                None => unnamed = true,
            }
        }
        self.bump(work, unnamed);
        for run in named {
            // No engine listening is fine: nobody waits then.
            let _ = self.runs.send(run);
        }
    }

    /// Everything may have changed (the connection was lost meanwhile).
    fn anything(&self) {
        self.bump(true, true);
    }

    fn bump(&self, work: bool, unnamed: bool) {
        if !work && !unnamed {
            return;
        }
        self.hints.send_modify(|h| {
            if unnamed {
                h.changes = h.changes.wrapping_add(1);
            }
            if work {
                h.work = h.work.wrapping_add(1);
            }
        });
    }
}

async fn listen_loop(
    pool: PgPool,
    channel: String,
    listener: PgListener,
    announced: Announced,
    mut stop: oneshot::Receiver<()>,
) {
    let signal = || announced.anything();
    let mut listener = Some(listener);
    let mut delay = Duration::from_millis(50);
    'run: loop {
        let Some(current) = listener.as_mut() else {
            tokio::select! {
                _ = &mut stop => break 'run,
                _ = tokio::time::sleep(delay) => {}
            }
            let connected = tokio::select! {
                _ = &mut stop => break 'run,
                connected = listen(&pool, &channel) => connected,
            };
            match connected {
                Ok(l) => {
                    listener = Some(l);
                    delay = Duration::from_millis(50);
                    signal();
                }
                Err(_) => delay = (delay * 2).min(Duration::from_secs(5)),
            }
            continue;
        };
        tokio::select! {
            _ = &mut stop => break 'run,
            received = current.try_recv() => match received {
                Ok(Some(first)) => {
                    let mut group = vec![first];
                    while let Some(next) = current.next_buffered() {
                        group.push(next);
                    }
                    announced.tell(group.iter().map(|n| n.payload()));
                }
                // The connection was lost and re-established.
                Ok(None) => signal(),
                Err(_) => listener = None,
            },
        }
    }
    drop(listener);
    pool.close().await;
}

/// Applies the embedded migrations that the database has not seen, in one transaction, under an
/// advisory lock so that processes opening a new database together do not race.
// Boxed so that the future is `Send` for every lifetime (sqlx executors otherwise defeat inference).
fn migrate<'a>(pool: &'a PgPool, schema: Option<&'a str>) -> BoxFuture<'a, Result<(), StoreError>> {
    Box::pin(migrate_inner(pool, schema))
}

async fn migrate_inner(pool: &PgPool, schema: Option<&str>) -> Result<(), StoreError> {
    let mut tx = pool.begin().await.map_err(db)?;
    sqlx::query("SELECT pg_advisory_xact_lock($1)").bind(MIGRATION_LOCK).execute(&mut *tx).await.map_err(db)?;
    if let Some(schema) = schema {
        // `schema` is a checked identifier.
        let sql = format!("CREATE SCHEMA IF NOT EXISTS {schema}; SET LOCAL search_path TO {schema}");
        Executor::execute(&mut *tx, sql.as_str()).await.map_err(db)?;
    }
    migrate_postgres(&mut tx, "schema_migrations", MIGRATIONS).await?;
    tx.commit().await.map_err(db)
}

/// Locks the run's row until the transaction ends; fails with `LeaseLost` unless the run is
/// running under this lease (attempt and token), through the same server-side check as the functions.
async fn check_fence(conn: &mut PgConnection, fence: &Fence) -> Tx<()> {
    sqlx::query("SELECT resumable_fence($1, $2)")
        .bind(fence.run_id.as_str())
        .bind(lease_key(fence))
        .execute(conn)
        .await
        .map_err(|e| fenced(e, fence))?;
    Ok(())
}

/// The lease key the server-side functions fence with: the claim's token in the high 32 bits and
/// its lease attempt in the low 32.
fn lease_key(fence: &Fence) -> i64 {
    (i64::from(fence.token) << 32) | i64::from(fence.attempt)
}

/// The failure of a server-side function that checks the fence: its SQLSTATEs `RS001` (lease
/// lost) and `RS002` (a history that does not allow the change) become store errors.
fn fenced(e: sqlx::Error, fence: &Fence) -> Failure {
    if let sqlx::Error::Database(d) = &e {
        match d.code().as_deref() {
            Some("RS001") => return StoreError::LeaseLost { run_id: fence.run_id.clone() }.into(),
            Some("RS002") => return StoreError::Corrupt(d.message().to_owned()).into(),
            _ => {}
        }
    }
    e.into()
}

/// Locks a run's row `FOR UPDATE` until the transaction ends (which also makes the insert of a
/// child of the run wait for its foreign key check, so that a cancellation sees every child) and
/// returns its status, if it exists.
async fn lock_run(conn: &mut PgConnection, id: &str) -> Tx<Option<RunStatus>> {
    let status: Option<String> =
        sqlx::query_scalar("SELECT status FROM runs WHERE id = $1 FOR UPDATE").bind(id).fetch_optional(conn).await?;
    Ok(status.map(|s| RunStatus::from_str(&s).map_err(StoreError::from)).transpose()?)
}

/// Locks the parent's row, if the run has a parent, and returns the parent's id. Taken before the
/// run's own row: rows are locked ancestors first.
async fn lock_parent(conn: &mut PgConnection, run_id: &RunId) -> Tx<Option<String>> {
    let parent: Option<String> = sqlx::query_scalar(
        "SELECT p.id FROM runs c JOIN runs p ON p.id = c.parent_run_id WHERE c.id = $1 FOR NO KEY UPDATE OF p",
    )
    .bind(run_id.as_str())
    .fetch_optional(conn)
    .await?;
    Ok(parent)
}

/// Appends one event to the run's log under the next sequence number, and returns that number.
async fn append(conn: &mut PgConnection, run_id: &RunId, kind: EventKind, payload: Value, now: Millis) -> Tx<i64> {
    let seq: i64 = sqlx::query_scalar("SELECT resumable_append($1, $2, $3::jsonb, $4)")
        .bind(run_id.as_str())
        .bind(kind.as_str())
        .bind(to_json(&payload))
        .bind(now)
        .fetch_one(conn)
        .await?;
    Ok(seq)
}

/// Disposes the run's active hooks and cancels its pending timers (part of ending a run).
async fn release_resources(conn: &mut PgConnection, run_id: &RunId, now: Millis) -> Tx<()> {
    let mut positions: Vec<i64> = sqlx::query_scalar(
        "UPDATE hooks SET active = FALSE, disposed_at = $1 WHERE run_id = $2 AND active RETURNING position",
    )
    .bind(now)
    .bind(run_id.as_str())
    .fetch_all(&mut *conn)
    .await?;
    positions.sort_unstable();
    for position in positions {
        append(conn, run_id, EventKind::HookDisposed, json!({ "position": position }), now).await?;
    }
    sqlx::query("UPDATE waits SET status = 'cancelled' WHERE run_id = $1 AND status = 'pending'")
        .bind(run_id.as_str())
        .execute(conn)
        .await?;
    Ok(())
}

/// Makes a run that has not ended runnable again: a waiting run becomes pending, a running one
/// remembers the request so that its suspension is not final. The caller holds the row's lock.
async fn wake_run(conn: &mut PgConnection, run_id: &str, now: Millis) -> Tx<()> {
    sqlx::query("SELECT resumable_wake_run($1, $2)").bind(run_id).bind(now).execute(conn).await?;
    Ok(())
}

/// Cancels one run whose row the transaction has locked: resources released, lease voided, event
/// appended.
async fn cancel_locked(conn: &mut PgConnection, id: &RunId, reason: &str, now: Millis) -> Tx<()> {
    release_resources(conn, id, now).await?;
    sqlx::query(
        "UPDATE runs SET status = 'cancelled', error = $1, completed_at = $2, wake_at = NULL,
             lease_owner = NULL, lease_expires_at = NULL
         WHERE id = $3",
    )
    .bind(reason)
    .bind(now)
    .bind(id.as_str())
    .execute(&mut *conn)
    .await?;
    append(conn, id, EventKind::RunCancelled, json!({ "reason": reason }), now).await?;
    Ok(())
}

const RUN_COLUMNS: &str = "id, workflow, input::text AS input, status, output::text AS output, error, \
                           idempotency_key, parent_run_id, lease_attempt, created_at, updated_at, started_at, \
                           completed_at";

fn run_from_row(row: &PgRow) -> Result<RunInfo, StoreError> {
    run_info(row)
}

impl Columns for PgRow {
    fn text(&self, column: &str) -> Result<String, StoreError> {
        self.try_get(column).map_err(db)
    }

    fn optional_text(&self, column: &str) -> Result<Option<String>, StoreError> {
        self.try_get(column).map_err(db)
    }

    fn int(&self, column: &str) -> Result<i64, StoreError> {
        self.try_get(column).map_err(db)
    }

    fn optional_int(&self, column: &str) -> Result<Option<i64>, StoreError> {
        self.try_get(column).map_err(db)
    }
}

/// Loads everything earlier executions of a run recorded, in one statement (one snapshot):
/// rows of steps (op 0), hooks (1), hook payloads (2), timers (3) and stream emits (4).
async fn load_history(conn: &mut PgConnection, run_id: &RunId) -> Tx<RunHistory> {
    let rows = sqlx::query(
        "SELECT 0 AS op, position, attempts AS n, failures AS m, retry_at AS at, name, status,
                result::text AS json, error AS other
             FROM steps WHERE run_id = $1
         UNION ALL
         SELECT 1, position, received, NULL, NULL, token, CASE WHEN active THEN 'active' END, metadata::text,
                conflict_run_id
             FROM hooks WHERE run_id = $1
         UNION ALL
         SELECT 2, position, seq, NULL, received_at, NULL, NULL, payload::text, NULL
             FROM hook_payloads WHERE run_id = $1
         UNION ALL
         SELECT 3, position, NULL, NULL, due_at, NULL, status, NULL, NULL FROM waits WHERE run_id = $1
         UNION ALL
         SELECT 4, position, idx, NULL, NULL, NULL, NULL, NULL, NULL FROM stream_events WHERE run_id = $1
         ORDER BY op, position, n",
    )
    .bind(run_id.as_str())
    .fetch_all(conn)
    .await?;
    let mut history = RunHistory::default();
    for row in &rows {
        let position = position_of(row)?;
        let status: Option<String> = get(row, "status")?;
        let json: Option<String> = get(row, "json")?;
        let other: Option<String> = get(row, "other")?;
        let n: Option<i64> = get(row, "n")?;
        let at: Option<i64> = get(row, "at")?;
        let op = match get::<i32>(row, "op")? {
            0 => {
                let state = match status.as_deref().unwrap_or_default() {
                    "running" => StepState::Running,
                    "retrying" => StepState::Retrying { retry_at: at.unwrap_or(0), error: other.unwrap_or_default() },
                    "completed" => StepState::Completed(parse_json(json.as_deref().unwrap_or_default())?),
                    "failed" => StepState::Failed(other.unwrap_or_default()),
                    s => return Err(StoreError::Corrupt(format!("unknown step status {s:?}")).into()),
                };
                let name = get::<Option<String>>(row, "name")?.unwrap_or_default();
                let failures = count_of(get::<Option<i64>>(row, "m")?.unwrap_or(0));
                OpRecord::Step(StepRecord { name, attempts: count_of(n.unwrap_or(0)), failures, state })
            }
            1 => {
                let state = match (status, other) {
                    (Some(_), _) => HookState::Active,
                    (None, Some(owner)) => HookState::Conflict { owner_run_id: RunId::from(owner) },
                    (None, None) => HookState::Disposed,
                };
                OpRecord::Hook(HookRecord {
                    token: get::<Option<String>>(row, "name")?.unwrap_or_default(),
                    metadata: parse_json(json.as_deref().unwrap_or_default())?,
                    state,
                    payloads: Vec::new(),
                })
            }
            // Payloads come after their hooks, in order.
            2 => {
                if let Some(OpRecord::Hook(h)) = history.ops.get_mut(&position) {
                    let value = parse_json(json.as_deref().unwrap_or_default())?;
                    h.payloads.push(HookPayload { value, received_at: at.unwrap_or(0) });
                }
                continue;
            }
            3 => {
                let state = match status.as_deref().unwrap_or_default() {
                    "pending" => WaitState::Pending,
                    "fired" => WaitState::Fired,
                    "cancelled" => WaitState::Cancelled,
                    s => return Err(StoreError::Corrupt(format!("unknown wait status {s:?}")).into()),
                };
                OpRecord::Wait(WaitRecord { due_at: at.unwrap_or(0), state })
            }
            _ => OpRecord::Emit(EmitRecord { index: n.unwrap_or(0).unsigned_abs() }),
        };
        history.ops.insert(position, op);
    }
    Ok(history)
}

mod transactions;

#[cfg(test)]
mod tests;
