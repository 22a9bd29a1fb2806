-- Stream events become recorded operations: each remembers the operation position of the `emit`
-- that wrote it, so that a replayed emit is recognised instead of appended again.
-- Nothing wrote to `stream_events` before this version, so it is recreated.

DROP TABLE stream_events;

CREATE TABLE stream_events (
    run_id     TEXT NOT NULL REFERENCES runs (id),
    idx        INTEGER NOT NULL,
    position   INTEGER NOT NULL,
    payload    TEXT NOT NULL,
    created_at INTEGER NOT NULL,
    PRIMARY KEY (run_id, idx),
    UNIQUE (run_id, position)
) WITHOUT ROWID;
