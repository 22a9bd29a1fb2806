-- Resumable application tables: single-use continuations, the demo order system, the audit log.
-- Times are milliseconds since the Unix epoch; amounts are integer cents.

CREATE TABLE continuations (
    key         BLOB PRIMARY KEY NOT NULL,
    audience    TEXT NOT NULL,
    expires_at  INTEGER NOT NULL,
    state       BLOB NOT NULL,
    status      TEXT NOT NULL CHECK (status IN ('available', 'claimed', 'consumed')),
    claim       TEXT,
    claim_until INTEGER,
    created_at  INTEGER NOT NULL
);

CREATE INDEX continuations_by_expiry ON continuations (expires_at);

CREATE TABLE orders (
    tenant         TEXT NOT NULL,
    id             TEXT NOT NULL,
    customer       TEXT NOT NULL,
    total_cents    INTEGER NOT NULL CHECK (total_cents >= 0),
    refunded_cents INTEGER NOT NULL DEFAULT 0 CHECK (refunded_cents >= 0 AND refunded_cents <= total_cents),
    status         TEXT NOT NULL,
    created_at     INTEGER NOT NULL,
    PRIMARY KEY (tenant, id)
);

-- One row per applied refund; the idempotency key makes a retried refund a no-op.
CREATE TABLE refunds (
    idempotency_key TEXT PRIMARY KEY NOT NULL,
    tenant          TEXT NOT NULL,
    order_id        TEXT NOT NULL,
    amount_cents    INTEGER NOT NULL CHECK (amount_cents > 0),
    created_at      INTEGER NOT NULL,
    FOREIGN KEY (tenant, order_id) REFERENCES orders (tenant, id)
);

-- Every host function call that ran live (not served from a ledger).
CREATE TABLE host_calls (
    id         INTEGER PRIMARY KEY AUTOINCREMENT,
    tenant     TEXT NOT NULL,
    run_id     TEXT NOT NULL,
    function   TEXT NOT NULL,
    created_at INTEGER NOT NULL
);

CREATE INDEX host_calls_by_run ON host_calls (run_id);
