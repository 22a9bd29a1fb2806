-- The durable key-value state of sessions (session.get / session.set / session.delete).
CREATE TABLE session_state (
    session_id TEXT NOT NULL,
    key        TEXT NOT NULL,
    value      TEXT NOT NULL,
    bytes      BIGINT NOT NULL CHECK (bytes >= 0),
    updated_at BIGINT NOT NULL,
    PRIMARY KEY (session_id, key)
);

-- Sessions whose end was requested: commands queued before the request are skipped.
CREATE TABLE session_ends (
    session_id   TEXT PRIMARY KEY NOT NULL,
    requested_by TEXT NOT NULL,
    requested_at BIGINT NOT NULL
);

-- What each session has taken in so far, so that its history (replayed at every wake-up) stays
-- bounded: commands and the bytes of their sources.
CREATE TABLE session_usage (
    session_id   TEXT PRIMARY KEY NOT NULL,
    commands     BIGINT NOT NULL,
    source_bytes BIGINT NOT NULL
);

-- The writes of session.set / session.delete already applied, by the call that made them
-- (`automation:call index`): a round retried after a crash does not apply them twice.
CREATE TABLE session_writes (
    session_id TEXT NOT NULL,
    write_key  TEXT NOT NULL,
    result     TEXT,
    PRIMARY KEY (session_id, write_key)
);
