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

use super::{
    BoxFuture, ClaimRequest, ClaimedRun, CreatedRun, EmitRecord, Fence, HookCreation, HookPayload, HookRecord,
    HookState, NewRun, OpRecord, RunHistory, RunOutcome, StepRecord, StepState, StepUpdate, Store, WaitRecord,
    WaitResolution, WaitState, WakeHints,
};
use crate::error::StoreError;
use crate::event::{Event, EventKind};
use crate::hook_data::{HookInfo, ResumeReceipt};
use crate::ids::RunId;
use crate::migrations::{Migration, migrate_postgres};
use crate::run::{RunCursor, RunFilter, RunInfo, RunPage, RunStatus};
use crate::time::{Millis, duration_ms, from_ms, now_ms, to_ms};

/// The embedded migrations, applied in order at open: (version, name, SQL).
const MIGRATIONS: &[Migration] = &[
    Migration::new(1, "init", include_str!("../../migrations/postgres/0001_init.sql")),
    Migration::new(2, "step_functions", include_str!("../../migrations/postgres/0002_step_functions.sql")),
    Migration::new(3, "more_functions", include_str!("../../migrations/postgres/0003_more_functions.sql")),
    Migration::new(4, "finish_run_function", include_str!("../../migrations/postgres/0004_finish_run_function.sql")),
    Migration::new(5, "step_failures", include_str!("../../migrations/postgres/0005_step_failures.sql")),
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
    Transient(String),
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
        if transient { Failure::Transient(e.to_string()) } else { Failure::Store(db(e)) }
    }
}

impl From<Failure> for StoreError {
    fn from(f: Failure) -> StoreError {
        match f {
            Failure::Store(e) => e,
            Failure::Transient(m) => StoreError::Database(m),
        }
    }
}

/// The result of one transaction attempt.
type Tx<T> = Result<T, Failure>;

fn db(e: sqlx::Error) -> StoreError {
    StoreError::Database(e.to_string())
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

fn to_json(v: &Value) -> String {
    // Serializing a `Value` cannot fail.
    serde_json::to_string(v).unwrap_or_else(|_| "null".to_owned())
}

fn parse_json(s: &str) -> Result<Value, StoreError> {
    serde_json::from_str(s).map_err(|e| StoreError::Corrupt(format!("invalid JSON in database: {e}")))
}

/// A message as PostgreSQL text can store it: U+0000 becomes U+FFFD.
fn message(s: &str) -> Cow<'_, str> {
    if s.contains('\0') { Cow::Owned(s.replace('\0', "\u{FFFD}")) } else { Cow::Borrowed(s) }
}

fn get<'r, T: sqlx::Decode<'r, Postgres> + sqlx::Type<Postgres>>(row: &'r PgRow, col: &str) -> Result<T, StoreError> {
    row.try_get(col).map_err(db)
}

fn position_of(row: &PgRow) -> Result<u32, StoreError> {
    let p: i64 = get(row, "position")?;
    u32::try_from(p).map_err(|_| StoreError::Corrupt(format!("invalid position {p}")))
}

