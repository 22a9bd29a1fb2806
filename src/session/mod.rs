//! Sessions: long-lived, durable owners of a sequence of commands.
//!
//! A session is a run of the workflow [`WORKFLOW`]. Each command is a script that runs in a fresh
//! realm as a child automation of the session (so it may ask for approval like any automation),
//! one after the other, sharing the session's durable key–value state through `session.get`,
//! `session.set`, `session.delete` and `session.keys`. Between commands the session holds no
//! memory: it waits on its hook raced against an idle timer and records `hibernated` when the
//! timer wins. It survives restarts and ends only when destroyed.
//!
//! The session's stream carries `created`, `status` (`active`, `hibernated`, `resuming`,
//! `destroyed`), `command_start`, `command_output` and `command_end` events.

mod event;
mod history;
mod state;
mod workflow;

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use resumable_workflow::{Engine, EngineError, RunId, RunInfo, RunStatus, StartOptions, StreamReader};
use serde::Serialize;
use serde_json::{Value, json};

pub use event::SessionEvent;
pub use history::{SessionSummary, SessionsShown};
pub use state::{MAX_KEY_BYTES, MAX_KEYS, MAX_STATE_BYTES, MAX_VALUE_BYTES, STATE_LIMIT_CODE, SessionState};
pub use workflow::{SessionInput, SessionMessage, WORKFLOW};

pub(crate) use workflow::{Deps, run_session};

use crate::audit::{Actor, Audit, AuditEntry};
use crate::automation::HookTokens;
use crate::automation::{Quotas, quotas_below as below};

/// The events read per page when a session's history is summarized.
const PAGE: u32 = 1_000;
/// The most commands one session takes.
pub const MAX_COMMANDS: u64 = 1_000;
/// The most bytes of command sources one session takes, all commands together.
pub const MAX_SOURCE_BYTES: usize = 16 * 1024 * 1024;
/// How long a command waits for a new session's first execution to create its hook.
const HOOK_WAIT: Duration = Duration::from_secs(10);

/// How a session is set up; each value is validated by [`SessionOptions::validate`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SessionOptions {
    /// How long the session waits for a command before it records `hibernated`.
    pub idle: Duration,
    /// The time cap of each command.
    pub command_timeout: Duration,
}

impl SessionOptions {
    /// The shortest idle time.
    pub const MIN_IDLE: Duration = Duration::from_millis(100);
    /// The longest idle time.
    pub const MAX_IDLE: Duration = Duration::from_secs(7 * 24 * 60 * 60);
    /// The longest command time cap.
    pub const MAX_COMMAND_TIMEOUT: Duration = Duration::from_secs(24 * 60 * 60);

    /// Refuses values outside their ranges, naming the value.
    pub fn validate(&self) -> Result<(), SessionError> {
        if self.idle < Self::MIN_IDLE || self.idle > Self::MAX_IDLE {
            return Err(SessionError::Invalid(format!(
                "idleMs must be between {} and {}",
                Self::MIN_IDLE.as_millis(),
                Self::MAX_IDLE.as_millis()
            )));
        }
        if self.command_timeout.is_zero() || self.command_timeout > Self::MAX_COMMAND_TIMEOUT {
            return Err(SessionError::Invalid(format!(
                "commandTimeoutMs must be between 1 and {}",
                Self::MAX_COMMAND_TIMEOUT.as_millis()
            )));
        }
        Ok(())
    }
}

impl Default for SessionOptions {
    /// Five minutes idle before hibernating; 30 seconds per command.
    fn default() -> Self {
        SessionOptions { idle: Duration::from_secs(300), command_timeout: Duration::from_secs(30) }
    }
}

/// Why a session request failed.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum SessionError {
    /// The session ended, or the caller's tenant has no session with this id.
    Gone {
        /// The id asked for.
        id: String,
        /// `destroyed`, `ended` (failed or cancelled) or `unknown`.
        status: &'static str,
    },
    /// The request is invalid (options, source).
    Invalid(String),
    /// No command of the session is running.
    NotRunning,
    /// The session took all the commands it can; start a new one.
    Full(String),
    /// Our fault.
    Internal(String),
    /// The act was done, but its audit entry could not be written (`AUDIT_UNAVAILABLE`).
    Audit(String),
    /// The tenant has as many live sessions as its quota allows (`QUOTA_EXCEEDED`).
    QuotaExceeded(String),
}

