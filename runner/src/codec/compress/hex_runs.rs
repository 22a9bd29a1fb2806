//! Hex-run packing: a filter applied to each piece of state before zstd.
//!
//! Host results are full of hexadecimal text: digests, ids, binary data dumped as hex. Such
//! text carries 4 bits per byte, which zstd can only recover with its Huffman stage, and that
//! stage is most of the time a resume spends decompressing. This filter stores every run of at
//! least [`MIN_RUN`] hex digits of one case as packed nibbles instead, two digits per byte, so
//! zstd sees those bytes as incompressible and copies them.
//!
//! # Format
//!
//! The packed form is the input with
//!
//! * every byte `0xFF` (never part of UTF-8 text) written as `FF 00`;
//! * every packed run written as `FF 01` (digits `0-9a-f`) or `FF 02` (digits `0-9A-F`), the
//!   number of digits `n` (at least [`MIN_RUN`]) as an unsigned LEB128 integer, then `n / 2`
//!   rounded up bytes, each holding two digits, high nibble first; an odd run's last low
//!   nibble is 0.

use hex_simd::AsciiCase;

use super::DecompressError;
use crate::leb128;

/// The shortest run of hex digits that is packed: shorter runs save too little to be worth
/// the 3 or 4 bytes a run costs.
pub(super) const MIN_RUN: usize = 16;

const ESCAPE: u8 = 0xFF;
const LITERAL: u8 = 0;
const LOWER: u8 = 1;
const UPPER: u8 = 2;

/// Per byte: [`LOWER`] if it is a digit of `0-9a-f`, [`UPPER`] if of `0-9A-F` (both bits for
/// `0-9`).
const CLASS: [u8; 256] = {
    let mut table = [0u8; 256];
    let mut i = 0;
    while i < 10 {
        table[b'0' as usize + i] = LOWER | UPPER;
        i += 1;
    }
    let mut i = 0;
    while i < 6 {
        table[b'a' as usize + i] = LOWER;
        table[b'A' as usize + i] = UPPER;
        i += 1;
    }
    table
};

/// The value of a hex digit of either case (0 for other bytes, which are never asked).
const VALUE: [u8; 256] = {
    let mut table = [0u8; 256];
    let mut i = 0;
    while i < 10 {
        table[b'0' as usize + i] = i as u8;
        i += 1;
    }
    let mut i = 0;
    while i < 6 {
        table[b'a' as usize + i] = 10 + i as u8;
        table[b'A' as usize + i] = 10 + i as u8;
        i += 1;
    }
    table
};

/// Appends the packed form of `input` to `out`.
pub(super) fn pack(input: &[u8], out: &mut Vec<u8>) {
    let mut literal_start = 0;
    let mut i = 0;
    while i < input.len() {
        if CLASS[input[i] as usize] == 0 {
            i += 1;
            continue;
        }
        let lower = run_length(&input[i..], LOWER);
        let upper = run_length(&input[i..], UPPER);
        let (length, mode) = if lower >= upper { (lower, LOWER) } else { (upper, UPPER) };
        if length < MIN_RUN {
            // Every run starting inside this one is shorter in its alphabet.
            i += length;
            continue;
        }
        push_literals(&input[literal_start..i], out);
        out.extend_from_slice(&[ESCAPE, mode]);
        leb128::push(length as u64, out);
        let mut pairs = input[i..i + length].chunks_exact(2);
        out.extend(pairs.by_ref().map(|pair| VALUE[pair[0] as usize] << 4 | VALUE[pair[1] as usize]));
        if let [last] = pairs.remainder() {
            out.push(VALUE[*last as usize] << 4);
        }
        i += length;
        literal_start = i;
    }
    push_literals(&input[literal_start..], out);
}

/// How many bytes at the start of `bytes` are digits of the alphabet `mode`.
fn run_length(bytes: &[u8], mode: u8) -> usize {
    bytes.iter().position(|&b| CLASS[b as usize] & mode == 0).unwrap_or(bytes.len())
}

/// Appends `bytes`, escaping each [`ESCAPE`].
fn push_literals(mut bytes: &[u8], out: &mut Vec<u8>) {
    while let Some(at) = memchr::memchr(ESCAPE, bytes) {
        out.extend_from_slice(&bytes[..at]);
        out.extend_from_slice(&[ESCAPE, LITERAL]);
        bytes = &bytes[at + 1..];
    }
    out.extend_from_slice(bytes);
}

