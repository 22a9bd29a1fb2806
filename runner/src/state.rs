//! What a continuation records, and its compact binary form.
//!
//! The state is encoded as a versioned binary record (LEB128 lengths, raw
//! UTF-8, little-endian floats) rather than JSON. Format 2, which this release writes:
//!
//! ```text
//! "RSv1" (magic)  uint version = 2
//! source hash (32 bytes)  scope hash (32 bytes)  text logical run id
//! seed (u64 LE)  start clock (f64 LE)
//! uint n  n × (text function name, signature digest (32 bytes))   names sorted, unique
//! uint count  count × entry
//! CRC-32 (u32 LE) of everything before it
//! ```
//!
//! where an entry is `text function, text arguments, outcome, settle order, clock (f64 LE)`
//! and a text is a uint length and UTF-8. The list of functions is exactly the set of functions
//! the entries call, each with the digest of its signature (see [`crate::scope`]). Format 1,
//! written by earlier releases, has no list (its scope hash covers every host-function name
//! of the run); it is still read. JSON values recorded from
//! host calls are kept as their exact text, so decoding a large ledger is
//! little more than a bounds-checked copy. Decoding is strict: a CRC-32 trailer
//! must match (so corruption, or a byte changed by whoever holds the key, is
//! caught), every length is checked, every text must be UTF-8 (and JSON where
//! JSON is expected), and trailing bytes are refused. [`StateParser`] reads a
//! state while it is decompressed, making the checks that need the whole state
//! (checksum, settle orders) at the end: a resume uses the first recorded calls
//! before then, but no host function runs before the whole state has passed.

use std::sync::Arc;

use crate::error::{ErrorCode, RunError};
use crate::leb128::{self, Leb128Error};
use crate::limits::{Limit, Limits};
use crate::scope::{Scope, UsedFunction};
use crate::text::clip;

use serde_json::Value;
use sha2::{Digest, Sha256};

/// Version of the state record this release writes: it lists the functions its ledger calls.
pub(crate) const STATE_VERSION: u64 = 2;
/// Version of the state record of earlier releases, without that list; still read.
pub(crate) const LEGACY_STATE_VERSION: u64 = 1;
/// The first bytes of every state (of every version: the version follows).
const MAGIC: &[u8; 4] = b"RSv1";
/// The fewest bytes a listed function takes: a length byte, `a.b`, a digest.
const MIN_FUNCTION_BYTES: usize = 1 + 3 + 32;

/// How one host call ended.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub(crate) enum CallOutcome {
    /// Resolved with this JSON text (shared: a replay hands it to the script without a copy).
    Fulfilled(Arc<str>),
    /// Rejected with this public message and optional JSON details.
    Rejected { message: String, details: Option<String> },
    /// Interrupted with this JSON payload.
    Interrupted(String),
}

impl CallOutcome {
    /// The bytes it records, as the output limit of host calls counts them.
    pub(crate) fn size(&self) -> usize {
        match self {
            CallOutcome::Fulfilled(text) => text.len(),
            CallOutcome::Interrupted(text) => text.len(),
            CallOutcome::Rejected { message, details } => message.len() + details.as_ref().map_or(0, String::len),
        }
    }

    /// How a host function's `result` is recorded: values and payloads as their JSON text, and
    /// a value or payload nested deeper than the sandbox reads (100 levels) as a failed call.
    /// The worker records its ledger with this, and in process mode the parent records what it
    /// served with it too, so that it can check the worker's ledger entry by entry.
    pub(crate) fn recorded(result: &resumable_host::HostResult) -> CallOutcome {
        use resumable_host::HostError;
        let max = crate::sandbox::MAX_DEPTH;
        let text = |value: &Value| serde_json::to_string(value).unwrap_or_else(|_| "null".into());
        match result {
            Ok(value) if json_depth_exceeds(value, max) => CallOutcome::Rejected {
                message: format!("the host function returned a value nested deeper than {max} levels"),
                details: None,
            },
            Err(HostError::Interrupt(payload)) if json_depth_exceeds(payload, max) => CallOutcome::Rejected {
                message: format!("the host function interrupted with a payload nested deeper than {max} levels"),
                details: None,
            },
            Ok(value) => CallOutcome::Fulfilled(text(value).into()),
            Err(HostError::Interrupt(payload)) => CallOutcome::Interrupted(text(payload)),
            Err(HostError::Failed(failure)) => {
                CallOutcome::Rejected { message: failure.message.clone(), details: failure.details.as_ref().map(text) }
            }
            // A kind of host error this runner does not know fails the call, saying nothing of it.
            Err(_) => CallOutcome::Rejected { message: "the host function failed".into(), details: None },
        }
    }
}

