//! The SQLite store's operations: each a transaction on the writer, or a read on a reader.

use super::*;

impl Store for SqliteStore {
    fn create_run(&self, run: NewRun) -> BoxFuture<'_, Result<CreatedRun, StoreError>> {
        Box::pin(async move {
            let id = RunId::generate();
            let input = to_json(&run.input);
            self.write_with(Commit::Durable, move |tx| {
                let now = now_ms();
                let mut feed = run.feed.clone();
                if let Some(parent) = &run.parent_run_id {
                    // A child of a run that has ended would run orphaned (writers are serialized here).
                    let parent_row: Option<(String, Option<String>)> = tx
                        .prepare_cached("SELECT status, feed FROM runs WHERE id = ?")
                        .and_then(|mut stmt| {
                            stmt.query_row(params![parent.as_str()], |row| Ok((row.get(0)?, row.get(1)?))).optional()
                        })
                        .map_err(db)?;
                    match parent_row {
                        Some((status, parent_feed)) if matches!(status.as_str(), "pending" | "running" | "waiting") => {
                            feed = parent_feed;
                        }
                        _ => return Err(StoreError::LeaseLost { run_id: parent.clone() }),
                    }
                }
                let inserted = tx
                    .prepare_cached(
                        "INSERT INTO runs
                             (id, workflow, input, status, idempotency_key, parent_run_id, feed, created_at, updated_at)
                         VALUES (?, ?, ?, 'pending', ?, ?, ?, ?, ?) ON CONFLICT (idempotency_key) DO NOTHING",
                    )
                    .and_then(|mut stmt| {
                        stmt.execute(params![
                            id.as_str(),
                            run.workflow,
                            input,
                            run.idempotency_key.as_deref(),
                            run.parent_run_id.as_ref().map(RunId::as_str),
                            feed,
                            now,
                            now,
                        ])
                    })
                    .map_err(db)?;
                if inserted == 0 {
                    // The unique constraint decided: a run with this key exists.
                    let existing: String = tx
                        .prepare_cached("SELECT id FROM runs WHERE idempotency_key = ?")
                        .and_then(|mut stmt| stmt.query_row(params![run.idempotency_key.as_deref()], |row| row.get(0)))
                        .map_err(db)?;
                    return Ok(CreatedRun { run_id: RunId::from(existing), created: false });
                }
                let payload = run.created_event(feed.as_deref());
                append(tx, &id, EventKind::RunCreated, &payload, now)?;
                Ok(CreatedRun { run_id: id, created: true })
            })
            .await
        })
    }

    fn get_run<'a>(&'a self, id: &'a RunId) -> BoxFuture<'a, Result<Option<RunInfo>, StoreError>> {
        Box::pin(async move {
            let id = id.clone();
            self.read(move |conn| {
                first_row(
                    conn,
                    concat!("SELECT ", run_columns!(), " FROM runs WHERE id = ?"),
                    params![id.as_str()],
                    run_from_row,
                )
            })
            .await
        })
    }

    fn list_runs<'a>(&'a self, filter: &'a RunFilter) -> BoxFuture<'a, Result<RunPage, StoreError>> {
        Box::pin(async move {
            use rusqlite::types::Value as Sql;
            let limit = filter.page_size();
            // Only the filters in use appear in the query, so that each shape gets a fitting plan
            // (a feed's runs of one workflow read `runs_by_feed`, newest first).
            let mut sql = concat!("SELECT ", run_columns!(), " FROM runs WHERE 1").to_owned();
            let mut values: Vec<Sql> = Vec::new();
            let mut and = |condition: &str, params: Vec<Sql>| {
                sql.push_str(" AND ");
                sql.push_str(condition);
                values.extend(params);
            };
            if let Some(feed) = &filter.feed {
                and("feed = ?", vec![Sql::Text(feed.clone())]);
            }
            if let Some(workflow) = &filter.workflow {
                and("workflow = ?", vec![Sql::Text(workflow.clone())]);
            }
            if !filter.statuses.is_empty() {
                let statuses: Vec<&str> = filter.statuses.iter().map(|s| s.as_str()).collect();
                let statuses = serde_json::to_string(&statuses).unwrap_or_else(|_| "[]".to_owned());
                and("status IN (SELECT value FROM json_each(?))", vec![Sql::Text(statuses)]);
            }
            if let Some(parent) = &filter.parent_run_id {
                and("parent_run_id = ?", vec![Sql::Text(parent.as_str().to_owned())]);
            }
            if let Some(after) = filter.created_after {
                and("created_at >= ?", vec![Sql::Integer(to_ms(after))]);
            }
            if let Some(before) = filter.created_before {
                and("created_at < ?", vec![Sql::Integer(to_ms(before))]);
            }
            if let Some(cursor) = &filter.cursor {
                let at = Sql::Integer(cursor.created_at_ms);
                let id = Sql::Text(cursor.run_id.as_str().to_owned());
                and("(created_at < ? OR (created_at = ? AND id < ?))", vec![at.clone(), at, id]);
            }
            sql.push_str(" ORDER BY created_at DESC, id DESC LIMIT ?");
            values.push(Sql::Integer(i64::from(limit) + 1));
            let runs =
                self.read(move |conn| all_rows(conn, &sql, rusqlite::params_from_iter(values), run_from_row)).await?;
            Ok(page(runs, limit))
        })
    }

    fn events<'a>(&'a self, id: &'a RunId) -> BoxFuture<'a, Result<Vec<Event>, StoreError>> {
        Box::pin(async move {
            let id = id.clone();
            self.read(move |conn| {
                all_rows(
                    conn,
                    "SELECT seq, kind, payload, created_at FROM events WHERE run_id = ? ORDER BY seq",
                    params![id.as_str()],
                    |row| rows::event(&id, row),
                )
            })
            .await
        })
    }

    fn claim<'a>(&'a self, req: &'a ClaimRequest) -> BoxFuture<'a, Result<Option<ClaimedRun>, StoreError>> {
        // An engine never takes over its own expired leases: its executions are alive while it
        // is, and a restarted engine has a new owner name.
        const RUNNABLE: &str = "SELECT id FROM runs
             WHERE workflow IN (SELECT value FROM json_each(?1))
               AND (status = 'pending'
                    OR (status = 'waiting' AND wake_at <= ?2)
                    OR (status = 'running' AND lease_expires_at <= ?2 AND lease_owner <> ?3))
             ORDER BY updated_at LIMIT 1";
        Box::pin(async move {
            let workflows = Arc::new(serde_json::to_string(&req.workflows).unwrap_or_else(|_| "[]".to_owned()));
            let owner = Arc::new(req.owner.clone());
            // Look on a reader first, so idle workers polling never take the write lock.
            let candidate = {
                let (workflows, owner) = (Arc::clone(&workflows), Arc::clone(&owner));
                self.read(move |conn| {
                    conn.prepare_cached(RUNNABLE)
                        .and_then(|mut stmt| {
                            stmt.query_row(params![workflows.as_str(), now_ms(), owner.as_str()], |row| {
                                row.get::<_, String>(0)
                            })
                            .optional()
                        })
                        .map_err(db)
                })
                .await?
            };
            if candidate.is_none() {
                return Ok(None);
            }
            let lease = duration_ms(req.lease);
            // A claim that a power loss undoes only hands the run back; what it leads to commits durably.
            self.write_with(Commit::Relaxed, move |tx| {
                // The clock is read once the write lock is held, so waiting for it never shortens a lease.
                let now = now_ms();
                let id: Option<String> = tx
                    .prepare_cached(RUNNABLE)
                    .and_then(|mut stmt| {
                        stmt.query_row(params![workflows.as_str(), now, owner.as_str()], |row| row.get(0)).optional()
                    })
                    .map_err(db)?;
                let Some(id) = id else {
                    return Ok(None);
                };
                let run_id = RunId::from(id);
                let claimed = first_row(
                    tx,
                    "UPDATE runs SET status = 'running', lease_owner = ?, lease_expires_at = ?,
                         lease_attempt = lease_attempt + 1, wake_at = NULL, wake_requested = 0,
                         started_at = COALESCE(started_at, ?)
                     WHERE id = ? RETURNING workflow, input, lease_attempt",
                    params![owner.as_str(), now.saturating_add(lease), now, run_id.as_str()],
                    |row| {
                        let attempt = count_of(get(row, "lease_attempt")?);
                        let workflow: String = get(row, "workflow")?;
                        let input = parse_json(&get::<String>(row, "input")?)?;
                        Ok((attempt, workflow, input))
                    },
                )?;
                let Some((attempt, workflow, input)) = claimed else {
                    return Err(StoreError::database(format!("run {run_id} vanished during its claim")));
                };
                let payload = json!({ "owner": owner.as_str(), "attempt": attempt });
                append(tx, &run_id, EventKind::RunStarted, &payload, now)?;
                let history = load_history(tx, &run_id)?;
                Ok(Some(ClaimedRun { fence: Fence { run_id, attempt, token: 0 }, workflow, input, history }))
            })
            .await
        })
    }

    fn renew_lease<'a>(&'a self, fence: &'a Fence, lease: Duration) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move {
            let fence = fence.clone();
            let lease = duration_ms(lease);
            self.write_with(Commit::Durable, move |tx| {
                let expires = now_ms().saturating_add(lease);
                let done = tx
                    .prepare_cached(
                        "UPDATE runs SET lease_expires_at = ?
                         WHERE id = ? AND status = 'running' AND lease_attempt = ?",
                    )
                    .and_then(|mut stmt| {
                        stmt.execute(params![expires, fence.run_id.as_str(), i64::from(fence.attempt)])
                    })
                    .map_err(db)?;
                // Nothing was written when the lease is lost, so rolling back is the same as committing.
                if done == 1 { Ok(()) } else { Err(StoreError::LeaseLost { run_id: fence.run_id.clone() }) }
            })
            .await
        })
    }

    fn next_wake_at<'a>(&'a self, workflows: &'a [String]) -> BoxFuture<'a, Result<Option<Millis>, StoreError>> {
        Box::pin(async move {
            let workflows = serde_json::to_string(workflows).unwrap_or_else(|_| "[]".to_owned());
            self.read(move |conn| {
                conn.prepare_cached(
                    "SELECT MIN(t) FROM (
                        SELECT MIN(wake_at) AS t FROM runs
                        WHERE status = 'waiting' AND wake_at IS NOT NULL
                            AND workflow IN (SELECT value FROM json_each(?1))
                        UNION ALL
                        SELECT MIN(lease_expires_at) AS t FROM runs
                        WHERE status = 'running' AND workflow IN (SELECT value FROM json_each(?1)))",
                )
                .and_then(|mut stmt| stmt.query_row(params![workflows], |row| row.get(0)))
                .map_err(db)
            })
            .await
        })
    }

    fn start_step<'a>(
        &'a self,
        fence: &'a Fence,
        position: u32,
        name: &'a str,
    ) -> BoxFuture<'a, Result<u32, StoreError>> {
        Box::pin(async move {
            let fence = fence.clone();
            let name = name.to_owned();
            self.write_with(Commit::Relaxed, move |tx| {
                let now = now_ms();
                let seq = fenced_seq(tx, &fence, now)?;
                let attempts: Option<i64> = tx
                    .prepare_cached(
                        "INSERT INTO steps (run_id, position, name, status, attempts, created_at, updated_at)
                         VALUES (?, ?, ?, 'running', 1, ?, ?)
                         ON CONFLICT (run_id, position) DO UPDATE
                             SET attempts = attempts + 1, status = 'running', retry_at = NULL,
                                 updated_at = excluded.updated_at
                             WHERE steps.status IN ('running', 'retrying') AND steps.name = excluded.name
                         RETURNING attempts",
                    )
                    .and_then(|mut stmt| {
                        stmt.query_row(params![fence.run_id.as_str(), i64::from(position), name, now, now], |row| {
                            row.get(0)
                        })
                        .optional()
                    })
                    .map_err(db)?;
                let Some(attempt) = attempts.map(count_of) else {
                    return Err(StoreError::Corrupt(format!(
                        "step at position {position} cannot start another attempt"
                    )));
                };
                let payload = json!({ "position": position, "name": name, "attempt": attempt });
                insert_event(tx, &fence.run_id, seq, EventKind::StepStarted, &payload, now)?;
                Ok(attempt)
            })
            .await
        })
    }

    fn update_step<'a>(
        &'a self,
        fence: &'a Fence,
        position: u32,
        update: StepUpdate,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move {
            let fence = fence.clone();
            let (status, attempt, result, error, retry_at, kind, payload) = match update {
                StepUpdate::Completed { attempt, result } => {
                    let payload = json!({ "position": position, "attempt": attempt, "result": result });
                    ("completed", attempt, Some(to_json(&result)), None, None, EventKind::StepCompleted, payload)
                }
                StepUpdate::Failed { attempt, error } => {
                    let payload = json!({ "position": position, "attempt": attempt, "error": error });
                    ("failed", attempt, None, Some(error), None, EventKind::StepFailed, payload)
                }
                StepUpdate::Retrying { attempt, error, retry_at } => {
                    let payload =
                        json!({ "position": position, "attempt": attempt, "error": error, "retry_at": retry_at });
                    ("retrying", attempt, None, Some(error), Some(retry_at), EventKind::StepRetrying, payload)
                }
            };
            self.write_with(Commit::Durable, move |tx| {
                let now = now_ms();
                let seq = fenced_seq(tx, &fence, now)?;
                let done = tx
                    .prepare_cached(
                        "UPDATE steps SET status = ?1, result = ?2, error = ?3, retry_at = ?4, updated_at = ?5,
                                          failures = failures + (?1 <> 'completed')
                         WHERE run_id = ? AND position = ? AND attempts = ? AND status = 'running'",
                    )
                    .and_then(|mut stmt| {
                        stmt.execute(params![
                            status,
                            result,
                            error,
                            retry_at,
                            now,
                            fence.run_id.as_str(),
                            i64::from(position),
                            i64::from(attempt),
                        ])
                    })
                    .map_err(db)?;
                if done != 1 {
                    return Err(StoreError::Corrupt(format!(
                        "step at position {position} is not running attempt {attempt}"
                    )));
                }
                insert_event(tx, &fence.run_id, seq, kind, &payload, now)
            })
            .await
        })
    }

    fn create_hook<'a>(
        &'a self,
        fence: &'a Fence,
        position: u32,
        token: &'a str,
        metadata: &'a Value,
    ) -> BoxFuture<'a, Result<HookCreation, StoreError>> {
        Box::pin(async move {
            let fence = fence.clone();
            let token = token.to_owned();
            let metadata = metadata.clone();
            self.write_with(Commit::Durable, move |tx| {
                let now = now_ms();
                let seq = fenced_seq(tx, &fence, now)?;
                let metadata_json = to_json(&metadata);
                // The partial unique index on active tokens decides; no check-then-insert.
                let inserted = tx
                    .prepare_cached(
                        "INSERT INTO hooks (run_id, position, token, metadata, active, created_at)
                         VALUES (?, ?, ?, ?, 1, ?)
                         ON CONFLICT (token) WHERE active = 1 DO NOTHING",
                    )
                    .and_then(|mut stmt| {
                        stmt.execute(params![fence.run_id.as_str(), i64::from(position), token, metadata_json, now])
                    })
                    .map_err(db)?;
                if inserted == 1 {
                    let payload = json!({ "position": position, "metadata": metadata });
                    insert_event(tx, &fence.run_id, seq, EventKind::HookCreated, &payload, now)?;
                    return Ok(HookCreation::Created);
                }
                let owner: String = tx
                    .prepare_cached("SELECT run_id FROM hooks WHERE token = ? AND active = 1")
                    .and_then(|mut stmt| stmt.query_row(params![token], |row| row.get(0)))
                    .map_err(db)?;
                tx.prepare_cached(
                    "INSERT INTO hooks (run_id, position, token, metadata, active, conflict_run_id, created_at)
                     VALUES (?, ?, ?, ?, 0, ?, ?)",
                )
                .and_then(|mut stmt| {
                    stmt.execute(params![fence.run_id.as_str(), i64::from(position), token, metadata_json, owner, now])
                })
                .map_err(db)?;
                let payload = json!({ "position": position, "owner_run_id": owner });
                insert_event(tx, &fence.run_id, seq, EventKind::HookConflict, &payload, now)?;
                Ok(HookCreation::Conflict { owner_run_id: RunId::from(owner) })
            })
            .await
        })
    }

    fn hook_payload<'a>(
        &'a self,
        run_id: &'a RunId,
        position: u32,
        index: u64,
    ) -> BoxFuture<'a, Result<Option<HookPayload>, StoreError>> {
        Box::pin(async move {
            let run_id = run_id.clone();
            let index = i64::try_from(index).unwrap_or(i64::MAX);
            self.read(move |conn| {
                first_row(
                    conn,
                    "SELECT payload, received_at FROM hook_payloads WHERE run_id = ? AND position = ? AND seq = ?",
                    params![run_id.as_str(), i64::from(position), index],
                    |row| {
                        Ok(HookPayload {
                            value: parse_json(&get::<String>(row, "payload")?)?,
                            received_at: get(row, "received_at")?,
                        })
                    },
                )
            })
            .await
        })
    }

    fn create_wait<'a>(
        &'a self,
        fence: &'a Fence,
        position: u32,
        due_at: Millis,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move {
            let fence = fence.clone();
            self.write_with(Commit::Durable, move |tx| {
                let now = now_ms();
                let seq = fenced_seq(tx, &fence, now)?;
                tx.prepare_cached(
                    "INSERT INTO waits (run_id, position, due_at, status, created_at) VALUES (?, ?, ?, 'pending', ?)",
                )
                .and_then(|mut stmt| stmt.execute(params![fence.run_id.as_str(), i64::from(position), due_at, now]))
                .map_err(db)?;
                let payload = json!({ "position": position, "due_at": due_at });
                insert_event(tx, &fence.run_id, seq, EventKind::WaitCreated, &payload, now)
            })
            .await
        })
    }

    fn resolve_wait<'a>(
        &'a self,
        fence: &'a Fence,
        position: u32,
        resolution: WaitResolution,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move {
            let fence = fence.clone();
            self.write_with(Commit::Durable, move |tx| {
                let now = now_ms();
                check_fence(tx, &fence)?;
                let (status, fired) = match resolution {
                    WaitResolution::Fired => ("fired", true),
                    WaitResolution::Cancelled => ("cancelled", false),
                };
                let done = tx
                    .prepare_cached(
                        "UPDATE waits SET status = ?, fired_at = ?
                         WHERE run_id = ? AND position = ? AND status = 'pending'",
                    )
                    .and_then(|mut stmt| {
                        stmt.execute(params![status, fired.then_some(now), fence.run_id.as_str(), i64::from(position)])
                    })
                    .map_err(db)?;
                if done == 1 {
                    let payload = json!({ "position": position, "fired": fired });
                    append(tx, &fence.run_id, EventKind::WaitCompleted, &payload, now)?;
                }
                Ok(())
            })
            .await
        })
    }

    fn record_step<'a>(
        &'a self,
        fence: &'a Fence,
        position: u32,
        name: &'a str,
        result: &'a Value,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move {
            let fence = fence.clone();
            let name = name.to_owned();
            let result_json = to_json(result);
            let payload = json!({ "position": position, "name": name, "attempt": 1, "result": result });
            self.write_with(Commit::Durable, move |tx| {
                let now = now_ms();
                let seq = fenced_seq(tx, &fence, now)?;
                tx.prepare_cached(
                    "INSERT INTO steps (run_id, position, name, status, attempts, result, created_at, updated_at)
                     VALUES (?, ?, ?, 'completed', 1, ?, ?, ?)",
                )
                .and_then(|mut stmt| {
                    stmt.execute(params![fence.run_id.as_str(), i64::from(position), name, result_json, now, now])
                })
                .map_err(db)?;
                insert_event(tx, &fence.run_id, seq, EventKind::StepCompleted, &payload, now)
            })
            .await
        })
    }

    fn suspend_run<'a>(
        &'a self,
        fence: &'a Fence,
        wake_at: Option<Millis>,
    ) -> BoxFuture<'a, Result<RunStatus, StoreError>> {
        Box::pin(async move {
            let fence = fence.clone();
            let status = self
                .write_with(Commit::Durable, move |tx| {
                    let now = now_ms();
                    check_fence(tx, &fence)?;
                    // A payload that arrived during the execution makes the run runnable again at once.
                    let status: String = tx
                        .prepare_cached(
                            "UPDATE runs SET status = CASE WHEN wake_requested = 1 THEN 'pending' ELSE 'waiting' END,
                                 wake_at = ?, wake_requested = 0, lease_owner = NULL, lease_expires_at = NULL
                             WHERE id = ? RETURNING status",
                        )
                        .and_then(|mut stmt| stmt.query_row(params![wake_at, fence.run_id.as_str()], |row| row.get(0)))
                        .map_err(db)?;
                    let payload = json!({ "wake_at": wake_at, "status": status });
                    append(tx, &fence.run_id, EventKind::RunSuspended, &payload, now)?;
                    Ok(status)
                })
                .await?;
            RunStatus::from_str(&status).map_err(StoreError::from)
        })
    }

    fn finish_run<'a>(&'a self, fence: &'a Fence, outcome: RunOutcome) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move {
            let fence = fence.clone();
            let (status, output, error, kind, payload) = match outcome {
                RunOutcome::Completed(v) => {
                    let output = to_json(&v);
                    let payload = json!({ "output": v });
                    ("completed", Some(output), None, EventKind::RunCompleted, payload)
                }
                RunOutcome::Failed(e) => {
                    let payload = json!({ "error": e });
                    ("failed", None, Some(e), EventKind::RunFailed, payload)
                }
            };
            self.write_with(Commit::Durable, move |tx| {
                let now = now_ms();
                check_fence(tx, &fence)?;
                release_resources(tx, &fence.run_id, now)?;
                tx.prepare_cached(
                    "UPDATE runs SET status = ?, output = ?, error = ?, completed_at = ?, wake_at = NULL,
                         lease_owner = NULL, lease_expires_at = NULL
                     WHERE id = ?",
                )
                .and_then(|mut stmt| stmt.execute(params![status, output, error, now, fence.run_id.as_str()]))
                .map_err(db)?;
                append(tx, &fence.run_id, kind, &payload, now)?;
                wake_parent(tx, &fence.run_id)
            })
            .await
        })
    }

    fn cancel_run<'a>(&'a self, id: &'a RunId, reason: &'a str) -> BoxFuture<'a, Result<RunStatus, StoreError>> {
        Box::pin(async move {
            let id = id.clone();
            let reason = reason.to_owned();
            self.write_with(Commit::Durable, move |tx| {
                let now = now_ms();
                let status: Option<String> = tx
                    .prepare_cached("SELECT status FROM runs WHERE id = ?")
                    .and_then(|mut stmt| stmt.query_row(params![id.as_str()], |row| row.get(0)).optional())
                    .map_err(db)?;
                let Some(status) = status else {
                    return Err(StoreError::RunNotFound(id));
                };
                let status = RunStatus::from_str(&status).map_err(StoreError::from)?;
                if status.is_terminal() {
                    return Ok(status);
                }
                cancel_one(tx, &id, &reason, now)?;
                // Descendants that have not ended go with it, parents before children.
                let descendants: Vec<String> = all_rows(
                    tx,
                    "WITH RECURSIVE tree(id, depth) AS (
                         SELECT id, 1 FROM runs WHERE parent_run_id = ?1
                         UNION ALL
                         SELECT r.id, t.depth + 1 FROM runs r JOIN tree t ON r.parent_run_id = t.id
                     )
                     SELECT tree.id FROM tree JOIN runs ON runs.id = tree.id
                     WHERE runs.status IN ('pending', 'running', 'waiting') ORDER BY tree.depth, tree.id",
                    params![id.as_str()],
                    |row| row.get(0).map_err(db),
                )?;
                let cascade = format!("parent run {id} was cancelled");
                for child in descendants {
                    cancel_one(tx, &RunId::from(child), &cascade, now)?;
                }
                wake_parent(tx, &id)?;
                Ok(RunStatus::Cancelled)
            })
            .await
        })
    }

    fn get_hook<'a>(&'a self, token: &'a str) -> BoxFuture<'a, Result<Option<HookInfo>, StoreError>> {
        Box::pin(async move {
            let token = token.to_owned();
            self.read(move |conn| {
                first_row(
                    conn,
                    "SELECT run_id, position, metadata, received, created_at FROM hooks WHERE token = ? AND active = 1",
                    params![token],
                    |row| {
                        Ok(HookInfo {
                            token: token.clone(),
                            run_id: RunId::from(get::<String>(row, "run_id")?),
                            position: position_of(row)?,
                            metadata: parse_json(&get::<String>(row, "metadata")?)?,
                            received: get::<i64>(row, "received")?.unsigned_abs(),
                            created_at: from_ms(get(row, "created_at")?),
                        })
                    },
                )
            })
            .await
        })
    }

    fn resume_hook<'a>(&'a self, token: &'a str, payload: Value) -> BoxFuture<'a, Result<ResumeReceipt, StoreError>> {
        Box::pin(async move {
            let token = token.to_owned();
            let payload = to_json(&payload);
            self.write_with(Commit::Durable, move |tx| {
                let now = now_ms();
                let hook = first_row(
                    tx,
                    "UPDATE hooks SET received = received + 1 WHERE token = ? AND active = 1
                     RETURNING run_id, position, received",
                    params![token],
                    |row| {
                        let run_id = RunId::from(get::<String>(row, "run_id")?);
                        Ok((run_id, position_of(row)?, get::<i64>(row, "received")? - 1))
                    },
                )?;
                let Some((run_id, position, index)) = hook else {
                    return Err(StoreError::HookNotFound(token));
                };
                tx.prepare_cached(
                    "INSERT INTO hook_payloads (run_id, position, seq, payload, received_at) VALUES (?, ?, ?, ?, ?)",
                )
                .and_then(|mut stmt| stmt.execute(params![run_id.as_str(), i64::from(position), index, payload, now]))
                .map_err(db)?;
                let event = json!({ "position": position, "index": index });
                append(tx, &run_id, EventKind::HookReceived, &event, now)?;
                wake_run(tx, run_id.as_str())?;
                Ok(ResumeReceipt { run_id, index: index.unsigned_abs() })
            })
            .await
        })
    }

    fn append_stream<'a>(
        &'a self,
        fence: &'a Fence,
        position: u32,
        event: &'a Value,
    ) -> BoxFuture<'a, Result<u64, StoreError>> {
        Box::pin(async move {
            let fence = fence.clone();
            let event = to_json(event);
            self.write_with(Commit::Durable, move |tx| {
                let now = now_ms();
                let seq = fenced_seq(tx, &fence, now)?;
                // The next numbers are computed inside the write transaction; the primary key
                // (run_id, idx) and the unique (run_id, position) reject any duplicate.
                let feed: Option<String> = tx
                    .prepare_cached("SELECT feed FROM runs WHERE id = ?")
                    .and_then(|mut stmt| stmt.query_row(params![fence.run_id.as_str()], |row| row.get(0)))
                    .map_err(db)?;
                let feed_seq: Option<i64> = match &feed {
                    None => None,
                    Some(feed) => Some(
                        tx.prepare_cached(
                            "INSERT INTO feed_heads (feed, last_seq) VALUES (?, 1)
                             ON CONFLICT (feed) DO UPDATE SET last_seq = last_seq + 1 RETURNING last_seq",
                        )
                        .and_then(|mut stmt| stmt.query_row(params![feed], |row| row.get(0)))
                        .map_err(db)?,
                    ),
                };
                let index: i64 = tx
                    .prepare_cached(
                        "INSERT INTO stream_events (run_id, idx, position, payload, created_at, feed, feed_seq)
                         SELECT ?, COALESCE(MAX(idx) + 1, 0), ?, ?, ?, ?, ? FROM stream_events WHERE run_id = ?
                         RETURNING idx",
                    )
                    .and_then(|mut stmt| {
                        stmt.query_row(
                            params![
                                fence.run_id.as_str(),
                                i64::from(position),
                                event,
                                now,
                                feed,
                                feed_seq,
                                fence.run_id.as_str()
                            ],
                            |row| row.get(0),
                        )
                    })
                    .map_err(db)?;
                let payload = json!({ "position": position, "index": index });
                insert_event(tx, &fence.run_id, seq, EventKind::StreamEmitted, &payload, now)?;
                Ok(index.unsigned_abs())
            })
            .await
        })
    }

    fn read_stream<'a>(
        &'a self,
        run_id: &'a RunId,
        from: u64,
        limit: u32,
    ) -> BoxFuture<'a, Result<Vec<(u64, Value)>, StoreError>> {
        Box::pin(async move {
            let run_id = run_id.clone();
            let from = i64::try_from(from).unwrap_or(i64::MAX);
            self.read(move |conn| {
                all_rows(
                    conn,
                    "SELECT idx, payload FROM stream_events WHERE run_id = ? AND idx >= ? ORDER BY idx LIMIT ?",
                    params![run_id.as_str(), from, i64::from(limit)],
                    |row| Ok((get::<i64>(row, "idx")?.unsigned_abs(), parse_json(&get::<String>(row, "payload")?)?)),
                )
            })
            .await
        })
    }

    fn feed_head<'a>(&'a self, feed: &'a str) -> BoxFuture<'a, Result<u64, StoreError>> {
        Box::pin(async move {
            let feed = feed.to_owned();
            let head = self
                .read(move |conn| {
                    first_row(conn, "SELECT last_seq FROM feed_heads WHERE feed = ?", params![feed], |row| {
                        get::<i64>(row, "last_seq")
                    })
                })
                .await?;
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
            let feed = feed.to_owned();
            let from = i64::try_from(from).unwrap_or(i64::MAX);
            self.read(move |conn| {
                all_rows(
                    conn,
                    "SELECT s.feed_seq, s.run_id, r.workflow, s.idx, s.payload
                     FROM stream_events s JOIN runs r ON r.id = s.run_id
                     WHERE s.feed = ? AND s.feed_seq >= ? ORDER BY s.feed_seq LIMIT ?",
                    params![feed, from, i64::from(limit)],
                    |row| rows::feed_entry(row),
                )
            })
            .await
        })
    }
}
