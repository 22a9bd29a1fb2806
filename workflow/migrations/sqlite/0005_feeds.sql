-- Feeds: a run may belong to a feed (a tenant, say); each event it appends to its stream is then
-- also numbered in that feed, 1, 2, 3, ..., so that one reader follows the streams of every run
-- of the feed from any number on. A child run is in its parent's feed.
ALTER TABLE runs ADD COLUMN feed TEXT;
ALTER TABLE stream_events ADD COLUMN feed TEXT;
ALTER TABLE stream_events ADD COLUMN feed_seq INTEGER;

CREATE UNIQUE INDEX stream_events_by_feed ON stream_events (feed, feed_seq) WHERE feed IS NOT NULL;

-- Listing a feed's runs of one workflow, newest first.
CREATE INDEX runs_by_feed ON runs (feed, workflow, created_at, id) WHERE feed IS NOT NULL;

-- The last number each feed gave out. Writers are serialized, so numbers commit in order.
CREATE TABLE feed_heads (
    feed     TEXT PRIMARY KEY NOT NULL,
    last_seq INTEGER NOT NULL
) WITHOUT ROWID;