/// Whether `value` nests deeper than `max` (checked without recursion).
pub(crate) fn json_depth_exceeds(value: &Value, max: usize) -> bool {
    let mut stack: Vec<(&Value, usize)> = vec![(value, 1)];
    while let Some((value, depth)) = stack.pop() {
        let children: Box<dyn Iterator<Item = &Value>> = match value {
            Value::Array(items) => Box::new(items.iter()),
            Value::Object(map) => Box::new(map.values()),
            _ => continue,
        };
        if depth > max {
            return true;
        }
        stack.extend(children.map(|child| (child, depth + 1)));
    }
    false
}

/// Why a continuation's state was refused: what is wrong with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct StateError(pub String);

impl std::fmt::Display for StateError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for StateError {}

impl From<String> for StateError {
    fn from(message: String) -> StateError {
        StateError(message)
    }
}

impl From<StateError> for String {
    fn from(error: StateError) -> String {
        error.0
    }
}

impl From<&str> for StateError {
    fn from(message: &str) -> StateError {
        StateError(message.to_string())
    }
}

/// One recorded host call.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub(crate) struct LedgerEntry {
    /// Full function name.
    pub function: String,
    /// Arguments as the canonical JSON array text the runner produced.
    pub arguments: String,
    pub outcome: CallOutcome,
    /// Position among settles (fulfilled and rejected calls only), from 0.
    pub settle_order: Option<u32>,
    /// Logical clock (ms since epoch) when the call settled or interrupted.
    pub clock: f64,
}

impl LedgerEntry {
    /// What the host function of call `index` receives when this interrupted entry is resumed with
    /// `resolution`; `None` unless the entry was interrupted.
    pub(crate) fn resume_with(&self, index: u32, resolution: serde_json::Value) -> Option<resumable_host::Resume> {
        let CallOutcome::Interrupted(payload) = &self.outcome else { return None };
        Some(resumable_host::Resume {
            interruption_id: format!("interrupt-{index}"),
            payload: serde_json::from_str(payload).unwrap_or(serde_json::Value::Null),
            resolution,
        })
    }
}

/// Everything needed to resume a run.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ContinuationState {
    pub source_hash: [u8; 32],
    pub scope_hash: [u8; 32],
    pub logical_run_id: String,
    pub seed: u64,
    pub start_clock: f64,
    /// The functions the ledger calls with their signatures, sorted by name (format 2); `None`
    /// for a state of format 1, which is encoded in that format again.
    pub functions: Option<Vec<UsedFunction>>,
    pub ledger: Vec<LedgerEntry>,
}

impl ContinuationState {
    /// The calls still waiting for a decision, by call index.
    pub(crate) fn pending_interruptions(&self) -> Result<Vec<crate::outcome::Interruption>, StateError> {
        pending_interruptions(&self.ledger)
    }

    pub(crate) fn encode(&self) -> Vec<u8> {
        let payload: usize = self.ledger.iter().map(|e| e.function.len() + e.arguments.len() + 64).sum();
        let mut w = Writer(Vec::with_capacity(payload + 128));
        w.0.extend_from_slice(MAGIC);
        w.uint(if self.functions.is_some() { STATE_VERSION } else { LEGACY_STATE_VERSION });
        w.0.extend_from_slice(&self.source_hash);
        w.0.extend_from_slice(&self.scope_hash);
        w.text(&self.logical_run_id);
        w.0.extend_from_slice(&self.seed.to_le_bytes());
        w.0.extend_from_slice(&self.start_clock.to_le_bytes());
        if let Some(functions) = &self.functions {
            w.uint(functions.len() as u64);
            for function in functions {
                w.text(&function.name);
                w.0.extend_from_slice(&function.signature);
            }
        }
        w.uint(self.ledger.len() as u64);
        for entry in &self.ledger {
            w.text(&entry.function);
            w.text(&entry.arguments);
            match &entry.outcome {
                CallOutcome::Fulfilled(value) => {
                    w.0.push(0);
                    w.text(value);
                }
                CallOutcome::Rejected { message, details } => {
                    w.0.push(1);
                    w.text(message);
                    match details {
                        None => w.0.push(0),
                        Some(d) => {
                            w.0.push(1);
                            w.text(d);
                        }
                    }
                }
                CallOutcome::Interrupted(payload) => {
                    w.0.push(2);
                    w.text(payload);
                }
            }
            match entry.settle_order {
                None => w.0.push(0),
                Some(order) => {
                    w.0.push(1);
                    w.uint(order as u64);
                }
            }
            w.0.extend_from_slice(&entry.clock.to_le_bytes());
        }
        let checksum = crc32fast::hash(&w.0);
        w.0.extend_from_slice(&checksum.to_le_bytes());
        w.0
    }

