//! What a connector call leaves in the tenant's audit log: its request before it is sent (the
//! SHA-256 of the body), and how each attempt ended (the status and the SHA-256 of the response's
//! body, or why there was no response).
//!
//! * The request's entry is written before anything is sent (tried three times over half a second
//!   while the database fails), and nothing is sent when it cannot be: no effect without its
//!   record. It is written once per call and body (its dedup key is the
//!   call's idempotency key and the body's digest), so a step retried after a crash, which sends
//!   the same request under the same key, adds nothing.
//! * Each attempt's outcome is written after it, once per distinct outcome of the call (the dedup
//!   key digests the request, the status, and the response's digest or the error): a 503 then a
//!   200 are two entries; the same 200 again, when a retried step repeats the call and the
//!   application answers it from its idempotency record, adds nothing. An outcome that cannot be
//!   written is logged, and the call goes on: the request's entry already says it was sent.

use std::time::Duration;

use resumable_host::{HostCallContext, HostError};
use serde_json::{Value, json};

use super::CallScope;
use crate::audit::{Actor, Audit, AuditEntry, AuditError, AuditKind, sha256_hex};

/// The actor of a call whose automation names no submitter.
const UNKNOWN_ACTOR: &str = "unknown";

/// How often an entry is tried while the database fails.
const WRITE_ATTEMPTS: u32 = 3;
/// The wait before the second try; it is 4 times longer before each next one.
const WRITE_RETRY: Duration = Duration::from_millis(100);

/// How one attempt of a request ended, as far as the log is concerned.
#[derive(Clone, Copy, Debug)]
pub(super) enum Outcome<'a> {
    /// The service answered `status`, with its `body`, or why the body could not be read whole.
    Response { status: u16, body: Result<&'a [u8], &'a str> },
    /// No answer (timeout, connection refused, a broken response): why.
    NoResponse(&'a str),
}

/// The audit entries of one connector call.
#[derive(Clone, Debug)]
pub(super) struct ExchangeLog {
    audit: Audit,
    tenant: String,
    actor: String,
    automation: String,
    function: String,
    call: u32,
    key: String,
    request_sha256: String,
    request_bytes: usize,
}

impl ExchangeLog {
    /// The log of a call of `function` with the request `body`, for the scope's tenant on behalf
    /// of the automation's submitter.
    pub(super) fn new(
        audit: Audit,
        scope: &CallScope,
        function: &str,
        ctx: &HostCallContext,
        body: &[u8],
    ) -> ExchangeLog {
        ExchangeLog {
            audit,
            tenant: scope.tenant.clone(),
            actor: scope.actor.clone(),
            automation: ctx.logical_run_id().to_owned(),
            function: function.to_owned(),
            call: ctx.index(),
            key: ctx.idempotency_key(),
            request_sha256: sha256_hex(body),
            request_bytes: body.len(),
        }
    }

    /// Records the request before it is sent; the error the script gets when it cannot be (then
    /// nothing is sent).
    pub(super) async fn request(&self) -> Result<(), HostError> {
        let data = json!({
            "function": self.function,
            "call": self.call,
            "idempotencyKey": self.key,
            "requestSha256": self.request_sha256,
            "requestBytes": self.request_bytes,
        });
        let entry = self.entry(AuditKind::ConnectorRequest, data, &self.request_sha256);
        match self.write(entry).await {
            Ok(()) => Ok(()),
            Err(e) => {
                let function = self.function.as_str();
                tracing::error!(function, error = %e, "a connector request was not sent: its audit entry failed");
                Err(HostError::new(format!(
                    "{}: the request was not sent: its audit entry could not be written",
                    self.function
                ))
                .with_details(json!({ "code": "CONNECTOR_AUDIT_UNAVAILABLE" })))
            }
        }
    }

    /// Records how attempt number `attempt` ended; a failure to do so is logged.
    pub(super) async fn outcome(&self, attempt: u32, outcome: Outcome<'_>) {
        let (status, response_sha256, response_bytes, error) = match outcome {
            Outcome::Response { status, body: Ok(body) } => {
                (Some(status), Some(sha256_hex(body)), Some(body.len()), None)
            }
            Outcome::Response { status, body: Err(why) } => (Some(status), None, None, Some(why)),
            Outcome::NoResponse(why) => (None, None, None, Some(why)),
        };
        let data = json!({
            "function": self.function,
            "call": self.call,
            "idempotencyKey": self.key,
            "attempt": attempt,
            "requestSha256": self.request_sha256,
            "status": status,
            "responseSha256": response_sha256,
            "responseBytes": response_bytes,
            "error": error,
        });
        let distinct = sha256_hex(json!([self.request_sha256, status, response_sha256, error]).to_string().as_bytes());
        let entry = self.entry(AuditKind::ConnectorResponse, data, &distinct);
        if let Err(e) = self.write(entry).await {
            let function = self.function.as_str();
            tracing::error!(function, attempt, error = %e, "a connector response's audit entry could not be written");
        }
    }

    /// Appends `entry`, trying again twice (after 100 ms, then 400 ms) while the database fails.
    async fn write(&self, entry: AuditEntry) -> Result<(), AuditError> {
        let mut wait = WRITE_RETRY;
        for _ in 1..WRITE_ATTEMPTS {
            match self.audit.record(&self.tenant, entry.clone()).await {
                Err(AuditError::Unavailable(e)) => {
                    tracing::warn!(function = %self.function, error = %e, "writing a connector's audit entry again");
                    tokio::time::sleep(wait).await;
                    wait *= 4;
                }
                done => return done.map(drop),
            }
        }
        self.audit.record(&self.tenant, entry).await.map(drop)
    }

    /// An entry of `kind` about this call, appended once per `distinct` value.
    fn entry(&self, kind: AuditKind, data: Value, distinct: &str) -> AuditEntry {
        let prefix = match kind {
            AuditKind::ConnectorRequest => "connector-request",
            _ => "connector-response",
        };
        // Automations submitted before submitters were recorded have none.
        let actor = if self.actor.is_empty() { UNKNOWN_ACTOR } else { self.actor.as_str() };
        AuditEntry::new(kind, Actor::new(actor), data)
            .about(self.automation.as_str())
            .dedup_key(format!("{prefix}:{}", sha256_hex(format!("{}\n{distinct}", self.key).as_bytes())))
    }
}
