-- Feeds: a run may belong to a feed (a tenant, say); each event it appends to its stream is then
-- also numbered in that feed, 1, 2, 3, ..., so that one reader follows the streams of every run
-- of the feed from any number on. A child run is in its parent's feed.
ALTER TABLE runs ADD COLUMN feed TEXT;
ALTER TABLE stream_events ADD COLUMN feed TEXT;
ALTER TABLE stream_events ADD COLUMN feed_seq BIGINT;

CREATE UNIQUE INDEX stream_events_by_feed ON stream_events (feed, feed_seq) WHERE feed IS NOT NULL;

-- Listing a feed's runs of one workflow, newest first.
CREATE INDEX runs_by_feed ON runs (feed, workflow, created_at, id) WHERE feed IS NOT NULL;

-- The last number each feed gave out. An append takes its number by updating its feed's row, at
-- the end of its transaction, and holds the row's lock until it commits: the next append of the
-- feed waits, so numbers commit in order and a rolled-back number is given again.
-- A reader that sees number n therefore sees every number before it: a cursor never skips an
-- event that commits late, as it could with a sequence.
CREATE TABLE feed_heads (
    feed     TEXT PRIMARY KEY,
    last_seq BIGINT NOT NULL
);

CREATE OR REPLACE FUNCTION resumable_append_stream(
    p_run TEXT, p_lease BIGINT, p_position BIGINT, p_event JSONB, p_kind TEXT, p_now BIGINT)
RETURNS BIGINT
LANGUAGE plpgsql AS $$
DECLARE
    v_index BIGINT;
    v_feed TEXT;
    v_feed_seq BIGINT;
BEGIN
    -- The run's row lock serializes appends of the run; the primary key (run_id, idx) and the
    -- unique (run_id, position) reject any duplicate.
    PERFORM resumable_fence(p_run, p_lease);
    SELECT COALESCE(MAX(idx) + 1, 0) INTO v_index FROM stream_events WHERE run_id = p_run;
    PERFORM resumable_append(p_run, p_kind, jsonb_build_object('position', p_position, 'index', v_index), p_now);
    SELECT feed INTO v_feed FROM runs WHERE id = p_run;
    IF v_feed IS NOT NULL THEN
        INSERT INTO feed_heads (feed, last_seq) VALUES (v_feed, 1)
        ON CONFLICT (feed) DO UPDATE SET last_seq = feed_heads.last_seq + 1
        RETURNING last_seq INTO v_feed_seq;
    END IF;
    INSERT INTO stream_events (run_id, idx, position, payload, created_at, feed, feed_seq)
    VALUES (p_run, v_index, p_position, p_event, p_now, v_feed, v_feed_seq);
    RETURN v_index;
END $$;
