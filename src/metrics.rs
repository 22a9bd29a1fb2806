//! The service's metrics, each named and recorded in one place, through the `metrics` facade:
//! without a recorder (an embedding application that installs none) they cost next to nothing.
//! `resumable serve` installs a Prometheus recorder and serves `/metrics`
//! ([`crate::server::install_metrics`]).

use std::time::{Duration, SystemTime};

use metrics::{Unit, counter, describe_counter, describe_gauge, describe_histogram, gauge, histogram};

/// Host calls, by function and outcome (`ok`, `error` or `interrupted`).
pub const HOST_CALLS: &str = "resumable_host_calls_total";
/// How long host calls took, by function.
pub const HOST_CALL_SECONDS: &str = "resumable_host_call_seconds";
/// How long a round of a script ran (host calls included), by outcome (`completed`,
/// `interrupted`, `failed`, `error`).
pub const SCRIPT_RUN_SECONDS: &str = "resumable_script_run_seconds";
/// The time from a round's approval request to the decision that settled it, by who decided
/// (`person` or `system`, on expiry).
pub const APPROVAL_WAIT_SECONDS: &str = "resumable_approval_wait_seconds";
/// Failed connector attempts, by function and kind (`transient`, retried; `final`, not).
pub const CONNECTOR_ERRORS: &str = "resumable_connector_errors_total";
/// Database errors, by layer (`engine` or `app`).
pub const STORE_ERRORS: &str = "resumable_store_errors_total";
/// Webhook delivery attempts, by outcome (`delivered`, `failed`, `rejected`, `dropped`).
pub const WEBHOOK_ATTEMPTS: &str = "resumable_webhook_attempts_total";
/// Automations not ended yet, by status (read from the database at scrape time; figures of the
/// whole database, the same on every server sharing it).
pub const AUTOMATIONS: &str = "resumable_automations";
/// Approval rounds waiting for a decision (read from the database at scrape time).
pub const PENDING_APPROVALS: &str = "resumable_pending_approvals";
/// Webhook deliveries not started yet or waiting to retry (read at scrape time).
pub const WEBHOOK_BACKLOG: &str = "resumable_webhook_backlog";
/// Worker processes by state (`busy`, `idle`).
pub const WORKER_PROCESSES: &str = "resumable_worker_processes";
/// Worker processes started.
pub const WORKER_PROCESSES_STARTED: &str = "resumable_worker_processes_started_total";
/// Worker processes stopped, by reason (`killed` during a run, `retired` between runs).
pub const WORKER_PROCESSES_STOPPED: &str = "resumable_worker_processes_stopped_total";
/// Script runs by bytecode cache lookup (`hit`, `miss`).
pub const BYTECODE_CACHE: &str = "resumable_bytecode_cache_total";

/// Registers every metric's description and unit with the installed recorder.
pub fn describe() {
    describe_counter!(HOST_CALLS, "Host calls, by function and outcome.");
    describe_histogram!(HOST_CALL_SECONDS, Unit::Seconds, "How long host calls took, by function.");
    describe_histogram!(SCRIPT_RUN_SECONDS, Unit::Seconds, "How long a round of a script ran, by outcome.");
    describe_histogram!(
        APPROVAL_WAIT_SECONDS,
        Unit::Seconds,
        "Time from an approval request to the decision that settled its round."
    );
    describe_counter!(CONNECTOR_ERRORS, "Failed connector attempts, by function and kind.");
    describe_counter!(STORE_ERRORS, "Database errors, by layer.");
    describe_counter!(WEBHOOK_ATTEMPTS, "Webhook delivery attempts, by outcome.");
    describe_gauge!(AUTOMATIONS, "Automations by status.");
    describe_gauge!(PENDING_APPROVALS, "Approval rounds waiting for a decision.");
    describe_gauge!(WEBHOOK_BACKLOG, "Webhook deliveries not started yet or waiting to retry.");
    describe_gauge!(WORKER_PROCESSES, "Worker processes by state.");
    describe_counter!(WORKER_PROCESSES_STARTED, "Worker processes started.");
    describe_counter!(WORKER_PROCESSES_STOPPED, "Worker processes stopped, by reason.");
    describe_counter!(BYTECODE_CACHE, "Script runs by bytecode cache lookup.");
}