/// Appends to `out` what `packed` (the output of [`pack`]) unpacks to, which must be exactly
/// `length` bytes.
///
/// # Errors
///
/// [`DecompressError::Corrupt`] if `packed` is not the packed form of `length` bytes; `out`
/// then holds an unspecified part of them.
pub(super) fn unpack(packed: &[u8], length: usize, out: &mut Vec<u8>) -> Result<(), DecompressError> {
    let end = out.len().checked_add(length).ok_or(DecompressError::Corrupt)?;
    out.try_reserve_exact(length).map_err(|_| DecompressError::Corrupt)?;
    let mut rest = packed;
    loop {
        let literals = memchr::memchr(ESCAPE, rest).unwrap_or(rest.len());
        if out.len() + literals > end {
            return Err(DecompressError::Corrupt);
        }
        out.extend_from_slice(&rest[..literals]);
        rest = &rest[literals..];
        let [ESCAPE, mode, after @ ..] = rest else { break };
        rest = after;
        let case = match *mode {
            LITERAL => {
                if out.len() == end {
                    return Err(DecompressError::Corrupt);
                }
                out.push(ESCAPE);
                continue;
            }
            LOWER => AsciiCase::Lower,
            UPPER => AsciiCase::Upper,
            _ => return Err(DecompressError::Corrupt),
        };
        let digits = leb128::read(&mut rest)
            .ok()
            .and_then(|n| usize::try_from(n).ok())
            .filter(|&n| n >= MIN_RUN && n <= end - out.len())
            .ok_or(DecompressError::Corrupt)?;
        let (run, after) = rest.split_at_checked(digits.div_ceil(2)).ok_or(DecompressError::Corrupt)?;
        rest = after;
        // An odd run's last byte holds one digit (and a low nibble of 0): written alone, so that
        // nothing is written past `length`, not even for a moment.
        let (pairs, last) = run.split_at(digits / 2);
        hex_simd::encode_append(pairs, out, case);
        if let [last] = last {
            if last & 0x0F != 0 {
                return Err(DecompressError::Corrupt);
            }
            let digits = if case == AsciiCase::Lower { b"0123456789abcdef" } else { b"0123456789ABCDEF" };
            out.push(digits[usize::from(last >> 4)]);
        }
    }
    if !rest.is_empty() || out.len() != end {
        return Err(DecompressError::Corrupt);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn packed(input: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        pack(input, &mut out);
        out
    }

    fn unpacked(packed: &[u8], length: usize) -> Result<Vec<u8>, DecompressError> {
        let mut out = b"before".to_vec();
        unpack(packed, length, &mut out)?;
        assert_eq!(&out[..6], b"before");
        Ok(out.split_off(6))
    }

    #[test]
    fn runs_of_either_case_pack_to_half() {
        let lower = b"{\"sha\":\"0123456789abcdef0123456789abcdef0\"}";
        let out = packed(lower);
        assert_eq!(&out[..8], b"{\"sha\":\"");
        assert_eq!(&out[8..11], &[ESCAPE, LOWER, 33]);
        assert_eq!(out[11], 0x01);
        assert_eq!(out[27], 0x00, "odd run: the last low nibble is 0");
        assert_eq!(&out[28..], b"\"}");
        assert_eq!(unpacked(&out, lower.len()).unwrap(), lower);

        let upper = b"DEADBEEF00112233DEADBEEF00112233";
        let out = packed(upper);
        assert_eq!(&out[..3], &[ESCAPE, UPPER, 32]);
        assert_eq!(out.len(), 3 + 16);
        assert_eq!(unpacked(&out, upper.len()).unwrap(), upper);
    }

    #[test]
    fn short_runs_mixed_case_and_escapes_stay_literal() {
        for input in [&b"0123456789abcde"[..], b"0123456789abcdeF0123456789abcde", b"\xFF\xFFplain text\xFF", b""] {
            let out = packed(input);
            let escapes = input.iter().filter(|&&b| b == ESCAPE).count();
            assert_eq!(out.len(), input.len() + escapes, "{input:?}");
            assert_eq!(unpacked(&out, input.len()).unwrap(), input);
        }
    }

    /// Unpacking never writes past the length it was given, so an output reserved for exactly
    /// that length is never reallocated.
    #[test]
    fn unpacking_stays_within_its_length() {
        for input in [&b"0123456789abcdef0"[..], b"x0123456789ABCDEF0", b"0123456789abcdef01"] {
            let packed = packed(input);
            let mut out = Vec::with_capacity(input.len());
            unpack(&packed, input.len(), &mut out).unwrap();
            assert_eq!(out, input);
            assert_eq!(out.capacity(), input.len(), "{input:?}");
        }
    }

    #[test]
    fn malformed_packed_forms_are_refused() {
        let cases: [(&[u8], usize); 9] = [
            (&[ESCAPE], 0),
            (&[ESCAPE, 3], 0),
            (&[ESCAPE, LOWER, 15, 0, 0, 0, 0, 0, 0, 0, 0], 15),
            (&[ESCAPE, LOWER, 16, 0, 0, 0, 0, 0, 0, 0], 16),
            (&[ESCAPE, LOWER, 17, 0, 0, 0, 0, 0, 0, 0, 0, 1], 17),
            (&[ESCAPE, LOWER, 0x80], 16),
            (b"abc", 2),
            (b"abc", 4),
            (&[ESCAPE, LITERAL], 0),
        ];
        for (packed, length) in cases {
            assert_eq!(unpacked(packed, length), Err(DecompressError::Corrupt), "{packed:?}");
        }
    }

    proptest! {
        #[test]
        fn pack_round_trips(input in proptest::collection::vec(
            prop_oneof![Just(b'a'), Just(b'F'), Just(b'7'), Just(b'"'), Just(ESCAPE), any::<u8>()], 0..400)
        ) {
            let out = packed(&input);
            prop_assert_eq!(unpacked(&out, input.len()).unwrap(), input.clone());
            prop_assert!(unpacked(&out, input.len() + 1).is_err());
            if !input.is_empty() {
                prop_assert!(unpacked(&out, input.len() - 1).is_err());
            }
        }

        #[test]
        fn garbage_never_panics(garbage in proptest::collection::vec(any::<u8>(), 0..64), length in 0usize..200) {
            let _ = unpacked(&garbage, length);
        }
    }
}
