//! Helpers shared by the codec tests.

use std::collections::HashSet;
use std::fmt;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use proptest::test_runner::TestCaseError;
use proptest::{prop_assert, prop_assert_eq};

use super::{CodecConfig, CodecConfigError, TokenError, TokenHeader, TokenRejection};

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

// ---------------------------------------------------------------------------------------
// Shared suite of the signed and the sealed codec.
//
// Both codecs have the same API, share the envelope (header, base64url parts) and the
// policy (size, audience, times), so every check that does not depend on the token's body
// is written once here, generic over [`TestCodec`], and called from both test modules.
// ---------------------------------------------------------------------------------------

pub(super) const NOW: u64 = 1_700_000_000;
pub(super) const SECRET_A: &[u8] = b"secret-A-0123456789abcdefghijklmnopqrstuvwxyz";
pub(super) const SECRET_B: &[u8] = b"secret-B-ZYXWVUTSRQPONMLKJIHGFEDCBA9876543210";
pub(super) const AUD: &str = "tenant-1/automation-7";
pub(super) const FIXED_NONCE: &str = "AAECAwQFBgcICQoLDA0ODw";
pub(super) const HOUR: u64 = 3600;
pub(super) const SKEW: u64 = 60;

/// The base64url alphabet plus the separator and characters a decoder must refuse.
pub(super) const MUTATION_CHARS: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_.= ";

pub(super) fn at(secs: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(secs)
}

pub(super) fn now() -> SystemTime {
    at(NOW)
}

pub(super) fn reason<T: fmt::Debug>(result: Result<T, TokenError>) -> TokenRejection {
    match result {
        Ok(value) => panic!("expected a rejection, got Ok({value:?})"),
        Err(err) => err.reason,
    }
}

/// A codec under test: the public API both codecs share, plus a way to build a token around
/// an arbitrary header, correctly authenticated (signed or sealed) with the current secret.
pub(super) trait TestCodec: Clone + fmt::Debug + Send + Sync + Sized + 'static {
    /// The header's `alg`.
    const ALGORITHM: &'static str;
    fn build(config: CodecConfig) -> Result<Self, CodecConfigError>;
    fn encode(&self, state: &[u8], audience: &str, now: SystemTime) -> String;
    fn decode(&self, token: &str, audience: &str, now: SystemTime) -> Result<Vec<u8>, TokenError>;
    fn decode_unscoped(&self, token: &str, now: SystemTime) -> Result<(TokenHeader, Vec<u8>), TokenError>;
    /// A token whose header part encodes `header` as is, authenticated with the current secret.
    fn raw_token(&self, header: &[u8], state: &[u8]) -> String;
    fn max_age(&self) -> Duration;
    fn clock_skew(&self) -> Duration;
    fn max_token_bytes(&self) -> usize;
}

/// Implements [`TestCodec`] for a codec type by forwarding to its inherent methods;
/// `$raw` is its private method that builds a token from raw header bytes and state.
macro_rules! impl_test_codec {
    ($codec:ty, $algorithm:expr, $raw:ident) => {
        impl $crate::codec::test_util::TestCodec for $codec {
            const ALGORITHM: &'static str = $algorithm;
            fn build(config: $crate::codec::CodecConfig) -> Result<Self, $crate::codec::CodecConfigError> {
                <$codec>::new(config)
            }
            fn encode(&self, state: &[u8], audience: &str, now: std::time::SystemTime) -> String {
                <$codec>::encode(self, state, audience, now)
            }
            fn decode(
                &self,
                token: &str,
                audience: &str,
                now: std::time::SystemTime,
            ) -> Result<Vec<u8>, $crate::codec::TokenError> {
                <$codec>::decode(self, token, audience, now)
            }
            fn decode_unscoped(
                &self,
                token: &str,
                now: std::time::SystemTime,
            ) -> Result<($crate::codec::TokenHeader, Vec<u8>), $crate::codec::TokenError> {
                <$codec>::decode_unscoped(self, token, now)
            }
            fn raw_token(&self, header: &[u8], state: &[u8]) -> String {
                self.$raw(header, state)
            }
            fn max_age(&self) -> std::time::Duration {
                <$codec>::max_age(self)
            }
            fn clock_skew(&self) -> std::time::Duration {
                <$codec>::clock_skew(self)
            }
            fn max_token_bytes(&self) -> usize {
                <$codec>::max_token_bytes(self)
            }
        }
    };
}
pub(super) use impl_test_codec;

