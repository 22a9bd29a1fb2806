//! Helpers shared by the codec tests.

/// Small deterministic PRNG (SplitMix64).
pub(super) struct SplitMix64(pub(super) u64);

impl SplitMix64 {
    pub(super) fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    pub(super) fn below(&mut self, bound: usize) -> usize {
        (self.next_u64() % bound as u64) as usize
    }

    pub(super) fn bytes(&mut self, len: usize) -> Vec<u8> {
        (0..len).map(|_| self.next_u64() as u8).collect()
    }

    /// `len` random lowercase hex digits.
    pub(super) fn hex(&mut self, len: usize) -> String {
        (0..len).map(|_| char::from(b"0123456789abcdef"[self.below(16)])).collect()
    }
}

/// The benchmark's continuation-sized state: 200 distinct random 4 KiB lowercase hex
/// strings with small JSON-like separators (821,490 bytes).
pub(super) fn hex_state(seed: u64) -> Vec<u8> {
    let mut rng = SplitMix64(seed);
    let mut state = Vec::with_capacity(200 * (4096 + 16));
    for index in 0..200 {
        state.extend_from_slice(format!("{{\"k{index}\":\"").as_bytes());
        state.extend_from_slice(rng.hex(4096).as_bytes());
        state.extend_from_slice(b"\"},");
    }
    state
}
