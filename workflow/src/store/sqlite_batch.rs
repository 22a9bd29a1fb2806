//! Group commit: the writer thread runs every write waiting in its queue inside one transaction,
//! each in a savepoint of its own, and commits them together, so one fsync makes all of them
//! durable. A write that fails rolls back to its savepoint and leaves the others in; callers are
//! answered only once the commit is done.

use std::panic::{AssertUnwindSafe, catch_unwind};

use rusqlite::Connection;
use tokio::sync::oneshot;

use super::sqlite_threads::db;
use crate::error::StoreError;

/// Most writes one commit covers.
pub(crate) const MAX_BATCH: usize = 64;

/// One caller's write, waiting for its batch.
pub(crate) trait BatchedWrite: Send {
    /// Whether this write may commit without an fsync of its own (see `synchronous = NORMAL`).
    fn relaxed(&self) -> bool;
    /// Runs the write in the batch's transaction; false if it failed.
    fn run(&mut self, connection: &Connection) -> bool;
    /// Answers the caller with the write's result once the batch committed (`Ok`) or failed.
    fn answer(self: Box<Self>, commit: Result<(), StoreError>);
}

/// A write as the pool queues it: the caller's work and where its answer goes.
pub(crate) struct PendingWrite<R, F> {
    pub relaxed: bool,
    pub work: Option<F>,
    pub result: Option<Result<R, StoreError>>,
    pub reply: oneshot::Sender<Result<R, StoreError>>,
}

impl<R, F> BatchedWrite for PendingWrite<R, F>
where
    R: Send,
    F: FnOnce(&Connection) -> Result<R, StoreError> + Send,
{
    fn relaxed(&self) -> bool {
        self.relaxed
    }

    fn run(&mut self, connection: &Connection) -> bool {
        let Some(work) = self.work.take() else { return false };
        let result = work(connection);
        let ok = result.is_ok();
        self.result = Some(result);
        ok
    }

    fn answer(self: Box<Self>, commit: Result<(), StoreError>) {
        let answer = match (self.result, commit) {
            (Some(Err(own)), _) => Err(own),
            (Some(Ok(value)), Ok(())) => Ok(value),
            (_, Err(commit)) => Err(commit),
            (None, Ok(())) => Err(StoreError::database("a write failed inside the database thread")),
        };
        let _ = self.reply.send(answer);
    }
}

/// The writer connection's durability mode, switched per batch.
pub(crate) struct Durability {
    /// Commits fsync unless a batch is all relaxed writes (`synchronous = FULL` configured).
    pub durable: bool,
    /// The connection currently runs at `synchronous = NORMAL`.
    pub relaxed: bool,
}

impl Durability {
    /// Sets `synchronous` for a batch: NORMAL if every write in it is relaxed, FULL otherwise.
    fn prepare(&mut self, connection: &Connection, relax: bool) -> Result<(), StoreError> {
        if !self.durable || relax == self.relaxed {
            return Ok(());
        }
        connection.pragma_update(None, "synchronous", if relax { "NORMAL" } else { "FULL" }).map_err(db)?;
        self.relaxed = relax;
        Ok(())
    }
}

/// Runs `batch` in one `BEGIN IMMEDIATE` transaction and answers every write.
pub(crate) fn run_batch(connection: &Connection, mut batch: Vec<Box<dyn BatchedWrite>>, durability: &mut Durability) {
    let relax = batch.iter().all(|write| write.relaxed());
    let outcome = durability
        .prepare(connection, relax)
        .and_then(|()| execute_cached(connection, "BEGIN IMMEDIATE"))
        .and_then(|()| {
            if let [only] = batch.as_mut_slice() {
                // Alone in its group, a write needs no savepoint: if it fails, the whole
                // transaction rolls back, and its caller gets its own error.
                if !run_caught(connection, only.as_mut()) {
                    return Err(StoreError::database("the write failed and was rolled back"));
                }
            } else {
                for write in batch.iter_mut() {
                    run_in_savepoint(connection, write.as_mut())?;
                }
            }
            execute_cached(connection, "COMMIT")
        });
    if outcome.is_err() && !connection.is_autocommit() {
        let _ = connection.execute_batch("ROLLBACK");
    }
    for write in batch {
        write.answer(outcome.clone());
    }
}

/// Runs one write; its changes are undone if it fails (or panics) and kept otherwise.
fn run_in_savepoint(connection: &Connection, write: &mut dyn BatchedWrite) -> Result<(), StoreError> {
    execute_cached(connection, "SAVEPOINT batched_write")?;
    if !run_caught(connection, write) {
        execute_cached(connection, "ROLLBACK TO batched_write")?;
    }
    execute_cached(connection, "RELEASE batched_write")
}

/// Runs a statement without parameters from the connection's statement cache (a group
/// commit runs the same few control statements for every write).
fn execute_cached(connection: &Connection, sql: &str) -> Result<(), StoreError> {
    connection.prepare_cached(sql).and_then(|mut statement| statement.execute([])).map(|_| ()).map_err(db)
}

/// Runs one write; false if it failed or panicked.
fn run_caught(connection: &Connection, write: &mut dyn BatchedWrite) -> bool {
    catch_unwind(AssertUnwindSafe(|| write.run(connection))).unwrap_or(false)
}
