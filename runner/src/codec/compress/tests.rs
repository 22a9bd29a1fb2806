use std::time::Instant;

use super::super::test_util::{SplitMix64, hex_state};
use super::*;

const MIB: usize = 1024 * 1024;

/// The zstd frame magic number, little-endian.
const MAGIC: [u8; 4] = [0x28, 0xB5, 0x2F, 0xFD];

/// A hand-made zstd frame: an optional 8-byte declared content size (single-segment frame)
/// or none (a 1 KiB window instead), then one last RLE block repeating `byte` `repeat`
/// times (at most 128 KiB).
fn rle_frame(declared: Option<u64>, repeat: u32, byte: u8) -> Vec<u8> {
    let mut frame = MAGIC.to_vec();
    match declared {
        Some(size) => {
            frame.push(0b1110_0000); // 8-byte content size, single segment
            frame.extend_from_slice(&size.to_le_bytes());
        }
        None => {
            frame.push(0b0000_0000); // no content size, window descriptor follows
            frame.push(0); // window of 1 KiB
        }
    }
    let block_header = (repeat << 3) | (1 << 1) | 1; // size, RLE, last block
    frame.extend_from_slice(&block_header.to_le_bytes()[..3]);
    frame.push(byte);
    frame
}

fn tagged(tag: u8, payload: &[u8]) -> Vec<u8> {
    let mut out = vec![tag];
    out.extend_from_slice(payload);
    out
}

/// `state` as earlier versions compressed it: one zstd frame ([`ZSTD`]) for one piece, else
/// a frame per piece ([`ZSTD_FRAMES`]).
fn legacy(state: &[u8]) -> Vec<u8> {
    let pieces = state.chunks(FRAME_INPUT_BYTES);
    let mut out = vec![if pieces.len() > 1 { ZSTD_FRAMES } else { ZSTD }];
    for piece in pieces {
        out.extend_from_slice(&zstd::bulk::compress(piece, ZSTD_LEVEL).unwrap());
    }
    out
}

/// A [`PACKED_FRAMES`] state that claims `total` bytes, with `frames` after the claim and
/// their lengths.
fn packed_state(total: u64, frames: &[&[u8]]) -> Vec<u8> {
    let mut out = vec![PACKED_FRAMES];
    crate::leb128::push(total, &mut out);
    for frame in frames {
        crate::leb128::push(frame.len() as u64, &mut out);
    }
    for frame in frames {
        out.extend_from_slice(frame);
    }
    out
}

#[test]
fn round_trips() {
    let mut rng = SplitMix64(0xC0FFEE);
    let random = rng.bytes(MIB);
    let hex = hex_state(1);
    let text = "the quick brown fox jumps over the lazy dog; ".repeat(1000).into_bytes();
    let cases: [(&str, Vec<u8>, u8); 8] = [
        ("empty", Vec::new(), STORED),
        ("one byte", vec![7], STORED),
        ("small", b"{\"pending\":[1,2,3]}".to_vec(), STORED),
        ("just below the threshold", vec![b'a'; MIN_COMPRESS_BYTES - 1], STORED),
        ("threshold", vec![b'a'; MIN_COMPRESS_BYTES], PACKED_FRAMES),
        ("1 MiB random", random, STORED),
        ("800 KiB hex", hex, PACKED_FRAMES),
        ("text", text, PACKED_FRAMES),
    ];
    for (name, state, tag) in cases {
        let packed = compress(&state);
        assert_eq!(packed[0], tag, "{name}");
        assert!(packed.len() <= state.len() + 1, "{name}: never more than one byte of overhead");
        let earlier = (state.len() >= MIN_COMPRESS_BYTES).then(|| legacy(&state));
        for packed in std::iter::once(packed).chain(earlier) {
            assert_eq!(decompress(&packed, state.len()).unwrap(), state, "{name}");
            assert_eq!(decompress(&packed, usize::MAX).unwrap(), state, "{name}");
            if !state.is_empty() {
                assert_eq!(decompress(&packed, state.len() - 1), Err(DecompressError::TooLarge), "{name}");
            }
        }
    }
}

