//! SQLite connections owned by dedicated threads, to which callers send whole units of work.
//!
//! A caller hands a closure to the pool; one of the pool's threads runs it against its own
//! connection and sends the result back. A transaction therefore costs one hand-off, however
//! many statements it runs, and a caller that stops waiting never leaves a transaction half done:
//! the closure runs to its end (a [`rusqlite::Transaction`] that was not committed rolls back
//! when dropped). Idle threads poll their queue for a moment before they sleep, and callers
//! poll for their answer before they wait to be woken ([`resumable_handoff`]): waking a
//! sleeping thread costs tens of microseconds on virtual machines, more than most statements.
//! The writer commits the writes
//! waiting in its queue together (see [`super::sqlite_batch`]). Closing the pool lets the work
//! already queued finish, then stops the threads and closes their connections.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::thread;
use std::time::Duration;

use crossbeam_channel::{Receiver, Sender, unbounded};
use resumable_handoff::{AnswerPolling, answer_soon, next_job};
use rusqlite::Connection;
use tokio::sync::oneshot;

use super::sqlite_batch::{BatchedWrite, Durability, MAX_BATCH, PendingWrite, run_batch};
use crate::error::StoreError;

/// How long an idle connection thread polls its queue before it sleeps.
const SPIN_BEFORE_SLEEP: Duration = Duration::from_micros(200);
/// How long a caller polls for its answer before it waits to be woken.
const POLL_FOR_ANSWER: Duration = Duration::from_micros(500);

type Work = Box<dyn FnOnce(&mut Connection) + Send>;

/// What a connection thread takes from the queue.
enum Job {
    /// A unit of work to run on the thread's connection.
    Run(Work),
    /// A write, committed together with the writes queued next to it.
    Write(Box<dyn BatchedWrite>),
    /// Stop: close the connection, then answer.
    Stop(oneshot::Sender<()>),
}

/// A fixed set of threads, each owning one connection, fed by one queue.
#[derive(Clone, Debug)]
pub(crate) struct ConnectionPool {
    queue: Sender<Job>,
    /// The number of threads.
    size: usize,
    /// Set by [`ConnectionPool::close`]; no work is taken after it.
    closed: Arc<AtomicBool>,
    /// Callers polling for their answer right now; more than one only burns the cores.
    pollers: Arc<AtomicUsize>,
}

impl ConnectionPool {
    /// Opens `size` connections with `open` (on their own threads) and fails if any does not open.
    pub(crate) fn open<F>(name: &str, size: usize, open: F) -> Result<ConnectionPool, StoreError>
    where
        F: Fn() -> Result<Connection, StoreError> + Send + Sync + 'static,
    {
        ConnectionPool::start(name, size, false, open)
    }

    /// Opens the one writer connection, whose [`write`](Self::write)s commit in groups; with
    /// `durable` (`synchronous = FULL`) a group of relaxed writes only commits without an fsync.
    pub(crate) fn open_writer<F>(name: &str, durable: bool, open: F) -> Result<ConnectionPool, StoreError>
    where
        F: Fn() -> Result<Connection, StoreError> + Send + Sync + 'static,
    {
        ConnectionPool::start(name, 1, durable, open)
    }

    fn start<F>(name: &str, size: usize, durable: bool, open: F) -> Result<ConnectionPool, StoreError>
    where
        F: Fn() -> Result<Connection, StoreError> + Send + Sync + 'static,
    {
        let (queue, work) = unbounded::<Job>();
        let spinners = Arc::new(AtomicUsize::new(0));
        let open = Arc::new(open);
        let size = size.max(1);
        for index in 0..size {
            let (opened_tx, opened_rx) = std::sync::mpsc::channel();
            let work = work.clone();
            let spinners = Arc::clone(&spinners);
            let open = open.clone();
            thread::Builder::new()
                .name(format!("{name}-{index}"))
                .spawn(move || match open() {
                    Ok(mut connection) => {
                        let _ = opened_tx.send(Ok(()));
                        let durability = Durability { durable, relaxed: false };
                        let stopped = serve(&mut connection, &work, &spinners, durability);
                        drop(work);
                        drop(connection);
                        if let Some(stopped) = stopped {
                            let _ = stopped.send(());
                        }
                    }
                    Err(e) => {
                        let _ = opened_tx.send(Err(e));
                    }
                })
                .map_err(|e| StoreError::database(format!("cannot start a database thread: {e}")))?;
            opened_rx.recv().map_err(|_| StoreError::database("a database thread stopped while opening"))??;
        }
        Ok(ConnectionPool {
            queue,
            size,
            closed: Arc::new(AtomicBool::new(false)),
            pollers: Arc::new(AtomicUsize::new(0)),
        })
    }

    /// Lets the work already queued finish, then stops the threads and closes their connections;
    /// later work fails. Returns once every connection is closed (at once if already closing).
    pub(crate) async fn close(&self) {
        if self.closed.swap(true, Ordering::AcqRel) {
            return;
        }
        let mut stopped = Vec::with_capacity(self.size);
        for _ in 0..self.size {
            let (tx, rx) = oneshot::channel();
            // Each thread takes one stop and takes nothing after it.
            if self.queue.send(Job::Stop(tx)).is_ok() {
                stopped.push(rx);
            }
        }
        for rx in stopped {
            let _ = rx.await;
        }
    }

