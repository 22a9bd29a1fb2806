//! The PostgreSQL store's operations: each one transaction, retried where that is safe.

use super::*;

/// The transactions behind the [`Store`] methods, one attempt each.
impl PgStore {
    async fn create_run_tx(&self, run: &NewRun) -> Tx<CreatedRun> {
        let id = RunId::generate();
        let mut tx = self.begin().await?;
        let now = now_ms();
        let mut feed = run.feed.clone();
        if let Some(parent) = &run.parent_run_id {
            // A child of a run that has ended would run orphaned; the lock orders this against a cancel.
            let parent_row: Option<(String, Option<String>)> =
                sqlx::query_as("SELECT status, feed FROM runs WHERE id = $1 FOR SHARE")
                    .bind(parent.as_str())
                    .fetch_optional(&mut *tx)
                    .await?;
            match parent_row {
                Some((status, parent_feed)) if matches!(status.as_str(), "pending" | "running" | "waiting") => {
                    feed = parent_feed;
                }
                _ => return Err(Failure::Store(StoreError::LeaseLost { run_id: parent.clone() })),
            }
        }
        let inserted = sqlx::query(
            "INSERT INTO runs (id, workflow, input, status, idempotency_key, parent_run_id, feed, created_at, updated_at)
             VALUES ($1, $2, $3::jsonb, 'pending', $4, $5, $6, $7, $7) ON CONFLICT (idempotency_key) DO NOTHING",
        )
        .bind(id.as_str())
        .bind(&run.workflow)
        .bind(to_json(&run.input))
        .bind(run.idempotency_key.as_deref())
        .bind(run.parent_run_id.as_ref().map(RunId::as_str))
        .bind(feed.as_deref())
        .bind(now)
        .execute(&mut *tx)
        .await?;
        if inserted.rows_affected() == 0 {
            // The unique constraint decided (after waiting for a concurrent inserter to commit);
            // this statement's snapshot sees the committed run.
            let existing: Option<String> = sqlx::query_scalar("SELECT id FROM runs WHERE idempotency_key = $1")
                .bind(run.idempotency_key.as_deref())
                .fetch_optional(&mut *tx)
                .await?;
            let existing =
                existing.ok_or_else(|| Failure::Transient(StoreError::database("idempotency key owner vanished")))?;
            tx.commit().await?;
            return Ok(CreatedRun { run_id: RunId::from(existing), created: false });
        }
        let payload = run.created_event(feed.as_deref());
        append(&mut tx, &id, EventKind::RunCreated, payload, now).await?;
        self.announce(&mut tx, &[(WORK, Some(id.as_str()))]).await?;
        tx.commit().await?;
        Ok(CreatedRun { run_id: id, created: true })
    }

