-- The audit log: per tenant, an append-only chain of entries. Each entry's hash covers the hash of
-- the entry before it (`prev_hash`; 32 zero bytes for the first) and its own fields (see
-- src/audit/chain.rs), so editing, removing or inserting an entry breaks the chain from there on.
CREATE TABLE audit_entries (
    tenant     TEXT NOT NULL,
    seq        BIGINT NOT NULL CHECK (seq > 0),
    time_ms    BIGINT NOT NULL,
    kind       TEXT NOT NULL,
    actor      TEXT NOT NULL,
    key_id     TEXT,
    automation TEXT,
    -- The entry's data as canonical JSON (keys sorted, no whitespace): the exact text hashed.
    data       TEXT NOT NULL,
    -- What makes a repeated append (a retried step, say) a no-op; not hashed.
    dedup_key  TEXT,
    prev_hash  BYTEA NOT NULL CHECK (length(prev_hash) = 32),
    hash       BYTEA NOT NULL CHECK (length(hash) = 32),
    PRIMARY KEY (tenant, seq),
    UNIQUE (tenant, dedup_key)
);

-- The last entry of each tenant's chain. An append locks this row first (an upsert that holds its
-- row lock until the append commits), so appends of one tenant take turns, from any number of
-- servers: seq has no gaps and the chain never forks.
CREATE TABLE audit_heads (
    tenant TEXT PRIMARY KEY NOT NULL,
    seq    BIGINT NOT NULL CHECK (seq >= 0),
    hash   BYTEA NOT NULL CHECK (length(hash) = 32)
);

-- Entries are never changed or removed by the application. This stops an accident, not someone
-- who may disable it: `resumable audit verify` finds what such a person changed.
CREATE FUNCTION audit_entries_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'audit entries are append-only';
END
$$;

CREATE TRIGGER audit_entries_append_only BEFORE UPDATE OR DELETE ON audit_entries
    FOR EACH ROW EXECUTE FUNCTION audit_entries_append_only();