/// Defines, in the calling test module, one `#[test]` per shared check above for `$codec`
/// (the test names are the historical ones; two of them name the codec).
macro_rules! shared_codec_tests {
    (
        $codec:ty,
        hand_built: $hand_built:ident,
        malformed_header: $malformed_header:ident,
        mutation_seed: $mutation_seed:expr,
        truncation_seed: $truncation_seed:expr $(,)?
    ) => {
        #[test]
        fn round_trip() {
            $crate::codec::test_util::check_round_trip::<$codec>();
        }
        #[test]
        fn round_trip_large_state() {
            $crate::codec::test_util::check_round_trip_large_state::<$codec>();
        }
        #[test]
        fn round_trip_awkward_audiences() {
            $crate::codec::test_util::check_round_trip_awkward_audiences::<$codec>();
        }
        #[test]
        fn rotation() {
            $crate::codec::test_util::check_rotation::<$codec>();
        }
        #[test]
        fn config_validation() {
            $crate::codec::test_util::check_config_validation::<$codec>();
        }
        #[test]
        fn config_defaults_and_setters() {
            $crate::codec::test_util::check_config_defaults_and_setters::<$codec>();
        }
        #[test]
        fn debug_output_hides_secrets() {
            $crate::codec::test_util::check_debug_output_hides_secrets::<$codec>();
        }
        #[test]
        fn too_large() {
            $crate::codec::test_util::check_too_large::<$codec>();
        }
        #[test]
        fn wrong_audience() {
            $crate::codec::test_util::check_wrong_audience::<$codec>();
        }
        #[test]
        fn expired() {
            $crate::codec::test_util::check_expired::<$codec>();
        }
        #[test]
        fn issued_in_future() {
            $crate::codec::test_util::check_issued_in_future::<$codec>();
        }
        #[test]
        fn too_old() {
            $crate::codec::test_util::check_too_old::<$codec>();
        }
        #[test]
        fn $hand_built() {
            $crate::codec::test_util::check_raw_canonical_header_is_accepted::<$codec>();
        }
        #[test]
        fn unsupported_format() {
            $crate::codec::test_util::check_unsupported_format::<$codec>();
        }
        #[test]
        fn non_canonical_header() {
            $crate::codec::test_util::check_non_canonical_header::<$codec>();
        }
        #[test]
        fn $malformed_header() {
            $crate::codec::test_util::check_malformed_header::<$codec>();
        }
        #[test]
        fn every_reason_is_reachable_and_distinct() {
            $crate::codec::test_util::check_every_reason_is_reachable_and_distinct::<$codec>();
        }
        #[test]
        fn every_single_char_mutation_of_a_small_token_is_rejected() {
            $crate::codec::test_util::check_every_single_char_mutation_of_a_small_token::<$codec>();
        }
        #[test]
        fn codec_is_send_sync_and_clone() {
            $crate::codec::test_util::check_codec_is_send_sync_and_clone::<$codec>();
        }
        #[test]
        fn random_single_char_mutations_are_rejected() {
            $crate::codec::test_util::check_random_single_char_mutations::<$codec>($mutation_seed);
        }
        #[test]
        fn random_truncations_and_extensions_are_rejected() {
            $crate::codec::test_util::check_random_truncations_and_extensions::<$codec>($truncation_seed);
        }
    };
}
pub(super) use shared_codec_tests;

/// A codec with `secret` as its only secret and default limits.
pub(super) fn codec<C: TestCodec>(secret: &[u8]) -> C {
    C::build(CodecConfig::new(secret)).expect("valid config")
}

/// A header in canonical form, like the encoder of `C` writes it (with a fixed nonce).
pub(super) fn header_json<C: TestCodec>(aud: &str, iat: u64, exp: u64) -> String {
    let alg = C::ALGORITHM;
    format!(
        r#"{{"alg":"{alg}","aud":"{aud}","exp":{exp},"fmt":"resumable-continuation","iat":{iat},"nonce":"{FIXED_NONCE}","v":1}}"#
    )
}

