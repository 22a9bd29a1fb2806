//! The storage surface of the engine: one trait, backends behind it.
//!
//! A backend implements [`Store`] with the semantics documented on each method. Every method that
//! changes state does so in **one transaction** that also appends the matching [`Event`]s to the
//! run's log, numbered by the run's sequence counter. Methods that take a [`Fence`] refuse to write
//! (with [`StoreError::LeaseLost`]) unless the run is still `running` under that lease attempt.
//! Uniqueness (idempotency keys, active hook tokens) is enforced by database constraints.

#[cfg(feature = "postgres")]
pub mod postgres;
mod rows;
pub use rows::stored_form;
#[cfg(feature = "sqlite")]
pub mod sqlite;
#[cfg(feature = "sqlite")]
mod sqlite_batch;
#[cfg(feature = "sqlite")]
mod sqlite_threads;

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use tokio::sync::{broadcast, watch};

use crate::error::StoreError;
use crate::event::Event;
use crate::hook_data::{HookInfo, ResumeReceipt};
use crate::ids::RunId;
use crate::run::{RunFilter, RunInfo, RunPage, RunStatus};

pub use crate::time::Millis;

/// A boxed, sendable future, the return type of every [`Store`] method (keeps the trait object-safe).
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Identifies one execution of a run: the run and the lease attempt that claimed it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Fence {
    /// The run being executed.
    pub run_id: RunId,
    /// The lease attempt of the claim (incremented by every claim).
    pub attempt: u32,
    /// A random number drawn by the claim where the backend needs one (PostgreSQL, whose claims
    /// may be lost in a crash of the server while their worker lives on), so that a lost claim and
    /// the next one never share a fence; 0 otherwise.
    pub token: u32,
}

/// A run to create.
#[derive(Clone, Debug, PartialEq)]
pub struct NewRun {
    /// The registered workflow's name.
    pub workflow: String,
    /// Its JSON input.
    pub input: Value,
    /// When set, a run that already has this key is returned instead of creating one.
    pub idempotency_key: Option<String>,
    /// The run that started this one as a child; it is woken when this run ends.
    pub parent_run_id: Option<RunId>,
    /// The feed whose readers see this run's stream events ([`Store::read_feed`]). A child run is
    /// in its parent's feed whatever this says.
    pub feed: Option<String>,
}

impl NewRun {
    /// The payload of the run's `run_created` event, with the feed it joined (its parent's, for a
    /// child).
    pub(crate) fn created_event(&self, feed: Option<&str>) -> Value {
        serde_json::json!({
            "workflow": self.workflow,
            "input": self.input,
            "idempotency_key": self.idempotency_key,
            "parent_run_id": self.parent_run_id,
            "feed": feed,
        })
    }
}

/// A stream event as a feed reader sees it ([`Store::read_feed`]).
#[derive(Clone, Debug, PartialEq)]
pub struct FeedEntry {
    /// Its number in the feed: 1, 2, 3, ... in the order the events committed.
    pub cursor: u64,
    /// The run that appended it.
    pub run_id: RunId,
    /// That run's workflow.
    pub workflow: String,
    /// Its index in the run's own stream.
    pub index: u64,
    /// The event.
    pub event: Value,
}

/// The result of [`Store::create_run`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CreatedRun {
    /// The new run's id, or the existing run's id for a repeated idempotency key.
    pub run_id: RunId,
    /// Whether a new run was created.
    pub created: bool,
}

/// What a worker asks [`Store::claim`] for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClaimRequest {
    /// The worker's identity, recorded as lease owner.
    pub owner: String,
    /// The workflows this worker can execute; other runs are left alone.
    pub workflows: Vec<String>,
    /// How long the lease lasts unless renewed.
    pub lease: Duration,
}

/// A run claimed for execution, with everything its replay needs.
#[derive(Clone, Debug, PartialEq)]
pub struct ClaimedRun {
    /// The execution's fence.
    pub fence: Fence,
    /// The workflow to run.
    pub workflow: String,
    /// Its input.
    pub input: Value,
    /// The operations recorded by earlier executions.
    pub history: RunHistory,
}

