-- Webhook delivery attempts, newest last: what GET /v1/webhooks/deliveries shows. The deliveries
-- themselves are durable workflow runs; this is their record, one row per attempt.
CREATE TABLE webhook_attempts (
    id            INTEGER PRIMARY KEY AUTOINCREMENT,
    tenant        TEXT NOT NULL,
    subscription  TEXT NOT NULL,
    webhook_id    TEXT NOT NULL,
    automation_id TEXT NOT NULL,
    event_type    TEXT NOT NULL,
    attempt       INTEGER NOT NULL,
    outcome       TEXT NOT NULL,
    http_status   INTEGER,
    error         TEXT,
    duration_ms   BIGINT NOT NULL,
    at            BIGINT NOT NULL
);

CREATE INDEX webhook_attempts_by_tenant ON webhook_attempts (tenant, id);
