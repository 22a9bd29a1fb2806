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

/// A random number below 2^31.
#[cfg(feature = "postgres")]
pub(crate) fn random_u31() -> u32 {
    let mut buf = [0u8; 4];
    fill(&mut buf);
    u32::from_be_bytes(buf) >> 1
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

/// The generator behind [`WorkflowContext::random`](crate::WorkflowContext::random): SplitMix64
/// seeded from the run id, so every execution of a run draws the same sequence.
#[derive(Clone, Debug)]
pub(crate) struct DeterministicRng {
    state: u64,
}

impl DeterministicRng {
    /// The generator of a run: the seed is the FNV-1a hash of its id.
    pub(crate) fn for_run(run_id: &RunId) -> DeterministicRng {
        let seed = run_id
            .as_str()
            .bytes()
            .fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3));
        DeterministicRng { state: seed }
    }

    fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A uniformly distributed float in `[0, 1)`.
    pub(crate) fn next_unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deterministic_rng_repeats_per_run_and_differs_between_runs() {
        let id = RunId::from("run_a");
        let draw = |id: &RunId| {
            let mut rng = DeterministicRng::for_run(id);
            (0..4).map(|_| rng.next_unit()).collect::<Vec<_>>()
        };
        assert_eq!(draw(&id), draw(&id));
        assert_ne!(draw(&id), draw(&RunId::from("run_b")));
        assert!(draw(&id).iter().all(|x| (0.0..1.0).contains(x)));
    }
}
