-- Ending a run as one server-side function: one round trip instead of eight (begin, the parent's
-- lock, the fence, the hooks, the timers, the run, its event, the notification, commit). The
-- statement that calls it sends the notification, naming the run and the parent it returns.

-- Disposes the run's active hooks (appending p_kind for each, in position order) and cancels its
-- pending timers.
CREATE FUNCTION resumable_release_resources(p_run TEXT, p_kind TEXT, p_now BIGINT) RETURNS VOID
LANGUAGE plpgsql AS $$
DECLARE
    v_position BIGINT;
BEGIN
    FOR v_position IN
        WITH disposed AS (
            UPDATE hooks SET active = FALSE, disposed_at = p_now WHERE run_id = p_run AND active RETURNING position
        )
        SELECT position FROM disposed ORDER BY position
    LOOP
        PERFORM resumable_append(p_run, p_kind, jsonb_build_object('position', v_position), p_now);
    END LOOP;
    UPDATE waits SET status = 'cancelled' WHERE run_id = p_run AND status = 'pending';
END $$;

-- Ends p_run under lease p_lease with p_status ('completed' or 'failed'): its hooks disposed, its
-- timers cancelled, event p_kind appended, its parent (if any) woken. Returns the woken parent.
CREATE FUNCTION resumable_finish_run(
    p_run TEXT, p_lease BIGINT, p_status TEXT, p_output JSONB, p_error TEXT, p_kind TEXT, p_payload JSONB,
    p_hook_kind TEXT, p_now BIGINT)
RETURNS TEXT
LANGUAGE plpgsql AS $$
DECLARE
    v_parent TEXT;
BEGIN
    -- The parent before the run (the lock order of ending a run).
    SELECT p.id INTO v_parent FROM runs c JOIN runs p ON p.id = c.parent_run_id
    WHERE c.id = p_run FOR NO KEY UPDATE OF p;
    PERFORM resumable_fence(p_run, p_lease);
    PERFORM resumable_release_resources(p_run, p_hook_kind, p_now);
    UPDATE runs SET status = p_status, output = p_output, error = p_error, completed_at = p_now, wake_at = NULL,
        lease_owner = NULL, lease_expires_at = NULL
    WHERE id = p_run;
    PERFORM resumable_append(p_run, p_kind, p_payload, p_now);
    IF v_parent IS NOT NULL THEN
        PERFORM resumable_wake_run(v_parent, p_now);
    END IF;
    RETURN v_parent;
END $$;