    /// Runs `work` as a write on the writer connection: inside a transaction shared with the
    /// writes queued next to it, in a savepoint of its own (an error rolls back `work` alone),
    /// answered once that transaction committed. `relaxed` writes may skip the fsync when every
    /// write of their group is relaxed.
    pub(crate) async fn write<R, F>(&self, relaxed: bool, work: F) -> Result<R, StoreError>
    where
        R: Send + 'static,
        F: FnOnce(&Connection) -> Result<R, StoreError> + Send + 'static,
    {
        let (reply, answer) = oneshot::channel();
        let write = PendingWrite { relaxed, work: Some(work), result: None, reply };
        self.submit(Job::Write(Box::new(write)), answer).await
    }

    /// Runs `work` on one of the pool's connections and returns its result.
    pub(crate) async fn run<R, F>(&self, work: F) -> Result<R, StoreError>
    where
        R: Send + 'static,
        F: FnOnce(&mut Connection) -> Result<R, StoreError> + Send + 'static,
    {
        let (reply, answer) = oneshot::channel();
        let job: Work = Box::new(move |connection| {
            let _ = reply.send(work(connection));
        });
        self.submit(Job::Run(job), answer).await
    }

    /// Queues `job` and waits for its answer.
    async fn submit<R>(&self, job: Job, mut answer: oneshot::Receiver<Result<R, StoreError>>) -> Result<R, StoreError> {
        if self.closed.load(Ordering::Acquire) {
            return Err(StoreError::database("the database is closed"));
        }
        // Work queued behind a concurrent close is discarded when the threads are gone, and its
        // caller is told the thread stopped.
        self.queue.send(job).map_err(|_| StoreError::database("the database threads have stopped"))?;
        let polling = AnswerPolling { pollers: &self.pollers, poll: POLL_FOR_ANSWER, with_spare_core: None };
        answer_soon(&mut answer, polling).await.ok_or_else(stopped_during_query)?
    }
}

/// Runs work from the queue until every sender is gone (`None`) or a stop arrives (its answer).
fn serve(
    connection: &mut Connection,
    work: &Receiver<Job>,
    spinners: &AtomicUsize,
    mut durability: Durability,
) -> Option<oneshot::Sender<()>> {
    // A job taken from the queue while gathering a group of writes, run right after the group.
    let mut held = None;
    loop {
        let job = match held.take() {
            Some(job) => job,
            None => next_job(work, spinners, SPIN_BEFORE_SLEEP)?,
        };
        match job {
            Job::Run(job) => {
                // A panic in one unit of work must not take the connection's thread down with it.
                let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| job(connection)));
            }
            Job::Write(first) => {
                let mut group = vec![first];
                while group.len() < MAX_BATCH {
                    match work.try_recv() {
                        Ok(Job::Write(write)) => group.push(write),
                        Ok(other) => {
                            held = Some(other);
                            break;
                        }
                        Err(_) => break,
                    }
                }
                run_batch(connection, group, &mut durability);
            }
            Job::Stop(stopped) => return Some(stopped),
        }
    }
}

/// The error of a caller whose work a stopping thread dropped.
fn stopped_during_query() -> StoreError {
    StoreError::database("a database thread stopped during a query")
}

