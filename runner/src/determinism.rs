//! The deterministic clock and random generator a script sees.
//!
//! `Math.random()` is xoshiro256** seeded through SplitMix64 from a 64-bit seed
//! that the continuation stores; `Date.now()` reads a logical clock that starts
//! at the run's recorded start time and moves only when a host call settles,
//! to the time recorded for that settle. A replay therefore sees exactly the
//! values the first run saw.

use std::time::{SystemTime, UNIX_EPOCH};

/// xoshiro256** over a SplitMix64-expanded seed.
#[derive(Clone, Debug)]
pub(crate) struct SeededRandom {
    s: [u64; 4],
}

impl SeededRandom {
    pub(crate) fn new(seed: u64) -> Self {
        let mut x = seed;
        let mut next = || {
            x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = x;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^ (z >> 31)
        };
        SeededRandom { s: [next(), next(), next(), next()] }
    }

    pub(crate) fn next_u64(&mut self) -> u64 {
        let result = self.s[1].wrapping_mul(5).rotate_left(7).wrapping_mul(9);
        let t = self.s[1] << 17;
        self.s[2] ^= self.s[0];
        self.s[3] ^= self.s[1];
        self.s[1] ^= self.s[2];
        self.s[0] ^= self.s[3];
        self.s[2] ^= t;
        self.s[3] = self.s[3].rotate_left(45);
        result
    }

    /// A float in [0, 1) with 53 random bits.
    pub(crate) fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }
}

/// A fresh seed from the operating system.
pub(crate) fn fresh_seed() -> u64 {
    let mut bytes = [0u8; 8];
    // The OS generator failing is not recoverable; fall back to the clock rather than panic.
    if getrandom::fill(&mut bytes).is_err() {
        return wall_clock_ms().to_bits() ^ 0xA5A5_5A5A_F0F0_0F0F;
    }
    u64::from_le_bytes(bytes)
}

/// Milliseconds since the Unix epoch, as JavaScript counts them.
pub(crate) fn wall_clock_ms() -> f64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as f64).unwrap_or(0.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_seed_same_sequence_in_unit_interval() {
        let mut a = SeededRandom::new(42);
        let mut b = SeededRandom::new(42);
        let mut c = SeededRandom::new(43);
        let xs: Vec<f64> = (0..1000).map(|_| a.next_f64()).collect();
        let ys: Vec<f64> = (0..1000).map(|_| b.next_f64()).collect();
        let zs: Vec<f64> = (0..1000).map(|_| c.next_f64()).collect();
        assert_eq!(xs, ys);
        assert_ne!(xs, zs);
        assert!(xs.iter().all(|x| (0.0..1.0).contains(x)));
        let mean = xs.iter().sum::<f64>() / xs.len() as f64;
        assert!((0.45..0.55).contains(&mean), "{mean}");
    }
}
