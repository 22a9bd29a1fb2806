//! Tests across the codecs and compression: the benchmark-sized state end to end.

use std::time::{Duration, UNIX_EPOCH};

use super::test_util::hex_state;
use super::*;

const SECRET: &[u8] = b"a-continuation-secret-of-at-least-32-bytes";
const AUD: &str = "tenant-1/automation-7";

#[test]
fn benchmark_state_fits_in_600_kb_tokens() {
    let now = UNIX_EPOCH + Duration::from_secs(1_700_000_000);
    let state = hex_state(0xB0B);
    assert_eq!(state.len(), 821_490);
    let packed = compress(&state);
    let signed = SignedCodec::new(SignedCodecConfig::new(SECRET)).unwrap();
    let sealed = SealedCodec::new(SealedCodecConfig::new(SECRET)).unwrap();
    let signed_token = signed.encode(&packed, AUD, now);
    let sealed_token = sealed.encode(&packed, AUD, now);
    println!(
        "state {} bytes, compressed {} bytes, signed token {} bytes, sealed token {} bytes",
        state.len(),
        packed.len(),
        signed_token.len(),
        sealed_token.len()
    );
    assert!(signed_token.len() <= 600_000, "signed token is {} bytes", signed_token.len());
    assert!(sealed_token.len() <= 600_000, "sealed token is {} bytes", sealed_token.len());
    // The signed token carries a digest of each 48 KiB of state (9 here), 43 base64url
    // characters each; give or take the tags and the algorithm names, that is the difference.
    let digests = packed.len().div_ceil(48 * 1024);
    assert_eq!(digests, 9);
    assert!(signed_token.len().abs_diff(sealed_token.len() + digests * 43) < 64);
    for bytes in [signed.decode(&signed_token, AUD, now).unwrap(), sealed.decode(&sealed_token, AUD, now).unwrap()] {
        assert_eq!(decompress(&bytes, state.len()).unwrap(), state);
    }
}

#[test]
fn one_config_builds_both_codecs() {
    let config = CodecConfig::new(SECRET).max_age(Duration::from_secs(60));
    let signed = SignedCodec::new(config.clone()).unwrap();
    let sealed = SealedCodec::new(config).unwrap();
    assert_eq!(signed.max_age(), sealed.max_age());
    assert_eq!(signed.max_token_bytes(), sealed.max_token_bytes());
    assert_eq!(TOKEN_ALGORITHM, "HS256-CHUNKED");
    assert_eq!(SEALED_TOKEN_ALGORITHM, "A256GCM");
}

/// Encode and decode timings of both codecs for the compressed benchmark state. Run with
/// `cargo test --release -p resumable-runner codec::tests -- --ignored --nocapture`.
#[test]
#[ignore = "timing report, run by hand in release mode"]
fn codec_timings() {
    let now = UNIX_EPOCH + Duration::from_secs(1_700_000_000);
    let state = hex_state(0xB0B);
    let packed = compress(&state);
    let best = |f: &mut dyn FnMut()| {
        (0..30)
            .map(|_| {
                let start = std::time::Instant::now();
                f();
                start.elapsed().as_secs_f64() * 1e3
            })
            .fold(f64::MAX, f64::min)
    };
    let signed = SignedCodec::new(SignedCodecConfig::new(SECRET)).unwrap();
    let sealed = SealedCodec::new(SealedCodecConfig::new(SECRET)).unwrap();
    let rotated = SealedCodec::new(SealedCodecConfig::new([9u8; 32]).previous_secret(SECRET)).unwrap();
    let signed_token = signed.encode(&packed, AUD, now);
    let sealed_token = sealed.encode(&packed, AUD, now);
    let timings = [
        ("signed encode", best(&mut || drop(std::hint::black_box(signed.encode(&packed, AUD, now))))),
        ("signed decode", best(&mut || drop(std::hint::black_box(signed.decode(&signed_token, AUD, now))))),
        ("sealed encode", best(&mut || drop(std::hint::black_box(sealed.encode(&packed, AUD, now))))),
        ("sealed decode", best(&mut || drop(std::hint::black_box(sealed.decode(&sealed_token, AUD, now))))),
        (
            "sealed decode, previous key",
            best(&mut || drop(std::hint::black_box(rotated.decode(&sealed_token, AUD, now)))),
        ),
    ];
    for (name, ms) in timings {
        println!("{name}: {ms:.3} ms for {} compressed bytes", packed.len());
    }
}
