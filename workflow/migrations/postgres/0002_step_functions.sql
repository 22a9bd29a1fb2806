-- The hot path of a step as server-side functions: one round trip per state change instead of a
-- transaction of five or six statements. Errors carry our own SQLSTATEs:
--   RS001: the execution's lease was lost (the run is not running under this lease attempt);
--   RS002: the step is not in a state that allows the change (a corrupt or raced history).

-- A random number drawn by every claim: with it, a claim lost in a crash of the server (claims do
-- not wait for the WAL flush) and the next claim of the run never share a fence.
ALTER TABLE runs ADD COLUMN lease_token BIGINT NOT NULL DEFAULT 0;

-- p_lease is the execution's lease key: its claim's token in the high 32 bits, its lease attempt
-- in the low 32.
CREATE FUNCTION resumable_fence(p_run TEXT, p_lease BIGINT) RETURNS VOID
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM 1 FROM runs
    WHERE id = p_run AND status = 'running'
      AND lease_attempt = (p_lease & 4294967295) AND lease_token = (p_lease >> 32)
    FOR NO KEY UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'RS001', MESSAGE = 'lease lost';
    END IF;
END $$;

CREATE FUNCTION resumable_append(p_run TEXT, p_kind TEXT, p_payload JSONB, p_now BIGINT) RETURNS BIGINT
LANGUAGE plpgsql AS $$
DECLARE
    v_seq BIGINT;
BEGIN
    UPDATE runs SET last_seq = last_seq + 1, updated_at = p_now WHERE id = p_run RETURNING last_seq INTO v_seq;
    INSERT INTO events (run_id, seq, kind, payload, created_at) VALUES (p_run, v_seq, p_kind, p_payload, p_now);
    RETURN v_seq;
END $$;

-- Records the start of an attempt of the step at p_position; returns the attempt's number. Its
-- commit does not wait for the WAL flush: the step's durable end flushes it anyway.
CREATE FUNCTION resumable_start_step(
    p_run TEXT, p_lease BIGINT, p_position BIGINT, p_name TEXT, p_kind TEXT, p_now BIGINT)
RETURNS BIGINT
LANGUAGE plpgsql AS $$
DECLARE
    v_attempts BIGINT;
BEGIN
    PERFORM set_config('synchronous_commit', 'off', true);
    PERFORM resumable_fence(p_run, p_lease);
    INSERT INTO steps (run_id, position, name, status, attempts, created_at, updated_at)
    VALUES (p_run, p_position, p_name, 'running', 1, p_now, p_now)
    ON CONFLICT (run_id, position) DO UPDATE
        SET attempts = steps.attempts + 1, status = 'running', retry_at = NULL, updated_at = excluded.updated_at
        WHERE steps.status IN ('running', 'retrying') AND steps.name = excluded.name
    RETURNING attempts INTO v_attempts;
    IF v_attempts IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'RS002',
            MESSAGE = format('step at position %s cannot start another attempt', p_position);
    END IF;
    PERFORM resumable_append(p_run, p_kind,
        jsonb_build_object('position', p_position, 'name', p_name, 'attempt', v_attempts), p_now);
    RETURN v_attempts;
END $$;

-- Ends attempt p_attempt of the step at p_position (completed, failed or retrying) and appends
-- its event.
CREATE FUNCTION resumable_update_step(
    p_run TEXT, p_lease BIGINT, p_position BIGINT, p_attempt BIGINT, p_status TEXT, p_result JSONB,
    p_error TEXT, p_retry_at BIGINT, p_kind TEXT, p_payload JSONB, p_now BIGINT)
RETURNS VOID
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM resumable_fence(p_run, p_lease);
    UPDATE steps SET status = p_status, result = p_result, error = p_error, retry_at = p_retry_at, updated_at = p_now
    WHERE run_id = p_run AND position = p_position AND attempts = p_attempt AND status = 'running';
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'RS002',
            MESSAGE = format('step at position %s is not running attempt %s', p_position, p_attempt);
    END IF;
    PERFORM resumable_append(p_run, p_kind, p_payload, p_now);
END $$;
