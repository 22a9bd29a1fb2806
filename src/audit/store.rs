//! The audit log's tables (`migrations/app/*/0005_audit.sql`): appending an entry to its tenant's
//! chain, one tenant's turn at a time, and reading entries and heads back.

use std::sync::{Arc, Mutex};

use crate::db::{AppDb, DbError, Guard, Param, Row, Step, TxOutcome, now_ms};

use super::chain::{ChainedFields, GENESIS, entry_hash};

/// Takes the tenant's turn: creates its head row if it has none, and locks it (on PostgreSQL the
/// upsert holds the row's lock until the append commits, and reads the row as the last append
/// left it; on SQLite the store's one writer runs the whole append). Returns the head.
const LOCK_HEAD: &str = "INSERT INTO audit_heads (tenant, seq, hash) VALUES ($1, 0, $2)
     ON CONFLICT (tenant) DO UPDATE SET seq = audit_heads.seq
     RETURNING seq, hash";

/// Appends the entry unless the tenant has one with the same dedup key.
const INSERT_ENTRY: &str = "INSERT INTO audit_entries
     (tenant, seq, time_ms, kind, actor, key_id, automation, data, dedup_key, prev_hash, hash)
     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)
     ON CONFLICT (tenant, dedup_key) DO NOTHING";

/// Moves the head to the new entry (from the head the append read).
const MOVE_HEAD: &str = "UPDATE audit_heads SET seq = $2, hash = $3 WHERE tenant = $1 AND seq = $4";

/// The refusal of an append whose dedup key the tenant has used.
const DUPLICATE: &str = "duplicate";

/// At most `$3` entries of tenant `$1` from number `$2` on, in order.
const ENTRIES: &str = "SELECT seq, time_ms, kind, actor, key_id, automation, data, prev_hash, hash
     FROM audit_entries WHERE tenant = $1 AND seq >= $2 ORDER BY seq LIMIT $3";

/// What an append stores: everything but the tenant's position in its chain, which the append
/// finds under the tenant's lock.
#[derive(Clone, Debug)]
pub(super) struct NewEntry {
    pub(super) tenant: String,
    pub(super) kind: &'static str,
    pub(super) actor: String,
    pub(super) key_id: Option<String>,
    pub(super) automation: Option<String>,
    pub(super) data: String,
    pub(super) dedup_key: Option<String>,
}

/// An entry as stored.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct StoredEntry {
    pub(super) seq: i64,
    pub(super) time_ms: i64,
    pub(super) kind: String,
    pub(super) actor: String,
    pub(super) key_id: Option<String>,
    pub(super) automation: Option<String>,
    pub(super) data: String,
    pub(super) prev_hash: Vec<u8>,
    pub(super) hash: Vec<u8>,
}

impl StoredEntry {
    fn of(row: &Row) -> Result<StoredEntry, DbError> {
        Ok(StoredEntry {
            seq: row.get("seq")?,
            time_ms: row.get("time_ms")?,
            kind: row.get("kind")?,
            actor: row.get("actor")?,
            key_id: row.get("key_id")?,
            automation: row.get("automation")?,
            data: row.get("data")?,
            prev_hash: row.get("prev_hash")?,
            hash: row.get("hash")?,
        })
    }

    /// The fields its hash covers, in the chain of `tenant`.
    pub(super) fn fields<'a>(&'a self, tenant: &'a str) -> ChainedFields<'a> {
        ChainedFields {
            tenant,
            seq: self.seq,
            time_ms: self.time_ms,
            kind: &self.kind,
            actor: &self.actor,
            key_id: self.key_id.as_deref(),
            automation: self.automation.as_deref(),
            data: &self.data,
        }
    }
}

/// A tenant's head as stored: the seq and hash of its last entry (0 and zeros before the first).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct StoredHead {
    pub(super) seq: i64,
    pub(super) hash: Vec<u8>,
}

