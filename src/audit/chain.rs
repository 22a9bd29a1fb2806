//! The hash that chains a tenant's entries: each entry's hash covers the previous entry's hash and
//! a canonical encoding of its own fields.
//!
//! ```text
//! hash = SHA-256( "resumable.audit.v1" 0x00
//!               || prev_hash                      32 bytes; 32 zero bytes for entry 1
//!               || str(tenant)
//!               || u64be(seq) || i64be(time_ms)
//!               || str(kind) || str(actor) || opt(key_id) || opt(automation)
//!               || str(data) )                    the stored canonical JSON text
//! str(s) = u64be(byte length of s) || the UTF-8 bytes of s
//! opt(x) = 0x00 when absent, 0x01 || str(x) when present
//! ```
//!
//! Every field is length-prefixed, so no two different entries encode to the same bytes. The
//! dedup key is not hashed: it only makes a repeated append a no-op.

use sha2::{Digest, Sha256};

/// The domain tag that starts every hashed encoding (version 1 of the encoding).
pub const DOMAIN: &[u8] = b"resumable.audit.v1\0";

/// The `prev_hash` of a tenant's first entry.
pub const GENESIS: [u8; 32] = [0; 32];

/// The fields of an entry that its hash covers, as stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChainedFields<'a> {
    /// The tenant whose chain holds the entry.
    pub tenant: &'a str,
    /// Its position in the chain, from 1.
    pub seq: i64,
    /// When it was appended, in milliseconds since the Unix epoch.
    pub time_ms: i64,
    /// Its kind's stored name.
    pub kind: &'a str,
    /// Who acted.
    pub actor: &'a str,
    /// The id of their API key, if any.
    pub key_id: Option<&'a str>,
    /// The automation or session it is about, if any.
    pub automation: Option<&'a str>,
    /// Its data: the canonical JSON text as stored.
    pub data: &'a str,
}

/// The hash of an entry with `fields` whose predecessor's hash is `prev`.
pub fn entry_hash(prev: &[u8; 32], fields: &ChainedFields<'_>) -> [u8; 32] {
    let mut hasher = Sha256::new();
    hasher.update(DOMAIN);
    hasher.update(prev);
    text(&mut hasher, fields.tenant);
    // A seq is positive; its bits as stored, whatever they are, are what is hashed.
    hasher.update(fields.seq.to_be_bytes());
    hasher.update(fields.time_ms.to_be_bytes());
    text(&mut hasher, fields.kind);
    text(&mut hasher, fields.actor);
    optional(&mut hasher, fields.key_id);
    optional(&mut hasher, fields.automation);
    text(&mut hasher, fields.data);
    hasher.finalize().into()
}

/// `str(s)`: the length in bytes as a big-endian u64, then the bytes.
fn text(hasher: &mut Sha256, s: &str) {
    hasher.update((s.len() as u64).to_be_bytes());
    hasher.update(s.as_bytes());
}

/// `opt(x)`: 0 when absent, 1 and `str(x)` when present.
fn optional(hasher: &mut Sha256, s: Option<&str>) {
    match s {
        None => hasher.update([0]),
        Some(s) => {
            hasher.update([1]);
            text(hasher, s);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fields() -> ChainedFields<'static> {
        ChainedFields {
            tenant: "acme",
            seq: 1,
            time_ms: 1_700_000_000_000,
            kind: "submission",
            actor: "alice",
            key_id: Some("0123456789ab"),
            automation: Some("run_00"),
            data: r#"{"sourceBytes":8}"#,
        }
    }

    #[test]
    fn the_hash_is_sha256_over_the_documented_encoding() {
        let f = fields();
        let mut bytes = DOMAIN.to_vec();
        bytes.extend_from_slice(&GENESIS);
        let str = |bytes: &mut Vec<u8>, s: &str| {
            bytes.extend_from_slice(&(s.len() as u64).to_be_bytes());
            bytes.extend_from_slice(s.as_bytes());
        };
        str(&mut bytes, "acme");
        bytes.extend_from_slice(&1u64.to_be_bytes());
        bytes.extend_from_slice(&1_700_000_000_000i64.to_be_bytes());
        str(&mut bytes, "submission");
        str(&mut bytes, "alice");
        bytes.push(1);
        str(&mut bytes, "0123456789ab");
        bytes.push(1);
        str(&mut bytes, "run_00");
        str(&mut bytes, r#"{"sourceBytes":8}"#);
        let expected: [u8; 32] = Sha256::digest(&bytes).into();
        assert_eq!(entry_hash(&GENESIS, &f), expected);
    }

    #[test]
    fn every_field_and_the_previous_hash_change_the_hash() {
        let base = entry_hash(&GENESIS, &fields());
        let changed = [
            ChainedFields { tenant: "acme2", ..fields() },
            ChainedFields { seq: 2, ..fields() },
            ChainedFields { time_ms: 1, ..fields() },
            ChainedFields { kind: "decision", ..fields() },
            ChainedFields { actor: "bob", ..fields() },
            ChainedFields { key_id: None, ..fields() },
            ChainedFields { automation: None, ..fields() },
            ChainedFields { data: r#"{"sourceBytes":9}"#, ..fields() },
            // Moving bytes between fields is a change too.
            ChainedFields { kind: "submissiona", actor: "lice", ..fields() },
            ChainedFields { key_id: Some(""), ..fields() },
        ];
        for f in changed {
            assert_ne!(entry_hash(&GENESIS, &f), base, "{f:?}");
        }
        assert_ne!(entry_hash(&[1; 32], &fields()), base);
    }
}