fn count_of(v: i64) -> u32 {
    u32::try_from(v).unwrap_or(u32::MAX)
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
        Err(StoreError::Database(format!(
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
            return Err(StoreError::Database(format!(
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

/// The transactions behind the [`Store`] methods, one attempt each.
impl PgStore {
    async fn create_run_tx(&self, run: &NewRun) -> Tx<CreatedRun> {
        let id = RunId::generate();
        let mut tx = self.begin().await?;
        let now = now_ms();
        if let Some(parent) = &run.parent_run_id {
            // A child of a run that has ended would run orphaned; the lock orders this against a cancel.
            let status: Option<String> = sqlx::query_scalar("SELECT status FROM runs WHERE id = $1 FOR SHARE")
                .bind(parent.as_str())
                .fetch_optional(&mut *tx)
                .await?;
            if !matches!(status.as_deref(), Some("pending" | "running" | "waiting")) {
                return Err(Failure::Store(StoreError::LeaseLost { run_id: parent.clone() }));
            }
        }
        let inserted = sqlx::query(
            "INSERT INTO runs (id, workflow, input, status, idempotency_key, parent_run_id, created_at, updated_at)
             VALUES ($1, $2, $3::jsonb, 'pending', $4, $5, $6, $6) ON CONFLICT (idempotency_key) DO NOTHING",
        )
        .bind(id.as_str())
        .bind(&run.workflow)
        .bind(to_json(&run.input))
        .bind(run.idempotency_key.as_deref())
        .bind(run.parent_run_id.as_ref().map(RunId::as_str))
        .bind(now)
        .execute(&mut *tx)
        .await?;
        if inserted.rows_affected() == 0 {
            // The unique constraint decided (after waiting for a concurrent inserter to commit);
            // this statement's snapshot sees the committed run.
            let existing: Option<String> = sqlx::query_scalar("SELECT id FROM runs WHERE idempotency_key = $1")
                .bind(run.idempotency_key.as_deref())
                .fetch_optional(&mut *tx)
                .await?;
            let existing = existing.ok_or_else(|| Failure::Transient("idempotency key owner vanished".into()))?;
            tx.commit().await?;
            return Ok(CreatedRun { run_id: RunId::from(existing), created: false });
        }
        let payload = run.created_event();
        append(&mut tx, &id, EventKind::RunCreated, payload, now).await?;
        self.announce(&mut tx, &[(WORK, Some(id.as_str()))]).await?;
        tx.commit().await?;
        Ok(CreatedRun { run_id: id, created: true })
    }

    async fn claim_tx(&self, req: &ClaimRequest) -> Tx<Option<ClaimedRun>> {
        let mut conn = self.pool.acquire().await?;
        // Read once connected, so waiting for a connection never shortens the lease.
        let now = now_ms();
        // One statement, so one short transaction: pick the due run (skipping runs that another
        // transaction holds: being claimed, or written by their execution), stamp the lease with a
        // fresh token and append `run_started`. Its commit does not wait for the WAL flush: a claim
        // lost in a crash of the server leaves the old lease to expire, its worker (if it lives on)
        // is fenced out by the token, and WAL order keeps the claim ahead of the execution's writes.
        let token = crate::ids::random_u31();
        let row = sqlx::query(
            "WITH relaxed AS (SELECT set_config('synchronous_commit', 'off', true)), due AS (
                 SELECT id FROM runs WHERE ready_at <= $1 AND workflow = ANY($2)
                   -- An engine never takes over its own leases (it is alive; a restart has a new name).
                   AND NOT (status = 'running' AND lease_owner = $3)
                 ORDER BY ready_at LIMIT 1 FOR NO KEY UPDATE SKIP LOCKED
             ), claimed AS (
                 UPDATE runs SET status = 'running', lease_owner = $3, lease_expires_at = $4,
                     lease_attempt = lease_attempt + 1, lease_token = $6, wake_at = NULL, wake_requested = FALSE,
                     started_at = COALESCE(started_at, $1), last_seq = last_seq + 1, updated_at = $1
                 FROM due WHERE runs.id = due.id
                 RETURNING runs.id, runs.workflow, runs.input, runs.lease_attempt, runs.last_seq
             ), started AS (
                 INSERT INTO events (run_id, seq, kind, payload, created_at)
                 SELECT id, last_seq, $5, jsonb_build_object('owner', $3::text, 'attempt', lease_attempt), $1
                 FROM claimed
             )
             SELECT id, workflow, input::text AS input, lease_attempt FROM claimed, relaxed",
        )
        .bind(now)
        .bind(&req.workflows)
        .bind(&req.owner)
        .bind(now.saturating_add(duration_ms(req.lease)))
        .bind(EventKind::RunStarted.as_str())
        .bind(i64::from(token))
        .fetch_optional(&mut *conn)
        .await?;
        let Some(row) = row else {
            return Ok(None);
        };
        let run_id = RunId::from(get::<String>(&row, "id")?);
        let attempt = count_of(get(&row, "lease_attempt")?);
        let workflow: String = get(&row, "workflow")?;
        let input = parse_json(&get::<String>(&row, "input")?)?;
        // Read after the claim committed: only this execution writes the run's records from now on
        // (others are fenced out), except hook payloads, whose late arrival wakes the run again.
        let history = load_history(&mut conn, &run_id).await?;
        Ok(Some(ClaimedRun { fence: Fence { run_id, attempt, token }, workflow, input, history }))
    }

    async fn start_step_tx(&self, fence: &Fence, position: u32, name: &str) -> Tx<u32> {
        let attempt: i64 = sqlx::query_scalar("SELECT resumable_start_step($1, $2, $3, $4, $5, $6)")
            .bind(fence.run_id.as_str())
            .bind(lease_key(fence))
            .bind(i64::from(position))
            .bind(name)
            .bind(EventKind::StepStarted.as_str())
            .bind(now_ms())
            .fetch_one(&self.pool)
            .await
            .map_err(|e| fenced(e, fence))?;
        Ok(count_of(attempt))
    }

    async fn update_step_tx(&self, fence: &Fence, position: u32, update: &StepUpdate) -> Tx<()> {
        let (status, attempt, result, error, retry_at, kind, payload) = match update {
            StepUpdate::Completed { attempt, result } => {
                let payload = json!({ "position": position, "attempt": attempt, "result": result });
                ("completed", *attempt, Some(to_json(result)), None, None, EventKind::StepCompleted, payload)
            }
            StepUpdate::Failed { attempt, error } => {
                let error = message(error);
                let payload = json!({ "position": position, "attempt": attempt, "error": error });
                ("failed", *attempt, None, Some(error), None, EventKind::StepFailed, payload)
            }
            StepUpdate::Retrying { attempt, error, retry_at } => {
                let error = message(error);
                let payload = json!({ "position": position, "attempt": attempt, "error": error, "retry_at": retry_at });
                ("retrying", *attempt, None, Some(error), Some(*retry_at), EventKind::StepRetrying, payload)
            }
        };
        sqlx::query("SELECT resumable_update_step($1, $2, $3, $4, $5, $6::jsonb, $7, $8, $9, $10::jsonb, $11)")
            .bind(fence.run_id.as_str())
            .bind(lease_key(fence))
            .bind(i64::from(position))
            .bind(i64::from(attempt))
            .bind(status)
            .bind(result)
            .bind(error.as_deref())
            .bind(retry_at)
            .bind(kind.as_str())
            .bind(to_json(&payload))
            .bind(now_ms())
            .execute(&self.pool)
            .await
            .map_err(|e| fenced(e, fence))?;
        Ok(())
    }

    async fn create_hook_tx(&self, fence: &Fence, position: u32, token: &str, metadata: &Value) -> Tx<HookCreation> {
        let now = now_ms();
        let mut tx = self.begin().await?;
        check_fence(&mut tx, fence).await?;
        // The partial unique index on active tokens decides. A concurrent insert of the same token
        // makes this one wait for that transaction's end; then the conflict (or not) is final.
        let inserted = sqlx::query(
            "INSERT INTO hooks (run_id, position, token, metadata, active, created_at)
             VALUES ($1, $2, $3, $4::jsonb, TRUE, $5)
             ON CONFLICT (token) WHERE active DO NOTHING",
        )
        .bind(fence.run_id.as_str())
        .bind(i64::from(position))
        .bind(token)
        .bind(to_json(metadata))
        .bind(now)
        .execute(&mut *tx)
        .await?;
        let creation = if inserted.rows_affected() == 1 {
            let payload = json!({ "position": position, "metadata": metadata });
            append(&mut tx, &fence.run_id, EventKind::HookCreated, payload, now).await?;
            HookCreation::Created
        } else {
            // A new statement, a new snapshot: it sees the owner's committed hook, unless the owner
            // ended in between (then the whole transaction is tried again).
            let owner: Option<String> = sqlx::query_scalar("SELECT run_id FROM hooks WHERE token = $1 AND active")
                .bind(token)
                .fetch_optional(&mut *tx)
                .await?;
            let owner = owner.ok_or_else(|| Failure::Transient("hook token owner vanished".into()))?;
            sqlx::query(
                "INSERT INTO hooks (run_id, position, token, metadata, active, conflict_run_id, created_at)
                 VALUES ($1, $2, $3, $4::jsonb, FALSE, $5, $6)",
            )
            .bind(fence.run_id.as_str())
            .bind(i64::from(position))
            .bind(token)
            .bind(to_json(metadata))
            .bind(&owner)
            .bind(now)
            .execute(&mut *tx)
            .await?;
            let payload = json!({ "position": position, "owner_run_id": owner });
            append(&mut tx, &fence.run_id, EventKind::HookConflict, payload, now).await?;
            HookCreation::Conflict { owner_run_id: RunId::from(owner) }
        };
        tx.commit().await?;
        Ok(creation)
    }

    async fn create_wait_tx(&self, fence: &Fence, position: u32, due_at: Millis) -> Tx<()> {
        let now = now_ms();
        let mut tx = self.begin().await?;
        check_fence(&mut tx, fence).await?;
        sqlx::query(
            "INSERT INTO waits (run_id, position, due_at, status, created_at) VALUES ($1, $2, $3, 'pending', $4)",
        )
        .bind(fence.run_id.as_str())
        .bind(i64::from(position))
        .bind(due_at)
        .bind(now)
        .execute(&mut *tx)
        .await?;
        let payload = json!({ "position": position, "due_at": due_at });
        append(&mut tx, &fence.run_id, EventKind::WaitCreated, payload, now).await?;
        tx.commit().await?;
        Ok(())
    }

    async fn resolve_wait_tx(&self, fence: &Fence, position: u32, resolution: WaitResolution) -> Tx<()> {
        let now = now_ms();
        let mut tx = self.begin().await?;
        check_fence(&mut tx, fence).await?;
        let (status, fired) = match resolution {
            WaitResolution::Fired => ("fired", true),
            WaitResolution::Cancelled => ("cancelled", false),
        };
        let done = sqlx::query(
            "UPDATE waits SET status = $1, fired_at = $2
             WHERE run_id = $3 AND position = $4 AND status = 'pending'",
        )
        .bind(status)
        .bind(fired.then_some(now))
        .bind(fence.run_id.as_str())
        .bind(i64::from(position))
        .execute(&mut *tx)
        .await?;
        if done.rows_affected() == 1 {
            let payload = json!({ "position": position, "fired": fired });
            append(&mut tx, &fence.run_id, EventKind::WaitCompleted, payload, now).await?;
        }
        tx.commit().await?;
        Ok(())
    }

    async fn record_step_tx(&self, fence: &Fence, position: u32, name: &str, result: &Value) -> Tx<()> {
        let payload = json!({ "position": position, "name": name, "attempt": 1, "result": result });
        sqlx::query("SELECT resumable_record_step($1, $2, $3, $4, $5::jsonb, $6, $7::jsonb, $8)")
            .bind(fence.run_id.as_str())
            .bind(lease_key(fence))
            .bind(i64::from(position))
            .bind(name)
            .bind(to_json(result))
            .bind(EventKind::StepCompleted.as_str())
            .bind(to_json(&payload))
            .bind(now_ms())
            .execute(&self.pool)
            .await
            .map_err(|e| fenced(e, fence))?;
        Ok(())
    }

    async fn suspend_run_tx(&self, fence: &Fence, wake_at: Option<Millis>) -> Tx<RunStatus> {
        // The function's own notification (it names no run) is off; this statement sends one that does.
        let status: String = sqlx::query_scalar(
            "SELECT s.status, CASE WHEN $5::text IS NOT NULL THEN pg_notify($5,
                 CASE WHEN s.status = 'pending' OR $3::bigint IS NOT NULL THEN 'work:' ELSE 'changed:' END || $1) END
             FROM resumable_suspend_run($1, $2, $3, $4, NULL, $6) AS s(status)",
        )
        .bind(fence.run_id.as_str())
        .bind(lease_key(fence))
        .bind(wake_at)
        .bind(EventKind::RunSuspended.as_str())
        .bind(self.channel.as_deref())
        .bind(now_ms())
        .fetch_one(&self.pool)
        .await
        .map_err(|e| fenced(e, fence))?;
        Ok(RunStatus::from_str(&status).map_err(StoreError::from)?)
    }

    async fn finish_run_tx(&self, fence: &Fence, outcome: &RunOutcome) -> Tx<()> {
        let (status, output, error, kind, payload) = match outcome {
            RunOutcome::Completed(v) => {
                ("completed", Some(to_json(v)), None, EventKind::RunCompleted, json!({ "output": v }))
            }
            RunOutcome::Failed(e) => {
                let e = message(e);
                let payload = json!({ "error": e });
                ("failed", None, Some(e), EventKind::RunFailed, payload)
            }
        };
        // One notification: the woken parent is work, and the run changed.
        sqlx::query(
            "SELECT CASE WHEN $10::text IS NOT NULL THEN
                 pg_notify($10, COALESCE('work:' || f.parent || ' ', '') || 'changed:' || $1) END
             FROM resumable_finish_run($1, $2, $3, $4::jsonb, $5, $6, $7::jsonb, $8, $9) AS f(parent)",
        )
        .bind(fence.run_id.as_str())
        .bind(lease_key(fence))
        .bind(status)
        .bind(output)
        .bind(error.as_deref())
        .bind(kind.as_str())
        .bind(to_json(&payload))
        .bind(EventKind::HookDisposed.as_str())
        .bind(now_ms())
        .bind(self.channel.as_deref())
        .execute(&self.pool)
        .await
        .map_err(|e| fenced(e, fence))?;
        Ok(())
    }

    async fn cancel_run_tx(&self, id: &RunId, reason: &str) -> Tx<RunStatus> {
        let now = now_ms();
        let mut tx = self.begin().await?;
        let parent = lock_parent(&mut tx, id).await?;
        let Some(status) = lock_run(&mut tx, id.as_str()).await? else {
            return Err(StoreError::RunNotFound(id.clone()).into());
        };
        if status.is_terminal() {
            return Ok(status);
        }
        let reason = message(reason);
        cancel_locked(&mut tx, id, &reason, now).await?;
        // Descendants that have not ended go with it, parents before children (the lock order).
        // The run's row is locked `FOR UPDATE`, so no child of it can be inserted meanwhile.
        let descendants: Vec<String> = sqlx::query_scalar(
            "WITH RECURSIVE tree(id, depth) AS (
                 SELECT id, 1 FROM runs WHERE parent_run_id = $1
                 UNION ALL
                 SELECT r.id, t.depth + 1 FROM runs r JOIN tree t ON r.parent_run_id = t.id
             )
             SELECT tree.id FROM tree JOIN runs ON runs.id = tree.id
             WHERE runs.status IN ('pending', 'running', 'waiting') ORDER BY tree.depth, tree.id",
        )
        .bind(id.as_str())
        .fetch_all(&mut *tx)
        .await?;
        let cascade = format!("parent run {id} was cancelled");
        let mut cancelled = vec![id.to_string()];
        for child in descendants {
            // It may have ended since the query; the lock makes its status final for this transaction.
            if lock_run(&mut tx, &child).await?.is_some_and(|s| !s.is_terminal()) {
                cancel_locked(&mut tx, &RunId::from(child.as_str()), &cascade, now).await?;
                cancelled.push(child);
            }
        }
        let mut entries = Vec::new();
        if let Some(parent) = parent.as_deref() {
            wake_run(&mut tx, parent, now).await?;
            entries.push((WORK, Some(parent)));
        }
        // A large cascade is announced as one change of unnamed runs.
        if cancelled.len() > MAX_NAMED_CHANGES {
            entries.push((CHANGED, None));
        } else {
            entries.extend(cancelled.iter().map(|run| (CHANGED, Some(run.as_str()))));
        }
        self.announce(&mut tx, &entries).await?;
        tx.commit().await?;
        Ok(RunStatus::Cancelled)
    }

    async fn resume_hook_tx(&self, token: &str, payload: &Value) -> Tx<ResumeReceipt> {
        // The function's own notification (it names no run) is off; this statement sends one that does.
        let row = sqlx::query(
            "SELECT h.o_run, h.o_index, CASE WHEN $4::text IS NOT NULL THEN pg_notify($4, 'work:' || h.o_run) END
             FROM resumable_resume_hook($1, $2::jsonb, $3, NULL, $5) AS h",
        )
        .bind(token)
        .bind(to_json(payload))
        .bind(EventKind::HookReceived.as_str())
        .bind(self.channel.as_deref())
        .bind(now_ms())
        .fetch_one(&self.pool)
        .await
        .map_err(|e| match &e {
            sqlx::Error::Database(d) if d.code().as_deref() == Some("RS003") => {
                StoreError::HookNotFound(token.to_owned()).into()
            }
            _ => Failure::from(e),
        })?;
        let run_id = RunId::from(get::<String>(&row, "o_run")?);
        let index: i64 = get(&row, "o_index")?;
        Ok(ResumeReceipt { run_id, index: index.unsigned_abs() })
    }

    async fn append_stream_tx(&self, fence: &Fence, position: u32, event: &Value) -> Tx<u64> {
        let index: i64 = sqlx::query_scalar("SELECT resumable_append_stream($1, $2, $3, $4::jsonb, $5, $6)")
            .bind(fence.run_id.as_str())
            .bind(lease_key(fence))
            .bind(i64::from(position))
            .bind(to_json(event))
            .bind(EventKind::StreamEmitted.as_str())
            .bind(now_ms())
            .fetch_one(&self.pool)
            .await
            .map_err(|e| fenced(e, fence))?;
        Ok(index.unsigned_abs())
    }
}

impl Store for PgStore {
    fn wake_signal(&self) -> Option<watch::Receiver<WakeHints>> {
        self.wake.clone()
    }

    fn changed_runs(&self) -> Option<broadcast::Receiver<RunId>> {
        self.changed.as_ref().map(broadcast::Sender::subscribe)
    }

    fn create_run(&self, run: NewRun) -> BoxFuture<'_, Result<CreatedRun, StoreError>> {
        Box::pin(async move { retrying(|| self.create_run_tx(&run)).await })
    }

    fn get_run<'a>(&'a self, id: &'a RunId) -> BoxFuture<'a, Result<Option<RunInfo>, StoreError>> {
        Box::pin(async move {
            let row = sqlx::query(&format!("SELECT {RUN_COLUMNS} FROM runs WHERE id = $1"))
                .bind(id.as_str())
                .fetch_optional(&self.pool)
                .await
                .map_err(db)?;
            row.as_ref().map(run_from_row).transpose()
        })
    }

    fn list_runs<'a>(&'a self, filter: &'a RunFilter) -> BoxFuture<'a, Result<RunPage, StoreError>> {
        Box::pin(async move {
            let limit = filter.page_size();
            // Only the filters in use appear in the query, so that each shape gets a fitting plan.
            let mut q = QueryBuilder::<Postgres>::new(format!("SELECT {RUN_COLUMNS} FROM runs WHERE TRUE"));
            if let Some(workflow) = &filter.workflow {
                q.push(" AND workflow = ").push_bind(workflow.as_str());
            }
            if !filter.statuses.is_empty() {
                let statuses: Vec<String> = filter.statuses.iter().map(|s| s.as_str().to_owned()).collect();
                q.push(" AND status = ANY(").push_bind(statuses).push(")");
            }
            if let Some(parent) = &filter.parent_run_id {
                q.push(" AND parent_run_id = ").push_bind(parent.as_str());
            }
            if let Some(after) = filter.created_after {
                q.push(" AND created_at >= ").push_bind(to_ms(after));
            }
            if let Some(before) = filter.created_before {
                q.push(" AND created_at < ").push_bind(to_ms(before));
            }
            if let Some(cursor) = &filter.cursor {
                q.push(" AND (created_at, id) < (").push_bind(cursor.created_at_ms);
                q.push(", ").push_bind(cursor.run_id.as_str()).push(")");
            }
            q.push(" ORDER BY created_at DESC, id DESC LIMIT ").push_bind(i64::from(limit) + 1);
            let rows = q.build().fetch_all(&self.pool).await.map_err(db)?;
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
            let rows = sqlx::query(
                "SELECT seq, kind, payload::text AS payload, created_at FROM events WHERE run_id = $1 ORDER BY seq",
            )
            .bind(id.as_str())
            .fetch_all(&self.pool)
            .await
            .map_err(db)?;
            rows.iter()
                .map(|row| {
                    let kind: String = get(row, "kind")?;
                    Ok(Event {
                        run_id: id.clone(),
                        seq: get::<i64>(row, "seq")?.unsigned_abs(),
                        kind: EventKind::from_str(&kind).map_err(StoreError::from)?,
                        payload: parse_json(&get::<String>(row, "payload")?)?,
                        created_at: from_ms(get(row, "created_at")?),
                    })
                })
                .collect()
        })
    }

    fn claim<'a>(&'a self, req: &'a ClaimRequest) -> BoxFuture<'a, Result<Option<ClaimedRun>, StoreError>> {
        Box::pin(async move { retrying(|| self.claim_tx(req)).await })
    }

    fn renew_lease<'a>(&'a self, fence: &'a Fence, lease: Duration) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move {
            let expires = now_ms().saturating_add(duration_ms(lease));
            let done = sqlx::query(
                "UPDATE runs SET lease_expires_at = $1
                 WHERE id = $2 AND status = 'running' AND lease_attempt = $3 AND lease_token = $4",
            )
            .bind(expires)
            .bind(fence.run_id.as_str())
            .bind(i64::from(fence.attempt))
            .bind(i64::from(fence.token))
            .execute(&self.pool)
            .await
            .map_err(db)?;
            if done.rows_affected() == 1 { Ok(()) } else { Err(StoreError::LeaseLost { run_id: fence.run_id.clone() }) }
        })
    }

    fn next_wake_at<'a>(&'a self, workflows: &'a [String]) -> BoxFuture<'a, Result<Option<Millis>, StoreError>> {
        Box::pin(async move {
            // A past time (a due run that a claim skipped because another transaction held it)
            // makes the worker look again at once, as on SQLite.
            sqlx::query_scalar(
                "SELECT MIN(ready_at) FROM runs
                 WHERE ready_at IS NOT NULL AND status <> 'pending' AND workflow = ANY($1)",
            )
            .bind(workflows)
            .fetch_one(&self.pool)
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
        Box::pin(async move { retrying(|| self.start_step_tx(fence, position, name)).await })
    }

    fn update_step<'a>(
        &'a self,
        fence: &'a Fence,
        position: u32,
        update: StepUpdate,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move { retrying(|| self.update_step_tx(fence, position, &update)).await })
    }

    fn create_hook<'a>(
        &'a self,
        fence: &'a Fence,
        position: u32,
        token: &'a str,
        metadata: &'a Value,
    ) -> BoxFuture<'a, Result<HookCreation, StoreError>> {
        Box::pin(async move { retrying(|| self.create_hook_tx(fence, position, token, metadata)).await })
    }

    fn hook_payload<'a>(
        &'a self,
        run_id: &'a RunId,
        position: u32,
        index: u64,
    ) -> BoxFuture<'a, Result<Option<HookPayload>, StoreError>> {
        Box::pin(async move {
            let row = sqlx::query(
                "SELECT payload::text AS payload, received_at FROM hook_payloads
                 WHERE run_id = $1 AND position = $2 AND seq = $3",
            )
            .bind(run_id.as_str())
            .bind(i64::from(position))
            .bind(i64::try_from(index).unwrap_or(i64::MAX))
            .fetch_optional(&self.pool)
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
        Box::pin(async move { retrying(|| self.create_wait_tx(fence, position, due_at)).await })
    }

    fn resolve_wait<'a>(
        &'a self,
        fence: &'a Fence,
        position: u32,
        resolution: WaitResolution,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move { retrying(|| self.resolve_wait_tx(fence, position, resolution)).await })
    }

    fn record_step<'a>(
        &'a self,
        fence: &'a Fence,
        position: u32,
        name: &'a str,
        result: &'a Value,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move { retrying(|| self.record_step_tx(fence, position, name, result)).await })
    }

    fn suspend_run<'a>(
        &'a self,
        fence: &'a Fence,
        wake_at: Option<Millis>,
    ) -> BoxFuture<'a, Result<RunStatus, StoreError>> {
        Box::pin(async move { retrying(|| self.suspend_run_tx(fence, wake_at)).await })
    }

    fn finish_run<'a>(&'a self, fence: &'a Fence, outcome: RunOutcome) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move { retrying(|| self.finish_run_tx(fence, &outcome)).await })
    }

    fn cancel_run<'a>(&'a self, id: &'a RunId, reason: &'a str) -> BoxFuture<'a, Result<RunStatus, StoreError>> {
        Box::pin(async move { retrying(|| self.cancel_run_tx(id, reason)).await })
    }

    fn get_hook<'a>(&'a self, token: &'a str) -> BoxFuture<'a, Result<Option<HookInfo>, StoreError>> {
        Box::pin(async move {
            let row = sqlx::query(
                "SELECT run_id, metadata::text AS metadata, received, created_at FROM hooks WHERE token = $1 AND active",
            )
            .bind(token)
            .fetch_optional(&self.pool)
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
        Box::pin(async move { retrying(|| self.resume_hook_tx(token, &payload)).await })
    }

    fn append_stream<'a>(
        &'a self,
        fence: &'a Fence,
        position: u32,
        event: &'a Value,
    ) -> BoxFuture<'a, Result<u64, StoreError>> {
        Box::pin(async move { retrying(|| self.append_stream_tx(fence, position, event)).await })
    }

    fn read_stream<'a>(
        &'a self,
        run_id: &'a RunId,
        from: u64,
        limit: u32,
    ) -> BoxFuture<'a, Result<Vec<(u64, Value)>, StoreError>> {
        Box::pin(async move {
            let rows = sqlx::query(
                "SELECT idx, payload::text AS payload FROM stream_events
                 WHERE run_id = $1 AND idx >= $2 ORDER BY idx LIMIT $3",
            )
            .bind(run_id.as_str())
            .bind(i64::try_from(from).unwrap_or(i64::MAX))
            .bind(i64::from(limit))
            .fetch_all(&self.pool)
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
    use sqlx::Connection;

    fn server_url() -> Option<String> {
        crate::testing::postgres_url()
    }

    /// A fresh schema name, in the format whose leftovers the conformance tests sweep away.
    fn schema_name() -> String {
        let secs = now_ms() / 1000;
        format!("rt_{secs}_{}_unit", crate::ids::random_hex(6))
    }

    async fn drop_schema(url: &str, schema: &str) {
        let mut conn = sqlx::PgConnection::connect(url).await.unwrap();
        Executor::execute(&mut conn, format!("DROP SCHEMA IF EXISTS {schema} CASCADE").as_str()).await.unwrap();
        conn.close().await.unwrap();
    }

    fn options(schema: &str) -> PgStoreOptions {
        PgStoreOptions {
            max_connections: 2,
            min_connections: 1,
            schema: Some(schema.to_owned()),
            notify_channel: schema.to_owned(),
            ..PgStoreOptions::default()
        }
    }

    fn new_run(workflow: &str) -> NewRun {
        NewRun { workflow: workflow.into(), input: json!({ "a": 1 }), idempotency_key: None, parent_run_id: None }
    }

    #[tokio::test]
    async fn unsupported_url_schemes_are_refused_without_echoing_the_url() {
        for url in ["mysql://admin:hunter2@db.example/prod", "admin:hunter2@db.example", "hunter2"] {
            let Err(StoreError::Database(message)) = crate::store::open(url).await else {
                panic!("{url} was accepted");
            };
            assert!(message.contains("postgres://") && message.contains("sqlite:"), "{message}");
            assert!(!message.contains("hunter2") && !message.contains("admin"), "{message}");
        }
        let sqlite = crate::store::open("sqlite::memory:").await.unwrap();
        assert!(sqlite.wake_signal().is_none(), "SQLite has no wake-up channel");
        assert!(sqlite.create_run(new_run("w")).await.unwrap().created);
    }

    #[tokio::test]
    async fn invalid_schema_and_channel_names_are_refused_before_connecting() {
        let url = "postgres://nobody:secret@127.0.0.1:1/none";
        for schema in ["Upper", "has-dash", "1digit", "semi;colon", ""] {
            let options = PgStoreOptions { schema: Some(schema.to_owned()), ..PgStoreOptions::default() };
            let Err(StoreError::Database(message)) = PgStore::open_with(url, options).await else {
                panic!("schema {schema:?} was accepted");
            };
            assert!(message.contains("invalid schema name"), "{message}");
        }
        let options = PgStoreOptions { notify_channel: "c".repeat(64), ..PgStoreOptions::default() };
        assert!(matches!(PgStore::open_with(url, options).await, Err(StoreError::Database(_))));
    }

    #[tokio::test]
    async fn postgres_urls_open_a_pg_store() {
        let Some(url) = server_url() else { return };
        // A schema created beforehand and chosen through the URL, so the default options apply.
        let schema = schema_name();
        let mut conn = sqlx::PgConnection::connect(&url).await.unwrap();
        Executor::execute(&mut conn, format!("CREATE SCHEMA {schema}").as_str()).await.unwrap();
        conn.close().await.unwrap();
        let separator = if url.contains('?') { '&' } else { '?' };
        for scheme in ["postgres", "postgresql"] {
            let rest = url.split_once("://").unwrap().1;
            let store = crate::store::open(&format!("{scheme}://{rest}{separator}options[search_path]={schema}"))
                .await
                .unwrap();
            assert!(store.wake_signal().is_some(), "PostgreSQL stores listen for wake-ups");
            let created = store.create_run(new_run("w")).await.unwrap();
            assert_eq!(store.get_run(&created.run_id).await.unwrap().unwrap().status, RunStatus::Pending);
        }
        let pg = PgStore::open_with(&url, options(&schema)).await.unwrap();
        let runs: i64 = sqlx::query_scalar("SELECT count(*) FROM runs").fetch_one(&pg.pool).await.unwrap();
        assert_eq!(runs, 2, "both stores wrote to the schema named in the URL");
        pg.close().await;
        drop_schema(&url, &schema).await;
    }

    #[tokio::test]
    async fn concurrent_first_opens_migrate_once() {
        let Some(url) = server_url() else { return };
        let schema = schema_name();
        let opens: Vec<_> = (0..4)
            .map(|_| {
                let (url, options) = (url.clone(), options(&schema));
                tokio::spawn(async move { PgStore::open_with(&url, options).await })
            })
            .collect();
        let mut stores = Vec::new();
        for open in opens {
            stores.push(open.await.unwrap().expect("every concurrent open succeeds"));
        }
        let versions: Vec<i64> = sqlx::query_scalar("SELECT version FROM schema_migrations ORDER BY version")
            .fetch_all(&stores[0].pool)
            .await
            .unwrap();
        assert_eq!(versions, MIGRATIONS.iter().map(|m| m.version).collect::<Vec<_>>());
        for store in &stores {
            store.close().await;
        }
        // Reopening applies nothing again.
        let store = PgStore::open_with(&url, options(&schema)).await.unwrap();
        let count: i64 =
            sqlx::query_scalar("SELECT count(*) FROM schema_migrations").fetch_one(&store.pool).await.unwrap();
        assert_eq!(count, MIGRATIONS.len() as i64);
        store.close().await;
        drop_schema(&url, &schema).await;
    }

    /// A database made before checksums were kept adopts them once; an edited migration is then
    /// refused with what to do.
    #[tokio::test]
    async fn applied_migrations_are_checked_against_their_checksums() {
        let Some(url) = server_url() else { return };
        let schema = schema_name();
        let store = PgStore::open_with(&url, options(&schema)).await.unwrap();
        sqlx::query("ALTER TABLE schema_migrations DROP COLUMN checksum").execute(&store.pool).await.unwrap();
        store.close().await;
        let store = PgStore::open_with(&url, options(&schema)).await.unwrap();
        let checksums: Vec<String> = sqlx::query_scalar("SELECT checksum FROM schema_migrations ORDER BY version")
            .fetch_all(&store.pool)
            .await
            .unwrap();
        assert_eq!(checksums, MIGRATIONS.iter().map(Migration::checksum).collect::<Vec<_>>());
        sqlx::query("UPDATE schema_migrations SET checksum = 'edited' WHERE version = 3")
            .execute(&store.pool)
            .await
            .unwrap();
        store.close().await;
        let refused = PgStore::open_with(&url, options(&schema)).await;
        assert!(
            matches!(refused, Err(StoreError::Corrupt(ref m)) if m.contains("migration 3") && m.contains("was changed")),
            "{refused:?}"
        );
        drop_schema(&url, &schema).await;
    }

    #[tokio::test]
    async fn newer_schema_is_refused() {
        let Some(url) = server_url() else { return };
        let schema = schema_name();
        let store = PgStore::open_with(&url, options(&schema)).await.unwrap();
        sqlx::query("INSERT INTO schema_migrations (version, name, applied_at) VALUES (99, 'future', 0)")
            .execute(&store.pool)
            .await
            .unwrap();
        store.close().await;
        let refused = PgStore::open_with(&url, options(&schema)).await;
        assert!(matches!(refused, Err(StoreError::Corrupt(ref m)) if m.contains("99")), "{refused:?}");
        drop_schema(&url, &schema).await;
    }

    #[tokio::test]
    async fn a_claim_lost_with_the_server_and_made_again_fences_out_its_old_worker() {
        let Some(url) = server_url() else { return };
        let schema = schema_name();
        let store = PgStore::open_with(&url, options(&schema)).await.unwrap();
        store.create_run(new_run("w")).await.unwrap();
        let lease = Duration::from_secs(30);
        let first = ClaimRequest { owner: "first".into(), workflows: vec!["w".into()], lease };
        let lost = store.claim(&first).await.unwrap().expect("claimed");
        // The server forgets the claim, as a crash before its WAL flush would; its worker lives on.
        sqlx::query(
            "UPDATE runs SET status = 'pending', lease_attempt = lease_attempt - 1, lease_owner = NULL,
                 lease_expires_at = NULL, lease_token = 0",
        )
        .execute(&store.pool)
        .await
        .unwrap();
        let second = ClaimRequest { owner: "second".into(), workflows: vec!["w".into()], lease };
        let again = store.claim(&second).await.unwrap().expect("claimed again");
        assert_eq!(again.fence.attempt, lost.fence.attempt, "the same lease attempt is handed out again");
        assert_ne!(again.fence.token, lost.fence.token);
        let stale = store.start_step(&lost.fence, 1, "s").await;
        assert!(matches!(stale, Err(StoreError::LeaseLost { .. })), "{stale:?}");
        let stale = store.renew_lease(&lost.fence, lease).await;
        assert!(matches!(stale, Err(StoreError::LeaseLost { .. })), "{stale:?}");
        let stale = store.append_stream(&lost.fence, 2, &json!(1)).await;
        assert!(matches!(stale, Err(StoreError::LeaseLost { .. })), "{stale:?}");
        assert_eq!(store.start_step(&again.fence, 1, "s").await.unwrap(), 1);
        store.renew_lease(&again.fence, lease).await.unwrap();
        store.close().await;
        drop_schema(&url, &schema).await;
    }

    #[test]
    fn notifications_that_name_a_run_wake_its_waiters_and_the_others_wake_everybody() {
        let (hints, watched) = watch::channel(WakeHints::default());
        let (runs, mut named) = broadcast::channel(8);
        let announced = Announced { hints, runs };
        announced.tell(["changed:run_a"]);
        assert_eq!(*watched.borrow(), WakeHints::default(), "a named change is for that run's waiters only");
        assert_eq!(named.try_recv().unwrap(), RunId::from("run_a"));
        // One notification per transaction, with several entries (a finished child and its parent).
        announced.tell(["work:run_b changed:run_c"]);
        assert_eq!(*watched.borrow(), WakeHints { work: 1, changes: 0 });
        assert_eq!(named.try_recv().unwrap(), RunId::from("run_b"));
        assert_eq!(named.try_recv().unwrap(), RunId::from("run_c"));
        // Payloads of an earlier release name no run.
        announced.tell(["changed"]);
        assert_eq!(*watched.borrow(), WakeHints { work: 1, changes: 1 });
        announced.tell(["work"]);
        assert_eq!(*watched.borrow(), WakeHints { work: 2, changes: 2 });
        announced.anything();
        assert_eq!(*watched.borrow(), WakeHints { work: 3, changes: 3 });
        assert!(named.try_recv().is_err());
    }

    #[tokio::test]
    async fn wake_signal_follows_other_stores_and_ends_with_its_store() {
        let Some(url) = server_url() else { return };
        let schema = schema_name();
        let writer = PgStore::open_with(&url, options(&schema)).await.unwrap();
        let reader = PgStore::open_with(&url, options(&schema)).await.unwrap();
        let mut signal = reader.wake_signal().unwrap();
        let mut runs = reader.changed_runs().unwrap();
        signal.borrow_and_update();
        let wait = Duration::from_secs(5);
        let created = writer.create_run(new_run("w")).await.unwrap().run_id;
        // A new run is work for a worker, and names itself for whoever waits on it.
        tokio::time::timeout(wait, signal.changed()).await.expect("notified of a new run").unwrap();
        let hints = *signal.borrow_and_update();
        assert!(hints.work >= 1 && hints.changes == 0, "{hints:?}");
        assert_eq!(tokio::time::timeout(wait, runs.recv()).await.expect("told which run").unwrap(), created);
        // A run that ends without a parent to wake is a change of that run, not work for anyone.
        let request =
            ClaimRequest { owner: "hints".into(), workflows: vec!["w".into()], lease: Duration::from_secs(30) };
        let claimed = writer.claim(&request).await.unwrap().expect("the run is claimed");
        writer.finish_run(&claimed.fence, RunOutcome::Completed(json!(1))).await.unwrap();
        assert_eq!(tokio::time::timeout(wait, runs.recv()).await.expect("told of the change").unwrap(), created);
        assert_eq!(*signal.borrow(), hints, "an ended run wakes no worker and names itself");
        // A child that ends names itself and its parent, which is work again, in one notification.
        let parent = writer.create_run(new_run("w")).await.unwrap().run_id;
        assert_eq!(tokio::time::timeout(wait, runs.recv()).await.unwrap().unwrap(), parent);
        let child =
            writer.create_run(NewRun { parent_run_id: Some(parent.clone()), ..new_run("c") }).await.unwrap().run_id;
        assert_eq!(tokio::time::timeout(wait, runs.recv()).await.unwrap().unwrap(), child);
        let request =
            ClaimRequest { owner: "hints".into(), workflows: vec!["c".into()], lease: Duration::from_secs(30) };
        let claimed = writer.claim(&request).await.unwrap().expect("the child is claimed");
        let before = *signal.borrow_and_update();
        writer.finish_run(&claimed.fence, RunOutcome::Completed(json!(2))).await.unwrap();
        assert_eq!(tokio::time::timeout(wait, runs.recv()).await.unwrap().unwrap(), parent);
        assert_eq!(tokio::time::timeout(wait, runs.recv()).await.unwrap().unwrap(), child);
        assert_eq!(signal.borrow_and_update().work, before.work + 1, "the woken parent is work");
        // A cancelled run names itself too.
        let doomed = writer.create_run(new_run("w")).await.unwrap().run_id;
        assert_eq!(tokio::time::timeout(wait, runs.recv()).await.expect("told of the new run").unwrap(), doomed);
        tokio::time::timeout(wait, signal.changed()).await.expect("notified of a new run").unwrap();
        let hints = *signal.borrow_and_update();
        writer.cancel_run(&doomed, "not needed").await.unwrap();
        assert_eq!(tokio::time::timeout(wait, runs.recv()).await.expect("told of the cancel").unwrap(), doomed);
        assert_eq!(*signal.borrow(), hints, "a cancelled run without a parent wakes no worker");
        // A store without notifications neither sends nor listens.
        let quiet =
            PgStore::open_with(&url, PgStoreOptions { notifications: false, ..options(&schema) }).await.unwrap();
        assert!(quiet.wake_signal().is_none() && quiet.changed_runs().is_none());
        signal.borrow_and_update();
        quiet.create_run(new_run("w")).await.unwrap();
        assert!(tokio::time::timeout(Duration::from_millis(300), signal.changed()).await.is_err());
        assert!(runs.try_recv().is_err());
        // Dropping the last clone of the store ends its listener task, and with it the signals.
        let clone = reader.clone();
        drop(reader);
        drop(clone);
        let ended = tokio::time::timeout(wait, async { while signal.changed().await.is_ok() {} }).await;
        assert!(ended.is_ok(), "the listener outlived its store");
        assert!(matches!(runs.recv().await, Err(broadcast::error::RecvError::Closed)));
        writer.close().await;
        quiet.close().await;
        drop_schema(&url, &schema).await;
    }

    #[tokio::test]
    async fn listener_reconnects_and_signals_after_losing_its_connection() {
        let Some(url) = server_url() else { return };
        let schema = schema_name();
        let store = PgStore::open_with(&url, options(&schema)).await.unwrap();
        let mut signal = store.wake_signal().unwrap();
        signal.borrow_and_update();
        let wait = Duration::from_secs(10);
        // The listener's connection, by its last statement (`LISTEN "<channel>"`, maybe with `;`).
        let listening = format!("LISTEN \"{schema}\"%");
        let killed: Vec<bool> =
            sqlx::query_scalar("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE query LIKE $1")
                .bind(&listening)
                .fetch_all(&store.pool)
                .await
                .unwrap();
        assert_eq!(killed, vec![true], "one listener connection");
        // The reconnection itself is signalled: notifications may have been missed meanwhile.
        tokio::time::timeout(wait, signal.changed()).await.expect("signalled after reconnecting").unwrap();
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            let listeners: i64 = sqlx::query_scalar("SELECT count(*) FROM pg_stat_activity WHERE query LIKE $1")
                .bind(&listening)
                .fetch_one(&store.pool)
                .await
                .unwrap();
            if listeners == 1 {
                break;
            }
            assert!(tokio::time::Instant::now() < deadline, "the listener did not reconnect");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        signal.borrow_and_update();
        store.create_run(new_run("w")).await.unwrap();
        tokio::time::timeout(wait, signal.changed()).await.expect("notified after reconnecting").unwrap();
        store.close().await;
        drop_schema(&url, &schema).await;
    }
}
