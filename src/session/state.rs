//! The durable key–value state that the commands of a session share, and the `session.*` host
//! functions through which scripts reach it.

use std::sync::Arc;

use resumable_host::{HostError, HostFunctionsBuilder};
use serde_json::{Value, json};

use crate::db::{AppDb, DbError, Guard, Param, Step, TxOutcome, now_ms};

/// The most bytes of a key.
pub const MAX_KEY_BYTES: usize = 256;
/// The most bytes of one value (as JSON text).
pub const MAX_VALUE_BYTES: usize = 64 * 1024;
/// The most bytes of all values of one session (as JSON text).
pub const MAX_STATE_BYTES: usize = 1024 * 1024;
/// The most keys of one session.
pub const MAX_KEYS: usize = 1024;

/// The code a script sees (as `error.details.code`) when a write would exceed a state limit.
pub const STATE_LIMIT_CODE: &str = "SESSION_STATE_LIMIT";

const GET: &str = "SELECT value FROM session_state WHERE session_id = $1 AND key = $2";
const KEYS: &str = "SELECT key FROM session_state WHERE session_id = $1 ORDER BY key";
const DELETE: &str = "DELETE FROM session_state WHERE session_id = $1 AND key = $2";
const CLEAR: &str = "DELETE FROM session_state WHERE session_id = $1";
/// Writes the key only while the session stays within its limits (0 rows otherwise).
const SET: &str = "INSERT INTO session_state (session_id, key, value, bytes, updated_at)
    SELECT $1, $2, $3, $4, $5
    WHERE (SELECT COALESCE(SUM(bytes), 0) FROM session_state WHERE session_id = $1 AND key <> $2) + $4 <= $6
      AND (SELECT COUNT(*) FROM session_state WHERE session_id = $1 AND key <> $2) < $7
    ON CONFLICT (session_id, key) DO UPDATE
    SET value = excluded.value, bytes = excluded.bytes, updated_at = excluded.updated_at";
const RECORD_WRITE: &str =
    "INSERT INTO session_writes (session_id, write_key) VALUES ($1, $2) ON CONFLICT (session_id, write_key) DO NOTHING";
/// Keeps whether the key exists, before a delete, as the write's result.
const RECORD_EXISTED: &str = "UPDATE session_writes SET result = CASE WHEN EXISTS
        (SELECT 1 FROM session_state WHERE session_id = $1 AND key = $3) THEN 'true' ELSE 'false' END
    WHERE session_id = $1 AND write_key = $2";
const WRITE_RESULT: &str = "SELECT result FROM session_writes WHERE session_id = $1 AND write_key = $2";
const FORGET_WRITES: &str = "DELETE FROM session_writes WHERE session_id = $1";
const LOCK_SESSION: &str = "UPDATE session_usage SET commands = commands WHERE session_id = $1";
const REQUEST_END: &str = "INSERT INTO session_ends (session_id, requested_by, requested_at) VALUES ($1, $2, $3)
    ON CONFLICT (session_id) DO NOTHING";
const END_REQUESTED: &str = "SELECT requested_by FROM session_ends WHERE session_id = $1";
/// Counts one more command of `$2` source bytes, unless the session would pass its bounds (0 rows).
const TAKE_COMMAND: &str = "INSERT INTO session_usage (session_id, commands, source_bytes) VALUES ($1, 1, $2)
    ON CONFLICT (session_id) DO UPDATE
    SET commands = session_usage.commands + 1, source_bytes = session_usage.source_bytes + excluded.source_bytes
    WHERE session_usage.commands < $3 AND session_usage.source_bytes + excluded.source_bytes <= $4";
const FORGET_USAGE: &str = "DELETE FROM session_usage WHERE session_id = $1";

/// The sessions' state in the application database.
#[derive(Clone, Debug)]
pub struct SessionState {
    db: AppDb,
}

