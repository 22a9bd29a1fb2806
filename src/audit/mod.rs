//! The audit trail: per tenant, an append-only chain of what was done and by whom.
//!
//! Each entry records one act: a submission, a decision, a cancel, a session's start, command,
//! cancel or destroy, or a connector's request and its outcome (as SHA-256 digests of the bodies,
//! never the bodies). Entries of a tenant are numbered from 1 without gaps, and each one's hash
//! covers the hash of the one before it and its own fields ([`chain`]), so a changed, removed or
//! inserted entry is found by [`Audit::verify`] (`resumable audit verify`).
//!
//! Appends of one tenant take turns through the tenant's head row, locked in the append's
//! transaction, so any number of servers on one PostgreSQL database append to one chain that
//! never forks. An entry with a dedup key ([`AuditEntry::dedup_key`]) is appended once per tenant:
//! a step retried after a crash, or a request repeated by its client, adds nothing.
//!
//! [`Audit`] is reachable from the automations ([`crate::automation::Automations::audit`]) and
//! from their workflow, so that the system's own acts (decisions on expiry) can be recorded too.

pub mod chain;
mod entry;
mod store;
mod verify;

use serde::Serialize;
use serde_json::Value;

use crate::db::{AppDb, DbError};

pub use entry::{Actor, AuditEntry, AuditKind, canonical_json, sha256_hex};
pub use verify::{Broken, ChainReport, Problem};

/// The longest tenant, actor or automation id an entry takes, in bytes.
pub const MAX_NAME_BYTES: usize = 256;
/// The longest key id, in bytes.
pub const MAX_KEY_ID_BYTES: usize = 64;
/// The longest dedup key, in bytes.
pub const MAX_DEDUP_KEY_BYTES: usize = 512;
/// The largest data of one entry, as canonical JSON.
pub const MAX_DATA_BYTES: usize = 1024 * 1024;
/// The most entries one [`Audit::page`] returns.
pub const MAX_PAGE: usize = 1_000;

/// Why the audit log refused or failed an operation.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AuditError {
    /// The entry cannot be recorded as it is (an empty or overlong field): `AUDIT_INVALID_ENTRY`.
    #[error("invalid audit entry: {0}")]
    Invalid(String),
    /// The database failed: `AUDIT_UNAVAILABLE`.
    #[error("the audit log is unavailable: {0}")]
    Unavailable(#[from] DbError),
}

impl AuditError {
    /// The stable code.
    pub fn code(&self) -> &'static str {
        match self {
            AuditError::Invalid(_) => "AUDIT_INVALID_ENTRY",
            AuditError::Unavailable(_) => "AUDIT_UNAVAILABLE",
        }
    }
}

/// How [`Audit::record`] ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Recorded {
    /// The entry was appended as number `seq` of its tenant's chain.
    Appended {
        /// Its number.
        seq: u64,
        /// Its hash.
        hash: [u8; 32],
    },
    /// The tenant has an entry with the same dedup key already; nothing was appended.
    AlreadyRecorded,
}

/// One entry of a tenant's chain, as stored (and served by `GET /v1/audit`).
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct AuditRecord {
    /// Its number in the tenant's chain, from 1.
    pub seq: u64,
    /// When it was appended, in milliseconds since the Unix epoch.
    pub time: i64,
    /// What it records ([`AuditKind::as_str`]).
    pub kind: String,
    /// Who acted.
    pub actor: String,
    /// The id of their API key, if any.
    pub key_id: Option<String>,
    /// The automation (or session) it is about, if any.
    pub automation: Option<String>,
    /// Its data (stored and hashed as [`canonical_json`]); `null` if the stored text is not JSON.
    pub data: Value,
    /// The previous entry's hash, in hex (64 zeros for entry 1).
    pub prev_hash: String,
    /// Its hash, in hex ([`chain::entry_hash`]).
    pub hash: String,
}

/// A page of a tenant's chain.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct AuditPage {
    /// The entries, in order.
    pub entries: Vec<AuditRecord>,
    /// Where the next page starts: the number after the last entry returned (or `from` when
    /// none was). Reading from it later returns the entries appended meanwhile.
    pub next: u64,
    /// The number of the tenant's last entry (0 when it has none).
    pub head_seq: u64,
    /// The hash of the tenant's last entry, in hex (64 zeros when it has none).
    pub head_hash: String,
}

/// The audit log on the application database. Clones share the database.
#[derive(Clone, Debug)]
pub struct Audit {
    db: AppDb,
}

