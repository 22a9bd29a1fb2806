-- More state changes as server-side functions, one round trip each (see 0002). Also:
--   RS003: no active hook has the token.
-- A hook disposed between finding it and locking its run raises 40001, which callers retry.

-- Appends p_event to the run's stream under the next index; returns the index.
CREATE FUNCTION resumable_append_stream(
    p_run TEXT, p_lease BIGINT, p_position BIGINT, p_event JSONB, p_kind TEXT, p_now BIGINT)
RETURNS BIGINT
LANGUAGE plpgsql AS $$
DECLARE
    v_index BIGINT;
BEGIN
    -- The run's row lock serializes appends of the run; the primary key (run_id, idx) and the
    -- unique (run_id, position) reject any duplicate.
    PERFORM resumable_fence(p_run, p_lease);
    INSERT INTO stream_events (run_id, idx, position, payload, created_at)
    SELECT p_run, COALESCE(MAX(idx) + 1, 0), p_position, p_event, p_now FROM stream_events WHERE run_id = p_run
    RETURNING idx INTO v_index;
    PERFORM resumable_append(p_run, p_kind, jsonb_build_object('position', p_position, 'index', v_index), p_now);
    RETURN v_index;
END $$;

-- Records a step that completed at once (a recorded value).
CREATE FUNCTION resumable_record_step(
    p_run TEXT, p_lease BIGINT, p_position BIGINT, p_name TEXT, p_result JSONB, p_kind TEXT, p_payload JSONB,
    p_now BIGINT)
RETURNS VOID
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM resumable_fence(p_run, p_lease);
    INSERT INTO steps (run_id, position, name, status, attempts, result, created_at, updated_at)
    VALUES (p_run, p_position, p_name, 'completed', 1, p_result, p_now, p_now);
    PERFORM resumable_append(p_run, p_kind, p_payload, p_now);
END $$;

-- Ends the execution: the run waits (or is pending again when a payload arrived meanwhile);
-- returns the new status. p_channel, when not NULL, is notified at commit: 'work' when the run is
-- runnable now or at a time, 'changed' when only an outside event can wake it.
CREATE FUNCTION resumable_suspend_run(p_run TEXT, p_lease BIGINT, p_wake_at BIGINT, p_kind TEXT, p_channel TEXT,
    p_now BIGINT)
RETURNS TEXT
LANGUAGE plpgsql AS $$
DECLARE
    v_status TEXT;
BEGIN
    -- Losing a suspension in a crash of the server only leaves the run running under a lease that
    -- expires, after which it is replayed; WAL order keeps it ahead of anything written after it.
    PERFORM set_config('synchronous_commit', 'off', true);
    PERFORM resumable_fence(p_run, p_lease);
    UPDATE runs SET status = CASE WHEN wake_requested THEN 'pending' ELSE 'waiting' END,
        wake_at = p_wake_at, wake_requested = FALSE, lease_owner = NULL, lease_expires_at = NULL
    WHERE id = p_run RETURNING status INTO v_status;
    PERFORM resumable_append(p_run, p_kind, jsonb_build_object('wake_at', p_wake_at, 'status', v_status), p_now);
    IF p_channel IS NOT NULL THEN
        PERFORM pg_notify(p_channel,
            CASE WHEN v_status = 'pending' OR p_wake_at IS NOT NULL THEN 'work' ELSE 'changed' END);
    END IF;
    RETURN v_status;
END $$;

-- Makes a run that has not ended runnable again: a waiting run becomes pending, a running one
-- remembers the request so that its suspension is not final. The caller holds the row's lock.
CREATE FUNCTION resumable_wake_run(p_run TEXT, p_now BIGINT) RETURNS VOID
LANGUAGE plpgsql AS $$
BEGIN
    UPDATE runs SET wake_requested = TRUE,
        updated_at = CASE WHEN status = 'waiting' THEN p_now ELSE updated_at END,
        status = CASE WHEN status = 'waiting' THEN 'pending' ELSE status END
    WHERE id = p_run AND status IN ('pending', 'running', 'waiting');
END $$;

-- Delivers p_payload to the active hook with p_token and wakes its run; returns the run and the
-- payload's index among the hook's payloads.
CREATE FUNCTION resumable_resume_hook(p_token TEXT, p_payload JSONB, p_kind TEXT, p_channel TEXT, p_now BIGINT,
    OUT o_run TEXT, OUT o_index BIGINT)
LANGUAGE plpgsql AS $$
DECLARE
    v_position BIGINT;
BEGIN
    SELECT h.run_id INTO o_run FROM hooks h WHERE h.token = p_token AND h.active;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'RS003', MESSAGE = 'no active hook has this token';
    END IF;
    -- The run before its hook (the lock order of ending a run).
    PERFORM 1 FROM runs r WHERE r.id = o_run FOR NO KEY UPDATE;
    UPDATE hooks h SET received = h.received + 1 WHERE h.token = p_token AND h.active AND h.run_id = o_run
    RETURNING h.position, h.received - 1 INTO v_position, o_index;
    IF NOT FOUND THEN
        -- Disposed before the lock was taken: its run ended, or another run owns the token now.
        RAISE EXCEPTION USING ERRCODE = '40001', MESSAGE = 'hook changed owner';
    END IF;
    INSERT INTO hook_payloads (run_id, position, seq, payload, received_at)
    VALUES (o_run, v_position, o_index, p_payload, p_now);
    PERFORM resumable_append(o_run, p_kind, jsonb_build_object('position', v_position, 'index', o_index), p_now);
    PERFORM resumable_wake_run(o_run, p_now);
    IF p_channel IS NOT NULL THEN
        PERFORM pg_notify(p_channel, 'work');
    END IF;
END $$;
