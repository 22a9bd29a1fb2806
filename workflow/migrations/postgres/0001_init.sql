-- Resumable workflow engine on PostgreSQL: the whole schema (the SQLite migrations 1-3 in one).
-- Times are BIGINT milliseconds since the Unix epoch, as the engine passes them around; JSON
-- values are JSONB; positions, counters and sequence numbers are BIGINT.

CREATE TABLE runs (
    id               TEXT PRIMARY KEY,
    workflow         TEXT NOT NULL,
    input            JSONB NOT NULL,
    status           TEXT NOT NULL
        CHECK (status IN ('pending', 'running', 'waiting', 'completed', 'failed', 'cancelled')),
    output           JSONB,
    error            TEXT,
    idempotency_key  TEXT UNIQUE,
    -- The run that started this one; it is woken when this run ends and cancels it with itself.
    parent_run_id    TEXT REFERENCES runs (id),
    -- Sequence number of the last event appended to this run's log.
    last_seq         BIGINT NOT NULL DEFAULT 0,
    -- While waiting: the earliest time a timer or a step retry makes the run runnable again.
    wake_at          BIGINT,
    -- Set when a hook payload (or a child's end) arrives while the run is executing, so that its
    -- suspension is not final.
    wake_requested   BOOLEAN NOT NULL DEFAULT FALSE,
    lease_owner      TEXT,
    lease_expires_at BIGINT,
    -- Incremented by every claim; writes of an execution are fenced by it.
    lease_attempt    BIGINT NOT NULL DEFAULT 0,
    created_at       BIGINT NOT NULL,
    updated_at       BIGINT NOT NULL,
    started_at       BIGINT,
    completed_at     BIGINT,
    -- When the run is (or becomes) claimable: a pending run since it last changed, a waiting run at
    -- its wake time, a running run when its lease expires; NULL when only a hook payload or nothing
    -- at all can make it runnable. Claims take the due run with the smallest value.
    ready_at         BIGINT GENERATED ALWAYS AS (
        CASE status
            WHEN 'pending' THEN updated_at
            WHEN 'waiting' THEN wake_at
            WHEN 'running' THEN lease_expires_at
        END
    ) STORED
);

-- The claim query: only runs that are or will become claimable are indexed.
CREATE INDEX runs_ready ON runs (ready_at) WHERE ready_at IS NOT NULL;
-- next_wake_at: the runs that time alone makes claimable (not the pending ones).
CREATE INDEX runs_timed ON runs (ready_at) WHERE ready_at IS NOT NULL AND status <> 'pending';
-- Listing runs newest first, optionally by status, workflow or parent.
CREATE INDEX runs_by_created ON runs (created_at, id);
CREATE INDEX runs_by_status_created ON runs (status, created_at, id);
CREATE INDEX runs_by_workflow_created ON runs (workflow, created_at, id);
CREATE INDEX runs_by_parent ON runs (parent_run_id, created_at, id) WHERE parent_run_id IS NOT NULL;

CREATE TABLE events (
    run_id     TEXT NOT NULL REFERENCES runs (id),
    seq        BIGINT NOT NULL,
    kind       TEXT NOT NULL,
    payload    JSONB NOT NULL,
    created_at BIGINT NOT NULL,
    PRIMARY KEY (run_id, seq)
);

-- One row per step position of a run.
CREATE TABLE steps (
    run_id     TEXT NOT NULL REFERENCES runs (id),
    position   BIGINT NOT NULL,
    name       TEXT NOT NULL,
    status     TEXT NOT NULL CHECK (status IN ('running', 'retrying', 'completed', 'failed')),
    attempts   BIGINT NOT NULL,
    result     JSONB,
    error      TEXT,
    retry_at   BIGINT,
    created_at BIGINT NOT NULL,
    updated_at BIGINT NOT NULL,
    PRIMARY KEY (run_id, position)
);

-- One row per hook position of a run. A row that lost a token conflict keeps the owner's run id.
CREATE TABLE hooks (
    run_id          TEXT NOT NULL REFERENCES runs (id),
    position        BIGINT NOT NULL,
    token           TEXT NOT NULL,
    metadata        JSONB NOT NULL,
    active          BOOLEAN NOT NULL,
    conflict_run_id TEXT,
    received        BIGINT NOT NULL DEFAULT 0,
    created_at      BIGINT NOT NULL,
    disposed_at     BIGINT,
    PRIMARY KEY (run_id, position)
);

-- Tokens are unique among active hooks, across all runs.
CREATE UNIQUE INDEX hooks_active_token ON hooks (token) WHERE active;

-- Payloads delivered to a hook, in the order they were received (seq 0, 1, 2, ...).
CREATE TABLE hook_payloads (
    run_id      TEXT NOT NULL,
    position    BIGINT NOT NULL,
    seq         BIGINT NOT NULL,
    payload     JSONB NOT NULL,
    received_at BIGINT NOT NULL,
    PRIMARY KEY (run_id, position, seq),
    FOREIGN KEY (run_id, position) REFERENCES hooks (run_id, position)
);

-- Durable timers, one row per sleep position of a run.
CREATE TABLE waits (
    run_id     TEXT NOT NULL REFERENCES runs (id),
    position   BIGINT NOT NULL,
    due_at     BIGINT NOT NULL,
    status     TEXT NOT NULL CHECK (status IN ('pending', 'fired', 'cancelled')),
    created_at BIGINT NOT NULL,
    fired_at   BIGINT,
    PRIMARY KEY (run_id, position)
);

-- Events a run writes to its stream, readable from any index; each remembers the operation
-- position of the emit that wrote it, so that a replayed emit is recognised.
CREATE TABLE stream_events (
    run_id     TEXT NOT NULL REFERENCES runs (id),
    idx        BIGINT NOT NULL,
    position   BIGINT NOT NULL,
    payload    JSONB NOT NULL,
    created_at BIGINT NOT NULL,
    PRIMARY KEY (run_id, idx),
    UNIQUE (run_id, position)
);
