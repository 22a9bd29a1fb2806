//! Verifying a tenant's chain: every entry in order from 1, each linked to the one before it,
//! each hashing to its recorded hash, and the last one named by the tenant's head.

use serde::Serialize;

use crate::db::{AppDb, DbError};

use super::chain::{GENESIS, entry_hash};
use super::store::{self, StoredEntry};

/// Entries read per query while verifying.
const PAGE: i64 = 1_000;

/// Why an entry does not verify. Each has a stable code ([`Problem::code`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub enum Problem {
    /// An entry number is missing (removed, or the next one inserted out of turn).
    #[serde(rename = "AUDIT_SEQ_GAP")]
    SeqGap,
    /// Its `prev_hash` is not the hash of the entry before it.
    #[serde(rename = "AUDIT_CHAIN_BROKEN")]
    ChainBroken,
    /// Its fields do not hash to its recorded hash: it was changed after it was appended.
    #[serde(rename = "AUDIT_HASH_MISMATCH")]
    HashMismatch,
    /// The tenant's head does not name the last entry: entries were removed from the end, or
    /// added without moving the head.
    #[serde(rename = "AUDIT_HEAD_MISMATCH")]
    HeadMismatch,
    /// A stored hash is not 32 bytes.
    #[serde(rename = "AUDIT_MALFORMED")]
    Malformed,
}

impl Problem {
    /// The stable code.
    pub fn code(self) -> &'static str {
        match self {
            Problem::SeqGap => "AUDIT_SEQ_GAP",
            Problem::ChainBroken => "AUDIT_CHAIN_BROKEN",
            Problem::HashMismatch => "AUDIT_HASH_MISMATCH",
            Problem::HeadMismatch => "AUDIT_HEAD_MISMATCH",
            Problem::Malformed => "AUDIT_MALFORMED",
        }
    }
}

/// The first entry of a chain that does not verify.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Broken {
    /// The entry's number.
    pub seq: i64,
    /// What is wrong with it.
    #[serde(rename = "code")]
    pub problem: Problem,
    /// The same, for a person.
    pub reason: String,
}

/// How one tenant's chain verified.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ChainReport {
    /// The tenant.
    pub tenant: String,
    /// The entries that verified (all of them when the chain is whole).
    pub verified: u64,
    /// The head's seq and hash (hex), as the tenant's head row holds them.
    #[serde(rename = "headSeq")]
    pub head_seq: Option<i64>,
    /// The head's hash in hex.
    #[serde(rename = "headHash")]
    pub head_hash: Option<String>,
    /// The first entry that does not verify, if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub broken: Option<Broken>,
}

impl ChainReport {
    /// Whether the whole chain verified.
    pub fn is_whole(&self) -> bool {
        self.broken.is_none()
    }
}

/// Verifies the chain of `tenant`, stopping at its first entry that does not verify.
pub(super) async fn verify_tenant(db: &AppDb, tenant: &str) -> Result<ChainReport, DbError> {
    let head = store::head(db, tenant).await?;
    let mut report = ChainReport {
        tenant: tenant.to_owned(),
        verified: 0,
        head_seq: head.as_ref().map(|h| h.seq),
        head_hash: head.as_ref().map(|h| hex(&h.hash)),
        broken: None,
    };
    let mut prev = GENESIS;
    let mut expected: i64 = 1;
    loop {
        let page = store::entries(db, tenant, expected, PAGE).await?;
        for entry in &page {
            match check(tenant, entry, expected, &prev) {
                Ok(hash) => prev = hash,
                Err(broken) => {
                    report.broken = Some(broken);
                    return Ok(report);
                }
            }
            report.verified += 1;
            expected += 1;
        }
        if page.len() < PAGE as usize {
            break;
        }
    }
    let last = expected - 1;
    let (head_seq, head_hash) = head.map_or((0, GENESIS.to_vec()), |h| (h.seq, h.hash));
    if head_seq != last || head_hash != prev {
        let (seq, reason) = if head_seq > last {
            (
                last + 1,
                format!("the head names entry {head_seq}, but the chain ends at entry {last}: entries were removed"),
            )
        } else if head_seq < last {
            (head_seq + 1, format!("the chain goes on to entry {last} past its head, entry {head_seq}"))
        } else {
            (last, format!("the head's hash is not entry {last}'s"))
        };
        report.broken = Some(Broken { seq, problem: Problem::HeadMismatch, reason });
    }
    Ok(report)
}

/// Checks `entry`, which should be number `expected` and follow a hash of `prev`; its hash.
fn check(tenant: &str, entry: &StoredEntry, expected: i64, prev: &[u8; 32]) -> Result<[u8; 32], Broken> {
    let broken = |seq, problem, reason: String| Broken { seq, problem, reason };
    if entry.seq != expected {
        let reason = format!("entry {expected} is missing: the chain goes on with entry {}", entry.seq);
        return Err(broken(expected, Problem::SeqGap, reason));
    }
    let seq = entry.seq;
    let (Ok(recorded_prev), Ok(recorded)) =
        (<[u8; 32]>::try_from(entry.prev_hash.as_slice()), <[u8; 32]>::try_from(entry.hash.as_slice()))
    else {
        return Err(broken(seq, Problem::Malformed, "its prev_hash or hash is not 32 bytes".to_owned()));
    };
    if recorded_prev != *prev {
        let reason = match seq {
            1 => "its prev_hash is not 32 zero bytes, as the first entry's is".to_owned(),
            _ => format!("its prev_hash is not the hash of entry {}", seq - 1),
        };
        return Err(broken(seq, Problem::ChainBroken, reason));
    }
    if entry_hash(prev, &entry.fields(tenant)) != recorded {
        let reason = "its fields do not hash to its recorded hash: it was changed after it was appended".to_owned();
        return Err(broken(seq, Problem::HashMismatch, reason));
    }
    Ok(recorded)
}

/// Bytes as lower-case hex.
pub(super) fn hex(bytes: &[u8]) -> String {
    hex_simd::encode_to_string(bytes, hex_simd::AsciiCase::Lower)
}
