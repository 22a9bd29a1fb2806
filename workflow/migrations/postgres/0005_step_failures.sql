-- How many attempts of a step ended in an error (retrying or failed). Attempts that started and
-- never recorded an end were interrupted (a crash, a lost lease): attempts - failures of them.
-- Retries are budgeted on failures, interruptions on their own larger budget, so a server killed
-- a few times during one step does not use up that step's retries.
ALTER TABLE steps ADD COLUMN failures BIGINT NOT NULL DEFAULT 0;
-- Before this, every attempt counted against the retries: steps that failed keep that count.
UPDATE steps SET failures = attempts WHERE status IN ('retrying', 'failed');

CREATE OR REPLACE FUNCTION resumable_update_step(
    p_run TEXT, p_lease BIGINT, p_position BIGINT, p_attempt BIGINT, p_status TEXT, p_result JSONB,
    p_error TEXT, p_retry_at BIGINT, p_kind TEXT, p_payload JSONB, p_now BIGINT)
RETURNS VOID
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM resumable_fence(p_run, p_lease);
    UPDATE steps SET status = p_status, result = p_result, error = p_error, retry_at = p_retry_at, updated_at = p_now,
                     failures = failures + CASE WHEN p_status = 'completed' THEN 0 ELSE 1 END
    WHERE run_id = p_run AND position = p_position AND attempts = p_attempt AND status = 'running';
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'RS002',
            MESSAGE = format('step at position %s is not running attempt %s', p_position, p_attempt);
    END IF;
    PERFORM resumable_append(p_run, p_kind, p_payload, p_now);
END $$;
