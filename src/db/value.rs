//! Statement parameters and result rows, the same for both backends.

use std::sync::Arc;

use rusqlite::types::{ToSqlOutput, ValueRef};

use super::DbError;

/// A statement parameter (`$1`, `$2`, … in the order given). Each carries its SQL type, so that a
/// NULL is typed as PostgreSQL expects; build them with `From` (`42.into()`, `"text".into()`,
/// `None::<String>.into()`).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Param {
    /// A 64-bit integer (`BIGINT` / `INTEGER`), or NULL.
    Int(Option<i64>),
    /// Text, or NULL.
    Text(Option<String>),
    /// Bytes (`BYTEA` / `BLOB`), or NULL.
    Bytes(Option<Vec<u8>>),
}

impl From<i64> for Param {
    fn from(v: i64) -> Param {
        Param::Int(Some(v))
    }
}

impl From<Option<i64>> for Param {
    fn from(v: Option<i64>) -> Param {
        Param::Int(v)
    }
}

impl From<&str> for Param {
    fn from(v: &str) -> Param {
        Param::Text(Some(v.to_owned()))
    }
}

impl From<String> for Param {
    fn from(v: String) -> Param {
        Param::Text(Some(v))
    }
}

impl From<Option<String>> for Param {
    fn from(v: Option<String>) -> Param {
        Param::Text(v)
    }
}

impl From<Vec<u8>> for Param {
    fn from(v: Vec<u8>) -> Param {
        Param::Bytes(Some(v))
    }
}

impl From<Option<Vec<u8>>> for Param {
    fn from(v: Option<Vec<u8>>) -> Param {
        Param::Bytes(v)
    }
}

impl From<&[u8]> for Param {
    fn from(v: &[u8]) -> Param {
        Param::Bytes(Some(v.to_vec()))
    }
}

impl rusqlite::ToSql for Param {
    fn to_sql(&self) -> rusqlite::Result<ToSqlOutput<'_>> {
        Ok(ToSqlOutput::Borrowed(match self {
            Param::Int(Some(v)) => ValueRef::Integer(*v),
            Param::Text(Some(v)) => ValueRef::Text(v.as_bytes()),
            Param::Bytes(Some(v)) => ValueRef::Blob(v),
            Param::Int(None) | Param::Text(None) | Param::Bytes(None) => ValueRef::Null,
        }))
    }
}

/// A value read from a result column.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum SqlValue {
    /// NULL.
    Null,
    /// An integer (of any width; a PostgreSQL boolean reads as 0 or 1).
    Int(i64),
    /// Text.
    Text(String),
    /// Bytes.
    Bytes(Vec<u8>),
}

impl SqlValue {
    /// The kind of value, for error messages.
    fn kind(&self) -> &'static str {
        match self {
            SqlValue::Null => "NULL",
            SqlValue::Int(_) => "an integer",
            SqlValue::Text(_) => "text",
            SqlValue::Bytes(_) => "bytes",
        }
    }
}

/// A Rust type a [`SqlValue`] converts to, for [`Row::get`].
pub trait FromSqlValue: Sized {
    /// What the type expects, for error messages.
    const EXPECTED: &'static str;

    /// The value as this type; `None` if it has another kind.
    fn from_sql_value(value: &SqlValue) -> Option<Self>;
}

impl FromSqlValue for i64 {
    const EXPECTED: &'static str = "an integer";

    fn from_sql_value(value: &SqlValue) -> Option<i64> {
        match value {
            SqlValue::Int(v) => Some(*v),
            _ => None,
        }
    }
}

impl FromSqlValue for String {
    const EXPECTED: &'static str = "text";

    fn from_sql_value(value: &SqlValue) -> Option<String> {
        match value {
            SqlValue::Text(v) => Some(v.clone()),
            _ => None,
        }
    }
}

impl FromSqlValue for Vec<u8> {
    const EXPECTED: &'static str = "bytes";

    fn from_sql_value(value: &SqlValue) -> Option<Vec<u8>> {
        match value {
            SqlValue::Bytes(v) => Some(v.clone()),
            _ => None,
        }
    }
}

impl<T: FromSqlValue> FromSqlValue for Option<T> {
    const EXPECTED: &'static str = T::EXPECTED;

    fn from_sql_value(value: &SqlValue) -> Option<Option<T>> {
        match value {
            SqlValue::Null => Some(None),
            other => T::from_sql_value(other).map(Some),
        }
    }
}

/// One result row, owned: its values by column name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Row {
    /// The column names, shared by the rows of one result.
    pub(super) columns: Arc<[String]>,
    /// The values, in column order.
    pub(super) values: Vec<SqlValue>,
}

impl Row {
    /// The value of `column` as a `T` (an `Option<T>` reads NULL as `None`).
    pub fn get<T: FromSqlValue>(&self, column: &str) -> Result<T, DbError> {
        let value = self
            .columns
            .iter()
            .position(|c| c == column)
            .and_then(|i| self.values.get(i))
            .ok_or_else(|| DbError::Row(format!("no column {column:?} in the result")))?;
        T::from_sql_value(value)
            .ok_or_else(|| DbError::Row(format!("column {column:?} holds {}, expected {}", value.kind(), T::EXPECTED)))
    }
}
