-- Every automation and session is in its tenant's feed (read by GET /v1/events); so is each
-- automation a session starts, as its child. Those started before this release join it here, and
-- the events they wrote are numbered by when they were written (within a millisecond, by run and
-- index).
UPDATE runs SET feed = json_extract(input, '$.tenant')
WHERE feed IS NULL AND workflow IN ('resumable.automation', 'resumable.session')
  AND json_extract(input, '$.tenant') IS NOT NULL;

UPDATE stream_events SET feed = numbered.feed, feed_seq = numbered.seq
FROM (
    SELECT run_id, idx, feed,
           COALESCE((SELECT last_seq FROM feed_heads h WHERE h.feed = written.feed), 0)
               + ROW_NUMBER() OVER (PARTITION BY feed ORDER BY written_at, run_id, idx) AS seq
    FROM (
        -- A run's events stay in index order, even where the clock went back between two of them.
        SELECT s.run_id, s.idx, r.feed, MAX(s.created_at) OVER (PARTITION BY s.run_id ORDER BY s.idx) AS written_at
        FROM stream_events s JOIN runs r ON r.id = s.run_id
        WHERE r.feed IS NOT NULL AND s.feed IS NULL
    ) AS written
) AS numbered
WHERE stream_events.run_id = numbered.run_id AND stream_events.idx = numbered.idx;

INSERT INTO feed_heads (feed, last_seq)
SELECT feed, MAX(feed_seq) FROM stream_events WHERE feed IS NOT NULL GROUP BY feed
ON CONFLICT (feed) DO UPDATE SET last_seq = MAX(feed_heads.last_seq, excluded.last_seq);