/// A token around the header text `header`, authenticated with `codec`'s current secret.
fn raw<C: TestCodec>(codec: &C, header: &str, state: &[u8]) -> String {
    codec.raw_token(header.as_bytes(), state)
}

pub(super) fn check_round_trip<C: TestCodec>() {
    let codec = codec::<C>(SECRET_A);
    for state in [Vec::new(), b"x".to_vec(), b"xy".to_vec(), b"xyz".to_vec(), (0..=255u8).collect::<Vec<u8>>()] {
        let token = codec.encode(&state, AUD, now());
        assert_eq!(codec.decode(&token, AUD, now()).unwrap(), state);
    }
}

pub(super) fn check_round_trip_large_state<C: TestCodec>() {
    let codec = codec::<C>(SECRET_A);
    let state = SplitMix64(42).bytes(1024 * 1024 + 7);
    let token = codec.encode(&state, AUD, now());
    assert_eq!(token.len(), token.capacity(), "encode preallocates exactly");
    assert_eq!(codec.decode(&token, AUD, now()).unwrap(), state);
}

pub(super) fn check_round_trip_awkward_audiences<C: TestCodec>() {
    let codec = codec::<C>(SECRET_A);
    for aud in [
        "",
        "quote\"back\\slash/solidus",
        "ctl\u{0}\u{1}\u{8}\u{c}\n\r\t\u{1f}\u{7f}",
        "é ünïcödé ✓ 𝄞",
        "\u{2028}\u{2029}",
    ] {
        let token = codec.encode(b"state", aud, now());
        assert_eq!(codec.decode(&token, aud, now()).unwrap(), b"state");
        let (header, _) = codec.decode_unscoped(&token, now()).unwrap();
        assert_eq!(header.audience, aud);
    }
}

/// 64 tokens of the same state have 64 distinct nonces; returns the tokens.
pub(super) fn check_nonces_are_fresh<C: TestCodec>() -> (C, Vec<String>) {
    let codec = codec::<C>(SECRET_A);
    let tokens: Vec<String> = (0..64).map(|_| codec.encode(b"same state", AUD, now())).collect();
    let nonces: HashSet<String> =
        tokens.iter().map(|token| codec.decode_unscoped(token, now()).unwrap().0.nonce).collect();
    assert_eq!(nonces.len(), 64);
    for token in &tokens {
        assert_eq!(codec.decode(token, AUD, now()).unwrap(), b"same state");
    }
    (codec, tokens)
}

pub(super) fn check_rotation<C: TestCodec>() {
    let old = codec::<C>(SECRET_A);
    let rotated = C::build(CodecConfig::new(SECRET_B).previous_secret(SECRET_A)).expect("valid config");
    let from_old = old.encode(b"state", AUD, now());
    assert_eq!(rotated.decode(&from_old, AUD, now()).unwrap(), b"state");
    // The rotated codec issues tokens with B, which the old codec does not know.
    let from_rotated = rotated.encode(b"state", AUD, now());
    assert_eq!(rotated.decode(&from_rotated, AUD, now()).unwrap(), b"state");
    assert_eq!(reason(old.decode(&from_rotated, AUD, now())), TokenRejection::BadSignature);
    // Rolling back (A current, B previous) still accepts tokens issued with B.
    let rolled_back = C::build(CodecConfig::new(SECRET_A).previous_secret(SECRET_B)).unwrap();
    assert_eq!(rolled_back.decode(&from_rotated, AUD, now()).unwrap(), b"state");
    assert_eq!(rolled_back.decode(&from_old, AUD, now()).unwrap(), b"state");
    // A codec that dropped A no longer accepts A's tokens.
    let b_only = codec::<C>(SECRET_B);
    assert_eq!(reason(b_only.decode(&from_old, AUD, now())), TokenRejection::BadSignature);
    // Several previous secrets: each is tried, and a large state survives the retries
    // (a failed attempt may wipe the decoding buffer).
    let third = [3u8; 32];
    let multi = C::build(CodecConfig::new(third).previous_secret(SECRET_B).previous_secret(SECRET_A)).unwrap();
    assert_eq!(multi.decode(&from_old, AUD, now()).unwrap(), b"state");
    assert_eq!(multi.decode(&from_rotated, AUD, now()).unwrap(), b"state");
    let big = SplitMix64(9).bytes(300_000);
    let big_token = old.encode(&big, AUD, now());
    assert_eq!(multi.decode(&big_token, AUD, now()).unwrap(), big);
    let (header, state) = multi.decode_unscoped(&big_token, now()).unwrap();
    assert_eq!((header.audience.as_str(), state), (AUD, big));
}