impl fmt::Display for SessionError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SessionError::Gone { id, status: "unknown" } => write!(f, "there is no session {id}"),
            SessionError::Gone { id, status } => write!(f, "session {id} has ended ({status})"),
            SessionError::Invalid(message) | SessionError::Full(message) | SessionError::QuotaExceeded(message) => {
                f.write_str(message)
            }
            SessionError::NotRunning => f.write_str("no command of this session is running"),
            SessionError::Internal(message) => write!(f, "internal error: {message}"),
            SessionError::Audit(message) => write!(f, "done, but not recorded in the audit log: {message}"),
        }
    }
}

impl std::error::Error for SessionError {}

impl From<EngineError> for SessionError {
    fn from(e: EngineError) -> Self {
        SessionError::Internal(e.to_string())
    }
}

impl From<crate::db::DbError> for SessionError {
    fn from(e: crate::db::DbError) -> Self {
        SessionError::Internal(e.to_string())
    }
}

/// A session as its tenant sees it.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SessionView {
    /// Its id.
    pub id: RunId,
    /// `active`, `hibernated`, `resuming`, `destroyed` or `ended`.
    pub status: String,
    /// Who started it.
    pub created_by: String,
    /// Commands taken up so far (started or skipped; queued ones are not counted yet).
    pub commands: u64,
    /// Commands that ended (completed, failed, cancelled or skipped).
    pub commands_ended: u64,
    /// The command running now and its automation: `{command, automation}`.
    pub running: Option<Value>,
    /// The idle time before hibernating, in milliseconds.
    pub idle_ms: u64,
    /// The time cap of each command, in milliseconds.
    pub command_timeout_ms: u64,
}

/// The session service; get it from [`Automations::sessions`](crate::automation::Automations::sessions).
#[derive(Clone, Debug)]
pub struct Sessions {
    engine: Engine,
    tokens: HookTokens,
    state: SessionState,
    policy_version: String,
    audit: Audit,
    quotas: Quotas,
}

impl Sessions {
    pub(crate) fn new(
        engine: Engine,
        tokens: HookTokens,
        state: SessionState,
        policy_version: String,
        audit: Audit,
        quotas: Quotas,
    ) -> Sessions {
        Sessions { engine, tokens, state, policy_version, audit, quotas }
    }

    /// Appends `entry` to the audit log of `tenant`, after the act it records succeeded.
    async fn record(&self, tenant: &str, entry: AuditEntry) -> Result<(), SessionError> {
        match self.audit.record(tenant, entry).await {
            Ok(_) => Ok(()),
            Err(e) => {
                tracing::error!(tenant, error = %e, "a session's act was done but its audit entry failed");
                Err(SessionError::Audit(e.to_string()))
            }
        }
    }

    /// What the session workflow needs, on the engine's `store`.
    pub(crate) fn deps(
        state: SessionState,
        tokens: HookTokens,
        store: Arc<dyn resumable_workflow::Store>,
    ) -> Arc<Deps> {
        Arc::new(Deps { state, tokens, store })
    }

    /// Starts a session for `tenant`; returns its id. The start is recorded in the tenant's
    /// audit log (as every act below that succeeds); if it cannot be, the answer is
    /// [`SessionError::Audit`].
    pub async fn start(
        &self,
        tenant: &str,
        actor: impl Into<Actor>,
        options: SessionOptions,
    ) -> Result<RunId, SessionError> {
        options.validate()?;
        if let Some(max) = self.quotas.of(tenant).max_sessions
            && let Err(live) = below(&self.engine, tenant, WORKFLOW, max).await?
        {
            return Err(SessionError::QuotaExceeded(format!(
                "tenant {tenant} has {live} live sessions, its quota is {max}: destroy one first"
            )));
        }
        let by = actor.into();
        let input = SessionInput {
            tenant: tenant.to_owned(),
            created_by: by.name.clone(),
            idle_ms: u64::try_from(options.idle.as_millis()).unwrap_or(u64::MAX),
            command_timeout_ms: u64::try_from(options.command_timeout.as_millis()).unwrap_or(u64::MAX),
            policy_version: self.policy_version.clone(),
        };
        let (idle_ms, command_timeout_ms) = (input.idle_ms, input.command_timeout_ms);
        let input = serde_json::to_value(&input).map_err(|e| SessionError::Internal(e.to_string()))?;
        let id = self.engine.start(WORKFLOW, input, StartOptions::default().in_feed(tenant)).await?;
        self.record(tenant, AuditEntry::session_start(by, id.as_str(), idle_ms, command_timeout_ms)).await?;
        Ok(id)
    }

