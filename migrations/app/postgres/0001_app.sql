-- Resumable application tables: single-use continuations, the demo order system, the audit log.
-- Times are milliseconds since the Unix epoch; amounts are integer cents.

CREATE TABLE continuations (
    key         BYTEA PRIMARY KEY NOT NULL,
    audience    TEXT NOT NULL,
    expires_at  BIGINT NOT NULL,
    state       BYTEA NOT NULL,
    status      TEXT NOT NULL CHECK (status IN ('available', 'claimed', 'consumed')),
    claim       TEXT,
    claim_until BIGINT,
    created_at  BIGINT NOT NULL
);

CREATE INDEX continuations_by_expiry ON continuations (expires_at);

CREATE TABLE orders (
    tenant         TEXT NOT NULL,
    id             TEXT NOT NULL,
    customer       TEXT NOT NULL,
    total_cents    BIGINT NOT NULL CHECK (total_cents >= 0),
    refunded_cents BIGINT NOT NULL DEFAULT 0 CHECK (refunded_cents >= 0 AND refunded_cents <= total_cents),
    status         TEXT NOT NULL,
    created_at     BIGINT NOT NULL,
    PRIMARY KEY (tenant, id)
);

CREATE TABLE refunds (
    idempotency_key TEXT PRIMARY KEY NOT NULL,
    tenant          TEXT NOT NULL,
    order_id        TEXT NOT NULL,
    amount_cents    BIGINT NOT NULL CHECK (amount_cents > 0),
    created_at      BIGINT NOT NULL,
    FOREIGN KEY (tenant, order_id) REFERENCES orders (tenant, id)
);

CREATE TABLE host_calls (
    id         BIGSERIAL PRIMARY KEY,
    tenant     TEXT NOT NULL,
    run_id     TEXT NOT NULL,
    function   TEXT NOT NULL,
    created_at BIGINT NOT NULL
);

CREATE INDEX host_calls_by_run ON host_calls (run_id);