    async fn claim_tx(&self, req: &ClaimRequest) -> Tx<Option<ClaimedRun>> {
        let mut conn = self.pool.acquire().await?;
        // Read once connected, so waiting for a connection never shortens the lease.
        let now = now_ms();
        // One statement, so one short transaction: pick the due run (skipping runs that another
        // transaction holds: being claimed, or written by their execution), stamp the lease with a
        // fresh token and append `run_started`. Its commit does not wait for the WAL flush: a claim
        // lost in a crash of the server leaves the old lease to expire, its worker (if it lives on)
        // is fenced out by the token, and WAL order keeps the claim ahead of the execution's writes.
        let token = crate::ids::random_u31();
        let row = sqlx::query(
            "WITH relaxed AS (SELECT set_config('synchronous_commit', 'off', true)), due AS (
                 SELECT id FROM runs WHERE ready_at <= $1 AND workflow = ANY($2)
                   -- An engine never takes over its own leases (it is alive; a restart has a new name).
                   AND NOT (status = 'running' AND lease_owner = $3)
                 ORDER BY ready_at LIMIT 1 FOR NO KEY UPDATE SKIP LOCKED
             ), claimed AS (
                 UPDATE runs SET status = 'running', lease_owner = $3, lease_expires_at = $4,
                     lease_attempt = lease_attempt + 1, lease_token = $6, wake_at = NULL, wake_requested = FALSE,
                     started_at = COALESCE(started_at, $1), last_seq = last_seq + 1, updated_at = $1
                 FROM due WHERE runs.id = due.id
                 RETURNING runs.id, runs.workflow, runs.input, runs.lease_attempt, runs.last_seq
             ), started AS (
                 INSERT INTO events (run_id, seq, kind, payload, created_at)
                 SELECT id, last_seq, $5, jsonb_build_object('owner', $3::text, 'attempt', lease_attempt), $1
                 FROM claimed
             )
             SELECT id, workflow, input::text AS input, lease_attempt FROM claimed, relaxed",
        )
        .bind(now)
        .bind(&req.workflows)
        .bind(&req.owner)
        .bind(now.saturating_add(duration_ms(req.lease)))
        .bind(EventKind::RunStarted.as_str())
        .bind(i64::from(token))
        .fetch_optional(&mut *conn)
        .await?;
        let Some(row) = row else {
            return Ok(None);
        };
        let run_id = RunId::from(get::<String>(&row, "id")?);
        let attempt = count_of(get(&row, "lease_attempt")?);
        let workflow: String = get(&row, "workflow")?;
        let input = parse_json(&get::<String>(&row, "input")?)?;
        // Read after the claim committed: only this execution writes the run's records from now on
        // (others are fenced out), except hook payloads, whose late arrival wakes the run again.
        let history = load_history(&mut conn, &run_id).await?;
        Ok(Some(ClaimedRun { fence: Fence { run_id, attempt, token }, workflow, input, history }))
    }

    async fn start_step_tx(&self, fence: &Fence, position: u32, name: &str) -> Tx<u32> {
        let attempt: i64 = sqlx::query_scalar("SELECT resumable_start_step($1, $2, $3, $4, $5, $6)")
            .bind(fence.run_id.as_str())
            .bind(lease_key(fence))
            .bind(i64::from(position))
            .bind(name)
            .bind(EventKind::StepStarted.as_str())
            .bind(now_ms())
            .fetch_one(&self.pool)
            .await
            .map_err(|e| fenced(e, fence))?;
        Ok(count_of(attempt))
    }

    async fn update_step_tx(&self, fence: &Fence, position: u32, update: &StepUpdate) -> Tx<()> {
        let (status, attempt, result, error, retry_at, kind, payload) = match update {
            StepUpdate::Completed { attempt, result } => {
                let payload = json!({ "position": position, "attempt": attempt, "result": result });
                ("completed", *attempt, Some(to_json(result)), None, None, EventKind::StepCompleted, payload)
            }
            StepUpdate::Failed { attempt, error } => {
                let error = message(error);
                let payload = json!({ "position": position, "attempt": attempt, "error": error });
                ("failed", *attempt, None, Some(error), None, EventKind::StepFailed, payload)
            }
            StepUpdate::Retrying { attempt, error, retry_at } => {
                let error = message(error);
                let payload = json!({ "position": position, "attempt": attempt, "error": error, "retry_at": retry_at });
                ("retrying", *attempt, None, Some(error), Some(*retry_at), EventKind::StepRetrying, payload)
            }
        };
        sqlx::query("SELECT resumable_update_step($1, $2, $3, $4, $5, $6::jsonb, $7, $8, $9, $10::jsonb, $11)")
            .bind(fence.run_id.as_str())
            .bind(lease_key(fence))
            .bind(i64::from(position))
            .bind(i64::from(attempt))
            .bind(status)
            .bind(result)
            .bind(error.as_deref())
            .bind(retry_at)
            .bind(kind.as_str())
            .bind(to_json(&payload))
            .bind(now_ms())
            .execute(&self.pool)
            .await
            .map_err(|e| fenced(e, fence))?;
        Ok(())
    }

    async fn create_hook_tx(&self, fence: &Fence, position: u32, token: &str, metadata: &Value) -> Tx<HookCreation> {
        let now = now_ms();
        let mut tx = self.begin().await?;
        check_fence(&mut tx, fence).await?;
        // The partial unique index on active tokens decides. A concurrent insert of the same token
        // makes this one wait for that transaction's end; then the conflict (or not) is final.
        let inserted = sqlx::query(
            "INSERT INTO hooks (run_id, position, token, metadata, active, created_at)
             VALUES ($1, $2, $3, $4::jsonb, TRUE, $5)
             ON CONFLICT (token) WHERE active DO NOTHING",
        )
        .bind(fence.run_id.as_str())
        .bind(i64::from(position))
        .bind(token)
        .bind(to_json(metadata))
        .bind(now)
        .execute(&mut *tx)
        .await?;
        let creation = if inserted.rows_affected() == 1 {
            let payload = json!({ "position": position, "metadata": metadata });
            append(&mut tx, &fence.run_id, EventKind::HookCreated, payload, now).await?;
            HookCreation::Created
        } else {
            // A new statement, a new snapshot: it sees the owner's committed hook, unless the owner
            // ended in between (then the whole transaction is tried again).
            let owner: Option<String> = sqlx::query_scalar("SELECT run_id FROM hooks WHERE token = $1 AND active")
                .bind(token)
                .fetch_optional(&mut *tx)
                .await?;
            let owner = owner.ok_or_else(|| Failure::Transient(StoreError::database("hook token owner vanished")))?;
            sqlx::query(
                "INSERT INTO hooks (run_id, position, token, metadata, active, conflict_run_id, created_at)
                 VALUES ($1, $2, $3, $4::jsonb, FALSE, $5, $6)",
            )
            .bind(fence.run_id.as_str())
            .bind(i64::from(position))
            .bind(token)
            .bind(to_json(metadata))
            .bind(&owner)
            .bind(now)
            .execute(&mut *tx)
            .await?;
            let payload = json!({ "position": position, "owner_run_id": owner });
            append(&mut tx, &fence.run_id, EventKind::HookConflict, payload, now).await?;
            HookCreation::Conflict { owner_run_id: RunId::from(owner) }
        };
        tx.commit().await?;
        Ok(creation)
    }

    async fn create_wait_tx(&self, fence: &Fence, position: u32, due_at: Millis) -> Tx<()> {
        let now = now_ms();
        let mut tx = self.begin().await?;
        check_fence(&mut tx, fence).await?;
        sqlx::query(
            "INSERT INTO waits (run_id, position, due_at, status, created_at) VALUES ($1, $2, $3, 'pending', $4)",
        )
        .bind(fence.run_id.as_str())
        .bind(i64::from(position))
        .bind(due_at)
        .bind(now)
        .execute(&mut *tx)
        .await?;
        let payload = json!({ "position": position, "due_at": due_at });
        append(&mut tx, &fence.run_id, EventKind::WaitCreated, payload, now).await?;
        tx.commit().await?;
        Ok(())
    }

    async fn resolve_wait_tx(&self, fence: &Fence, position: u32, resolution: WaitResolution) -> Tx<()> {
        let now = now_ms();
        let mut tx = self.begin().await?;
        check_fence(&mut tx, fence).await?;
        let (status, fired) = match resolution {
            WaitResolution::Fired => ("fired", true),
            WaitResolution::Cancelled => ("cancelled", false),
        };
        let done = sqlx::query(
            "UPDATE waits SET status = $1, fired_at = $2
             WHERE run_id = $3 AND position = $4 AND status = 'pending'",
        )
        .bind(status)
        .bind(fired.then_some(now))
        .bind(fence.run_id.as_str())
        .bind(i64::from(position))
        .execute(&mut *tx)
        .await?;
        if done.rows_affected() == 1 {
            let payload = json!({ "position": position, "fired": fired });
            append(&mut tx, &fence.run_id, EventKind::WaitCompleted, payload, now).await?;
        }
        tx.commit().await?;
        Ok(())
    }

    async fn record_step_tx(&self, fence: &Fence, position: u32, name: &str, result: &Value) -> Tx<()> {
        let payload = json!({ "position": position, "name": name, "attempt": 1, "result": result });
        sqlx::query("SELECT resumable_record_step($1, $2, $3, $4, $5::jsonb, $6, $7::jsonb, $8)")
            .bind(fence.run_id.as_str())
            .bind(lease_key(fence))
            .bind(i64::from(position))
            .bind(name)
            .bind(to_json(result))
            .bind(EventKind::StepCompleted.as_str())
            .bind(to_json(&payload))
            .bind(now_ms())
            .execute(&self.pool)
            .await
            .map_err(|e| fenced(e, fence))?;
        Ok(())
    }

    async fn suspend_run_tx(&self, fence: &Fence, wake_at: Option<Millis>) -> Tx<RunStatus> {
        // The function's own notification (it names no run) is off; this statement sends one that does.
        let status: String = sqlx::query_scalar(
            "SELECT s.status, CASE WHEN $5::text IS NOT NULL THEN pg_notify($5,
                 CASE WHEN s.status = 'pending' OR $3::bigint IS NOT NULL THEN 'work:' ELSE 'changed:' END || $1) END
             FROM resumable_suspend_run($1, $2, $3, $4, NULL, $6) AS s(status)",
        )
        .bind(fence.run_id.as_str())
        .bind(lease_key(fence))
        .bind(wake_at)
        .bind(EventKind::RunSuspended.as_str())
        .bind(self.channel.as_deref())
        .bind(now_ms())
        .fetch_one(&self.pool)
        .await
        .map_err(|e| fenced(e, fence))?;
        Ok(RunStatus::from_str(&status).map_err(StoreError::from)?)
    }

    async fn finish_run_tx(&self, fence: &Fence, outcome: &RunOutcome) -> Tx<()> {
        let (status, output, error, kind, payload) = match outcome {
            RunOutcome::Completed(v) => {
                ("completed", Some(to_json(v)), None, EventKind::RunCompleted, json!({ "output": v }))
            }
            RunOutcome::Failed(e) => {
                let e = message(e);
                let payload = json!({ "error": e });
                ("failed", None, Some(e), EventKind::RunFailed, payload)
            }
        };
        // One notification: the woken parent is work, and the run changed.
        sqlx::query(
            "SELECT CASE WHEN $10::text IS NOT NULL THEN
                 pg_notify($10, COALESCE('work:' || f.parent || ' ', '') || 'changed:' || $1) END
             FROM resumable_finish_run($1, $2, $3, $4::jsonb, $5, $6, $7::jsonb, $8, $9) AS f(parent)",
        )
        .bind(fence.run_id.as_str())
        .bind(lease_key(fence))
        .bind(status)
        .bind(output)
        .bind(error.as_deref())
        .bind(kind.as_str())
        .bind(to_json(&payload))
        .bind(EventKind::HookDisposed.as_str())
        .bind(now_ms())
        .bind(self.channel.as_deref())
        .execute(&self.pool)
        .await
        .map_err(|e| fenced(e, fence))?;
        Ok(())
    }

    async fn cancel_run_tx(&self, id: &RunId, reason: &str) -> Tx<RunStatus> {
        let now = now_ms();
        let mut tx = self.begin().await?;
        let parent = lock_parent(&mut tx, id).await?;
        let Some(status) = lock_run(&mut tx, id.as_str()).await? else {
            return Err(StoreError::RunNotFound(id.clone()).into());
        };
        if status.is_terminal() {
            return Ok(status);
        }
        let reason = message(reason);
        cancel_locked(&mut tx, id, &reason, now).await?;
        // Descendants that have not ended go with it, parents before children (the lock order).
        // The run's row is locked `FOR UPDATE`, so no child of it can be inserted meanwhile.
        let descendants: Vec<String> = sqlx::query_scalar(
            "WITH RECURSIVE tree(id, depth) AS (
                 SELECT id, 1 FROM runs WHERE parent_run_id = $1
                 UNION ALL
                 SELECT r.id, t.depth + 1 FROM runs r JOIN tree t ON r.parent_run_id = t.id
             )
             SELECT tree.id FROM tree JOIN runs ON runs.id = tree.id
             WHERE runs.status IN ('pending', 'running', 'waiting') ORDER BY tree.depth, tree.id",
        )
        .bind(id.as_str())
        .fetch_all(&mut *tx)
        .await?;
        let cascade = format!("parent run {id} was cancelled");
        let mut cancelled = vec![id.to_string()];
        for child in descendants {
            // It may have ended since the query; the lock makes its status final for this transaction.
            if lock_run(&mut tx, &child).await?.is_some_and(|s| !s.is_terminal()) {
                cancel_locked(&mut tx, &RunId::from(child.as_str()), &cascade, now).await?;
                cancelled.push(child);
            }
        }
        let mut entries = Vec::new();
        if let Some(parent) = parent.as_deref() {
            wake_run(&mut tx, parent, now).await?;
            entries.push((WORK, Some(parent)));
        }
        // A large cascade is announced as one change of unnamed runs.
        if cancelled.len() > MAX_NAMED_CHANGES {
            entries.push((CHANGED, None));
        } else {
            entries.extend(cancelled.iter().map(|run| (CHANGED, Some(run.as_str()))));
        }
        self.announce(&mut tx, &entries).await?;
        tx.commit().await?;
        Ok(RunStatus::Cancelled)
    }

    async fn resume_hook_tx(&self, token: &str, payload: &Value) -> Tx<ResumeReceipt> {
        // The function's own notification (it names no run) is off; this statement sends one that does.
        let row = sqlx::query(
            "SELECT h.o_run, h.o_index, CASE WHEN $4::text IS NOT NULL THEN pg_notify($4, 'work:' || h.o_run) END
             FROM resumable_resume_hook($1, $2::jsonb, $3, NULL, $5) AS h",
        )
        .bind(token)
        .bind(to_json(payload))
        .bind(EventKind::HookReceived.as_str())
        .bind(self.channel.as_deref())
        .bind(now_ms())
        .fetch_one(&self.pool)
        .await
        .map_err(|e| match &e {
            sqlx::Error::Database(d) if d.code().as_deref() == Some("RS003") => {
                StoreError::HookNotFound(token.to_owned()).into()
            }
            _ => Failure::from(e),
        })?;
        let run_id = RunId::from(get::<String>(&row, "o_run")?);
        let index: i64 = get(&row, "o_index")?;
        Ok(ResumeReceipt { run_id, index: index.unsigned_abs() })
    }

    async fn append_stream_tx(&self, fence: &Fence, position: u32, event: &Value) -> Tx<u64> {
        let index: i64 = sqlx::query_scalar("SELECT resumable_append_stream($1, $2, $3, $4::jsonb, $5, $6)")
            .bind(fence.run_id.as_str())
            .bind(lease_key(fence))
            .bind(i64::from(position))
            .bind(to_json(event))
            .bind(EventKind::StreamEmitted.as_str())
            .bind(now_ms())
            .fetch_one(&self.pool)
            .await
            .map_err(|e| fenced(e, fence))?;
        Ok(index.unsigned_abs())
    }
}