    /// Queues `source` as the session's next command; returns its number (1 for the first).
    /// A session takes at most [`MAX_COMMANDS`] commands and [`MAX_SOURCE_BYTES`] of sources:
    /// every wake-up replays its history, so a longer one belongs in a new session.
    pub async fn command(
        &self,
        tenant: &str,
        id: &RunId,
        source: &str,
        actor: impl Into<Actor>,
    ) -> Result<u64, SessionError> {
        let by = actor.into();
        self.live(tenant, id).await?;
        if !self.state.take_command(id.as_str(), source.len(), MAX_COMMANDS, MAX_SOURCE_BYTES).await? {
            return Err(SessionError::Full(format!(
                "a session takes at most {MAX_COMMANDS} commands and {MAX_SOURCE_BYTES} bytes of sources; \
                 start a new session"
            )));
        }
        let message = SessionMessage::Command { source: source.to_owned(), submitted_by: by.name.clone() };
        let number = self.deliver(id, &message).await? + 1;
        // A destroy that came in meanwhile skips this command (or ends the session before it).
        if self.state.end_requested_by(id.as_str()).await?.is_some() {
            return Err(SessionError::Gone { id: id.to_string(), status: "destroyed" });
        }
        self.record(tenant, AuditEntry::session_command(by, id.as_str(), number, source)).await?;
        Ok(number)
    }

    /// Ends the session: commands queued before are skipped, the running one is cancelled, its
    /// state is deleted, and it records `destroyed`.
    pub async fn destroy(&self, tenant: &str, id: &RunId, actor: impl Into<Actor>) -> Result<(), SessionError> {
        let by = actor.into();
        self.live(tenant, id).await?;
        self.state.request_end(id.as_str(), &by.name).await?;
        if let Some((_, automation)) = Summary::read(&self.engine, id).await?.running {
            self.engine.cancel(&automation).await?;
        }
        self.deliver(id, &SessionMessage::Destroy { by: by.name.clone() }).await?;
        self.record(tenant, AuditEntry::session_destroy(by, id.as_str())).await?;
        Ok(())
    }

    /// Cancels the running command for `by` (it ends with `RUN_ABORTED`); returns its number.
    pub async fn cancel_command(&self, tenant: &str, id: &RunId, by: impl Into<Actor>) -> Result<u64, SessionError> {
        self.live(tenant, id).await?;
        let (command, automation) = Summary::read(&self.engine, id).await?.running.ok_or(SessionError::NotRunning)?;
        match self.engine.cancel(&automation).await? {
            RunStatus::Cancelled => {
                self.record(tenant, AuditEntry::session_cancel(by, id.as_str(), command)).await?;
                Ok(command)
            }
            _ => Err(SessionError::NotRunning),
        }
    }

    /// The live session `id` of `tenant`.
    pub async fn get(&self, tenant: &str, id: &RunId) -> Result<SessionView, SessionError> {
        let (run, input) = self.live(tenant, id).await?;
        Ok(Summary::read(&self.engine, id).await?.view(run, input))
    }

    /// Session `id` of `tenant`, live or ended, with its first `max_events` events (the inbox's
    /// session page); [`SessionError::Gone`] (`unknown`) for another tenant's or none.
    pub async fn inspect(
        &self,
        tenant: &str,
        id: &RunId,
        max_events: u32,
    ) -> Result<(SessionView, bool, Vec<(u64, Value)>), SessionError> {
        let (run, input) = self.owned(tenant, id).await?;
        let mut summary = Summary::read(&self.engine, id).await?;
        if run.status.is_terminal() && summary.status != "destroyed" {
            summary.status = "ended".into();
        }
        let events = self.engine.store().read_stream(id, 0, max_events).await.map_err(EngineError::from)?;
        let live = !run.status.is_terminal();
        Ok((summary.view(run, input), live, events))
    }

    /// The events of live session `id` from index `from`: its history, then each new event until
    /// it ends (a reader following it sees `destroyed` last).
    pub async fn events(&self, tenant: &str, id: &RunId, from: u64) -> Result<StreamReader, SessionError> {
        self.live(tenant, id).await?;
        Ok(self.engine.read_stream(id, from).await?)
    }