impl Audit {
    /// The audit log on `db` (whose migrations create its tables).
    pub fn new(db: AppDb) -> Audit {
        Audit { db }
    }

    /// Appends `entry` to the chain of `tenant`. With a dedup key the tenant used already, it
    /// appends nothing and answers [`Recorded::AlreadyRecorded`].
    pub async fn record(&self, tenant: &str, entry: AuditEntry) -> Result<Recorded, AuditError> {
        let data = canonical_json(&entry.data);
        check_len("tenant", tenant, 1, MAX_NAME_BYTES)?;
        check_len("actor", &entry.actor.name, 1, MAX_NAME_BYTES)?;
        if let Some(key_id) = &entry.actor.key_id {
            check_len("key id", key_id, 1, MAX_KEY_ID_BYTES)?;
        }
        if let Some(automation) = &entry.automation {
            check_len("automation", automation, 1, MAX_NAME_BYTES)?;
        }
        if let Some(key) = &entry.dedup_key {
            check_len("dedup key", key, 1, MAX_DEDUP_KEY_BYTES)?;
        }
        check_len("data", &data, 2, MAX_DATA_BYTES)?;
        let new = store::NewEntry {
            tenant: tenant.to_owned(),
            kind: entry.kind.as_str(),
            actor: entry.actor.name,
            key_id: entry.actor.key_id,
            automation: entry.automation,
            data,
            dedup_key: entry.dedup_key,
        };
        Ok(match store::append(&self.db, new).await? {
            store::Appended::Entry { seq, hash, .. } => {
                Recorded::Appended { seq: u64::try_from(seq).unwrap_or_default(), hash }
            }
            store::Appended::Duplicate => Recorded::AlreadyRecorded,
        })
    }

    /// At most `limit` (1 to [`MAX_PAGE`]) entries of `tenant` from number `from` on, in order,
    /// with the tenant's head.
    pub async fn page(&self, tenant: &str, from: u64, limit: usize) -> Result<AuditPage, AuditError> {
        let from = i64::try_from(from.max(1)).unwrap_or(i64::MAX);
        let limit = i64::try_from(limit.clamp(1, MAX_PAGE)).unwrap_or(1);
        // The head first: the entries read after it reach at least as far.
        let head = store::head(&self.db, tenant).await?;
        let stored = store::entries(&self.db, tenant, from, limit).await?;
        let next = stored.last().map_or(from, |e| e.seq.saturating_add(1));
        let entries = stored.into_iter().map(record_of).collect();
        let (head_seq, head_hash) = head.map_or((0, verify::hex(&chain::GENESIS)), |h| (h.seq, verify::hex(&h.hash)));
        Ok(AuditPage {
            entries,
            next: u64::try_from(next).unwrap_or_default(),
            head_seq: u64::try_from(head_seq).unwrap_or_default(),
            head_hash,
        })
    }

    /// Verifies the chain of `tenant`, or of every tenant that has one, in tenant order.
    pub async fn verify(&self, tenant: Option<&str>) -> Result<Vec<ChainReport>, AuditError> {
        let tenants = match tenant {
            Some(tenant) => vec![tenant.to_owned()],
            None => store::tenants(&self.db).await?,
        };
        let mut reports = Vec::with_capacity(tenants.len());
        for tenant in &tenants {
            reports.push(verify::verify_tenant(&self.db, tenant).await?);
        }
        Ok(reports)
    }
}

/// Refuses `value` unless it has `min` to `max` bytes.
fn check_len(what: &str, value: &str, min: usize, max: usize) -> Result<(), AuditError> {
    if value.len() < min || value.len() > max {
        return Err(AuditError::Invalid(format!("the {what} must have {min} to {max} bytes, not {}", value.len())));
    }
    Ok(())
}

fn record_of(entry: store::StoredEntry) -> AuditRecord {
    let data = serde_json::from_str(&entry.data).unwrap_or_else(|_| {
        tracing::warn!(seq = entry.seq, "an audit entry's data is not JSON: run `resumable audit verify`");
        Value::Null
    });
    AuditRecord {
        seq: u64::try_from(entry.seq).unwrap_or_default(),
        time: entry.time_ms,
        prev_hash: verify::hex(&entry.prev_hash),
        hash: verify::hex(&entry.hash),
        kind: entry.kind,
        actor: entry.actor,
        key_id: entry.key_id,
        automation: entry.automation,
        data,
    }
}

#[cfg(test)]
mod tests;
