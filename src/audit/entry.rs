//! What an audit entry says before it joins its tenant's chain: its kind, who acted (an actor and,
//! for a caller with an API key, the key's id), the automation or session it is about, its data,
//! and the key that makes appending it again a no-op.

use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use crate::automation::Decision;

/// Who did something: an actor's name and, when they called with an API key, the key's id (a
/// digest prefix, never the key). `"alice".into()` is an actor without a key id.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Actor {
    /// The actor's name (an API key's `actor`, or the server's own name for its decisions).
    pub name: String,
    /// The id of the API key they called with, if any.
    pub key_id: Option<String>,
}

impl Actor {
    /// An actor without a key id.
    pub fn new(name: impl Into<String>) -> Actor {
        Actor { name: name.into(), key_id: None }
    }

    /// The actor, calling with the API key of id `key_id`.
    pub fn with_key_id(mut self, key_id: impl Into<String>) -> Actor {
        self.key_id = Some(key_id.into());
        self
    }
}

impl From<&str> for Actor {
    fn from(name: &str) -> Actor {
        Actor::new(name)
    }
}

impl From<String> for Actor {
    fn from(name: String) -> Actor {
        Actor::new(name)
    }
}

impl From<&Actor> for Actor {
    fn from(actor: &Actor) -> Actor {
        actor.clone()
    }
}

/// What an entry records. Its name ([`AuditKind::as_str`]) is stored, hashed and served, and
/// stays the same across releases.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum AuditKind {
    /// A script submitted as an automation (`submission`).
    Submission,
    /// A decision batch that counted, a person's or the system's (`decision`).
    Decision,
    /// An automation cancelled (`cancel`).
    Cancel,
    /// A connector's request, before it is sent: the digest of its body (`connector_request`).
    ConnectorRequest,
    /// How one of a connector's requests ended: the status and the digest of the response's body,
    /// or why there was none (`connector_response`).
    ConnectorResponse,
    /// A session started (`session_start`).
    SessionStart,
    /// A script queued as a session's command (`session_command`).
    SessionCommand,
    /// A session's running command cancelled (`session_cancel`).
    SessionCancel,
    /// A session destroyed (`session_destroy`).
    SessionDestroy,
}

impl AuditKind {
    /// The stored name.
    pub fn as_str(self) -> &'static str {
        match self {
            AuditKind::Submission => "submission",
            AuditKind::Decision => "decision",
            AuditKind::Cancel => "cancel",
            AuditKind::ConnectorRequest => "connector_request",
            AuditKind::ConnectorResponse => "connector_response",
            AuditKind::SessionStart => "session_start",
            AuditKind::SessionCommand => "session_command",
            AuditKind::SessionCancel => "session_cancel",
            AuditKind::SessionDestroy => "session_destroy",
        }
    }
}

impl std::fmt::Display for AuditKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An entry to append with [`Audit::record`](super::Audit::record); the log adds its tenant,
/// sequence number, time and hashes.
#[derive(Clone, Debug, PartialEq)]
pub struct AuditEntry {
    pub(super) kind: AuditKind,
    pub(super) actor: Actor,
    pub(super) automation: Option<String>,
    pub(super) data: Value,
    pub(super) dedup_key: Option<String>,
}

impl AuditEntry {
    /// An entry of `kind` by `actor` with `data` (a JSON object, by convention camelCase).
    pub fn new(kind: AuditKind, actor: impl Into<Actor>, data: Value) -> AuditEntry {
        AuditEntry { kind, actor: actor.into(), automation: None, data, dedup_key: None }
    }

    /// The entry, about automation (or session) `id`.
    pub fn about(mut self, id: impl Into<String>) -> AuditEntry {
        self.automation = Some(id.into());
        self
    }

    /// The entry, appended at most once per tenant under `key`: a second append with the same
    /// key (a retried step, a repeated request) adds nothing.
    pub fn dedup_key(mut self, key: impl Into<String>) -> AuditEntry {
        self.dedup_key = Some(key.into());
        self
    }

    /// Its kind.
    pub fn kind(&self) -> AuditKind {
        self.kind
    }

    /// Who acted.
    pub fn actor(&self) -> &Actor {
        &self.actor
    }

    /// Its data.
    pub fn data(&self) -> &Value {
        &self.data
    }