/// A framed state is seen piece by piece as it decompresses, and progress can stop it early.
#[test]
fn framed_states_decompress_progressively() {
    /// The length of what is decoded after each frame, checking it against `state`. A
    /// packed state is given only as much of its input as each frame needs.
    fn frame_by_frame(packed: &[u8], state: &[u8]) -> Vec<usize> {
        let header =
            if packed[0] == PACKED_FRAMES { header_len_bound(state.len()).min(packed.len()) } else { packed.len() };
        let mut decoder = FrameDecoder::new(&packed[..header], packed.len(), state.len()).unwrap();
        assert_eq!(decoder.total(), state.len());
        let mut seen = Vec::new();
        while let Some(end) = decoder.next_frame_end() {
            assert_eq!(decoder.next_frame(&packed[..end - 1]), Err(DecompressError::Corrupt), "a frame cut short");
            let so_far = decoder.next_frame(&packed[..end]).unwrap().unwrap();
            assert_eq!(so_far, &state[..so_far.len()]);
            seen.push(so_far.len());
        }
        assert_eq!(decoder.next_frame(packed), Ok(None));
        assert_eq!(decoder.into_output(), state);
        seen
    }
    let state = hex_state(4);
    let expected: Vec<usize> = (1..=state.len().div_ceil(FRAME_INPUT_BYTES))
        .map(|frames| (frames * FRAME_INPUT_BYTES).min(state.len()))
        .collect();
    for packed in [compress(&state), legacy(&state)] {
        assert_eq!(frame_by_frame(&packed, &state), expected);
        let mut first = FrameDecoder::new(&packed, packed.len(), state.len()).unwrap();
        first.next_frame(&packed).unwrap();
        assert_eq!(first.into_output(), &state[..FRAME_INPUT_BYTES]);
    }
    // A small state is one frame.
    let small = compress(&state[..1000]);
    assert_eq!(small[0], PACKED_FRAMES);
    assert_eq!(frame_by_frame(&small, &state[..1000]), [1000]);
    assert_eq!(frame_by_frame(&legacy(&state[..1000]), &state[..1000]), [1000]);
    // Other formats need all of their input at once.
    let earlier = legacy(&state);
    assert_eq!(FrameDecoder::new(&earlier[..1000], earlier.len(), state.len()).err(), Some(DecompressError::Corrupt));
}

#[test]
fn hex_state_compresses_to_about_half() {
    let state = hex_state(2);
    assert_eq!(state.len(), 821_490);
    let packed = compress(&state);
    assert_eq!(packed[0], PACKED_FRAMES);
    // 4 bits of information per hex digit: a little over half the input.
    assert!(packed.len() < 420_000, "{}", packed.len());
    // The same hex in upper case packs as well.
    let upper = compress(&state.to_ascii_uppercase());
    assert!(upper.len() < 420_000, "{}", upper.len());
}

#[test]
fn bomb_is_refused_without_decoding() {
    let zeros = vec![0u8; 64 * MIB];
    let packed = compress(&zeros);
    assert_eq!(packed[0], PACKED_FRAMES);
    assert!(packed.len() < 32 * 1024, "{}", packed.len());
    assert_eq!(decompress(&packed, MIB), Err(DecompressError::TooLarge));
    assert_eq!(decompress(&packed, 64 * MIB - 1), Err(DecompressError::TooLarge));
    assert_eq!(decompress(&packed, 64 * MIB).unwrap().len(), 64 * MIB);
}