pub(super) fn check_config_validation<C: TestCodec>() {
    let err = C::build(CodecConfig::new(vec![1u8; 31])).unwrap_err();
    assert_eq!(err.to_string(), "continuation secret must be at least 32 bytes (got 31)");
    let err = C::build(CodecConfig::new(b"short".to_vec())).unwrap_err();
    assert_eq!(err, CodecConfigError("continuation secret must be at least 32 bytes (got 5)".into()));
    let err =
        C::build(CodecConfig::new(SECRET_A).previous_secret(SECRET_B).previous_secret(vec![1u8; 31])).unwrap_err();
    assert_eq!(err.to_string(), "previous continuation secret #2 must be at least 32 bytes (got 31)");
    let err = C::build(CodecConfig::new(SECRET_A).max_token_bytes(0)).unwrap_err();
    assert!(err.to_string().contains("max_token_bytes"), "{err}");
    let err = C::build(CodecConfig::new(SECRET_A).max_age(Duration::from_millis(999))).unwrap_err();
    assert!(err.to_string().contains("max_age"), "{err}");

    assert!(C::build(CodecConfig::new(vec![1u8; 32])).is_ok());
    assert!(C::build(CodecConfig::new(vec![1u8; 32]).previous_secret(vec![2u8; 32])).is_ok());
    assert!(C::build(CodecConfig::new(SECRET_A).max_token_bytes(1)).is_ok());
}

pub(super) fn check_config_defaults_and_setters<C: TestCodec>() {
    let config = CodecConfig::new(SECRET_A);
    assert_eq!(config.max_age, Duration::from_secs(3600));
    assert_eq!(config.clock_skew, Duration::from_secs(60));
    assert_eq!(config.max_token_bytes, 48 * 1024 * 1024);
    assert!(config.previous_secrets.is_empty());
    let config = config
        .max_age(Duration::from_secs(5))
        .clock_skew(Duration::from_secs(1))
        .max_token_bytes(10)
        .previous_secret(SECRET_B);
    let codec = C::build(config).unwrap();
    assert_eq!(codec.max_age(), Duration::from_secs(5));
    assert_eq!(codec.clock_skew(), Duration::from_secs(1));
    assert_eq!(codec.max_token_bytes(), 10);
}

pub(super) fn check_debug_output_hides_secrets<C: TestCodec>() {
    let codec = C::build(CodecConfig::new(SECRET_A).previous_secret(SECRET_B)).unwrap();
    let config = CodecConfig::new(SECRET_A).previous_secret(SECRET_B);
    let debugs = [format!("{codec:?}"), format!("{codec:#?}"), format!("{config:?}"), format!("{config:#?}")];
    assert!(debugs[0].contains(C::ALGORITHM) && debugs[0].contains("previous_secrets: 1"), "{}", debugs[0]);
    for debug in debugs {
        for secret in [SECRET_A, SECRET_B] {
            let text = std::str::from_utf8(secret).unwrap();
            assert!(!debug.contains(text), "{debug}");
            assert!(!debug.contains("secret-A"), "{debug}");
            assert!(!debug.contains("secret-B"), "{debug}");
            let as_list = format!("{:?}", &secret[..4]);
            assert!(!debug.contains(&as_list[1..as_list.len() - 1]), "{debug}");
            let hex: String = secret[..4].iter().map(|b| format!("{b:02x}")).collect();
            assert!(!debug.contains(&hex), "{debug}");
        }
    }
}

