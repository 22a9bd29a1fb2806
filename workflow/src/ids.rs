//! Run identifiers and the engine's source of randomness (ids, retry jitter).

use std::fmt;

use serde::{Deserialize, Serialize};

/// The identifier of a workflow run, such as `run_3f9c0a…` (32 random hex digits after the prefix).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct RunId(String);

impl RunId {
    /// Creates a new random run id.
    pub fn generate() -> RunId {
        RunId(format!("run_{}", random_hex(16)))
    }

    /// The id as a string slice.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for RunId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl From<String> for RunId {
    fn from(s: String) -> RunId {
        RunId(s)
    }
}

impl From<&str> for RunId {
    fn from(s: &str) -> RunId {
        RunId(s.to_owned())
    }
}

impl AsRef<str> for RunId {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

/// Fills `buf` from the operating system's random source.
fn fill(buf: &mut [u8]) {
    // The OS source failing is not recoverable; ids must never repeat.
    getrandom::fill(buf).expect("operating system random source failed");
}

/// `bytes` random bytes as lowercase hex.
pub(crate) fn random_hex(bytes: usize) -> String {
    let mut buf = vec![0u8; bytes];
    fill(&mut buf);
    buf.iter().map(|b| format!("{b:02x}")).collect()
}

/// A uniformly distributed float in `[0, 1)`.
pub(crate) fn random_unit() -> f64 {
    let mut buf = [0u8; 8];
    fill(&mut buf);
    (u64::from_le_bytes(buf) >> 11) as f64 / (1u64 << 53) as f64
}
