//! [`AppDb`](super::AppDb) statements on the workflow store's SQLite connections.

use std::sync::Arc;

use resumable_workflow::migrations::migrate_sqlite;
use resumable_workflow::{SqliteStore, StoreError};
use rusqlite::types::ValueRef;

use super::{DbError, MIGRATIONS_TABLE, Param, Row, SQLITE_MIGRATIONS, SqlValue, Step, TxOutcome};

/// A SQLite error inside a [`SqliteStore`] closure.
pub(super) fn sqlite(e: rusqlite::Error) -> StoreError {
    StoreError::driver(e)
}

/// The SQLite migrations, in the store's write transaction.
pub(super) fn sqlite_migrate(conn: &rusqlite::Connection) -> Result<(), StoreError> {
    migrate_sqlite(conn, MIGRATIONS_TABLE, SQLITE_MIGRATIONS)
}

/// Runs a statement that returns rows on SQLite: a `SELECT` on a read connection, anything else
/// on the writer.
pub(super) async fn sqlite_fetch(
    store: &SqliteStore,
    sql: &'static str,
    params: Vec<Param>,
) -> Result<Vec<Row>, DbError> {
    let work = move |conn: &rusqlite::Connection| sqlite_query(conn, sql, &params);
    Ok(if is_select(sql) { store.read(work).await? } else { store.write(work).await? })
}

/// Whether `sql` is a `SELECT` (which reads only).
pub(super) fn is_select(sql: &str) -> bool {
    sql.trim_start().get(..6).is_some_and(|word| word.eq_ignore_ascii_case("select"))
}

/// Prepares `sql` (cached) and binds `params` to `$1`, `$2`, … by name: SQLite numbers named
/// parameters by first appearance, not by the digits.
pub(super) fn sqlite_prepare<'c>(
    conn: &'c rusqlite::Connection,
    sql: &str,
    params: &[Param],
) -> Result<rusqlite::CachedStatement<'c>, StoreError> {
    let mut stmt = conn.prepare_cached(sql).map_err(sqlite)?;
    if stmt.parameter_count() != params.len() {
        return Err(StoreError::database(format!(
            "the statement takes {} parameters, {} were given",
            stmt.parameter_count(),
            params.len()
        )));
    }
    for (i, param) in params.iter().enumerate() {
        let name = format!("${}", i + 1);
        let index = stmt
            .parameter_index(&name)
            .map_err(sqlite)?
            .ok_or_else(|| StoreError::database(format!("the statement has no parameter {name}")))?;
        stmt.raw_bind_parameter(index, param).map_err(sqlite)?;
    }
    Ok(stmt)
}

/// Runs one statement that returns no rows; the rows it affected.
pub(super) fn sqlite_execute(conn: &rusqlite::Connection, sql: &str, params: &[Param]) -> Result<u64, StoreError> {
    let affected = sqlite_prepare(conn, sql, params)?.raw_execute().map_err(sqlite)?;
    Ok(u64::try_from(affected).unwrap_or(u64::MAX))
}

/// Runs one statement and reads all its rows.
pub(super) fn sqlite_query(conn: &rusqlite::Connection, sql: &str, params: &[Param]) -> Result<Vec<Row>, StoreError> {
    let mut stmt = sqlite_prepare(conn, sql, params)?;
    let columns: Arc<[String]> = stmt.column_names().into_iter().map(str::to_owned).collect();
    let mut rows = stmt.raw_query();
    let mut out = Vec::new();
    while let Some(row) = rows.next().map_err(sqlite)? {
        let values = (0..columns.len())
            .map(|i| {
                Ok(match row.get_ref(i).map_err(sqlite)? {
                    ValueRef::Null => SqlValue::Null,
                    ValueRef::Integer(v) => SqlValue::Int(v),
                    ValueRef::Text(v) => SqlValue::Text(
                        String::from_utf8(v.to_vec())
                            .map_err(|_| StoreError::Corrupt(format!("column {:?} is not UTF-8", columns[i])))?,
                    ),
                    ValueRef::Blob(v) => SqlValue::Bytes(v.to_vec()),
                    ValueRef::Real(_) => {
                        return Err(StoreError::database(format!("column {:?} is a float", columns[i])));
                    }
                })
            })
            .collect::<Result<_, StoreError>>()?;
        out.push(Row { columns: Arc::clone(&columns), values });
    }
    Ok(out)
}

/// Runs a transaction's steps inside a savepoint of the store's write transaction, so that a
/// refusal rolls back these steps and nothing else.
pub(super) fn sqlite_transaction(conn: &rusqlite::Connection, steps: &[Step]) -> Result<TxOutcome, StoreError> {
    const UNDO: &str = "ROLLBACK TO app_transaction; RELEASE app_transaction";
    conn.execute_batch("SAVEPOINT app_transaction").map_err(sqlite)?;
    let mut outcome = Ok(TxOutcome::Committed);
    for step in steps {
        match sqlite_execute(conn, step.sql, &step.params).map(|affected| step.decide(affected)) {
            Ok(None) => {}
            Ok(Some(end)) => {
                outcome = Ok(end);
                break;
            }
            Err(e) => {
                outcome = Err(e);
                break;
            }
        }
    }
    match outcome {
        Ok(TxOutcome::Committed) => conn.execute_batch("RELEASE app_transaction").map_err(sqlite)?,
        Ok(TxOutcome::Refused(_)) => conn.execute_batch(UNDO).map_err(sqlite)?,
        // The error matters more than a failure to undo (the store rolls the work back anyway).
        Err(_) => {
            let _ = conn.execute_batch(UNDO);
        }
    }
    outcome
}

/// Runs `sql`, then the steps `then` builds from its rows, inside a savepoint of the store's
/// write transaction (see [`AppDb::read_then_write`](super::AppDb::read_then_write)): a refusal or
/// an error of `then` rolls back the statement and the steps, and nothing else.
pub(super) fn sqlite_read_then_write<F>(
    conn: &rusqlite::Connection,
    sql: &str,
    params: &[Param],
    then: F,
) -> Result<Result<TxOutcome, DbError>, StoreError>
where
    F: FnOnce(Vec<Row>) -> Result<Vec<Step>, DbError>,
{
    const UNDO: &str = "ROLLBACK TO app_read_then_write; RELEASE app_read_then_write";
    conn.execute_batch("SAVEPOINT app_read_then_write").map_err(sqlite)?;
    let outcome = sqlite_query(conn, sql, params).map(|rows| then(rows).map(|steps| sqlite_transaction(conn, &steps)));
    match outcome {
        Ok(Ok(Ok(TxOutcome::Committed))) => {
            conn.execute_batch("RELEASE app_read_then_write").map_err(sqlite)?;
            Ok(Ok(TxOutcome::Committed))
        }
        Ok(Ok(Ok(refused @ TxOutcome::Refused(_)))) => {
            conn.execute_batch(UNDO).map_err(sqlite)?;
            Ok(Ok(refused))
        }
        Ok(Err(e)) => {
            conn.execute_batch(UNDO).map_err(sqlite)?;
            Ok(Err(e))
        }
        // The error matters more than a failure to undo (the store rolls the work back anyway).
        Ok(Ok(Err(e))) | Err(e) => {
            let _ = conn.execute_batch(UNDO);
            Err(e)
        }
    }
}
