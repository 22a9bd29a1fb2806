-- Child runs: a run started by another run's workflow remembers its parent, which is woken when
-- the child ends (and cancelled with it).

ALTER TABLE runs ADD COLUMN parent_run_id TEXT REFERENCES runs (id);

CREATE INDEX runs_by_parent ON runs (parent_run_id) WHERE parent_run_id IS NOT NULL;

-- Listing runs newest first, optionally by status.
CREATE INDEX runs_by_created ON runs (created_at, id);
CREATE INDEX runs_by_status_created ON runs (status, created_at, id);