impl SessionState {
    /// The state kept in `db`.
    pub fn new(db: AppDb) -> SessionState {
        SessionState { db }
    }

    /// The value of `key` in `session`, if set.
    pub async fn get(&self, session: &str, key: &str) -> Result<Option<Value>, DbError> {
        let row = self.db.fetch_optional(GET, vec![session.into(), key.into()]).await?;
        match row {
            Some(row) => {
                let text: String = row.get("value")?;
                serde_json::from_str(&text).map(Some).map_err(|e| DbError::Row(format!("session state {key:?}: {e}")))
            }
            None => Ok(None),
        }
    }

    /// Sets `key` of `session` to `value` as the write `write_key` (a call's stable identity):
    /// `Ok(false)` when that would exceed [`MAX_STATE_BYTES`] or [`MAX_KEYS`] (nothing is written
    /// then); a write already applied under `write_key` is not applied again.
    pub async fn set(&self, session: &str, write_key: &str, key: &str, value: &Value) -> Result<bool, DbError> {
        let text = value.to_string();
        let bytes = i64::try_from(text.len()).unwrap_or(i64::MAX);
        let params: Vec<Param> = vec![
            session.into(),
            key.into(),
            text.into(),
            bytes.into(),
            now_ms().into(),
            (MAX_STATE_BYTES as i64).into(),
            (MAX_KEYS as i64).into(),
        ];
        // The session's usage row, taken first, serializes concurrent writes of one session, so that
        // the limits hold on PostgreSQL too (SQLite has one writer).
        let steps = vec![
            Step::new(LOCK_SESSION, vec![session.into()]),
            Step::new(RECORD_WRITE, vec![session.into(), write_key.into()]).guard(Guard::StopUnless(1)),
            Step::new(SET, params).guard(Guard::RefuseUnless(1, String::new())),
        ];
        Ok(self.db.transaction(steps).await? == TxOutcome::Committed)
    }

    /// Removes `key` of `session` as the write `write_key`; whether it was set (when the write was
    /// applied before, what it answered then).
    pub async fn delete(&self, session: &str, write_key: &str, key: &str) -> Result<bool, DbError> {
        let steps = vec![
            Step::new(LOCK_SESSION, vec![session.into()]),
            Step::new(RECORD_WRITE, vec![session.into(), write_key.into()]).guard(Guard::StopUnless(1)),
            Step::new(RECORD_EXISTED, vec![session.into(), write_key.into(), key.into()]),
            Step::new(DELETE, vec![session.into(), key.into()]),
        ];
        self.db.transaction(steps).await?;
        let row = self.db.fetch_one(WRITE_RESULT, vec![session.into(), write_key.into()]).await?;
        Ok(row.get::<Option<String>>("result")?.as_deref() == Some("true"))
    }

    /// The keys of `session`, sorted.
    pub async fn keys(&self, session: &str) -> Result<Vec<String>, DbError> {
        let rows = self.db.fetch_all(KEYS, vec![session.into()]).await?;
        rows.iter().map(|row| row.get("key")).collect()
    }

    /// Removes all of `session`'s state and usage counters.
    pub async fn clear(&self, session: &str) -> Result<u64, DbError> {
        self.db.execute(FORGET_USAGE, vec![session.into()]).await?;
        self.db.execute(FORGET_WRITES, vec![session.into()]).await?;
        self.db.execute(CLEAR, vec![session.into()]).await
    }

    /// Counts one more command of `source_bytes` for `session`; `Ok(false)` (nothing counted) when
    /// the session already took `max_commands` commands or `max_source_bytes` of sources.
    pub async fn take_command(
        &self,
        session: &str,
        source_bytes: usize,
        max_commands: u64,
        max_source_bytes: usize,
    ) -> Result<bool, DbError> {
        let wide = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
        let params: Vec<Param> = vec![
            session.into(),
            wide(source_bytes as u64).into(),
            wide(max_commands).into(),
            wide(max_source_bytes as u64).into(),
        ];
        Ok(self.db.execute(TAKE_COMMAND, params).await? == 1)
    }