    /// Decodes and validates a state; the error says what is wrong.
    pub(crate) fn decode(bytes: &[u8]) -> Result<Self, StateError> {
        let Some((body, checksum)) = bytes.split_last_chunk::<4>() else {
            return Err("state is truncated".into());
        };
        if crc32fast::hash(body) != u32::from_le_bytes(*checksum) {
            return Err("state checksum mismatch".into());
        }
        // Checked above, before anything is parsed.
        let mut parser = StateParser::skipping_checksum(bytes.len());
        let mut head = None;
        let mut ledger = Vec::new();
        parser.advance(bytes, |item| match item {
            Parsed::Head(parsed) => {
                ledger.reserve_exact(parsed.count);
                head = Some(parsed);
            }
            Parsed::Entry(entry) => ledger.push(entry),
        })?;
        parser.finish(bytes)?;
        Ok(ContinuationState::from_parts(head.ok_or("state is truncated")?, ledger))
    }

    /// The state made of `head` (whose count is not kept) and `ledger`.
    pub(crate) fn from_parts(head: StateHead, ledger: Vec<LedgerEntry>) -> Self {
        let StateHead { source_hash, scope_hash, logical_run_id, seed, start_clock, functions, count: _ } = head;
        ContinuationState { source_hash, scope_hash, logical_run_id, seed, start_clock, functions, ledger }
    }

    /// The head (counting the ledger) and the ledger.
    pub(crate) fn into_parts(self) -> (StateHead, Vec<LedgerEntry>) {
        let ContinuationState { source_hash, scope_hash, logical_run_id, seed, start_clock, functions, ledger } = self;
        let count = ledger.len();
        (StateHead { source_hash, scope_hash, logical_run_id, seed, start_clock, functions, count }, ledger)
    }
}

/// What a state records before its ledger.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct StateHead {
    pub source_hash: [u8; 32],
    pub scope_hash: [u8; 32],
    pub logical_run_id: String,
    pub seed: u64,
    pub start_clock: f64,
    /// The functions the ledger calls with their signatures, sorted by name; `None` in a state
    /// of format 1.
    pub functions: Option<Vec<UsedFunction>>,
    /// How many ledger entries follow.
    pub count: usize,
}

/// One part of a state, as [`StateParser`] reads it.
pub(crate) enum Parsed {
    Head(StateHead),
    Entry(LedgerEntry),
}

/// Reads a state of known length while its bytes arrive (say, as they are decompressed): the
/// head, then each ledger entry once all of its bytes are there. Every check of
/// [`ContinuationState::decode`] is made, the checksum and the settle orders at the end, in
/// [`finish`](Self::finish).
pub(crate) struct StateParser {
    /// Length of the whole state, checksum included.
    total: usize,
    /// Where the next part starts.
    pos: usize,
    /// Entries still to read; `None` before the head.
    remaining: Option<usize>,
    /// Index of the next entry, from 1.
    next_index: usize,
    /// Settle orders seen so far.
    settles: Vec<u32>,
    /// The names the state lists (format 2), each with whether an entry calls it so far.
    listed: Option<Vec<(String, bool)>>,
    /// Checksum of the bytes before `checked`; `None` when the checksum is not checked.
    crc: Option<crc32fast::Hasher>,
    checked: usize,
}

impl StateParser {
    /// A parser for a state of `total` bytes.
    pub(crate) fn new(total: usize) -> Self {
        StateParser {
            total,
            pos: 0,
            remaining: None,
            next_index: 1,
            settles: Vec::new(),
            listed: None,
            crc: Some(crc32fast::Hasher::new()),
            checked: 0,
        }
    }

    /// A parser for a state of `total` bytes whose checksum is already checked: it is skipped.
    pub(crate) fn skipping_checksum(total: usize) -> Self {
        StateParser { crc: None, ..StateParser::new(total) }
    }