/// The recorded operations of a run, by position (steps, hooks, timers and emits share one counter).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RunHistory {
    /// Operation records keyed by position.
    pub ops: BTreeMap<u32, OpRecord>,
}

/// One recorded operation.
#[derive(Clone, Debug, PartialEq)]
pub enum OpRecord {
    /// A step.
    Step(StepRecord),
    /// A hook.
    Hook(HookRecord),
    /// A durable timer.
    Wait(WaitRecord),
    /// An event appended to the run's stream.
    Emit(EmitRecord),
}

/// A recorded stream emit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EmitRecord {
    /// The index the event got in the run's stream.
    pub index: u64,
}

/// A recorded step.
#[derive(Clone, Debug, PartialEq)]
pub struct StepRecord {
    /// The step's name.
    pub name: String,
    /// Attempts started so far.
    pub attempts: u32,
    /// Attempts that ended in an error. Every other attempt, except one still running, was
    /// interrupted (by a crash or a lost lease) before it could record an end.
    pub failures: u32,
    /// Where it stands.
    pub state: StepState,
}

/// The state of a recorded step.
#[derive(Clone, Debug, PartialEq)]
pub enum StepState {
    /// An attempt started and did not record an end (its worker died or lost its lease).
    Running,
    /// The last attempt failed with a retryable error; the next one is due at `retry_at`.
    Retrying {
        /// When the next attempt is due.
        retry_at: Millis,
        /// The last attempt's error.
        error: String,
    },
    /// Completed with this result.
    Completed(Value),
    /// Failed for good with this error.
    Failed(String),
}

/// A recorded hook.
#[derive(Clone, Debug, PartialEq)]
pub struct HookRecord {
    /// The token asked for.
    pub token: String,
    /// The metadata given.
    pub metadata: Value,
    /// Where it stands.
    pub state: HookState,
    /// Payloads received so far, in order.
    pub payloads: Vec<HookPayload>,
}

/// The state of a recorded hook.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HookState {
    /// Owns its token and accepts payloads.
    Active,
    /// Disposed when its run ended.
    Disposed,
    /// Never owned its token: this run held it when the hook was created.
    Conflict {
        /// The run that owned the token.
        owner_run_id: RunId,
    },
}

/// A recorded durable timer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WaitRecord {
    /// When it is due.
    pub due_at: Millis,
    /// Where it stands.
    pub state: WaitState,
}

/// The state of a durable timer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WaitState {
    /// Not yet observed as fired.
    Pending,
    /// Fired (observed by the workflow after its due time).
    Fired,
    /// Cancelled: the hook it raced against won, or its run ended first.
    Cancelled,
}

/// How a pending timer is resolved, for [`Store::resolve_wait`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WaitResolution {
    /// The timer fired.
    Fired,
    /// The hook payload it raced against arrived first; the timer will never fire.
    Cancelled,
}

/// A payload delivered to a hook.
#[derive(Clone, Debug, PartialEq)]
pub struct HookPayload {
    /// The payload.
    pub value: Value,
    /// When the store received it.
    pub received_at: Millis,
}

/// How a step attempt ended, for [`Store::update_step`].
#[derive(Clone, Debug, PartialEq)]
pub enum StepUpdate {
    /// Completed with a result.
    Completed {
        /// The attempt that completed.
        attempt: u32,
        /// Its result.
        result: Value,
    },
    /// Failed for good.
    Failed {
        /// The attempt that failed.
        attempt: u32,
        /// Its error.
        error: String,
    },
    /// Failed with a retryable error; attempt again at `retry_at`.
    Retrying {
        /// The attempt that failed.
        attempt: u32,
        /// Its error.
        error: String,
        /// When the next attempt is due.
        retry_at: Millis,
    },
}

/// The result of [`Store::create_hook`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HookCreation {
    /// The hook was created and owns its token.
    Created,
    /// Another run's active hook owns the token; the conflict was recorded.
    Conflict {
        /// The owner.
        owner_run_id: RunId,
    },
}

/// How a run ended, for [`Store::finish_run`].
#[derive(Clone, Debug, PartialEq)]
pub enum RunOutcome {
    /// Completed with an output.
    Completed(Value),
    /// Failed with an error message.
    Failed(String),
}