/// A [`rusqlite::Error`] as a store error.
pub(crate) fn db(e: rusqlite::Error) -> StoreError {
    StoreError::driver(e)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn memory() -> Result<Connection, StoreError> {
        Connection::open_in_memory().map_err(db)
    }

    #[tokio::test]
    async fn runs_work_and_returns_its_result() {
        let pool = ConnectionPool::open("test-db", 1, memory).unwrap();
        let n: i64 = pool.run(|c| c.query_row("SELECT 40 + 2", [], |r| r.get(0)).map_err(db)).await.unwrap();
        assert_eq!(n, 42);
    }

    #[tokio::test]
    async fn a_panicking_job_is_an_error_and_the_thread_lives_on() {
        let pool = ConnectionPool::open("test-db", 1, memory).unwrap();
        let failed = pool.run(|_| -> Result<(), StoreError> { panic!("boom") }).await;
        assert!(matches!(failed, Err(StoreError::Database(_))), "{failed:?}");
        let n: i64 = pool.run(|c| c.query_row("SELECT 1", [], |r| r.get(0)).map_err(db)).await.unwrap();
        assert_eq!(n, 1);
    }

    #[tokio::test]
    async fn a_caller_that_stops_waiting_does_not_cut_a_transaction_short() {
        let pool = ConnectionPool::open("test-db", 1, memory).unwrap();
        pool.run(|c| c.execute_batch("CREATE TABLE t (v INTEGER)").map_err(db)).await.unwrap();
        let slow = pool.run(|c| {
            let tx = c.transaction().map_err(db)?;
            tx.execute("INSERT INTO t VALUES (1)", []).map_err(db)?;
            std::thread::sleep(Duration::from_millis(50));
            tx.execute("INSERT INTO t VALUES (2)", []).map_err(db)?;
            tx.commit().map_err(db)
        });
        // Dropped before the transaction ends.
        let _ = tokio::time::timeout(Duration::from_millis(5), slow).await;
        let rows: i64 =
            pool.run(|c| c.query_row("SELECT COUNT(*) FROM t", [], |r| r.get(0)).map_err(db)).await.unwrap();
        assert_eq!(rows, 2);
    }

    #[tokio::test]
    async fn close_finishes_queued_work_then_closes_every_connection() {
        let dir = std::env::temp_dir().join(format!("resumable-threads-unit-{}", crate::ids::random_hex(8)));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("t.db");
        let file = path.clone();
        let pool = ConnectionPool::open("test-db", 2, move || Connection::open(&file).map_err(db)).unwrap();
        pool.run(|c| c.execute_batch("PRAGMA journal_mode = WAL; CREATE TABLE t (v INTEGER)").map_err(db))
            .await
            .unwrap();
        let slow = pool.run(|c| {
            std::thread::sleep(Duration::from_millis(30));
            c.execute("INSERT INTO t VALUES (1)", []).map_err(db)
        });
        let (inserted, ()) = tokio::join!(slow, async {
            tokio::time::sleep(Duration::from_millis(5)).await;
            pool.close().await;
        });
        assert_eq!(inserted.unwrap(), 1);
        let after = pool.run(|c| c.query_row("SELECT 1", [], |r| r.get::<_, i64>(0)).map_err(db)).await;
        assert!(matches!(after, Err(StoreError::Database(_))), "{after:?}");
        pool.close().await;
        // The last connection to close checkpoints the log and removes it.
        assert!(!dir.join("t.db-wal").exists());
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn a_connection_that_cannot_open_is_an_error() {
        let failed = ConnectionPool::open("test-db", 2, || Err(StoreError::database("no such file")));
        assert!(matches!(failed, Err(StoreError::Database(m)) if m.message() == "no such file"));
    }

    /// Writes queued behind a busy writer commit as one group; the one that fails and the one
    /// that panics leave nothing behind, the others all commit.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_group_of_writes_commits_together_and_a_failed_write_alone_rolls_back() {
        let pool = ConnectionPool::open_writer("test-db", false, memory).unwrap();
        pool.run(|c| c.execute_batch("CREATE TABLE t (v INTEGER)").map_err(db)).await.unwrap();
        let blocker = pool.clone();
        let busy = tokio::spawn(async move {
            blocker
                .run(|_| {
                    std::thread::sleep(Duration::from_millis(100));
                    Ok(())
                })
                .await
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        let mut writes = Vec::new();
        for v in 0..8i64 {
            let pool = pool.clone();
            writes.push(tokio::spawn(async move {
                pool.write(false, move |c| {
                    c.execute("INSERT INTO t VALUES (?1)", [v]).map_err(db)?;
                    match v {
                        3 => Err(StoreError::Corrupt("refused".into())),
                        5 => panic!("a write panicked"),
                        _ => Ok(v),
                    }
                })
                .await
            }));
            // Queue them in order.
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        busy.await.unwrap().unwrap();
        let mut answers = Vec::new();
        for write in writes {
            answers.push(write.await.unwrap());
        }
        assert_eq!(answers[3], Err(StoreError::Corrupt("refused".into())));
        assert!(matches!(answers[5], Err(StoreError::Database(_))), "{:?}", answers[5]);
        for v in [0, 1, 2, 4, 6, 7] {
            assert_eq!(answers[v as usize], Ok(v));
        }
        let kept: Vec<i64> = pool
            .run(|c| {
                let mut stmt = c.prepare("SELECT v FROM t ORDER BY v").map_err(db)?;
                let rows = stmt.query_map([], |r| r.get(0)).map_err(db)?;
                rows.collect::<Result<_, _>>().map_err(db)
            })
            .await
            .unwrap();
        assert_eq!(kept, [0, 1, 2, 4, 6, 7]);
    }

    #[tokio::test]
    async fn a_write_alone_in_its_group_that_fails_leaves_nothing_and_keeps_its_error() {
        let pool = ConnectionPool::open_writer("test-db", false, memory).unwrap();
        pool.run(|c| c.execute_batch("CREATE TABLE t (v INTEGER)").map_err(db)).await.unwrap();
        let failed = pool
            .write(false, |c| {
                c.execute("INSERT INTO t VALUES (1)", []).map_err(db)?;
                Err::<(), _>(StoreError::Corrupt("refused".into()))
            })
            .await;
        assert_eq!(failed, Err(StoreError::Corrupt("refused".into())));
        let rows: i64 =
            pool.run(|c| c.query_row("SELECT COUNT(*) FROM t", [], |r| r.get(0)).map_err(db)).await.unwrap();
        assert_eq!(rows, 0);
        assert_eq!(pool.write(false, |c| c.execute("INSERT INTO t VALUES (2)", []).map_err(db)).await, Ok(1));
    }
}