    /// Reads every part that `available` (the first bytes of the state, more at each call)
    /// completes, handing each to `emit`.
    pub(crate) fn advance(&mut self, available: &[u8], mut emit: impl FnMut(Parsed)) -> Result<(), StateError> {
        let body = &available[..available.len().min(self.total.saturating_sub(4))];
        if let Some(crc) = &mut self.crc {
            crc.update(&body[self.checked.min(body.len())..]);
        }
        self.checked = self.checked.max(body.len());
        let complete = available.len() >= self.total;
        loop {
            if self.remaining == Some(0) {
                return Ok(());
            }
            let mut r = Reader { bytes: body, pos: self.pos };
            let parsed = match self.remaining {
                None => read_head(&mut r, self.total).map(Parsed::Head),
                Some(_) => read_entry(&mut r, self.next_index).map(Parsed::Entry),
            };
            let item = match parsed {
                Ok(item) => item,
                // The part goes on in bytes that have not arrived: read it again then.
                Err(_) if !complete && r.ran_out() => return Ok(()),
                Err(error) => return Err(error),
            };
            self.pos = r.pos;
            match &item {
                Parsed::Head(head) => {
                    self.remaining = Some(head.count);
                    self.listed = head.functions.as_ref().map(|f| f.iter().map(|f| (f.name.clone(), false)).collect());
                }
                Parsed::Entry(entry) => {
                    if let Some(listed) = &mut self.listed {
                        let Ok(at) = listed.binary_search_by(|(name, _)| name.as_str().cmp(&entry.function)) else {
                            let index = self.next_index;
                            return Err(StateError::from(format!("call {index}: its function is not listed")));
                        };
                        listed[at].1 = true;
                    }
                    self.settles.extend(entry.settle_order);
                    self.next_index += 1;
                    self.remaining = self.remaining.map(|n| n - 1);
                }
            }
            emit(item);
        }
    }

    /// Checks the end of the state, `all` of whose bytes [`advance`](Self::advance) has read:
    /// every entry there, nothing after them but a matching checksum, and settle orders that
    /// number the settled calls from 0.
    pub(crate) fn finish(mut self, all: &[u8]) -> Result<(), StateError> {
        if all.len() != self.total || self.remaining != Some(0) || all.len() < 4 {
            return Err("state is truncated".into());
        }
        if self.pos != self.total - 4 {
            return Err("trailing bytes after the state".into());
        }
        let checksum = u32::from_le_bytes(all[self.total - 4..].try_into().expect("four bytes"));
        if self.crc.is_some_and(|crc| crc.finalize() != checksum) {
            return Err("state checksum mismatch".into());
        }
        self.settles.sort_unstable();
        if self.settles.iter().enumerate().any(|(i, &s)| s != i as u32) {
            return Err("settle orders are not a permutation".into());
        }
        if self.listed.is_some_and(|listed| listed.iter().any(|(_, called)| !called)) {
            return Err("the state lists a function that no call calls".into());
        }
        Ok(())
    }
}

/// The head of a state of `total` bytes.
fn read_head(r: &mut Reader<'_>, total: usize) -> Result<StateHead, StateError> {
    if r.take(4)? != MAGIC {
        return Err("not a continuation state".into());
    }
    let version = r.uint()?;
    if version != STATE_VERSION && version != LEGACY_STATE_VERSION {
        return Err(StateError::from(format!("unsupported state version {version}")));
    }
    let source_hash = r.array32()?;
    let scope_hash = r.array32()?;
    let logical_run_id = r.text()?.to_string();
    if logical_run_id.is_empty() || logical_run_id.len() > 256 {
        return Err("invalid logical run id".into());
    }
    let seed = u64::from_le_bytes(r.array8()?);
    let start_clock = r.clock()?;
    let functions = if version == STATE_VERSION { Some(read_functions(r, total)?) } else { None };
    let count = r.uint()?;
    // Each entry takes at least 13 bytes, so a count larger than that cannot be honest.
    if count > (total.saturating_sub(4) / 13) as u64 {
        return Err("ledger length exceeds the state".into());
    }
    Ok(StateHead { source_hash, scope_hash, logical_run_id, seed, start_clock, functions, count: count as usize })
}