    /// Records that `actor` asked to end `session` (the first request is kept).
    pub async fn request_end(&self, session: &str, actor: &str) -> Result<(), DbError> {
        self.db.execute(REQUEST_END, vec![session.into(), actor.into(), now_ms().into()]).await?;
        Ok(())
    }

    /// Who asked to end `session`, if anyone did.
    pub async fn end_requested_by(&self, session: &str) -> Result<Option<String>, DbError> {
        let row = self.db.fetch_optional(END_REQUESTED, vec![session.into()]).await?;
        row.map(|row| row.get("requested_by")).transpose()
    }

    /// Adds `session.get(key)`, `session.set(key, value)`, `session.delete(key)` and
    /// `session.keys()` on `session`'s state to `builder`.
    pub fn register(&self, builder: HostFunctionsBuilder, session: &str) -> HostFunctionsBuilder {
        let scoped = Arc::new((self.clone(), session.to_owned()));
        let (get, set, delete, keys) = (scoped.clone(), scoped.clone(), scoped.clone(), scoped);
        builder
            .typed("session.get", ["key"], move |_, (key,): (String,)| {
                let scoped = Arc::clone(&get);
                async move {
                    check_key(&key)?;
                    let value = scoped.0.get(&scoped.1, &key).await.map_err(HostError::internal)?;
                    Ok(value.unwrap_or(Value::Null))
                }
            })
            .typed("session.set", ["key", "value"], move |ctx, (key, value): (String, Value)| {
                let scoped = Arc::clone(&set);
                async move {
                    check_key(&key)?;
                    let bytes = value.to_string().len();
                    if bytes > MAX_VALUE_BYTES {
                        return Err(limit_error(format!(
                            "session.set: the value of {key:?} has {bytes} bytes as JSON, more than {MAX_VALUE_BYTES}"
                        )));
                    }
                    let applied = scoped.0.set(&scoped.1, &write_key(&ctx), &key, &value).await;
                    if !applied.map_err(HostError::internal)? {
                        return Err(limit_error(format!(
                            "session.set: the session's state would exceed {MAX_STATE_BYTES} bytes or {MAX_KEYS} keys"
                        )));
                    }
                    Ok(Value::Null)
                }
            })
            .typed("session.delete", ["key"], move |ctx, (key,): (String,)| {
                let scoped = Arc::clone(&delete);
                async move {
                    check_key(&key)?;
                    let existed = scoped.0.delete(&scoped.1, &write_key(&ctx), &key).await;
                    Ok(Value::Bool(existed.map_err(HostError::internal)?))
                }
            })
            .function("session.keys", move |_, _| {
                let scoped = Arc::clone(&keys);
                async move { Ok(json!(scoped.0.keys(&scoped.1).await.map_err(HostError::internal)?)) }
            })
    }
}

/// The identity of a call's write: its automation and its index there, the same in every retry of
/// the round that makes it.
fn write_key(ctx: &resumable_host::HostCallContext) -> String {
    format!("{}:{}", ctx.logical_run_id(), ctx.index())
}

fn check_key(key: &str) -> Result<(), HostError> {
    if key.is_empty() || key.len() > MAX_KEY_BYTES {
        return Err(HostError::new(format!("session: a key must have 1 to {MAX_KEY_BYTES} bytes")));
    }
    // PostgreSQL's text cannot hold it; refused on every backend alike.
    if key.contains('\0') {
        return Err(HostError::new("session: a key cannot hold a NUL character"));
    }
    Ok(())
}