/// A host call of `function` ended after `took`.
pub(crate) fn host_call(function: &str, outcome: &'static str, took: Duration) {
    counter!(HOST_CALLS, "function" => function.to_owned(), "outcome" => outcome).increment(1);
    histogram!(HOST_CALL_SECONDS, "function" => function.to_owned()).record(took);
}

/// A round of a script ran for `took` and ended as `outcome`.
pub(crate) fn script_run(outcome: &'static str, took: Duration) {
    histogram!(SCRIPT_RUN_SECONDS, "outcome" => outcome).record(took);
}

/// A round's requests, asked at `asked_at`, were settled now, by a person or the system.
pub(crate) fn approval_settled(by_system: bool, asked_at: SystemTime) {
    let by = if by_system { "system" } else { "person" };
    let waited = SystemTime::now().duration_since(asked_at).unwrap_or_default();
    histogram!(APPROVAL_WAIT_SECONDS, "decided_by" => by).record(waited);
}

/// An attempt of a connector call of `function` failed; `retried` when another follows.
pub(crate) fn connector_error(function: &str, retried: bool) {
    let kind = if retried { "transient" } else { "final" };
    counter!(CONNECTOR_ERRORS, "function" => function.to_owned(), "kind" => kind).increment(1);
}

/// The database failed a statement of `layer` (`engine` or `app`).
pub(crate) fn store_error(layer: &'static str) {
    counter!(STORE_ERRORS, "layer" => layer).increment(1);
}

/// A webhook delivery attempt ended as `outcome`.
pub(crate) fn webhook_attempt(outcome: &str) {
    counter!(WEBHOOK_ATTEMPTS, "outcome" => outcome.to_owned()).increment(1);
}

/// The figures read from the database at scrape time.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Gauges {
    /// Automations not ended yet, by status.
    pub automations: Vec<(String, u64)>,
    /// Rounds waiting for a decision.
    pub pending_approvals: u64,
    /// Webhook deliveries not started yet or waiting to retry.
    pub webhook_backlog: u64,
}

impl Gauges {
    /// The statuses of automations not ended yet.
    pub const LIVE: [&'static str; 3] = ["pending", "running", "waiting"];

    /// Sets the gauges to these figures.
    pub(crate) fn publish(&self) {
        for status in Gauges::LIVE {
            let n = self.automations.iter().find(|(s, _)| s == status).map_or(0, |(_, n)| *n);
            gauge!(AUTOMATIONS, "status" => status).set(n as f64);
        }
        gauge!(PENDING_APPROVALS).set(self.pending_approvals as f64);
        gauge!(WEBHOOK_BACKLOG).set(self.webhook_backlog as f64);
    }
}

/// Sets the worker-process figures and the runner's counters (which it keeps itself) to `runner`'s.
pub(crate) fn publish_runner(runner: &resumable_runner::RunnerStats) {
    gauge!(WORKER_PROCESSES, "state" => "busy").set(runner.processes_busy as f64);
    gauge!(WORKER_PROCESSES, "state" => "idle").set(runner.processes_idle as f64);
    counter!(WORKER_PROCESSES_STARTED).absolute(runner.processes_started);
    counter!(WORKER_PROCESSES_STOPPED, "reason" => "killed").absolute(runner.processes_killed);
    counter!(WORKER_PROCESSES_STOPPED, "reason" => "retired").absolute(runner.processes_retired);
    counter!(BYTECODE_CACHE, "lookup" => "hit").absolute(runner.bytecode_hits);
    counter!(BYTECODE_CACHE, "lookup" => "miss").absolute(runner.bytecode_misses);
}