/// The functions a state of format 2 lists, sorted and unique.
fn read_functions(r: &mut Reader<'_>, total: usize) -> Result<Vec<UsedFunction>, StateError> {
    let n = r.uint()?;
    if n > (total / MIN_FUNCTION_BYTES) as u64 {
        return Err("function list exceeds the state".into());
    }
    let mut functions: Vec<UsedFunction> = Vec::with_capacity(n as usize);
    for _ in 0..n {
        let name = r.text()?.to_string();
        check_function_name(&name)?;
        if functions.last().is_some_and(|last| last.name >= name) {
            return Err("the state's functions are not sorted and unique".into());
        }
        functions.push(UsedFunction { name, signature: r.array32()? });
    }
    Ok(functions)
}

/// Ledger entry `index` (from 1).
fn read_entry(r: &mut Reader<'_>, index: usize) -> Result<LedgerEntry, StateError> {
    let function = r.text()?.to_string();
    check_function_name(&function).map_err(|e| format!("call {index}: {e}"))?;
    let arguments = r.json()?.to_string();
    if !arguments.starts_with('[') {
        return Err(StateError::from(format!("call {index}: arguments are not an array")));
    }
    let outcome = match r.byte()? {
        0 => CallOutcome::Fulfilled(r.json()?.into()),
        1 => {
            let message = r.text()?.to_string();
            let details = match r.byte()? {
                0 => None,
                1 => Some(r.json()?.to_string()),
                _ => return Err(StateError::from(format!("call {index}: bad details flag"))),
            };
            CallOutcome::Rejected { message, details }
        }
        2 => CallOutcome::Interrupted(r.json()?.to_string()),
        other => return Err(StateError::from(format!("call {index}: unknown outcome {other}"))),
    };
    let settle_order = match r.byte()? {
        0 => None,
        1 => Some(u32::try_from(r.uint()?).map_err(|_| format!("call {index}: bad settle order"))?),
        _ => return Err(StateError::from(format!("call {index}: bad settle flag"))),
    };
    let interrupted = matches!(outcome, CallOutcome::Interrupted(_));
    if interrupted == settle_order.is_some() {
        return Err(StateError::from(format!("call {index}: settle order does not match its outcome")));
    }
    let clock = r.clock()?;
    Ok(LedgerEntry { function, arguments, outcome, settle_order, clock })
}

/// Every interrupted call of `ledger`, described for whoever decides.
pub(crate) fn pending_interruptions(ledger: &[LedgerEntry]) -> Result<Vec<crate::outcome::Interruption>, StateError> {
    let mut out = Vec::new();
    for (i, entry) in ledger.iter().enumerate() {
        let CallOutcome::Interrupted(payload) = &entry.outcome else { continue };
        let unreadable = |e: serde_json::Error| format!("call {} cannot be described: {e}", i + 1);
        out.push(crate::outcome::Interruption {
            id: format!("interrupt-{}", i + 1),
            function: entry.function.clone(),
            arguments: serde_json::from_str(&entry.arguments).map_err(unreadable)?,
            payload: serde_json::from_str(payload).map_err(unreadable)?,
        });
    }
    Ok(out)
}

fn check_function_name(name: &str) -> Result<(), StateError> {
    match name.split_once('.') {
        Some((ns, f))
            if resumable_host::validate_identifier(ns).is_ok() && resumable_host::validate_identifier(f).is_ok() =>
        {
            Ok(())
        }
        _ => Err("invalid function name".into()),
    }
}

struct Writer(Vec<u8>);

impl Writer {
    fn uint(&mut self, value: u64) {
        leb128::push(value, &mut self.0);
    }

    fn text(&mut self, s: &str) {
        self.uint(s.len() as u64);
        self.0.extend_from_slice(s.as_bytes());
    }
}

/// Whether `text` (valid UTF-8) is a JSON string literal without escapes: a quote, then no
/// quote, backslash or control character, then a quote. Host results are often such strings,
/// and this check is much cheaper than a JSON parser's.
fn is_plain_json_string(text: &str) -> bool {
    is_unescaped_json_string(text.as_bytes(), false)
}

/// Whether `bytes` are ASCII and a JSON string literal without escapes: the common case of
/// [`is_plain_json_string`], told in one pass, without a separate UTF-8 validation.
fn is_plain_ascii_json_string(bytes: &[u8]) -> bool {
    is_unescaped_json_string(bytes, true)
}