/// The database a URL names, by its scheme (letter case aside): `sqlite:`, or `postgres://` and
/// `postgresql://`. The one place that reads a database URL's scheme.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum DatabaseKind {
    /// A SQLite file (or an in-memory database).
    Sqlite,
    /// A PostgreSQL server.
    Postgres,
}

impl DatabaseKind {
    /// The kind of database `url` names; `None` for any other scheme.
    pub fn of_url(url: &str) -> Option<DatabaseKind> {
        let (scheme, rest) = url.split_once(':')?;
        match scheme.to_ascii_lowercase().as_str() {
            "sqlite" => Some(DatabaseKind::Sqlite),
            "postgres" | "postgresql" if rest.starts_with("//") => Some(DatabaseKind::Postgres),
            _ => None,
        }
    }
}

/// Opens the store at `url`, choosing the backend by the URL's scheme: `postgres://` or
/// `postgresql://` opens a [`postgres::PgStore`], `sqlite:` a [`sqlite::SqliteStore`], each with
/// default options and migrated. Any other scheme is a [`StoreError::Database`] naming the accepted
/// ones (the URL itself, which may hold a password, is not repeated).
pub async fn open(url: &str) -> Result<Arc<dyn Store>, StoreError> {
    match DatabaseKind::of_url(url) {
        #[cfg(feature = "postgres")]
        Some(DatabaseKind::Postgres) => Ok(Arc::new(postgres::PgStore::open(url).await?)),
        #[cfg(feature = "sqlite")]
        Some(DatabaseKind::Sqlite) => Ok(Arc::new(sqlite::SqliteStore::open(url).await?)),
        #[cfg(not(all(feature = "sqlite", feature = "postgres")))]
        Some(kind) => Err(StoreError::database(format!(
            "this build has no {kind:?} store: it was built without the cargo feature for it"
        ))),
        None => Err(unsupported_url(url)),
    }
}

/// The error for a URL of no known database: it names the scheme only when the URL is plainly
/// `scheme://…` (anything else may be a secret), never the rest.
fn unsupported_url(url: &str) -> StoreError {
    let scheme = url.split_once(':').map(|(scheme, _)| scheme.to_ascii_lowercase());
    match scheme.as_deref() {
        Some(scheme)
            if url[scheme.len()..].starts_with("://")
                && scheme.chars().all(|c| c.is_ascii_alphanumeric() || "+-.".contains(c)) =>
        {
            StoreError::database(format!(
                "unsupported store URL scheme {scheme:?}: expected postgres://, postgresql:// or sqlite:"
            ))
        }
        _ => StoreError::database("unsupported store URL: expected postgres://, postgresql:// or sqlite:"),
    }
}

/// What another process announced, as counters that only grow (so that hints coalesced by a
/// [`watch`] channel are never lost): `work` counts hints that a run may have become runnable,
/// `changes` hints that some run, not named, may have changed (changes of named runs arrive
/// through [`Store::changed_runs`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WakeHints {
    /// Hints that a run may have become runnable.
    pub work: u64,
    /// Hints that some run, not named, may have changed.
    pub changes: u64,
}

