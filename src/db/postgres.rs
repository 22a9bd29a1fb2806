//! [`AppDb`](super::AppDb) statements on a sqlx PostgreSQL pool.

use std::sync::Arc;

use sqlx::postgres::{PgArguments, PgRow};
use sqlx::query::Query;
use sqlx::{Column as _, Postgres, Row as _, TypeInfo as _};

use super::{DbError, Param, Row, SqlValue, Step, TxOutcome};

/// A sqlx query of `sql` with `params` bound in order.
pub(super) fn pg_query<'q>(sql: &'q str, params: &'q [Param]) -> Query<'q, Postgres, PgArguments> {
    params.iter().fold(sqlx::query(sql), |query, param| match param {
        Param::Int(v) => query.bind(*v),
        Param::Text(v) => query.bind(v.as_deref()),
        Param::Bytes(v) => query.bind(v.as_deref()),
    })
}

/// The column names of a PostgreSQL result.
pub(super) fn pg_columns(row: &PgRow) -> Arc<[String]> {
    row.columns().iter().map(|c| c.name().to_owned()).collect()
}

/// A PostgreSQL row as an owned [`Row`].
pub(super) fn pg_row(row: &PgRow, columns: &Arc<[String]>) -> Result<Row, DbError> {
    let values = row
        .columns()
        .iter()
        .enumerate()
        .map(|(i, column)| {
            let value = match column.type_info().name() {
                "INT8" => row.try_get::<Option<i64>, _>(i)?.map(SqlValue::Int),
                "INT4" => row.try_get::<Option<i32>, _>(i)?.map(|v| SqlValue::Int(v.into())),
                "INT2" => row.try_get::<Option<i16>, _>(i)?.map(|v| SqlValue::Int(v.into())),
                "BOOL" => row.try_get::<Option<bool>, _>(i)?.map(|v| SqlValue::Int(v.into())),
                "TEXT" | "VARCHAR" | "BPCHAR" | "NAME" => row.try_get::<Option<String>, _>(i)?.map(SqlValue::Text),
                "BYTEA" => row.try_get::<Option<Vec<u8>>, _>(i)?.map(SqlValue::Bytes),
                other => {
                    return Err(DbError::Row(format!("column {:?} has the unsupported type {other}", column.name())));
                }
            };
            Ok(value.unwrap_or(SqlValue::Null))
        })
        .collect::<Result<_, DbError>>()?;
    Ok(Row { columns: Arc::clone(columns), values })
}

/// Runs `steps` in order on the open transaction `tx`, each followed by what its guard decides;
/// the caller commits on [`TxOutcome::Committed`] and rolls back on [`TxOutcome::Refused`].
pub(super) async fn pg_steps(tx: &mut sqlx::PgConnection, steps: &[Step]) -> Result<TxOutcome, DbError> {
    for step in steps {
        let affected = pg_query(step.sql, &step.params).execute(&mut *tx).await?.rows_affected();
        match step.decide(affected) {
            None => {}
            Some(outcome) => return Ok(outcome),
        }
    }
    Ok(TxOutcome::Committed)
}
