//! The host calls each round made, recorded with the round, so that whoever judges a request
//! sees what the script did before it asked: each call's function, arguments and result, error
//! or interruption. Calls served from the ledger on resume are not made again, so each call is
//! recorded once, by the round that made it.

use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use resumable_host::HostError;
use resumable_workflow::{Event, EventKind};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::workflow::ROUND_STEP;

/// The calls a round records at most (the first ones to end); it makes as many as its limits allow.
pub const MAX_RECORDED_CALLS: usize = 100;

/// The JSON text of an argument or a result recorded at most; a larger one is recorded as its
/// size and the start of its text.
pub const MAX_RECORDED_BYTES: usize = 2048;

/// How a host call ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CallOutcome {
    /// It returned a result.
    Ok,
    /// It failed; the script got an error.
    Error,
    /// It asked for a decision: the round ended there.
    Interrupted,
}

impl CallOutcome {
    /// The outcome's name, as the JSON and the metrics have it.
    pub fn as_str(self) -> &'static str {
        match self {
            CallOutcome::Ok => "ok",
            CallOutcome::Error => "error",
            CallOutcome::Interrupted => "interrupted",
        }
    }
}

/// One host call a round made.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HostCall {
    /// The function, `namespace.name`.
    pub function: String,
    /// Its arguments (each at most [`MAX_RECORDED_BYTES`] of JSON, else a preview).
    pub arguments: Vec<Value>,
    /// How it ended.
    pub outcome: CallOutcome,
    /// What it returned (a preview past [`MAX_RECORDED_BYTES`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<Value>,
    /// The error the script got.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// When it started, in ms since the epoch.
    pub started_at: i64,
    /// How long it took, in ms.
    pub duration_ms: u64,
}

/// `value`, or, when its JSON text is longer than [`MAX_RECORDED_BYTES`], `{truncated, bytes,
/// preview}` with the start of that text.
fn recorded(value: &Value) -> Value {
    let text = value.to_string();
    if text.len() <= MAX_RECORDED_BYTES {
        return value.clone();
    }
    let mut end = MAX_RECORDED_BYTES;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    json!({ "truncated": true, "bytes": text.len(), "preview": &text[..end] })
}

/// `text`, cut at [`MAX_RECORDED_BYTES`] (on a character boundary, with `…`).
fn capped(mut text: String) -> String {
    if text.len() > MAX_RECORDED_BYTES {
        let mut end = MAX_RECORDED_BYTES;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
        text.push('…');
    }
    text
}

/// The calls of one round, as they end (host calls may run concurrently).
#[derive(Clone, Debug, Default)]
pub(crate) struct CallLog(Arc<Mutex<Vec<HostCall>>>);

impl CallLog {
    /// Records a call of `function` with `arguments` that started at `started` and ended with
    /// `result` after `took`.
    pub(crate) fn record(
        &self,
        function: &str,
        arguments: &[Value],
        result: &Result<Value, HostError>,
        started: SystemTime,
        took: Duration,
    ) {
        let mut log = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if log.len() >= MAX_RECORDED_CALLS {
            return;
        }
        let (outcome, result, error) = match result {
            Ok(value) => (CallOutcome::Ok, Some(recorded(value)), None),
            Err(HostError::Interrupt(_)) => (CallOutcome::Interrupted, None, None),
            Err(e) => (CallOutcome::Error, None, Some(capped(e.to_string()))),
        };
        log.push(HostCall {
            function: function.to_owned(),
            arguments: arguments.iter().map(recorded).collect(),
            outcome,
            result,
            error,
            started_at: crate::db::to_ms(started),
            duration_ms: u64::try_from(took.as_millis()).unwrap_or(u64::MAX),
        });
    }

    /// The calls recorded, in the order they ended.
    pub(crate) fn take(&self) -> Vec<HostCall> {
        std::mem::take(&mut *self.0.lock().unwrap_or_else(|p| p.into_inner()))
    }
}

/// A host call with the round that made it, as the automation's page and API show it.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RoundCall {
    /// The round that made it (1 for the first).
    pub round: u32,
    /// The call.
    #[serde(flatten)]
    pub call: HostCall,
}

/// The host calls recorded by the rounds of a run whose event log is `events`, round by round.
pub(crate) fn recorded_calls(events: &[Event]) -> Vec<RoundCall> {
    // The rounds' positions, in order: each round is a step that may have started several times.
    let mut rounds: Vec<u64> = Vec::new();
    for e in events.iter().filter(|e| e.kind == EventKind::StepStarted && e.payload["name"] == ROUND_STEP) {
        if let Some(position) = e.payload["position"].as_u64().filter(|p| !rounds.contains(p)) {
            rounds.push(position);
        }
    }
    let mut calls = Vec::new();
    for e in events.iter().filter(|e| e.kind == EventKind::StepCompleted) {
        let Some(round) = e.payload["position"].as_u64().and_then(|p| rounds.iter().position(|r| *r == p)) else {
            continue;
        };
        let recorded = e.payload["result"]["calls"].as_array().into_iter().flatten();
        for call in recorded.filter_map(|c| serde_json::from_value::<HostCall>(c.clone()).ok()) {
            calls.push(RoundCall { round: round as u32 + 1, call });
        }
    }
    calls
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn large_values_are_recorded_as_a_preview_and_calls_past_the_cap_are_not() {
        let log = CallLog::default();
        let big = json!("é".repeat(MAX_RECORDED_BYTES));
        let now = SystemTime::now();
        log.record("a.b", &[json!(1), big.clone()], &Ok(json!({ "ok": true })), now, Duration::from_millis(3));
        log.record("a.c", &[], &Err(HostError::new("nope")), now, Duration::ZERO);
        log.record("a.d", &[], &Err(HostError::Interrupt(json!({}))), now, Duration::ZERO);
        for _ in 0..MAX_RECORDED_CALLS {
            log.record("a.e", &[], &Ok(json!(null)), now, Duration::ZERO);
        }
        let calls = log.take();
        assert_eq!(calls.len(), MAX_RECORDED_CALLS);
        assert_eq!(calls[0].arguments[0], json!(1));
        let preview = &calls[0].arguments[1];
        assert_eq!(
            (preview["truncated"].clone(), preview["bytes"].clone()),
            (json!(true), json!(big.to_string().len()))
        );
        assert!(preview["preview"].as_str().unwrap().len() <= MAX_RECORDED_BYTES);
        assert_eq!(
            (calls[0].outcome, calls[0].result.clone(), calls[0].duration_ms),
            (CallOutcome::Ok, Some(json!({ "ok": true })), 3)
        );
        assert_eq!((calls[1].outcome, calls[1].error.as_deref()), (CallOutcome::Error, Some("nope")));
        assert_eq!(
            (calls[2].outcome, calls[2].result.clone(), calls[2].error.clone()),
            (CallOutcome::Interrupted, None, None)
        );
        assert!(log.take().is_empty(), "taken");
    }
}