/// [`is_plain_json_string`], refusing any byte above ASCII too when `ascii_only`.
#[inline(always)]
fn is_unescaped_json_string(bytes: &[u8], ascii_only: bool) -> bool {
    let limit = if ascii_only { 0x80 } else { 0x100 };
    bytes.len() >= 2
        && bytes[0] == b'"'
        && bytes[bytes.len() - 1] == b'"'
        && bytes[1..bytes.len() - 1].chunks(64).all(|chunk| {
            // No early exit inside a chunk, so the compiler can use vector instructions.
            !chunk.iter().fold(false, |bad, &b| bad | (b < 0x20) | (u16::from(b) >= limit) | (b == b'"') | (b == b'\\'))
        })
}

struct Reader<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    /// Whether the last read failed for want of bytes.
    fn ran_out(&self) -> bool {
        self.pos > self.bytes.len()
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], StateError> {
        let Some(end) = self.pos.checked_add(n).filter(|&e| e <= self.bytes.len()) else {
            // Marks the reader as out of bytes (see `ran_out`).
            self.pos = self.bytes.len() + 1;
            return Err("state is truncated".into());
        };
        let out = &self.bytes[self.pos..end];
        self.pos = end;
        Ok(out)
    }

    fn byte(&mut self) -> Result<u8, StateError> {
        Ok(self.take(1)?[0])
    }

    fn uint(&mut self) -> Result<u64, StateError> {
        let mut rest = self.bytes.get(self.pos..).unwrap_or_default();
        let available = rest.len();
        match leb128::read(&mut rest) {
            Ok(value) => {
                self.pos += available - rest.len();
                Ok(value)
            }
            Err(Leb128Error::Truncated) => {
                // Marks the reader as out of bytes (see `ran_out`).
                self.pos = self.bytes.len() + 1;
                Err("state is truncated".into())
            }
            Err(Leb128Error::Overflow) => Err("integer overflow in state".into()),
            Err(Leb128Error::NonCanonical) => Err("non-canonical integer in state".into()),
        }
    }

    fn text(&mut self) -> Result<&'a str, StateError> {
        let len = usize::try_from(self.uint()?).map_err(|_| "length overflow")?;
        std::str::from_utf8(self.take(len)?).map_err(|_| "invalid UTF-8 in state".into())
    }

    fn json(&mut self) -> Result<&'a str, StateError> {
        let len = usize::try_from(self.uint()?).map_err(|_| "length overflow")?;
        let bytes = self.take(len)?;
        if is_plain_ascii_json_string(bytes) {
            // SAFETY: ASCII is valid UTF-8.
            return Ok(unsafe { std::str::from_utf8_unchecked(bytes) });
        }
        let text = std::str::from_utf8(bytes).map_err(|_| "invalid UTF-8 in state")?;
        if !is_plain_json_string(text) {
            serde_json::from_str::<serde::de::IgnoredAny>(text).map_err(|e| format!("invalid JSON in state: {e}"))?;
        }
        Ok(text)
    }

    fn array32(&mut self) -> Result<[u8; 32], StateError> {
        Ok(self.take(32)?.try_into().expect("length checked"))
    }

    fn array8(&mut self) -> Result<[u8; 8], StateError> {
        Ok(self.take(8)?.try_into().expect("length checked"))
    }

    fn clock(&mut self) -> Result<f64, StateError> {
        let v = f64::from_le_bytes(self.array8()?);
        if !v.is_finite() || !(0.0..=8.64e15).contains(&v) {
            return Err("invalid clock value in state".into());
        }
        Ok(v)
    }
}

/// SHA-256 of the source text.
pub(crate) fn source_hash(source: &str) -> [u8; 32] {
    Sha256::digest(source.as_bytes()).into()
}

/// Checks the head of a continuation's state against a run: made for its source and scope
/// (with every function it called still there, unchanged), recording no more calls than its
/// limit.
pub(crate) fn check_head(head: &StateHead, source: &[u8; 32], scope: &Scope, limits: &Limits) -> Result<(), RunError> {
    if &head.source_hash != source {
        return Err(RunError::protocol("continuation rejected: it was made for a different source"));
    }
    scope.check(head)?;
    if head.count as u64 > limits.get(Limit::HostCalls) {
        return Err(RunError::new(ErrorCode::BridgeLimit, "the continuation records more host calls than the limit"));
    }
    Ok(())
}

/// The error for a host call whose output is over the limit of `bytes`.
pub(crate) fn output_too_large(function: &str, bytes: usize) -> RunError {
    RunError::new(ErrorCode::BridgeLimit, format!("the output of {function} is larger than the limit of {bytes} bytes"))
}