/// The storage backend of the engine.
///
/// All methods are safe to call concurrently, from many engines and processes sharing a database.
pub trait Store: Send + Sync + 'static {
    /// Counters the backend bumps whenever another process sharing the database may have made a
    /// run runnable, or changed one (wake-up hints, such as PostgreSQL's `NOTIFY`). Every engine
    /// subscribes: new work wakes a worker to claim it, a change wakes whoever waits for runs or
    /// streams; polling remains the fallback. `None` (the default) when the backend has no such
    /// channel.
    fn wake_signal(&self) -> Option<watch::Receiver<WakeHints>> {
        None
    }

    /// The runs that other processes announced as changed (or runnable), by name, as the
    /// announcements arrive, so that an engine wakes only the waiters of those runs. A receiver
    /// that falls behind gets [`broadcast::error::RecvError::Lagged`] and should consider every
    /// run changed. `None` (the default) when the backend names no runs.
    fn changed_runs(&self) -> Option<broadcast::Receiver<RunId>> {
        None
    }

    /// Creates a pending run (event `run_created`). With an idempotency key that a run already has,
    /// returns that run with `created = false`, decided by a unique constraint. A child run whose
    /// parent has ended is refused with [`StoreError::LeaseLost`] naming the parent; a child takes
    /// its parent's feed.
    fn create_run(&self, run: NewRun) -> BoxFuture<'_, Result<CreatedRun, StoreError>>;

    /// Reads one run.
    fn get_run<'a>(&'a self, id: &'a RunId) -> BoxFuture<'a, Result<Option<RunInfo>, StoreError>>;

    /// Lists runs matching `filter`, newest first (by creation time, then id), one page at a time.
    fn list_runs<'a>(&'a self, filter: &'a RunFilter) -> BoxFuture<'a, Result<RunPage, StoreError>>;

    /// Reads a run's whole event log, in `seq` order.
    fn events<'a>(&'a self, id: &'a RunId) -> BoxFuture<'a, Result<Vec<Event>, StoreError>>;

    /// Atomically claims one runnable run of the given workflows: pending, waiting with a due wake
    /// time, or running with an expired lease. Sets it running under a new lease attempt (event
    /// `run_started`) and returns its history.
    fn claim<'a>(&'a self, req: &'a ClaimRequest) -> BoxFuture<'a, Result<Option<ClaimedRun>, StoreError>>;

    /// Extends the lease of an execution; [`StoreError::LeaseLost`] if it is no longer current.
    fn renew_lease<'a>(&'a self, fence: &'a Fence, lease: Duration) -> BoxFuture<'a, Result<(), StoreError>>;

    /// The earliest future time at which a run of these workflows becomes claimable by time alone
    /// (a wake time of a waiting run, or a lease expiry), if any.
    fn next_wake_at<'a>(&'a self, workflows: &'a [String]) -> BoxFuture<'a, Result<Option<Millis>, StoreError>>;

    /// Starts the next attempt of the step at `position` (creating its record for attempt 1) and
    /// returns the attempt number (event `step_started`).
    fn start_step<'a>(
        &'a self,
        fence: &'a Fence,
        position: u32,
        name: &'a str,
    ) -> BoxFuture<'a, Result<u32, StoreError>>;

    /// Records how a step attempt ended (event `step_completed`, `step_failed` or `step_retrying`).
    fn update_step<'a>(
        &'a self,
        fence: &'a Fence,
        position: u32,
        update: StepUpdate,
    ) -> BoxFuture<'a, Result<(), StoreError>>;

    /// Creates the hook at `position` (event `hook_created`) or, when an active hook of another
    /// run owns the token, records the conflict (event `hook_conflict`).
    fn create_hook<'a>(
        &'a self,
        fence: &'a Fence,
        position: u32,
        token: &'a str,
        metadata: &'a Value,
    ) -> BoxFuture<'a, Result<HookCreation, StoreError>>;

    /// The payload number `index` (0-based) received by the hook at `position`, if it arrived.
    fn hook_payload<'a>(
        &'a self,
        run_id: &'a RunId,
        position: u32,
        index: u64,
    ) -> BoxFuture<'a, Result<Option<HookPayload>, StoreError>>;

    /// Creates the durable timer at `position` (event `wait_created`).
    fn create_wait<'a>(
        &'a self,
        fence: &'a Fence,
        position: u32,
        due_at: Millis,
    ) -> BoxFuture<'a, Result<(), StoreError>>;

    /// Resolves the pending timer at `position` (event `wait_completed` with `fired` true or
    /// false); a no-op if it was already resolved.
    fn resolve_wait<'a>(
        &'a self,
        fence: &'a Fence,
        position: u32,
        resolution: WaitResolution,
    ) -> BoxFuture<'a, Result<(), StoreError>>;

    /// Records at `position` a step that completed at once with `result`, in one transaction
    /// (event `step_completed`, attempt 1). Used for values that must be the same on every replay
    /// (the clock, a child run's result).
    fn record_step<'a>(
        &'a self,
        fence: &'a Fence,
        position: u32,
        name: &'a str,
        result: &'a Value,
    ) -> BoxFuture<'a, Result<(), StoreError>>;

    /// Ends an execution that is blocked (event `run_suspended`): the run becomes `waiting` until
    /// `wake_at` or a hook payload, or `pending` at once if a payload arrived during the execution.
    /// Returns the new status.
    fn suspend_run<'a>(
        &'a self,
        fence: &'a Fence,
        wake_at: Option<Millis>,
    ) -> BoxFuture<'a, Result<RunStatus, StoreError>>;

    /// Ends a run (event `run_completed` or `run_failed`), disposing its active hooks (events
    /// `hook_disposed`) and cancelling its pending timers in the same transaction, and wakes its
    /// parent run, if any.
    fn finish_run<'a>(&'a self, fence: &'a Fence, outcome: RunOutcome) -> BoxFuture<'a, Result<(), StoreError>>;

    /// Cancels a run that has not ended (event `run_cancelled`, hooks disposed, timers cancelled,
    /// any execution's lease voided), and with it every child run that has not ended, in one
    /// transaction; wakes its parent, if any. Returns the run's status afterwards; a run that had
    /// already ended keeps its status.
    fn cancel_run<'a>(&'a self, id: &'a RunId, reason: &'a str) -> BoxFuture<'a, Result<RunStatus, StoreError>>;

    /// Reads the active hook with this token, if any.
    fn get_hook<'a>(&'a self, token: &'a str) -> BoxFuture<'a, Result<Option<HookInfo>, StoreError>>;

    /// Delivers a payload to the active hook with this token (event `hook_received`) and wakes its
    /// run. [`StoreError::HookNotFound`] when no active hook has the token.
    fn resume_hook<'a>(&'a self, token: &'a str, payload: Value) -> BoxFuture<'a, Result<ResumeReceipt, StoreError>>;

    /// Appends `event` to the run's stream as the emit at `position` (event `stream_emitted`) and
    /// returns its index: 0, 1, 2, ... in append order. The index is unique per run and the
    /// position is recorded once, both by constraint. When the run is in a feed, the event also
    /// takes the feed's next number, in the same transaction, such that numbers become visible in
    /// order: a reader that sees number n sees every number before it, with no gaps.
    fn append_stream<'a>(
        &'a self,
        fence: &'a Fence,
        position: u32,
        event: &'a Value,
    ) -> BoxFuture<'a, Result<u64, StoreError>>;

    /// Reads up to `limit` events of the run's stream from index `from`, in index order.
    fn read_stream<'a>(
        &'a self,
        run_id: &'a RunId,
        from: u64,
        limit: u32,
    ) -> BoxFuture<'a, Result<Vec<(u64, Value)>, StoreError>>;

    /// The last number `feed` gave out (0 before its first event).
    fn feed_head<'a>(&'a self, feed: &'a str) -> BoxFuture<'a, Result<u64, StoreError>>;

    /// Reads up to `limit` stream events of the runs in `feed`, from number `from` on, in number
    /// order.
    fn read_feed<'a>(
        &'a self,
        feed: &'a str,
        from: u64,
        limit: u32,
    ) -> BoxFuture<'a, Result<Vec<FeedEntry>, StoreError>>;
}

#[cfg(test)]
mod tests {
    use super::DatabaseKind;

    #[test]
    fn a_url_names_its_database_by_scheme_whatever_the_letter_case() {
        for (url, kind) in [
            ("sqlite://resumable.db", Some(DatabaseKind::Sqlite)),
            ("SQLite:relative.db", Some(DatabaseKind::Sqlite)),
            ("sqlite::memory:", Some(DatabaseKind::Sqlite)),
            ("postgres://u:p@host/db", Some(DatabaseKind::Postgres)),
            ("PostgreSQL://host/db", Some(DatabaseKind::Postgres)),
            ("postgres:host/db", None),
            ("mysql://host/db", None),
            ("resumable.db", None),
        ] {
            assert_eq!(DatabaseKind::of_url(url), kind, "{url}");
        }
    }
}