    /// `by` submitted `source` as automation `automation` (with the client's idempotency key, if
    /// any): the script's SHA-256 and size, not the script. Once per automation.
    pub fn submission(
        by: impl Into<Actor>,
        automation: &str,
        source: &str,
        idempotency_key: Option<&str>,
    ) -> AuditEntry {
        let mut data = json!({ "sourceSha256": sha256_hex(source.as_bytes()), "sourceBytes": source.len() });
        if let Some(key) = idempotency_key {
            data["idempotencyKey"] = json!(key);
        }
        AuditEntry::new(AuditKind::Submission, by, data).about(automation).dedup_key(format!("submission:{automation}"))
    }

    /// `by` decided `decisions` in round `round` of `automation`: per request its interruption id,
    /// whether it was approved, and the reason. A person's decision through the API, or the
    /// system's own (on expiry, say: give it a [`dedup_key`](Self::dedup_key) when a retried step
    /// may record it again).
    pub fn decision(by: impl Into<Actor>, automation: &str, round: u32, decisions: &[Decision]) -> AuditEntry {
        let decisions: Vec<Value> = decisions
            .iter()
            .map(|d| json!({ "interruptionId": d.interruption_id, "approved": d.approved, "reason": d.reason }))
            .collect();
        AuditEntry::new(AuditKind::Decision, by, json!({ "round": round, "decisions": decisions })).about(automation)
    }

    /// `by` cancelled `automation`, which then had `status`.
    pub fn cancel(by: impl Into<Actor>, automation: &str, status: &str) -> AuditEntry {
        AuditEntry::new(AuditKind::Cancel, by, json!({ "status": status })).about(automation)
    }

    /// `by` started session `session` with these idle and command times (in milliseconds).
    pub fn session_start(by: impl Into<Actor>, session: &str, idle_ms: u64, command_timeout_ms: u64) -> AuditEntry {
        let data = json!({ "idleMs": idle_ms, "commandTimeoutMs": command_timeout_ms });
        AuditEntry::new(AuditKind::SessionStart, by, data).about(session).dedup_key(format!("session-start:{session}"))
    }

    /// `by` queued `source` as command number `command` of session `session`: the script's
    /// SHA-256 and size. Once per command.
    pub fn session_command(by: impl Into<Actor>, session: &str, command: u64, source: &str) -> AuditEntry {
        let data = json!({
            "command": command,
            "sourceSha256": sha256_hex(source.as_bytes()),
            "sourceBytes": source.len(),
        });
        AuditEntry::new(AuditKind::SessionCommand, by, data)
            .about(session)
            .dedup_key(format!("session-command:{session}:{command}"))
    }

    /// `by` cancelled command number `command` of session `session`.
    pub fn session_cancel(by: impl Into<Actor>, session: &str, command: u64) -> AuditEntry {
        AuditEntry::new(AuditKind::SessionCancel, by, json!({ "command": command })).about(session)
    }

    /// `by` destroyed session `session`.
    pub fn session_destroy(by: impl Into<Actor>, session: &str) -> AuditEntry {
        AuditEntry::new(AuditKind::SessionDestroy, by, json!({}))
            .about(session)
            .dedup_key(format!("session-destroy:{session}"))
    }
}

/// The SHA-256 digest of `bytes` in lower-case hex.
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex_simd::encode_to_string(Sha256::digest(bytes), hex_simd::AsciiCase::Lower)
}

pub use resumable_host::canonical_json;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn canonical_json_sorts_keys_at_every_depth() {
        let value = json!({ "b": [{ "z": 1, "a": "x\"y" }], "a": null, "é": true });
        assert_eq!(canonical_json(&value), r#"{"a":null,"b":[{"a":"x\"y","z":1}],"é":true}"#);
        let reparsed: Value = serde_json::from_str(&canonical_json(&value)).unwrap();
        assert_eq!(reparsed, value);
    }

    #[test]
    fn a_submission_records_the_script_digest_not_the_script() {
        let entry = AuditEntry::submission(Actor::new("alice").with_key_id("0123456789ab"), "run_1", "return 1", None);
        assert_eq!(entry.kind().as_str(), "submission");
        assert_eq!(entry.actor().key_id.as_deref(), Some("0123456789ab"));
        assert_eq!(entry.data()["sourceSha256"], sha256_hex(b"return 1"));
        assert!(!entry.data().to_string().contains("return 1"));
        assert_eq!(entry.dedup_key.as_deref(), Some("submission:run_1"));
    }
}