/// The error for a resolution that names no interrupted call.
pub(crate) fn unknown_interruption(id: &str) -> RunError {
    RunError::protocol(format!("unknown interruption id {:?}", clip(id, 64)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// The shortcut only ever accepts what the JSON parser accepts, as the same string.
        #[test]
        fn plain_json_strings_are_valid_json(inner in "(\\PC|[\"\\\\\u{0}-\u{1f}]){0,12}") {
            let text = format!("\"{inner}\"");
            if is_plain_json_string(&text) {
                prop_assert_eq!(serde_json::from_str::<String>(&text).ok(), Some(inner.clone()));
            }
            // The ASCII check is the plain check for ASCII text, and never holds for other text.
            prop_assert_eq!(is_plain_ascii_json_string(text.as_bytes()), text.is_ascii() && is_plain_json_string(&text));
        }
    }

    #[test]
    fn plain_json_strings() {
        for plain in ["\"\"", "\"abc\"", "\"é ✓\""] {
            assert!(is_plain_json_string(plain), "{plain}");
            assert_eq!(is_plain_ascii_json_string(plain.as_bytes()), plain.is_ascii(), "{plain}");
        }
        assert!(!is_plain_ascii_json_string(b"\"\x7f\x80\""));
        assert!(is_plain_ascii_json_string(b"\"\x7f\""));
        for other in ["\"", "\"a\\\"b\"", "\"a\"b\"", "\"tab\there\"", "1", "\"open", "[\"a\"]", "\"\\u0041\""] {
            assert!(!is_plain_json_string(other), "{other}");
        }
    }

    fn listed(name: &str, signature: u8) -> UsedFunction {
        UsedFunction { name: name.into(), signature: [signature; 32] }
    }

    fn sample() -> ContinuationState {
        ContinuationState {
            source_hash: source_hash("return 1"),
            scope_hash: [7; 32],
            logical_run_id: "run-1".into(),
            seed: 99,
            start_clock: 1.7e12,
            functions: Some(vec![listed("tools.a", 1), listed("tools.b", 2), listed("tools.c", 3)]),
            ledger: vec![
                LedgerEntry {
                    function: "tools.a".into(),
                    arguments: "[1,\"x\"]".into(),
                    outcome: CallOutcome::Fulfilled("{\"ok\":true}".into()),
                    settle_order: Some(0),
                    clock: 1.7e12 + 5.0,
                },
                LedgerEntry {
                    function: "tools.b".into(),
                    arguments: "[]".into(),
                    outcome: CallOutcome::Rejected { message: "no".into(), details: Some("[1]".into()) },
                    settle_order: Some(1),
                    clock: 1.7e12 + 6.0,
                },
                LedgerEntry {
                    function: "tools.c".into(),
                    arguments: "[]".into(),
                    outcome: CallOutcome::Interrupted("{\"kind\":\"approval\"}".into()),
                    settle_order: None,
                    clock: 1.7e12 + 7.0,
                },
            ],
        }
    }

    /// `bytes` read by a [`StateParser`] as they arrive, `piece` bytes at a time.
    fn streamed(bytes: &[u8], piece: usize) -> Result<ContinuationState, StateError> {
        let mut parser = StateParser::new(bytes.len());
        let (mut head, mut ledger) = (None, Vec::new());
        let mut available = 0;
        loop {
            available = (available + piece).min(bytes.len());
            parser.advance(&bytes[..available], |item| match item {
                Parsed::Head(parsed) => head = Some(parsed),
                Parsed::Entry(entry) => ledger.push(entry),
            })?;
            if available == bytes.len() {
                break;
            }
        }
        parser.finish(bytes)?;
        let head = head.ok_or("no head")?;
        assert_eq!(head.count, ledger.len());
        Ok(ContinuationState::from_parts(head, ledger))
    }

    /// The sample as a state of format 1 (no list of functions).
    fn legacy_sample() -> ContinuationState {
        ContinuationState { functions: None, ..sample() }
    }

    #[test]
    fn round_trips() {
        for state in [sample(), legacy_sample()] {
            assert_eq!(ContinuationState::decode(&state.encode()).unwrap(), state);
            for piece in [1, 2, 7, 64, 1 << 20] {
                assert_eq!(streamed(&state.encode(), piece).unwrap(), state, "{piece} bytes at a time");
            }
        }
        assert_eq!(sample().encode()[4], STATE_VERSION as u8);
        assert_eq!(legacy_sample().encode()[4], LEGACY_STATE_VERSION as u8);
    }

    #[test]
    fn the_encoding_of_format_2_is_as_documented() {
        let state = ContinuationState {
            source_hash: [1; 32],
            scope_hash: [2; 32],
            logical_run_id: "r".into(),
            seed: 3,
            start_clock: 0.0,
            functions: Some(vec![listed("t.f", 4)]),
            ledger: vec![LedgerEntry {
                function: "t.f".into(),
                arguments: "[]".into(),
                outcome: CallOutcome::Interrupted("1".into()),
                settle_order: None,
                clock: 0.0,
            }],
        };
        let mut expected = b"RSv1\x02".to_vec();
        expected.extend([1; 32]);
        expected.extend([2; 32]);
        expected.extend(b"\x01r");
        expected.extend(3u64.to_le_bytes());
        expected.extend(0f64.to_le_bytes());
        expected.extend(b"\x01\x03t.f");
        expected.extend([4; 32]);
        expected.extend(b"\x01\x03t.f\x02[]\x02\x011\x00");
        expected.extend(0f64.to_le_bytes());
        expected.extend(crc32fast::hash(&expected).to_le_bytes());
        assert_eq!(state.encode(), expected);
    }

    #[test]
    fn the_list_of_functions_must_be_the_functions_called() {
        let refused = |state: ContinuationState, why: &str| {
            let bytes = state.encode();
            assert!(ContinuationState::decode(&bytes).unwrap_err().0.contains(why), "{why}");
            assert!(streamed(&bytes, 3).unwrap_err().0.contains(why), "{why}, streamed");
        };
        let mut unlisted = sample();
        unlisted.functions.as_mut().unwrap().remove(1);
        refused(unlisted, "call 2: its function is not listed");
        let mut uncalled = sample();
        uncalled.functions.as_mut().unwrap().push(listed("tools.d", 4));
        refused(uncalled, "lists a function that no call calls");
        let mut unsorted = sample();
        unsorted.functions.as_mut().unwrap().swap(0, 1);
        refused(unsorted, "not sorted and unique");
        let mut twice = sample();
        twice.functions.as_mut().unwrap().insert(0, listed("tools.a", 1));
        refused(twice, "not sorted and unique");
        let mut bad_name = sample();
        bad_name.functions.as_mut().unwrap()[0].name = "nope".into();
        refused(bad_name, "invalid function name");
    }

    #[test]
    fn every_truncation_and_extension_is_refused() {
        for bytes in [sample().encode(), legacy_sample().encode()] {
            for cut in 0..bytes.len() {
                assert!(ContinuationState::decode(&bytes[..cut]).is_err(), "cut at {cut}");
                assert!(streamed(&bytes[..cut], 1 + cut % 5).is_err(), "cut at {cut}, streamed");
            }
            let mut longer = bytes.clone();
            longer.push(0);
            assert!(ContinuationState::decode(&longer).is_err());
            assert!(streamed(&longer, 3).is_err());
        }
    }

    #[test]
    fn ten_thousand_seeded_byte_mutations_are_refused() {
        let bytes = sample().encode();
        let mut seed = 0x9E37_79B9_7F4A_7C15u64;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        for case in 0..10_000 {
            let mut mutated = bytes.clone();
            let at = (next() % mutated.len() as u64) as usize;
            match case % 4 {
                0 => mutated[at] ^= 1 << (next() % 8),
                1 => mutated[at] = mutated[at].wrapping_add(1 + (next() % 255) as u8),
                2 => {
                    mutated.insert(at, next() as u8);
                }
                _ => {
                    mutated.remove(at);
                }
            }
            assert!(ContinuationState::decode(&mutated).is_err(), "case {case} was accepted");
            assert!(streamed(&mutated, 1 + case % 9).is_err(), "case {case} was accepted, streamed");
        }
    }

    #[test]
    fn inconsistent_settle_orders_are_refused() {
        let mut state = sample();
        state.ledger[1].settle_order = Some(0);
        assert!(ContinuationState::decode(&state.encode()).unwrap_err().0.contains("permutation"));
        assert!(streamed(&state.encode(), 5).unwrap_err().0.contains("permutation"));
        let mut state = sample();
        state.ledger[2].settle_order = Some(2);
        assert!(ContinuationState::decode(&state.encode()).is_err());
    }
}
