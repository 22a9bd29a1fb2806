-- The audit log: per tenant, an append-only chain of entries. Each entry's hash covers the hash of
-- the entry before it (`prev_hash`; 32 zero bytes for the first) and its own fields (see
-- src/audit/chain.rs), so editing, removing or inserting an entry breaks the chain from there on.
CREATE TABLE audit_entries (
    tenant     TEXT NOT NULL,
    seq        INTEGER NOT NULL CHECK (seq > 0),
    time_ms    INTEGER NOT NULL,
    kind       TEXT NOT NULL,
    actor      TEXT NOT NULL,
    key_id     TEXT,
    automation TEXT,
    -- The entry's data as canonical JSON (keys sorted, no whitespace): the exact text hashed.
    data       TEXT NOT NULL,
    -- What makes a repeated append (a retried step, say) a no-op; not hashed.
    dedup_key  TEXT,
    prev_hash  BLOB NOT NULL CHECK (length(prev_hash) = 32),
    hash       BLOB NOT NULL CHECK (length(hash) = 32),
    PRIMARY KEY (tenant, seq),
    UNIQUE (tenant, dedup_key)
);

-- The last entry of each tenant's chain. An append locks (on SQLite: writes) this row first, so
-- appends of one tenant take turns: seq has no gaps and the chain never forks.
CREATE TABLE audit_heads (
    tenant TEXT PRIMARY KEY NOT NULL,
    seq    INTEGER NOT NULL CHECK (seq >= 0),
    hash   BLOB NOT NULL CHECK (length(hash) = 32)
);

-- Entries are never changed or removed by the application. These stop an accident, not someone
-- who may drop them: `resumable audit verify` finds what such a person changed.
CREATE TRIGGER audit_entries_no_update BEFORE UPDATE ON audit_entries
BEGIN
    SELECT RAISE(ABORT, 'audit entries are append-only');
END;

CREATE TRIGGER audit_entries_no_delete BEFORE DELETE ON audit_entries
BEGIN
    SELECT RAISE(ABORT, 'audit entries are append-only');
END;
