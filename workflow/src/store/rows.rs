//! Decoding what the backends read: one place for the JSON columns, the counts and positions,
//! a run's row and a page of runs, whichever database the row came from. Each backend only says
//! how to read one column of its rows ([`Columns`]).

use serde_json::Value;

use super::FeedEntry;
use crate::error::StoreError;
use crate::event::{Event, EventKind};
use crate::ids::RunId;
use crate::run::{RunCursor, RunInfo, RunPage, RunStatus};
use crate::time::{from_ms, to_ms};

/// How a backend reads a column of one of its rows.
pub(crate) trait Columns {
    /// A text column.
    fn text(&self, column: &str) -> Result<String, StoreError>;
    /// A text column that may be NULL.
    fn optional_text(&self, column: &str) -> Result<Option<String>, StoreError>;
    /// An integer column.
    fn int(&self, column: &str) -> Result<i64, StoreError>;
    /// An integer column that may be NULL.
    fn optional_int(&self, column: &str) -> Result<Option<i64>, StoreError>;
}

/// The text a JSON value is stored as. A NUL character (U+0000), which PostgreSQL's `jsonb`
/// cannot hold, is stored as U+FFFD on every backend, in strings and keys alike, so that a value
/// holding one is stored (and read back the same everywhere) instead of failing every write.
pub(crate) fn to_json(v: &Value) -> String {
    // Serializing a `Value` cannot fail.
    let text = serde_json::to_string(v).unwrap_or_else(|_| "null".to_owned());
    if text.contains("\\u0000") { serde_json::to_string(&without_nul(v)).unwrap_or(text) } else { text }
}

/// `v` as a store keeps it and gives it back: with every U+0000 in its strings and keys replaced
/// by U+FFFD (see [`to_json`]).
pub fn stored_form(v: &Value) -> Value {
    let text = serde_json::to_string(v).unwrap_or_default();
    if text.contains("\\u0000") { without_nul(v) } else { v.clone() }
}

/// `v` with every U+0000 in its strings and keys replaced by U+FFFD.
fn without_nul(v: &Value) -> Value {
    let clean = |s: &str| s.replace('\0', "\u{FFFD}");
    match v {
        Value::String(s) => Value::String(clean(s)),
        Value::Array(items) => Value::Array(items.iter().map(without_nul).collect()),
        Value::Object(map) => Value::Object(map.iter().map(|(k, v)| (clean(k), without_nul(v))).collect()),
        other => other.clone(),
    }
}

/// A JSON value read back.
pub(crate) fn parse_json(s: &str) -> Result<Value, StoreError> {
    serde_json::from_str(s).map_err(|e| StoreError::Corrupt(format!("invalid JSON in database: {e}")))
}

/// A stored count, saturated at `u32::MAX`.
pub(crate) fn count_of(v: i64) -> u32 {
    u32::try_from(v).unwrap_or(u32::MAX)
}

/// The `position` column of a row.
pub(crate) fn position_of(row: &impl Columns) -> Result<u32, StoreError> {
    let p = row.int("position")?;
    u32::try_from(p).map_err(|_| StoreError::Corrupt(format!("invalid position {p}")))
}

/// A run, from a row of the columns both backends select for it.
pub(crate) fn run_info(row: &impl Columns) -> Result<RunInfo, StoreError> {
    let status: RunStatus = row.text("status")?.parse()?;
    Ok(RunInfo {
        id: RunId::from(row.text("id")?),
        workflow: row.text("workflow")?,
        status,
        input: parse_json(&row.text("input")?)?,
        output: row.optional_text("output")?.as_deref().map(parse_json).transpose()?,
        error: row.optional_text("error")?,
        idempotency_key: row.optional_text("idempotency_key")?,
        parent_run_id: row.optional_text("parent_run_id")?.map(RunId::from),
        attempt: count_of(row.int("lease_attempt")?),
        created_at: from_ms(row.int("created_at")?),
        updated_at: from_ms(row.int("updated_at")?),
        started_at: row.optional_int("started_at")?.map(from_ms),
        completed_at: row.optional_int("completed_at")?.map(from_ms),
    })
}

/// An event of `run_id`'s log, from a row of `seq`, `kind`, `payload` and `created_at`.
pub(crate) fn event(run_id: &RunId, row: &impl Columns) -> Result<Event, StoreError> {
    let kind: EventKind = row.text("kind")?.parse()?;
    Ok(Event {
        run_id: run_id.clone(),
        seq: row.int("seq")?.unsigned_abs(),
        kind,
        payload: parse_json(&row.text("payload")?)?,
        created_at: from_ms(row.int("created_at")?),
    })
}

/// A feed's entry, from a row of `feed_seq`, `run_id`, `workflow`, `idx` and `payload`.
pub(crate) fn feed_entry(row: &impl Columns) -> Result<FeedEntry, StoreError> {
    Ok(FeedEntry {
        cursor: row.int("feed_seq")?.unsigned_abs(),
        run_id: RunId::from(row.text("run_id")?),
        workflow: row.text("workflow")?,
        index: row.int("idx")?.unsigned_abs(),
        event: parse_json(&row.text("payload")?)?,
    })
}

/// A page of at most `limit` runs from `runs`, read with one more than `limit` so that a next
/// page is known to exist.
pub(crate) fn page(mut runs: Vec<RunInfo>, limit: u32) -> RunPage {
    let next_cursor = if runs.len() > limit as usize {
        runs.truncate(limit as usize);
        runs.last().map(|r| RunCursor { created_at_ms: to_ms(r.created_at), run_id: r.id.clone() })
    } else {
        None
    };
    RunPage { runs, next_cursor }
}