impl Store for PgStore {
    fn wake_signal(&self) -> Option<watch::Receiver<WakeHints>> {
        self.wake.clone()
    }

    fn changed_runs(&self) -> Option<broadcast::Receiver<RunId>> {
        self.changed.as_ref().map(broadcast::Sender::subscribe)
    }

    fn create_run(&self, run: NewRun) -> BoxFuture<'_, Result<CreatedRun, StoreError>> {
        Box::pin(async move { retrying(|| self.create_run_tx(&run)).await })
    }

    fn get_run<'a>(&'a self, id: &'a RunId) -> BoxFuture<'a, Result<Option<RunInfo>, StoreError>> {
        Box::pin(async move {
            let row = sqlx::query(&format!("SELECT {RUN_COLUMNS} FROM runs WHERE id = $1"))
                .bind(id.as_str())
                .fetch_optional(&self.pool)
                .await
                .map_err(db)?;
            row.as_ref().map(run_from_row).transpose()
        })
    }

    fn list_runs<'a>(&'a self, filter: &'a RunFilter) -> BoxFuture<'a, Result<RunPage, StoreError>> {
        Box::pin(async move {
            let limit = filter.page_size();
            // Only the filters in use appear in the query, so that each shape gets a fitting plan.
            let mut q = QueryBuilder::<Postgres>::new(format!("SELECT {RUN_COLUMNS} FROM runs WHERE TRUE"));
            if let Some(workflow) = &filter.workflow {
                q.push(" AND workflow = ").push_bind(workflow.as_str());
            }
            if !filter.statuses.is_empty() {
                let statuses: Vec<String> = filter.statuses.iter().map(|s| s.as_str().to_owned()).collect();
                q.push(" AND status = ANY(").push_bind(statuses).push(")");
            }
            if let Some(parent) = &filter.parent_run_id {
                q.push(" AND parent_run_id = ").push_bind(parent.as_str());
            }
            if let Some(feed) = &filter.feed {
                q.push(" AND feed = ").push_bind(feed.as_str());
            }
            if let Some(after) = filter.created_after {
                q.push(" AND created_at >= ").push_bind(to_ms(after));
            }
            if let Some(before) = filter.created_before {
                q.push(" AND created_at < ").push_bind(to_ms(before));
            }
            if let Some(cursor) = &filter.cursor {
                q.push(" AND (created_at, id) < (").push_bind(cursor.created_at_ms);
                q.push(", ").push_bind(cursor.run_id.as_str()).push(")");
            }
            q.push(" ORDER BY created_at DESC, id DESC LIMIT ").push_bind(i64::from(limit) + 1);
            let rows = q.build().fetch_all(&self.pool).await.map_err(db)?;
            let runs = rows.iter().map(run_from_row).collect::<Result<Vec<_>, _>>()?;
            Ok(page(runs, limit))
        })
    }

    fn events<'a>(&'a self, id: &'a RunId) -> BoxFuture<'a, Result<Vec<Event>, StoreError>> {
        Box::pin(async move {
            let rows = sqlx::query(
                "SELECT seq, kind, payload::text AS payload, created_at FROM events WHERE run_id = $1 ORDER BY seq",
            )
            .bind(id.as_str())
            .fetch_all(&self.pool)
            .await
            .map_err(db)?;
            rows.iter().map(|row| rows::event(id, row)).collect()
        })
    }

    fn claim<'a>(&'a self, req: &'a ClaimRequest) -> BoxFuture<'a, Result<Option<ClaimedRun>, StoreError>> {
        Box::pin(async move { retrying(|| self.claim_tx(req)).await })
    }

    fn renew_lease<'a>(&'a self, fence: &'a Fence, lease: Duration) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move {
            let expires = now_ms().saturating_add(duration_ms(lease));
            let done = sqlx::query(
                "UPDATE runs SET lease_expires_at = $1
                 WHERE id = $2 AND status = 'running' AND lease_attempt = $3 AND lease_token = $4",
            )
            .bind(expires)
            .bind(fence.run_id.as_str())
            .bind(i64::from(fence.attempt))
            .bind(i64::from(fence.token))
            .execute(&self.pool)
            .await
            .map_err(db)?;
            if done.rows_affected() == 1 { Ok(()) } else { Err(StoreError::LeaseLost { run_id: fence.run_id.clone() }) }
        })
    }

    fn next_wake_at<'a>(&'a self, workflows: &'a [String]) -> BoxFuture<'a, Result<Option<Millis>, StoreError>> {
        Box::pin(async move {
            // A past time (a due run that a claim skipped because another transaction held it)
            // makes the worker look again at once, as on SQLite.
            sqlx::query_scalar(
                "SELECT MIN(ready_at) FROM runs
                 WHERE ready_at IS NOT NULL AND status <> 'pending' AND workflow = ANY($1)",
            )
            .bind(workflows)
            .fetch_one(&self.pool)
            .await
            .map_err(db)
        })
    }

    fn start_step<'a>(
        &'a self,
        fence: &'a Fence,
        position: u32,
        name: &'a str,
    ) -> BoxFuture<'a, Result<u32, StoreError>> {
        Box::pin(async move { retrying(|| self.start_step_tx(fence, position, name)).await })
    }

    fn update_step<'a>(
        &'a self,
        fence: &'a Fence,
        position: u32,
        update: StepUpdate,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move { retrying(|| self.update_step_tx(fence, position, &update)).await })
    }

    fn create_hook<'a>(
        &'a self,
        fence: &'a Fence,
        position: u32,
        token: &'a str,
        metadata: &'a Value,
    ) -> BoxFuture<'a, Result<HookCreation, StoreError>> {
        Box::pin(async move { retrying(|| self.create_hook_tx(fence, position, token, metadata)).await })
    }

    fn hook_payload<'a>(
        &'a self,
        run_id: &'a RunId,
        position: u32,
        index: u64,
    ) -> BoxFuture<'a, Result<Option<HookPayload>, StoreError>> {
        Box::pin(async move {
            let row = sqlx::query(
                "SELECT payload::text AS payload, received_at FROM hook_payloads
                 WHERE run_id = $1 AND position = $2 AND seq = $3",
            )
            .bind(run_id.as_str())
            .bind(i64::from(position))
            .bind(i64::try_from(index).unwrap_or(i64::MAX))
            .fetch_optional(&self.pool)
            .await
            .map_err(db)?;
            let Some(row) = row else {
                return Ok(None);
            };
            Ok(Some(HookPayload {
                value: parse_json(&get::<String>(&row, "payload")?)?,
                received_at: get(&row, "received_at")?,
            }))
        })
    }

    fn create_wait<'a>(
        &'a self,
        fence: &'a Fence,
        position: u32,
        due_at: Millis,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move { retrying(|| self.create_wait_tx(fence, position, due_at)).await })
    }

    fn resolve_wait<'a>(
        &'a self,
        fence: &'a Fence,
        position: u32,
        resolution: WaitResolution,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move { retrying(|| self.resolve_wait_tx(fence, position, resolution)).await })
    }

    fn record_step<'a>(
        &'a self,
        fence: &'a Fence,
        position: u32,
        name: &'a str,
        result: &'a Value,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move { retrying(|| self.record_step_tx(fence, position, name, result)).await })
    }

    fn suspend_run<'a>(
        &'a self,
        fence: &'a Fence,
        wake_at: Option<Millis>,
    ) -> BoxFuture<'a, Result<RunStatus, StoreError>> {
        Box::pin(async move { retrying(|| self.suspend_run_tx(fence, wake_at)).await })
    }

    fn finish_run<'a>(&'a self, fence: &'a Fence, outcome: RunOutcome) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move { retrying(|| self.finish_run_tx(fence, &outcome)).await })
    }

    fn cancel_run<'a>(&'a self, id: &'a RunId, reason: &'a str) -> BoxFuture<'a, Result<RunStatus, StoreError>> {
        Box::pin(async move { retrying(|| self.cancel_run_tx(id, reason)).await })
    }

    fn get_hook<'a>(&'a self, token: &'a str) -> BoxFuture<'a, Result<Option<HookInfo>, StoreError>> {
        Box::pin(async move {
            let row = sqlx::query(
                "SELECT run_id, position, metadata::text AS metadata, received, created_at FROM hooks WHERE token = $1 AND active",
            )
            .bind(token)
            .fetch_optional(&self.pool)
            .await
            .map_err(db)?;
            let Some(row) = row else {
                return Ok(None);
            };
            Ok(Some(HookInfo {
                token: token.to_owned(),
                run_id: RunId::from(get::<String>(&row, "run_id")?),
                position: position_of(&row)?,
                metadata: parse_json(&get::<String>(&row, "metadata")?)?,
                received: get::<i64>(&row, "received")?.unsigned_abs(),
                created_at: from_ms(get(&row, "created_at")?),
            }))
        })
    }

    fn resume_hook<'a>(&'a self, token: &'a str, payload: Value) -> BoxFuture<'a, Result<ResumeReceipt, StoreError>> {
        Box::pin(async move { retrying(|| self.resume_hook_tx(token, &payload)).await })
    }

    fn append_stream<'a>(
        &'a self,
        fence: &'a Fence,
        position: u32,
        event: &'a Value,
    ) -> BoxFuture<'a, Result<u64, StoreError>> {
        Box::pin(async move { retrying(|| self.append_stream_tx(fence, position, event)).await })
    }

    fn read_stream<'a>(
        &'a self,
        run_id: &'a RunId,
        from: u64,
        limit: u32,
    ) -> BoxFuture<'a, Result<Vec<(u64, Value)>, StoreError>> {
        Box::pin(async move {
            let rows = sqlx::query(
                "SELECT idx, payload::text AS payload FROM stream_events
                 WHERE run_id = $1 AND idx >= $2 ORDER BY idx LIMIT $3",
            )
            .bind(run_id.as_str())
            .bind(i64::try_from(from).unwrap_or(i64::MAX))
            .bind(i64::from(limit))
            .fetch_all(&self.pool)
            .await
            .map_err(db)?;
            rows.iter()
                .map(|row| Ok((get::<i64>(row, "idx")?.unsigned_abs(), parse_json(&get::<String>(row, "payload")?)?)))
                .collect()
        })
    }

    fn feed_head<'a>(&'a self, feed: &'a str) -> BoxFuture<'a, Result<u64, StoreError>> {
        Box::pin(async move {
            let head: Option<i64> = sqlx::query_scalar("SELECT last_seq FROM feed_heads WHERE feed = $1")
                .bind(feed)
                .fetch_optional(&self.pool)
                .await
                .map_err(db)?;
            Ok(head.unwrap_or_default().unsigned_abs())
        })
    }

    fn read_feed<'a>(
        &'a self,
        feed: &'a str,
        from: u64,
        limit: u32,
    ) -> BoxFuture<'a, Result<Vec<FeedEntry>, StoreError>> {
        Box::pin(async move {
            // One statement, so one snapshot: numbers commit in order (see `resumable_append_stream`),
            // so the rows it sees from `from` on have no gaps.
            let rows = sqlx::query(
                "SELECT s.feed_seq, s.run_id, r.workflow, s.idx, s.payload::text AS payload
                 FROM stream_events s JOIN runs r ON r.id = s.run_id
                 WHERE s.feed = $1 AND s.feed_seq >= $2 ORDER BY s.feed_seq LIMIT $3",
            )
            .bind(feed)
            .bind(i64::try_from(from).unwrap_or(i64::MAX))
            .bind(i64::from(limit))
            .fetch_all(&self.pool)
            .await
            .map_err(db)?;
            rows.iter().map(rows::feed_entry).collect()
        })
    }
}