pub(super) fn check_too_large<C: TestCodec>() {
    let probe = codec::<C>(SECRET_A).encode(b"state", AUD, now());
    let exact = C::build(CodecConfig::new(SECRET_A).max_token_bytes(probe.len())).unwrap();
    let token = exact.encode(b"state", AUD, now());
    assert_eq!(token.len(), probe.len());
    assert_eq!(exact.decode(&token, AUD, now()).unwrap(), b"state");
    let bigger = exact.encode(b"state!", AUD, now());
    assert_eq!(reason(exact.decode(&bigger, AUD, now())), TokenRejection::TooLarge);
    // The size check comes before anything else, even for garbage.
    let tiny = C::build(CodecConfig::new(SECRET_A).max_token_bytes(3)).unwrap();
    assert_eq!(reason(tiny.decode("garbage", AUD, now())), TokenRejection::TooLarge);
    assert_eq!(reason(tiny.decode_unscoped("garbage", now())), TokenRejection::TooLarge);
}

pub(super) fn check_wrong_audience<C: TestCodec>() {
    let codec = codec::<C>(SECRET_A);
    let token = codec.encode(b"state", AUD, now());
    for other in ["", "tenant-1/automation-8", "tenant-1/automation-7 ", "TENANT-1/automation-7"] {
        assert_eq!(reason(codec.decode(&token, other, now())), TokenRejection::WrongAudience);
    }
    // decode_unscoped does not need it.
    assert!(codec.decode_unscoped(&token, now()).is_ok());
}

pub(super) fn check_expired<C: TestCodec>() {
    let codec = codec::<C>(SECRET_A);
    let token = codec.encode(b"state", AUD, now());
    // Valid up to and including exp + skew.
    assert!(codec.decode(&token, AUD, at(NOW + HOUR + SKEW)).is_ok());
    assert_eq!(reason(codec.decode(&token, AUD, at(NOW + HOUR + SKEW + 1))), TokenRejection::Expired);
    assert_eq!(reason(codec.decode_unscoped(&token, at(NOW + 10 * HOUR))), TokenRejection::Expired);
}

pub(super) fn check_issued_in_future<C: TestCodec>() {
    let codec = codec::<C>(SECRET_A);
    let token = codec.encode(b"state", AUD, at(NOW + SKEW));
    assert!(codec.decode(&token, AUD, now()).is_ok());
    let token = codec.encode(b"state", AUD, at(NOW + SKEW + 1));
    assert_eq!(reason(codec.decode(&token, AUD, now())), TokenRejection::IssuedInFuture);
    // Before the epoch counts as 0.
    assert_eq!(reason(codec.decode(&token, AUD, UNIX_EPOCH - Duration::from_secs(5))), TokenRejection::IssuedInFuture);
}

pub(super) fn check_too_old<C: TestCodec>() {
    let issuer = codec::<C>(SECRET_A);
    let strict = C::build(CodecConfig::new(SECRET_A).max_age(Duration::from_secs(10 * 60))).unwrap();
    let token = issuer.encode(b"state", AUD, now());
    assert!(strict.decode(&token, AUD, at(NOW + 600 + SKEW)).is_ok());
    assert_eq!(reason(strict.decode(&token, AUD, at(NOW + 600 + SKEW + 1))), TokenRejection::TooOld);
    assert_eq!(reason(strict.decode_unscoped(&token, at(NOW + 20 * 60))), TokenRejection::TooOld);
    // A forged-looking far-future exp (validly authenticated) does not extend the lifetime.
    let header = header_json::<C>(AUD, NOW, u64::MAX);
    let long_lived = raw(&issuer, &header, b"state");
    assert!(issuer.decode(&long_lived, AUD, at(NOW + HOUR)).is_ok());
    assert_eq!(reason(issuer.decode(&long_lived, AUD, at(NOW + HOUR + SKEW + 1))), TokenRejection::TooOld);
}

/// A hand-built token with the canonical header is accepted like an encoded one.
pub(super) fn check_raw_canonical_header_is_accepted<C: TestCodec>() {
    let codec = codec::<C>(SECRET_A);
    let token = raw(&codec, &header_json::<C>(AUD, NOW, NOW + HOUR), b"state");
    assert_eq!(codec.decode(&token, AUD, now()).unwrap(), b"state");
    let (header, _) = codec.decode_unscoped(&token, now()).unwrap();
    assert_eq!(
        header,
        TokenHeader { issued_at: NOW, expires_at: NOW + HOUR, audience: AUD.to_owned(), nonce: FIXED_NONCE.to_owned() }
    );
}

