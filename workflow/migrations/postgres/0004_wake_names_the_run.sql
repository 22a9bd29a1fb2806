-- Wake-up notifications name the run they are about ('work:<run>', 'changed:<run>'), so that an
-- engine wakes only the waiters of that run; a payload without a run ('work', 'changed', from an
-- engine of an earlier release) still wakes every waiter. The two functions that notify are
-- replaced with versions that differ only in their payloads.

CREATE OR REPLACE FUNCTION resumable_suspend_run(p_run TEXT, p_lease BIGINT, p_wake_at BIGINT, p_kind TEXT, p_channel TEXT,
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
            CASE WHEN v_status = 'pending' OR p_wake_at IS NOT NULL THEN 'work:' ELSE 'changed:' END || p_run);
    END IF;
    RETURN v_status;
END $$;

CREATE OR REPLACE FUNCTION resumable_resume_hook(p_token TEXT, p_payload JSONB, p_kind TEXT, p_channel TEXT, p_now BIGINT,
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
        PERFORM pg_notify(p_channel, 'work:' || o_run);
    END IF;
END $$;
