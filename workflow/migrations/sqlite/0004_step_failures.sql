-- How many attempts of a step ended in an error (retrying or failed). Attempts that started and
-- never recorded an end were interrupted (a crash, a lost lease): attempts - failures of them.
-- Retries are budgeted on failures, interruptions on their own larger budget, so a server killed
-- a few times during one step does not use up that step's retries.
ALTER TABLE steps ADD COLUMN failures INTEGER NOT NULL DEFAULT 0;
-- Before this, every attempt counted against the retries: steps that failed keep that count.
UPDATE steps SET failures = attempts WHERE status IN ('retrying', 'failed');