    /// The run of session `id` and its input when `tenant` owns it; [`SessionError::Gone`]
    /// (`unknown`) otherwise.
    async fn owned(&self, tenant: &str, id: &RunId) -> Result<(RunInfo, SessionInput), SessionError> {
        let unknown = || SessionError::Gone { id: id.to_string(), status: "unknown" };
        let run = match self.engine.get_run(id).await {
            Ok(run) => run,
            Err(EngineError::RunNotFound(_)) => return Err(unknown()),
            Err(e) => return Err(e.into()),
        };
        match (run.workflow.as_str(), serde_json::from_value::<SessionInput>(run.input.clone())) {
            (WORKFLOW, Ok(input)) if input.tenant == tenant => Ok((run, input)),
            _ => Err(unknown()),
        }
    }

    /// Like [`owned`](Sessions::owned), and [`SessionError::Gone`] once the session ended or its
    /// end was requested.
    async fn live(&self, tenant: &str, id: &RunId) -> Result<(RunInfo, SessionInput), SessionError> {
        let (run, input) = self.owned(tenant, id).await?;
        let gone = |status| SessionError::Gone { id: id.to_string(), status };
        match run.status {
            RunStatus::Completed => Err(gone("destroyed")),
            s if s.is_terminal() => Err(gone("ended")),
            _ if self.state.end_requested_by(id.as_str()).await?.is_some() => Err(gone("destroyed")),
            _ => Ok((run, input)),
        }
    }

    /// Delivers `message` to the session's hook; its index among the hook's messages.
    async fn deliver(&self, id: &RunId, message: &SessionMessage) -> Result<u64, SessionError> {
        let payload = serde_json::to_value(message).map_err(|e| SessionError::Internal(e.to_string()))?;
        let token = self.tokens.for_session(id.as_str());
        let mut pause = Duration::from_millis(2);
        let started = tokio::time::Instant::now();
        loop {
            match self.engine.resume_hook(&token, payload.clone()).await {
                Ok(receipt) => return Ok(receipt.index),
                // The hook is created by the session's first execution, and disposed when it ends.
                Err(EngineError::HookNotFound) => match self.engine.get_run(id).await?.status {
                    RunStatus::Completed => return Err(SessionError::Gone { id: id.to_string(), status: "destroyed" }),
                    s if s.is_terminal() => return Err(SessionError::Gone { id: id.to_string(), status: "ended" }),
                    _ if started.elapsed() > HOOK_WAIT => {
                        return Err(SessionError::Internal("the session has not started within 10 s".into()));
                    }
                    _ => {
                        tokio::time::sleep(pause).await;
                        pause = (pause * 2).min(Duration::from_millis(100));
                    }
                },
                Err(e) => return Err(e.into()),
            }
        }
    }
}

/// What a session's events say about it.
#[derive(Debug, Default)]
struct Summary {
    status: String,
    started: u64,
    skipped: u64,
    ended: u64,
    running: Option<(u64, RunId)>,
}

impl Summary {
    async fn read(engine: &Engine, id: &RunId) -> Result<Summary, SessionError> {
        let mut summary = Summary { status: "active".into(), ..Summary::default() };
        let mut from = 0;
        loop {
            let page = engine.store().read_stream(id, from, PAGE).await.map_err(EngineError::from)?;
            let Some((last, _)) = page.last() else { break };
            from = last + 1;
            for (_, event) in &page {
                summary.apply(event);
            }
            if page.len() < PAGE as usize {
                break;
            }
        }
        Ok(summary)
    }

    /// The view of session `run`, started with `input`, that this summarizes.
    fn view(self, run: RunInfo, input: SessionInput) -> SessionView {
        SessionView {
            id: run.id,
            status: self.status,
            created_by: input.created_by,
            commands: self.started + self.skipped,
            commands_ended: self.ended,
            running: self.running.map(|(command, automation)| json!({ "command": command, "automation": automation })),
            idle_ms: input.idle_ms,
            command_timeout_ms: input.command_timeout_ms,
        }
    }

    fn apply(&mut self, event: &Value) {
        // Events this build does not know (a newer release's) change nothing.
        let Ok(event) = serde_json::from_value::<SessionEvent>(event.clone()) else { return };
        match event {
            SessionEvent::Status { status, .. } => self.status = status,
            SessionEvent::CommandStart { command, automation, .. } => {
                self.started += 1;
                self.running = Some((command, RunId::from(automation)));
            }
            SessionEvent::CommandEnd { command, status, .. } => {
                self.ended += 1;
                if status == "skipped" {
                    self.skipped += 1;
                }
                if self.running.as_ref().is_some_and(|(running, _)| *running == command) {
                    self.running = None;
                }
            }
            _ => {}
        }
    }
}