/// Every `header` is authenticated correctly but rejected for `expected`.
fn assert_headers_rejected<C: TestCodec>(codec: &C, headers: &[String], expected: TokenRejection) {
    for header in headers {
        let token = raw(codec, header, b"state");
        assert_eq!(reason(codec.decode(&token, AUD, now())), expected, "{header}");
    }
}

pub(super) fn check_unsupported_format<C: TestCodec>() {
    let codec = codec::<C>(SECRET_A);
    let canonical = header_json::<C>(AUD, NOW, NOW + HOUR);
    let alg = format!(r#""alg":"{}""#, C::ALGORITHM);
    let mut cases = vec![
        canonical.replace("resumable-continuation", "resumable-continuation2"),
        canonical.replace("resumable-continuation", "other-format"),
        canonical.replace(r#""v":1"#, r#""v":2"#),
        canonical.replace(r#""v":1"#, r#""v":0"#),
        canonical.replace(r#""v":1"#, r#""v":"1""#),
        canonical.replace(r#""v":1"#, r#""v":1.0"#),
        // The algorithm in another case.
        canonical.replace(&alg, &alg.to_lowercase()),
        // Extra field.
        canonical.replace(r#","v":1}"#, r#","v":1,"x":0}"#),
        canonical.replace(r#"{"alg""#, r#"{"aaa":null,"alg""#),
        // Missing identification fields.
        canonical.replace(r#""fmt":"resumable-continuation","#, ""),
        canonical.replace(r#","v":1"#, ""),
        canonical.replace(&format!("{alg},"), ""),
    ];
    // Any other algorithm, the other codec's included.
    for other in ["none", "HS256", "HS512", "A256GCM", "C20P"].into_iter().filter(|&other| other != C::ALGORITHM) {
        cases.push(canonical.replace(&alg, &format!(r#""alg":"{other}""#)));
    }
    assert!(cases.iter().all(|case| *case != canonical));
    assert_headers_rejected(&codec, &cases, TokenRejection::UnsupportedFormat);
}

pub(super) fn check_non_canonical_header<C: TestCodec>() {
    let codec = codec::<C>(SECRET_A);
    let exp = NOW + HOUR;
    let canonical = header_json::<C>(AUD, NOW, exp);
    let alg = C::ALGORITHM;
    let reordered = format!(
        r#"{{"aud":"{AUD}","alg":"{alg}","exp":{exp},"fmt":"resumable-continuation","iat":{NOW},"nonce":"{FIXED_NONCE}","v":1}}"#
    );
    let cases = [
        reordered,
        canonical.replace(',', ", "),
        canonical.replace(':', " : "),
        format!(" {canonical}"),
        format!("{canonical}\n"),
        canonical.replace("tenant-1", "tenant\\u002d1"),
        canonical.replace("tenant-1", "tenant\\-1").replace("\\-", "\\u002D"),
        canonical.replace('/', r"\/"),
        // Duplicate key (the last value wins in the parser, so re-serialization differs).
        canonical.replace(r#""aud":"#, r#""aud":"tenant-2/automation-7","aud":"#),
    ];
    assert_headers_rejected(&codec, &cases, TokenRejection::NonCanonical);
}

pub(super) fn check_malformed_header<C: TestCodec>() {
    let codec = codec::<C>(SECRET_A);
    let exp = NOW + HOUR;
    let canonical = header_json::<C>(AUD, NOW, exp);
    let cases = [
        String::new(),
        "null".into(),
        "[]".into(),
        "\"header\"".into(),
        "{".into(),
        format!("{canonical}}}"),
        format!("{canonical}x"),
        "\u{fffd}".into(),
        // Missing fields.
        canonical.replace(&format!(r#""aud":"{AUD}","#), ""),
        canonical.replace(&format!(r#","exp":{exp}"#), ""),
        canonical.replace(&format!(r#","iat":{NOW}"#), ""),
        canonical.replace(&format!(r#","nonce":"{FIXED_NONCE}""#), ""),
        // Wrong types / out of range.
        canonical.replace(&format!(r#""aud":"{AUD}""#), r#""aud":7"#),
        canonical.replace(&format!(r#""exp":{exp}"#), &format!(r#""exp":"{exp}""#)),
        canonical.replace(&format!(r#""exp":{exp}"#), r#""exp":-1"#),
        canonical.replace(&format!(r#""exp":{exp}"#), r#""exp":1.5"#),
        canonical.replace(&format!(r#""exp":{exp}"#), r#""exp":18446744073709551616"#),
        canonical.replace(&format!(r#""iat":{NOW}"#), r#""iat":null"#),
        // Bad nonces.
        canonical.replace(FIXED_NONCE, "short"),
        canonical.replace(FIXED_NONCE, "AAECAwQFBgcICQoLDA0ODx"),
        canonical.replace(FIXED_NONCE, "AAECAwQFBgcICQoLDA0OD+"),
        canonical.replace(FIXED_NONCE, "AAECAwQFBgcICQoLDA0ODwA"),
        // exp before iat.
        header_json::<C>(AUD, NOW, NOW - 1),
    ];
    assert_headers_rejected(&codec, &cases, TokenRejection::Malformed);
    // Non-UTF-8 header bytes.
    let token = codec.raw_token(&[0xff, 0xfe, b'{', b'}'], b"state");
    assert_eq!(reason(codec.decode(&token, AUD, now())), TokenRejection::Malformed);
}

pub(super) fn check_every_reason_is_reachable_and_distinct<C: TestCodec>() {
    let issuer = codec::<C>(SECRET_A);
    let strict = C::build(CodecConfig::new(SECRET_A).max_age(Duration::from_secs(600)).max_token_bytes(4096)).unwrap();
    let token = issuer.encode(b"state", AUD, now());
    let canonical = header_json::<C>(AUD, NOW, NOW + HOUR);
    let reasons = [
        reason(strict.decode(&"A".repeat(4097), AUD, now())),
        reason(strict.decode("a.b", AUD, now())),
        reason(codec::<C>(SECRET_B).decode(&token, AUD, now())),
        reason(strict.decode(&raw(&issuer, &canonical.replace(r#""v":1"#, r#""v":2"#), b""), AUD, now())),
        reason(strict.decode(&raw(&issuer, &canonical.replace(',', ", "), b""), AUD, now())),
        reason(strict.decode(&token, "someone-else", now())),
        reason(issuer.decode(&token, AUD, at(NOW + HOUR + SKEW + 1))),
        reason(strict.decode(&token, AUD, at(NOW - SKEW - 1))),
        reason(strict.decode(&token, AUD, at(NOW + 600 + SKEW + 1))),
    ];
    assert_eq!(reasons, TokenRejection::ALL);
    let distinct: HashSet<TokenRejection> = reasons.into_iter().collect();
    assert_eq!(distinct.len(), 9);
    // Too few and too many parts are both malformed, whichever the codec's part count.
    assert_eq!(reason(strict.decode("a.b.c", AUD, now())), TokenRejection::Malformed);
}

/// 1000 random single-character substitutions of a token of a 97-byte state (drawn from
/// `seed`) are all rejected, for the same reason with and without an audience.
pub(super) fn check_random_single_char_mutations<C: TestCodec>(seed: u64) {
    let codec = codec::<C>(SECRET_A);
    let mut rng = SplitMix64(seed);
    let state = rng.bytes(97);
    let token = codec.encode(&state, AUD, now());
    assert!(token.is_ascii());
    let original = token.as_bytes();
    for _ in 0..1000 {
        let pos = rng.below(original.len());
        let replacement = loop {
            let c = MUTATION_CHARS[rng.below(MUTATION_CHARS.len())];
            if c != original[pos] {
                break c;
            }
        };
        let mut mutated = original.to_vec();
        mutated[pos] = replacement;
        let mutated = String::from_utf8(mutated).unwrap();
        let scoped = reason(codec.decode(&mutated, AUD, now()));
        let unscoped = reason(codec.decode_unscoped(&mutated, now()));
        assert_eq!(scoped, unscoped, "{mutated}");
        assert!(matches!(scoped, TokenRejection::Malformed | TokenRejection::BadSignature), "{scoped:?} for {mutated}");
    }
    // The original still decodes.
    assert_eq!(codec.decode(&token, AUD, now()).unwrap(), state);
}

pub(super) fn check_every_single_char_mutation_of_a_small_token<C: TestCodec>() {
    let codec = codec::<C>(SECRET_A);
    let token = codec.encode(b"tiny", "a", now());
    let original = token.as_bytes();
    for pos in 0..original.len() {
        for &c in MUTATION_CHARS.iter().filter(|&&c| c != original[pos]) {
            let mut mutated = original.to_vec();
            mutated[pos] = c;
            let mutated = String::from_utf8(mutated).unwrap();
            assert!(codec.decode(&mutated, "a", now()).is_err(), "{mutated}");
        }
    }
}

/// 1000 random truncations, extensions and insertions (drawn from `seed`) of a token of a
/// 64-byte state are all rejected.
pub(super) fn check_random_truncations_and_extensions<C: TestCodec>(seed: u64) {
    let codec = codec::<C>(SECRET_A);
    let mut rng = SplitMix64(seed);
    let state = rng.bytes(64);
    let token = codec.encode(&state, AUD, now());
    for i in 0..1000 {
        let mutated = match i % 3 {
            // Truncate to a random shorter length (possibly empty).
            0 => token[..rng.below(token.len())].to_owned(),
            // Append 1..=8 random characters.
            1 => {
                let mut extended = token.clone();
                for _ in 0..=rng.below(8) {
                    extended.push(char::from(MUTATION_CHARS[rng.below(MUTATION_CHARS.len())]));
                }
                extended
            }
            // Insert 1..=4 random characters at a random position.
            _ => {
                let mut extended = token.clone();
                let pos = rng.below(token.len() + 1);
                for _ in 0..=rng.below(4) {
                    extended.insert(pos, char::from(MUTATION_CHARS[rng.below(MUTATION_CHARS.len())]));
                }
                extended
            }
        };
        let rejection = reason(codec.decode(&mutated, AUD, now()));
        assert!(
            matches!(rejection, TokenRejection::Malformed | TokenRejection::BadSignature),
            "{rejection:?} for {mutated}"
        );
    }
}

pub(super) fn check_codec_is_send_sync_and_clone<C: TestCodec>() {
    fn assert_traits<T: Send + Sync + Clone + fmt::Debug + 'static>() {}
    assert_traits::<C>();
    assert_traits::<CodecConfig>();
    assert_traits::<TokenError>();
    let codec = codec::<C>(SECRET_A);
    let token = codec.encode(b"state", AUD, now());
    let clone = codec.clone();
    assert_eq!(clone.decode(&token, AUD, now()).unwrap(), b"state");
    assert_eq!(codec.decode(&clone.encode(b"state", AUD, now()), AUD, now()).unwrap(), b"state");
}

/// Property: a token decodes to its state at any time within its lifetime.
pub(super) fn prop_round_trip<C: TestCodec>(state: &[u8], aud: &str, offset: u64) -> Result<(), TestCaseError> {
    let codec = codec::<C>(SECRET_A);
    let token = codec.encode(state, aud, now());
    prop_assert_eq!(codec.decode(&token, aud, at(NOW + offset)).unwrap(), state);
    Ok(())
}

/// Property: arbitrary text is rejected, scoped or not, without a panic.
pub(super) fn prop_garbage_is_rejected<C: TestCodec>(token: &str, aud: &str) -> Result<(), TestCaseError> {
    let codec = codec::<C>(SECRET_A);
    prop_assert!(codec.decode(token, aud, now()).is_err());
    prop_assert!(codec.decode_unscoped(token, now()).is_err());
    Ok(())
}

/// Property: `.`-joined garbage parts are rejected by `codec` without a panic.
pub(super) fn prop_dotted_garbage_is_rejected<C: TestCodec>(codec: &C, parts: &[String]) -> Result<(), TestCaseError> {
    let token = parts.join(".");
    prop_assert!(codec.decode(&token, AUD, now()).is_err());
    Ok(())
}