fn limit_error(message: String) -> HostError {
    HostError::new(message).with_details(json!({ "code": STATE_LIMIT_CODE }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_one_to_max_bytes_without_nul() {
        assert!(check_key("k").is_ok());
        assert!(check_key(&"k".repeat(MAX_KEY_BYTES)).is_ok());
        for bad in [String::new(), "k".repeat(MAX_KEY_BYTES + 1), "a\0b".to_owned()] {
            assert!(check_key(&bad).is_err(), "{bad:?}");
        }
    }

    async fn temp_state(name: &str) -> (SessionState, std::path::PathBuf) {
        let dir =
            std::env::temp_dir().join(format!("resumable-{name}-{}", resumable_workflow::testing::random_suffix()));
        std::fs::create_dir_all(&dir).unwrap();
        let db = AppDb::open(&format!("sqlite://{}", dir.join("app.db").display())).await.unwrap();
        (SessionState::new(db), dir)
    }

    #[tokio::test]
    async fn a_session_takes_commands_until_its_count_or_its_bytes_run_out() {
        let (state, dir) = temp_state("usage").await;
        assert!(state.take_command("s1", 10, 2, 100).await.unwrap());
        assert!(state.take_command("s1", 10, 2, 100).await.unwrap());
        assert!(!state.take_command("s1", 10, 2, 100).await.unwrap(), "the third command is refused");
        assert!(state.take_command("s2", 60, 5, 100).await.unwrap());
        assert!(!state.take_command("s2", 41, 5, 100).await.unwrap(), "101 bytes would pass the bound");
        assert!(state.take_command("s2", 40, 5, 100).await.unwrap(), "a refusal counted nothing");
        state.clear("s1").await.unwrap();
        assert!(state.take_command("s1", 10, 2, 100).await.unwrap(), "clearing forgets the usage");
        std::fs::remove_dir_all(dir).ok();
    }

    #[tokio::test]
    async fn writes_past_the_limits_change_nothing() {
        let (state, dir) = temp_state("limits").await;
        assert!(state.take_command("s", 1, 10, 100).await.unwrap());
        let big = Value::String("x".repeat(MAX_STATE_BYTES / 2));
        assert!(state.set("s", "w1", "a", &big).await.unwrap());
        assert!(!state.set("s", "w2", "b", &big).await.unwrap(), "two halves and their quotes pass 1 MiB");
        assert!(state.set("s", "w3", "a", &Value::from(1)).await.unwrap(), "replacing a key counts its new size only");
        assert!(state.set("s", "w2", "b", &big).await.unwrap(), "a refused write was not recorded");
        assert_eq!(state.keys("s").await.unwrap(), ["a", "b"]);
        assert_eq!(state.get("s", "a").await.unwrap(), Some(Value::from(1)));
        std::fs::remove_dir_all(dir).ok();
    }

    #[tokio::test]
    async fn a_write_made_again_by_a_retried_call_is_applied_once() {
        let (state, dir) = temp_state("writes").await;
        assert!(state.take_command("s", 1, 10, 100).await.unwrap());
        assert!(state.set("s", "run_a:1", "n", &Value::from(1)).await.unwrap());
        assert!(state.set("s", "run_a:2", "n", &Value::from(2)).await.unwrap());
        assert!(state.set("s", "run_a:1", "n", &Value::from(5)).await.unwrap(), "already applied: not again");
        assert_eq!(state.get("s", "n").await.unwrap(), Some(Value::from(2)));
        assert!(state.delete("s", "run_a:3", "n").await.unwrap());
        assert!(state.delete("s", "run_a:3", "n").await.unwrap(), "a repeated delete answers what it did");
        assert!(!state.delete("s", "run_a:4", "n").await.unwrap());
        state.clear("s").await.unwrap();
        assert!(state.take_command("s", 1, 10, 100).await.unwrap());
        assert!(state.set("s", "run_a:1", "n", &Value::from(7)).await.unwrap());
        assert_eq!(state.get("s", "n").await.unwrap(), Some(Value::from(7)), "clearing forgets the writes");
        std::fs::remove_dir_all(dir).ok();
    }
}
