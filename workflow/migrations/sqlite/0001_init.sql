-- Resumable workflow engine: initial schema.
-- Times are milliseconds since the Unix epoch; JSON values are stored as text.

CREATE TABLE runs (
    id               TEXT PRIMARY KEY NOT NULL,
    workflow         TEXT NOT NULL,
    input            TEXT NOT NULL,
    status           TEXT NOT NULL
        CHECK (status IN ('pending', 'running', 'waiting', 'completed', 'failed', 'cancelled')),
    output           TEXT,
    error            TEXT,
    idempotency_key  TEXT UNIQUE,
    -- Sequence number of the last event appended to this run's log.
    last_seq         INTEGER NOT NULL DEFAULT 0,
    -- While waiting: the earliest time a timer or a step retry makes the run runnable again.
    wake_at          INTEGER,
    -- Set when a hook payload arrives while the run is executing, so that its suspension is not final.
    wake_requested   INTEGER NOT NULL DEFAULT 0,
    lease_owner      TEXT,
    lease_expires_at INTEGER,
    -- Incremented by every claim; writes of an execution are fenced by it.
    lease_attempt    INTEGER NOT NULL DEFAULT 0,
    created_at       INTEGER NOT NULL,
    updated_at       INTEGER NOT NULL,
    started_at       INTEGER,
    completed_at     INTEGER
);

CREATE INDEX runs_by_status_wake ON runs (status, wake_at);
CREATE INDEX runs_by_status_lease ON runs (status, lease_expires_at);
CREATE INDEX runs_by_workflow ON runs (workflow, created_at);

CREATE TABLE events (
    run_id     TEXT NOT NULL REFERENCES runs (id),
    seq        INTEGER NOT NULL,
    kind       TEXT NOT NULL,
    payload    TEXT NOT NULL,
    created_at INTEGER NOT NULL,
    PRIMARY KEY (run_id, seq)
) WITHOUT ROWID;

-- One row per step position of a run.
CREATE TABLE steps (
    run_id     TEXT NOT NULL REFERENCES runs (id),
    position   INTEGER NOT NULL,
    name       TEXT NOT NULL,
    status     TEXT NOT NULL CHECK (status IN ('running', 'retrying', 'completed', 'failed')),
    attempts   INTEGER NOT NULL,
    result     TEXT,
    error      TEXT,
    retry_at   INTEGER,
    created_at INTEGER NOT NULL,
    updated_at INTEGER NOT NULL,
    PRIMARY KEY (run_id, position)
) WITHOUT ROWID;

-- One row per hook position of a run. A row that lost a token conflict keeps the owner's run id.
CREATE TABLE hooks (
    run_id          TEXT NOT NULL REFERENCES runs (id),
    position        INTEGER NOT NULL,
    token           TEXT NOT NULL,
    metadata        TEXT NOT NULL,
    active          INTEGER NOT NULL CHECK (active IN (0, 1)),
    conflict_run_id TEXT,
    received        INTEGER NOT NULL DEFAULT 0,
    created_at      INTEGER NOT NULL,
    disposed_at     INTEGER,
    PRIMARY KEY (run_id, position)
) WITHOUT ROWID;

-- Tokens are unique among active hooks, across all runs.
CREATE UNIQUE INDEX hooks_active_token ON hooks (token) WHERE active = 1;

-- Payloads delivered to a hook, in the order they were received (seq 0, 1, 2, ...).
CREATE TABLE hook_payloads (
    run_id      TEXT NOT NULL,
    position    INTEGER NOT NULL,
    seq         INTEGER NOT NULL,
    payload     TEXT NOT NULL,
    received_at INTEGER NOT NULL,
    PRIMARY KEY (run_id, position, seq),
    FOREIGN KEY (run_id, position) REFERENCES hooks (run_id, position)
) WITHOUT ROWID;

-- Durable timers, one row per sleep position of a run.
CREATE TABLE waits (
    run_id     TEXT NOT NULL REFERENCES runs (id),
    position   INTEGER NOT NULL,
    due_at     INTEGER NOT NULL,
    status     TEXT NOT NULL CHECK (status IN ('pending', 'fired', 'cancelled')),
    created_at INTEGER NOT NULL,
    fired_at   INTEGER,
    PRIMARY KEY (run_id, position)
) WITHOUT ROWID;

CREATE INDEX waits_pending_due ON waits (due_at) WHERE status = 'pending';

-- Events a run writes to its stream, readable from any index.
CREATE TABLE stream_events (
    run_id     TEXT NOT NULL REFERENCES runs (id),
    idx        INTEGER NOT NULL,
    payload    TEXT NOT NULL,
    created_at INTEGER NOT NULL,
    PRIMARY KEY (run_id, idx)
) WITHOUT ROWID;