/// How an append ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Appended {
    /// The entry is number `seq` of its tenant's chain, with this hash and time.
    Entry { seq: i64, hash: [u8; 32], time_ms: i64 },
    /// The tenant had an entry with this dedup key; nothing changed.
    Duplicate,
}

/// Appends `entry` to its tenant's chain in one transaction: lock the head, insert the entry
/// after it, move the head.
pub(super) async fn append(db: &AppDb, entry: NewEntry) -> Result<Appended, DbError> {
    let appended = Arc::new(Mutex::new(None));
    let slot = Arc::clone(&appended);
    let tenant = entry.tenant.clone();
    let outcome = db
        .read_then_write(LOCK_HEAD, vec![tenant.into(), GENESIS.to_vec().into()], move |rows| {
            let row = rows.first().ok_or_else(|| DbError::Row("the audit head upsert returned no row".into()))?;
            let head_seq: i64 = row.get("seq")?;
            let prev: [u8; 32] = row
                .get::<Vec<u8>>("hash")?
                .try_into()
                .map_err(|_| DbError::Row("the audit head's hash is not 32 bytes".into()))?;
            let seq = head_seq + 1;
            let time_ms = now_ms();
            let fields = ChainedFields {
                tenant: &entry.tenant,
                seq,
                time_ms,
                kind: entry.kind,
                actor: &entry.actor,
                key_id: entry.key_id.as_deref(),
                automation: entry.automation.as_deref(),
                data: &entry.data,
            };
            let hash = entry_hash(&prev, &fields);
            *slot.lock().unwrap_or_else(|e| e.into_inner()) = Some(Appended::Entry { seq, hash, time_ms });
            let insert: Vec<Param> = vec![
                entry.tenant.clone().into(),
                seq.into(),
                time_ms.into(),
                entry.kind.into(),
                entry.actor.into(),
                entry.key_id.into(),
                entry.automation.into(),
                entry.data.into(),
                entry.dedup_key.into(),
                prev.to_vec().into(),
                hash.to_vec().into(),
            ];
            let head: Vec<Param> = vec![entry.tenant.into(), seq.into(), hash.to_vec().into(), head_seq.into()];
            Ok(vec![
                Step::new(INSERT_ENTRY, insert).guard(Guard::RefuseUnless(1, DUPLICATE.to_owned())),
                Step::new(MOVE_HEAD, head)
                    .guard(Guard::RefuseUnless(1, "the audit head moved during the append".to_owned())),
            ])
        })
        .await?;
    match outcome {
        TxOutcome::Committed => appended
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
            .ok_or_else(|| DbError::Row("the audit append committed without an entry".into())),
        TxOutcome::Refused(why) if why == DUPLICATE => Ok(Appended::Duplicate),
        TxOutcome::Refused(why) => Err(DbError::Row(why)),
    }
}

/// At most `limit` entries of `tenant` from number `from` on, in order.
pub(super) async fn entries(db: &AppDb, tenant: &str, from: i64, limit: i64) -> Result<Vec<StoredEntry>, DbError> {
    let rows = db.fetch_all(ENTRIES, vec![tenant.into(), from.into(), limit.into()]).await?;
    rows.iter().map(StoredEntry::of).collect()
}

/// The head of `tenant`, if it ever had an entry.
pub(super) async fn head(db: &AppDb, tenant: &str) -> Result<Option<StoredHead>, DbError> {
    let row = db.fetch_optional("SELECT seq, hash FROM audit_heads WHERE tenant = $1", vec![tenant.into()]).await?;
    row.map(|row| Ok(StoredHead { seq: row.get("seq")?, hash: row.get("hash")? })).transpose()
}

/// Every tenant with a head or an entry, in order.
pub(super) async fn tenants(db: &AppDb) -> Result<Vec<String>, DbError> {
    let sql = "SELECT tenant FROM audit_heads UNION SELECT tenant FROM audit_entries ORDER BY tenant";
    let rows = db.fetch_all(sql, vec![]).await?;
    rows.iter().map(|row| row.get("tenant")).collect()
}