#[test]
fn hand_made_frames() {
    // A correct frame: 128 KiB of 'z' from 17 bytes.
    let frame = tagged(ZSTD, &rle_frame(Some(128 * 1024), 128 * 1024, b'z'));
    assert_eq!(frame.len(), 1 + 17);
    assert_eq!(decompress(&frame, 128 * 1024).unwrap(), vec![b'z'; 128 * 1024]);
    assert_eq!(decompress(&frame, 128 * 1024 - 1), Err(DecompressError::TooLarge));
    // Declaring a terabyte: too large for any sane limit, and a lie for 17 bytes of frame
    // even with no limit at all (nothing is allocated either way).
    let huge = tagged(ZSTD, &rle_frame(Some(1 << 40), 128 * 1024, b'z'));
    assert_eq!(decompress(&huge, 48 * MIB), Err(DecompressError::TooLarge));
    assert_eq!(decompress(&huge, usize::MAX), Err(DecompressError::Corrupt));
    // Declaring less or more than the blocks hold.
    let short = tagged(ZSTD, &rle_frame(Some(100), 128 * 1024, b'z'));
    assert_eq!(decompress(&short, usize::MAX), Err(DecompressError::Corrupt));
    let long = tagged(ZSTD, &rle_frame(Some(128 * 1024 + 1), 128 * 1024, b'z'));
    assert_eq!(decompress(&long, usize::MAX), Err(DecompressError::Corrupt));
    // No declared size.
    let no_size = tagged(ZSTD, &rle_frame(None, 100, b'z'));
    assert_eq!(decompress(&no_size, usize::MAX), Err(DecompressError::Corrupt));

    // Packed frames: one per 64 KiB of the claimed length, each holding a packed piece ('z'
    // is not a hex digit, so 'z's pack as themselves).
    let piece = rle_frame(Some(FRAME_INPUT_BYTES as u64), FRAME_INPUT_BYTES as u32, b'z');
    let tail = rle_frame(Some(10), 10, b'z');
    let good = packed_state(FRAME_INPUT_BYTES as u64 + 10, &[&piece, &tail]);
    assert_eq!(good.len(), 1 + 3 + 1 + 1 + 17 + 17);
    assert_eq!(decompress(&good, usize::MAX).unwrap(), vec![b'z'; FRAME_INPUT_BYTES + 10]);
    assert_eq!(decompress(&good, FRAME_INPUT_BYTES + 9), Err(DecompressError::TooLarge));
    let huge_claim = packed_state(1 << 40, &[&piece, &tail]);
    assert_eq!(decompress(&huge_claim, 48 * MIB), Err(DecompressError::TooLarge));
    assert_eq!(decompress(&huge_claim, usize::MAX), Err(DecompressError::Corrupt));
    let (piece, tail) = (piece.as_slice(), tail.as_slice());
    for frames in [&[piece][..], &[piece, tail, tail], &[tail, piece]] {
        let state = packed_state(FRAME_INPUT_BYTES as u64 + 10, frames);
        assert_eq!(decompress(&state, usize::MAX), Err(DecompressError::Corrupt), "{} frames", frames.len());
    }
    // A frame may hold up to twice its piece (every byte an escaped 0xFF), not more.
    let escaped = packed_state(10, &[&rle_frame(Some(20), 20, 0xFF)]);
    assert_eq!(decompress(&escaped, usize::MAX), Err(DecompressError::Corrupt), "FF FF is no escape");
    let too_big = packed_state(10, &[&rle_frame(Some(21), 21, b'z')]);
    assert_eq!(decompress(&too_big, usize::MAX), Err(DecompressError::Corrupt));
    // Frame lengths that do not fill the input exactly.
    let mut short = good.clone();
    short[4] = 16;
    assert_eq!(decompress(&short, usize::MAX), Err(DecompressError::Corrupt));
    let mut zero = good.clone();
    zero[4] = 0;
    assert_eq!(decompress(&zero, usize::MAX), Err(DecompressError::Corrupt));
    let mut pairs = Vec::new();
    for _ in 0..10 {
        pairs.extend_from_slice(&[0xFF, 0]);
    }
    let escapes = packed_state(10, &[&zstd::bulk::compress(&pairs, 1).unwrap()]);
    assert_eq!(decompress(&escapes, usize::MAX).unwrap(), vec![0xFF; 10]);
}

#[test]
fn corrupt_and_unknown_inputs() {
    let packed = legacy(&hex_state(3)[..10_000]);
    assert_eq!(packed[0], ZSTD);
    let frame = &packed[1..];
    let mut two_frames = packed.clone();
    two_frames.extend_from_slice(frame);
    let mut trailing = packed.clone();
    trailing.push(0);
    let one_of_frames = tagged(ZSTD_FRAMES, frame);
    let mut frames = two_frames.clone();
    frames[0] = ZSTD_FRAMES;
    let mut frames_trailing = frames.clone();
    frames_trailing.push(0);
    let current = compress(&hex_state(3)[..100_000]);
    assert_eq!(current[0], PACKED_FRAMES);
    let mut current_trailing = current.clone();
    current_trailing.push(0);
    let cases: [(&[u8], DecompressError); 21] = [
        (&[], DecompressError::Corrupt),
        (&[ZSTD], DecompressError::Corrupt),
        (&[ZSTD, 1, 2, 3, 4, 5, 6, 7, 8], DecompressError::Corrupt),
        (&packed[..packed.len() / 2], DecompressError::Corrupt),
        (&packed[..packed.len() - 1], DecompressError::Corrupt),
        (&two_frames, DecompressError::Corrupt),
        (&trailing, DecompressError::Corrupt),
        (&[ZSTD_FRAMES], DecompressError::Corrupt),
        (&[ZSTD_FRAMES, 1, 2, 3], DecompressError::Corrupt),
        (&one_of_frames, DecompressError::Corrupt),
        (&frames_trailing, DecompressError::Corrupt),
        (&frames[..frames.len() - 1], DecompressError::Corrupt),
        (&[PACKED_FRAMES], DecompressError::Corrupt),
        (&[PACKED_FRAMES, 0], DecompressError::Corrupt),
        (&[PACKED_FRAMES, 100], DecompressError::Corrupt),
        (&[PACKED_FRAMES, 100, 0x80], DecompressError::Corrupt),
        (&current[..current.len() - 1], DecompressError::Corrupt),
        (&current_trailing, DecompressError::Corrupt),
        (&current[..current.len() / 2], DecompressError::Corrupt),
        (&[4, 1, 2, 3], DecompressError::UnknownFormat),
        (&[0xff], DecompressError::UnknownFormat),
    ];
    for (input, expected) in cases {
        assert_eq!(decompress(input, usize::MAX), Err(expected), "{input:?}");
    }
    // Two frames under the framed tag are a state: the piece twice.
    assert_eq!(decompress(&frames, usize::MAX).unwrap(), [&hex_state(3)[..10_000]; 2].concat());
    // The stored form of anything is its bytes, limits aside.
    assert_eq!(decompress(&[STORED], 0).unwrap(), b"");
    assert_eq!(decompress(&tagged(STORED, b"abc"), 3).unwrap(), b"abc");
    assert_eq!(decompress(&tagged(STORED, b"abc"), 2), Err(DecompressError::TooLarge));
}

#[test]
fn errors_map_to_token_rejections() {
    let cases = [
        (DecompressError::TooLarge, TokenRejection::TooLarge),
        (DecompressError::UnknownFormat, TokenRejection::UnsupportedFormat),
        (DecompressError::Corrupt, TokenRejection::Malformed),
    ];
    for (err, rejection) in cases {
        assert_eq!(TokenRejection::from(err), rejection);
        assert_eq!(TokenError::from(err).reason, rejection);
        assert!(!err.to_string().is_empty());
    }
}

#[test]
fn every_byte_flip_of_a_frame_is_safe() {
    let state = hex_state(4)[..3000].to_vec();
    let packed = compress(&state);
    assert_eq!(packed[0], PACKED_FRAMES);
    for index in 1..packed.len() {
        for bit in 0..8 {
            let mut mutated = packed.clone();
            mutated[index] ^= 1 << bit;
            // Without a checksum a flip may still decode (authentication is the codec's
            // job); it must never panic nor exceed the limit.
            if let Ok(out) = decompress(&mutated, state.len()) {
                assert!(out.len() <= state.len());
            }
        }
    }
}

/// Compression timings at several zstd levels for the benchmark state. Run with
/// `cargo test --release -p resumable-runner codec::compress -- --ignored --nocapture`.
#[test]
#[ignore = "timing report, run by hand in release mode"]
fn level_timings() {
    let state = hex_state(7);
    let best = |f: &mut dyn FnMut()| {
        (0..30)
            .map(|_| {
                let start = Instant::now();
                f();
                start.elapsed().as_secs_f64() * 1e3
            })
            .fold(f64::MAX, f64::min)
    };
    for level in [-1, 1, 2, 3, 5] {
        let packed = compress_with_level(&state, level);
        let compress_ms = best(&mut || drop(std::hint::black_box(compress_with_level(&state, level))));
        let decompress_ms = best(&mut || drop(std::hint::black_box(decompress(&packed, state.len()).unwrap())));
        println!(
            "level {level:>2}: {} -> {} bytes ({} base64url chars); compress {compress_ms:.3} ms, decompress {decompress_ms:.3} ms",
            state.len(),
            packed.len(),
            base64::encoded_len(packed.len(), false).unwrap_or(0),
        );
    }
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(256))]

    #[test]
    fn compress_prop_round_trip(
        state in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..4096),
        repeat in 1usize..8,
    ) {
        let state = state.repeat(repeat);
        let packed = compress(&state);
        proptest::prop_assert!(packed.len() <= state.len() + 1);
        proptest::prop_assert_eq!(decompress(&packed, state.len()).unwrap(), state);
    }

    #[test]
    fn compress_prop_garbage_never_panics(
        bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..512),
        max_output in 0usize..1_000_000,
    ) {
        if let Ok(out) = decompress(&bytes, max_output) {
            proptest::prop_assert!(out.len() <= max_output);
        }
    }

    #[test]
    fn compress_prop_garbage_frames_never_panic(
        body in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..512),
        descriptor in proptest::prelude::any::<u8>(),
        max_output in 0usize..1_000_000,
    ) {
        for tag in [ZSTD, PACKED_FRAMES] {
            let mut bytes = vec![tag];
            if tag == PACKED_FRAMES {
                crate::leb128::push(max_output as u64 / 2, &mut bytes);
                crate::leb128::push(body.len() as u64 + 5, &mut bytes);
            }
            bytes.extend_from_slice(&MAGIC);
            bytes.push(descriptor);
            bytes.extend_from_slice(&body);
            if let Ok(out) = decompress(&bytes, max_output) {
                proptest::prop_assert!(out.len() <= max_output);
            }
        }
    }
}
