use std::collections::HashSet;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;

use super::*;

const NOW: u64 = 1_700_000_000;
const SECRET_A: &[u8] = b"secret-A-0123456789abcdefghijklmnopqrstuvwxyz";
const SECRET_B: &[u8] = b"secret-B-ZYXWVUTSRQPONMLKJIHGFEDCBA9876543210";
const AUD: &str = "tenant-1/automation-7";
const FIXED_NONCE: &str = "AAECAwQFBgcICQoLDA0ODw";
const HOUR: u64 = 3600;
const SKEW: u64 = 60;

fn at(secs: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(secs)
}

fn now() -> SystemTime {
    at(NOW)
}

fn codec(secret: &[u8]) -> SignedCodec {
    SignedCodec::new(SignedCodecConfig::new(secret)).expect("valid config")
}

fn reason<T: fmt::Debug>(result: Result<T, TokenError>) -> TokenRejection {
    match result {
        Ok(value) => panic!("expected a rejection, got Ok({value:?})"),
        Err(err) => err.reason,
    }
}

/// Signs an arbitrary header text with the codec's current secret.
fn sign_raw(codec: &SignedCodec, header: &str, state: &[u8]) -> String {
    codec.sign_parts(header.as_bytes(), state)
}

/// A header in canonical form, like the encoder writes it (with a fixed nonce).
fn header_json(aud: &str, iat: u64, exp: u64) -> String {
    format!(
        r#"{{"alg":"HS256","aud":"{aud}","exp":{exp},"fmt":"resumable-continuation","iat":{iat},"nonce":"{FIXED_NONCE}","v":1}}"#
    )
}

/// Small deterministic PRNG (SplitMix64).
struct SplitMix64(u64);

impl SplitMix64 {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, bound: usize) -> usize {
        (self.next_u64() % bound as u64) as usize
    }

    fn bytes(&mut self, len: usize) -> Vec<u8> {
        (0..len).map(|_| self.next_u64() as u8).collect()
    }
}

/// The base64url alphabet plus the separator and characters a decoder must refuse.
const MUTATION_CHARS: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_.= ";

#[test]
fn round_trip() {
    let codec = codec(SECRET_A);
    for state in [Vec::new(), b"x".to_vec(), b"xy".to_vec(), b"xyz".to_vec(), (0..=255u8).collect::<Vec<u8>>()] {
        let token = codec.encode(&state, AUD, now());
        assert_eq!(codec.decode(&token, AUD, now()).unwrap(), state);
    }
}

#[test]
fn round_trip_large_state() {
    let codec = codec(SECRET_A);
    let state = SplitMix64(42).bytes(1024 * 1024 + 7);
    let token = codec.encode(&state, AUD, now());
    assert_eq!(token.len(), token.capacity(), "encode preallocates exactly");
    assert_eq!(codec.decode(&token, AUD, now()).unwrap(), state);
}

#[test]
fn round_trip_awkward_audiences() {
    let codec = codec(SECRET_A);
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

#[test]
fn canonical_header_matches_serde_json() {
    #[derive(serde::Serialize)]
    struct Repr<'a> {
        alg: &'a str,
        aud: &'a str,
        exp: u64,
        fmt: &'a str,
        iat: u64,
        nonce: &'a str,
        v: u64,
    }
    let mut all_chars: String = (0u32..0x300).filter_map(char::from_u32).collect();
    all_chars.push_str("\u{2028}𝄞\u{fffd}");
    for aud in ["", AUD, "a\"b\\c", all_chars.as_str()] {
        let ours = canonical_header(aud, u64::MAX, 0, FIXED_NONCE);
        let theirs = serde_json::to_string(&Repr {
            alg: "HS256",
            aud,
            exp: u64::MAX,
            fmt: TOKEN_FORMAT,
            iat: 0,
            nonce: FIXED_NONCE,
            v: 1,
        })
        .unwrap();
        assert_eq!(ours, theirs);
    }
}

#[test]
fn token_shape() {
    let codec = codec(SECRET_A);
    let token = codec.encode(b"hello", AUD, now());
    let parts: Vec<&str> = token.split('.').collect();
    assert_eq!(parts.len(), 3);
    assert!(token.bytes().all(|b| b == b'.' || super::is_base64url_byte(b)));
    assert_eq!(parts[2].len(), MAC_CHARS);
    assert_eq!(URL_SAFE_NO_PAD.decode(parts[1]).unwrap(), b"hello");
    let header = String::from_utf8(URL_SAFE_NO_PAD.decode(parts[0]).unwrap()).unwrap();
    let (decoded, _) = codec.decode_unscoped(&token, now()).unwrap();
    assert_eq!(decoded.issued_at, NOW);
    assert_eq!(decoded.expires_at, NOW + HOUR);
    assert_eq!(decoded.audience, AUD);
    assert_eq!(decoded.nonce.len(), 22);
    assert_eq!(
        header,
        format!(
            r#"{{"alg":"HS256","aud":"{AUD}","exp":{},"fmt":"resumable-continuation","iat":{NOW},"nonce":"{}","v":1}}"#,
            NOW + HOUR,
            decoded.nonce
        )
    );
    // The MAC is HMAC-SHA256 over the ASCII of `header.state`.
    let mut mac = HmacSha256::new_from_slice(SECRET_A).unwrap();
    mac.update(format!("{}.{}", parts[0], parts[1]).as_bytes());
    assert_eq!(URL_SAFE_NO_PAD.encode(mac.finalize().into_bytes().as_slice()), parts[2]);
}

#[test]
fn nonces_are_fresh() {
    let codec = codec(SECRET_A);
    let nonces: HashSet<String> = (0..64)
        .map(|_| {
            let token = codec.encode(b"same", AUD, now());
            codec.decode_unscoped(&token, now()).unwrap().0.nonce
        })
        .collect();
    assert_eq!(nonces.len(), 64);
}

#[test]
fn rotation() {
    let old = codec(SECRET_A);
    let rotated = SignedCodec::new(SignedCodecConfig::new(SECRET_B).previous_secret(SECRET_A)).expect("valid config");
    let from_old = old.encode(b"state", AUD, now());
    assert_eq!(rotated.decode(&from_old, AUD, now()).unwrap(), b"state");
    // The rotated codec signs with B, which the old codec does not know.
    let from_rotated = rotated.encode(b"state", AUD, now());
    assert_eq!(rotated.decode(&from_rotated, AUD, now()).unwrap(), b"state");
    assert_eq!(reason(old.decode(&from_rotated, AUD, now())), TokenRejection::BadSignature);
    // A codec that dropped A no longer accepts A's tokens.
    let b_only = codec(SECRET_B);
    assert_eq!(reason(b_only.decode(&from_old, AUD, now())), TokenRejection::BadSignature);
    // Several previous secrets: each is tried.
    let third = [3u8; 32];
    let multi =
        SignedCodec::new(SignedCodecConfig::new(third).previous_secret(SECRET_B).previous_secret(SECRET_A)).unwrap();
    assert_eq!(multi.decode(&from_old, AUD, now()).unwrap(), b"state");
    assert_eq!(multi.decode(&from_rotated, AUD, now()).unwrap(), b"state");
}

#[test]
fn config_validation() {
    let err = SignedCodec::new(SignedCodecConfig::new(vec![1u8; 31])).unwrap_err();
    assert_eq!(err.to_string(), "continuation secret must be at least 32 bytes (got 31)");
    let err = SignedCodec::new(SignedCodecConfig::new(b"short".to_vec())).unwrap_err();
    assert_eq!(err, CodecConfigError("continuation secret must be at least 32 bytes (got 5)".into()));
    let err =
        SignedCodec::new(SignedCodecConfig::new(SECRET_A).previous_secret(SECRET_B).previous_secret(vec![1u8; 31]))
            .unwrap_err();
    assert_eq!(err.to_string(), "previous continuation secret #2 must be at least 32 bytes (got 31)");
    let err = SignedCodec::new(SignedCodecConfig::new(SECRET_A).max_token_bytes(0)).unwrap_err();
    assert!(err.to_string().contains("max_token_bytes"), "{err}");
    let err = SignedCodec::new(SignedCodecConfig::new(SECRET_A).max_age(Duration::from_millis(999))).unwrap_err();
    assert!(err.to_string().contains("max_age"), "{err}");

    assert!(SignedCodec::new(SignedCodecConfig::new(vec![1u8; 32])).is_ok());
    assert!(SignedCodec::new(SignedCodecConfig::new(vec![1u8; 32]).previous_secret(vec![2u8; 32])).is_ok());
    assert!(SignedCodec::new(SignedCodecConfig::new(SECRET_A).max_token_bytes(1)).is_ok());
}

#[test]
fn config_defaults_and_setters() {
    let config = SignedCodecConfig::new(SECRET_A);
    assert_eq!(config.max_age, Duration::from_secs(3600));
    assert_eq!(config.clock_skew, Duration::from_secs(60));
    assert_eq!(config.max_token_bytes, 48 * 1024 * 1024);
    assert!(config.previous_secrets.is_empty());
    let config = config
        .max_age(Duration::from_secs(5))
        .clock_skew(Duration::from_secs(1))
        .max_token_bytes(10)
        .previous_secret(SECRET_B);
    let codec = SignedCodec::new(config).unwrap();
    assert_eq!(codec.max_age(), Duration::from_secs(5));
    assert_eq!(codec.clock_skew(), Duration::from_secs(1));
    assert_eq!(codec.max_token_bytes(), 10);
}

#[test]
fn debug_output_hides_secrets() {
    let codec = SignedCodec::new(SignedCodecConfig::new(SECRET_A).previous_secret(SECRET_B)).unwrap();
    let config = SignedCodecConfig::new(SECRET_A).previous_secret(SECRET_B);
    for debug in [format!("{codec:?}"), format!("{codec:#?}"), format!("{config:?}"), format!("{config:#?}")] {
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

#[test]
fn too_large() {
    let probe = codec(SECRET_A).encode(b"state", AUD, now());
    let exact = SignedCodec::new(SignedCodecConfig::new(SECRET_A).max_token_bytes(probe.len())).unwrap();
    let token = exact.encode(b"state", AUD, now());
    assert_eq!(token.len(), probe.len());
    assert_eq!(exact.decode(&token, AUD, now()).unwrap(), b"state");
    let bigger = exact.encode(b"state!", AUD, now());
    assert_eq!(reason(exact.decode(&bigger, AUD, now())), TokenRejection::TooLarge);
    // The size check comes before anything else, even for garbage.
    let tiny = SignedCodec::new(SignedCodecConfig::new(SECRET_A).max_token_bytes(3)).unwrap();
    assert_eq!(reason(tiny.decode("garbage", AUD, now())), TokenRejection::TooLarge);
    assert_eq!(reason(tiny.decode_unscoped("garbage", now())), TokenRejection::TooLarge);
}

#[test]
fn wrong_audience() {
    let codec = codec(SECRET_A);
    let token = codec.encode(b"state", AUD, now());
    for other in ["", "tenant-1/automation-8", "tenant-1/automation-7 ", "TENANT-1/automation-7"] {
        assert_eq!(reason(codec.decode(&token, other, now())), TokenRejection::WrongAudience);
    }
    // decode_unscoped does not need it.
    assert!(codec.decode_unscoped(&token, now()).is_ok());
}

#[test]
fn expired() {
    let codec = codec(SECRET_A);
    let token = codec.encode(b"state", AUD, now());
    // Valid up to and including exp + skew.
    assert!(codec.decode(&token, AUD, at(NOW + HOUR + SKEW)).is_ok());
    assert_eq!(reason(codec.decode(&token, AUD, at(NOW + HOUR + SKEW + 1))), TokenRejection::Expired);
    assert_eq!(reason(codec.decode_unscoped(&token, at(NOW + 10 * HOUR))), TokenRejection::Expired);
}

#[test]
fn issued_in_future() {
    let codec = codec(SECRET_A);
    let token = codec.encode(b"state", AUD, at(NOW + SKEW));
    assert!(codec.decode(&token, AUD, now()).is_ok());
    let token = codec.encode(b"state", AUD, at(NOW + SKEW + 1));
    assert_eq!(reason(codec.decode(&token, AUD, now())), TokenRejection::IssuedInFuture);
    // Before the epoch counts as 0.
    assert_eq!(reason(codec.decode(&token, AUD, UNIX_EPOCH - Duration::from_secs(5))), TokenRejection::IssuedInFuture);
}

#[test]
fn too_old() {
    let issuer = codec(SECRET_A);
    let strict = SignedCodec::new(SignedCodecConfig::new(SECRET_A).max_age(Duration::from_secs(10 * 60))).unwrap();
    let token = issuer.encode(b"state", AUD, now());
    assert!(strict.decode(&token, AUD, at(NOW + 600 + SKEW)).is_ok());
    assert_eq!(reason(strict.decode(&token, AUD, at(NOW + 600 + SKEW + 1))), TokenRejection::TooOld);
    assert_eq!(reason(strict.decode_unscoped(&token, at(NOW + 20 * 60))), TokenRejection::TooOld);
    // A forged-looking far-future exp (validly signed) does not extend the lifetime.
    let header = header_json(AUD, NOW, u64::MAX);
    let long_lived = sign_raw(&issuer, &header, b"state");
    assert!(issuer.decode(&long_lived, AUD, at(NOW + HOUR)).is_ok());
    assert_eq!(reason(issuer.decode(&long_lived, AUD, at(NOW + HOUR + SKEW + 1))), TokenRejection::TooOld);
}

#[test]
fn hand_signed_canonical_header_is_accepted() {
    let codec = codec(SECRET_A);
    let token = sign_raw(&codec, &header_json(AUD, NOW, NOW + HOUR), b"state");
    assert_eq!(codec.decode(&token, AUD, now()).unwrap(), b"state");
    let (header, _) = codec.decode_unscoped(&token, now()).unwrap();
    assert_eq!(
        header,
        TokenHeader { issued_at: NOW, expires_at: NOW + HOUR, audience: AUD.to_owned(), nonce: FIXED_NONCE.to_owned() }
    );
}

#[test]
fn malformed_shapes() {
    let codec = codec(SECRET_A);
    let token = codec.encode(b"state", AUD, now());
    let parts: Vec<&str> = token.split('.').collect();
    let (h, s, m) = (parts[0], parts[1], parts[2]);
    let cases = [
        String::new(),
        ".".into(),
        "..".into(),
        "...".into(),
        format!("{h}.{s}"),
        format!("{h}.{s}.{m}."),
        format!("{h}.{s}.{m}.{m}"),
        format!(".{h}.{s}.{m}"),
        format!("{h}.{s}.{m}="),
        format!("{h}=.{s}.{m}"),
        format!("{h}.{s} .{m}"),
        format!(" {h}.{s}.{m}"),
        format!("{h}.{s}.{m}\n"),
        format!("{h}.{s}.+{}", &m[1..]),
        format!("{h}.{s}./{}", &m[1..]),
        format!("{h}.{s}."),
        format!("{h}.{s}.{}", &m[..42]),
        format!("{h}.{s}.{m}AAAA"),
        format!("{h}.{s}.{m}A"),
        format!("{h}.{s}é.{m}"),
        format!("{h}.{s}.{}é", &m[..42]),
        "é.é.é".into(),
        "\u{0}.\u{0}.\u{0}".into(),
    ];
    for case in &cases {
        assert_eq!(reason(codec.decode(case, AUD, now())), TokenRejection::Malformed, "{case:?}");
        assert_eq!(reason(codec.decode_unscoped(case, now())), TokenRejection::Malformed, "{case:?}");
    }
}

#[test]
fn non_canonical_base64_is_malformed() {
    let codec = codec(SECRET_A);
    // One zero byte is "AA"; "AB" decodes to the same byte with a non-zero trailing bit.
    let token = codec.encode(&[0u8], AUD, now());
    let parts: Vec<&str> = token.split('.').collect();
    assert_eq!(parts[1], "AA");
    for alt in ["AB", "AP", "AR", "A_", "A", "AA=", "AA==", "AAB", "AAAAA"] {
        let forged = format!("{}.{alt}.{}", parts[0], parts[2]);
        assert_eq!(reason(codec.decode(&forged, AUD, now())), TokenRejection::Malformed, "{alt}");
    }
    // "AQ" is the canonical encoding of another byte: well-formed, so only the MAC rejects it.
    let forged = format!("{}.AQ.{}", parts[0], parts[2]);
    assert_eq!(reason(codec.decode(&forged, AUD, now())), TokenRejection::BadSignature);
    // The MAC's last character carries 2 unused bits: every other character is refused.
    let m = parts[2];
    let last = m.as_bytes()[m.len() - 1];
    for &c in MUTATION_CHARS.iter().filter(|&&c| c != last) {
        let forged = format!("{}.{}.{}{}", parts[0], parts[1], &m[..m.len() - 1], char::from(c));
        assert!(codec.decode(&forged, AUD, now()).is_err(), "{forged}");
    }
}

#[test]
fn bad_signature() {
    let codec = codec(SECRET_A);
    let token = codec.encode(b"state", AUD, now());
    let parts: Vec<&str> = token.split('.').collect();
    // Swap in a different (well-formed) state.
    let forged = format!("{}.{}.{}", parts[0], URL_SAFE_NO_PAD.encode(b"evil!"), parts[2]);
    assert_eq!(reason(codec.decode(&forged, AUD, now())), TokenRejection::BadSignature);
    // Swap in another token's MAC.
    let other = codec.encode(b"state", AUD, now());
    let other_mac = other.rsplit('.').next().unwrap();
    let forged = format!("{}.{}.{other_mac}", parts[0], parts[1]);
    assert_eq!(reason(codec.decode(&forged, AUD, now())), TokenRejection::BadSignature);
    // An all-zero MAC of the right length.
    let forged = format!("{}.{}.{}", parts[0], parts[1], URL_SAFE_NO_PAD.encode([0u8; 32]));
    assert_eq!(reason(codec.decode(&forged, AUD, now())), TokenRejection::BadSignature);
    // A header that would be rejected for other reasons is never looked at without a MAC.
    let forged = format!("{}.{}.{}", URL_SAFE_NO_PAD.encode("{}"), parts[1], parts[2]);
    assert_eq!(reason(codec.decode(&forged, AUD, now())), TokenRejection::BadSignature);
}

#[test]
fn unsupported_format() {
    let codec = codec(SECRET_A);
    let exp = NOW + HOUR;
    let canonical = header_json(AUD, NOW, exp);
    let cases = [
        canonical.replace("resumable-continuation", "resumable-continuation2"),
        canonical.replace("resumable-continuation", "other-format"),
        canonical.replace(r#""v":1"#, r#""v":2"#),
        canonical.replace(r#""v":1"#, r#""v":0"#),
        canonical.replace(r#""v":1"#, r#""v":"1""#),
        canonical.replace(r#""v":1"#, r#""v":1.0"#),
        canonical.replace(r#""alg":"HS256""#, r#""alg":"none""#),
        canonical.replace(r#""alg":"HS256""#, r#""alg":"HS512""#),
        canonical.replace(r#""alg":"HS256""#, r#""alg":"hs256""#),
        // Extra field.
        canonical.replace(r#","v":1}"#, r#","v":1,"x":0}"#),
        canonical.replace(r#"{"alg""#, r#"{"aaa":null,"alg""#),
        // Missing identification fields.
        canonical.replace(r#""fmt":"resumable-continuation","#, ""),
        canonical.replace(r#","v":1"#, ""),
        canonical.replace(r#""alg":"HS256","#, ""),
    ];
    for header in &cases {
        let token = sign_raw(&codec, header, b"state");
        assert_eq!(reason(codec.decode(&token, AUD, now())), TokenRejection::UnsupportedFormat, "{header}");
    }
}

#[test]
fn non_canonical_header() {
    let codec = codec(SECRET_A);
    let exp = NOW + HOUR;
    let canonical = header_json(AUD, NOW, exp);
    let reordered = format!(
        r#"{{"aud":"{AUD}","alg":"HS256","exp":{exp},"fmt":"resumable-continuation","iat":{NOW},"nonce":"{FIXED_NONCE}","v":1}}"#
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
    for header in &cases {
        let token = sign_raw(&codec, header, b"state");
        assert_eq!(reason(codec.decode(&token, AUD, now())), TokenRejection::NonCanonical, "{header}");
    }
}

#[test]
fn malformed_signed_header() {
    let codec = codec(SECRET_A);
    let exp = NOW + HOUR;
    let canonical = header_json(AUD, NOW, exp);
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
        header_json(AUD, NOW, NOW - 1),
    ];
    for header in &cases {
        let token = sign_raw(&codec, header, b"state");
        assert_eq!(reason(codec.decode(&token, AUD, now())), TokenRejection::Malformed, "{header}");
    }
    // Non-UTF-8 header bytes.
    let token = codec.sign_parts(&[0xff, 0xfe, b'{', b'}'], b"state");
    assert_eq!(reason(codec.decode(&token, AUD, now())), TokenRejection::Malformed);
}

#[test]
fn every_reason_is_reachable_and_distinct() {
    let issuer = codec(SECRET_A);
    let strict =
        SignedCodec::new(SignedCodecConfig::new(SECRET_A).max_age(Duration::from_secs(600)).max_token_bytes(4096))
            .unwrap();
    let token = issuer.encode(b"state", AUD, now());
    let canonical = header_json(AUD, NOW, NOW + HOUR);
    let reasons = [
        reason(strict.decode(&"A".repeat(4097), AUD, now())),
        reason(strict.decode("a.b", AUD, now())),
        reason(codec(SECRET_B).decode(&token, AUD, now())),
        reason(strict.decode(&sign_raw(&issuer, &canonical.replace(r#""v":1"#, r#""v":2"#), b""), AUD, now())),
        reason(strict.decode(&sign_raw(&issuer, &canonical.replace(',', ", "), b""), AUD, now())),
        reason(strict.decode(&token, "someone-else", now())),
        reason(issuer.decode(&token, AUD, at(NOW + HOUR + SKEW + 1))),
        reason(strict.decode(&token, AUD, at(NOW - SKEW - 1))),
        reason(strict.decode(&token, AUD, at(NOW + 600 + SKEW + 1))),
    ];
    assert_eq!(reasons, TokenRejection::ALL);
    let distinct: HashSet<TokenRejection> = reasons.into_iter().collect();
    assert_eq!(distinct.len(), 9);
}

#[test]
fn random_single_char_mutations_are_rejected() {
    let codec = codec(SECRET_A);
    let mut rng = SplitMix64(0x5EED_0001);
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
    // The original still verifies.
    assert_eq!(codec.decode(&token, AUD, now()).unwrap(), state);
}

#[test]
fn every_single_char_mutation_of_a_small_token_is_rejected() {
    let codec = codec(SECRET_A);
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

#[test]
fn random_truncations_and_extensions_are_rejected() {
    let codec = codec(SECRET_A);
    let mut rng = SplitMix64(0x5EED_0002);
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

#[test]
fn codec_is_send_sync_and_clone() {
    fn assert_traits<T: Send + Sync + Clone + fmt::Debug + 'static>() {}
    assert_traits::<SignedCodec>();
    assert_traits::<SignedCodecConfig>();
    assert_traits::<TokenError>();
    let codec = codec(SECRET_A);
    let token = codec.encode(b"state", AUD, now());
    let clone = codec.clone();
    assert_eq!(clone.decode(&token, AUD, now()).unwrap(), b"state");
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(128))]

    #[test]
    fn codec_prop_round_trip(
        state in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..2048),
        aud in ".{0,40}",
        offset in 0u64..=(HOUR + SKEW),
    ) {
        let codec = codec(SECRET_A);
        let token = codec.encode(&state, &aud, now());
        proptest::prop_assert_eq!(codec.decode(&token, &aud, at(NOW + offset)).unwrap(), state);
    }

    #[test]
    fn codec_prop_garbage_never_panics(token in ".{0,200}", aud in ".{0,8}") {
        let codec = codec(SECRET_A);
        proptest::prop_assert!(codec.decode(&token, &aud, now()).is_err());
        proptest::prop_assert!(codec.decode_unscoped(&token, now()).is_err());
    }

    #[test]
    fn codec_prop_dotted_garbage_never_panics(
        parts in proptest::collection::vec("[A-Za-z0-9_=é -]{0,60}", 0..5),
    ) {
        let codec = codec(SECRET_A);
        let token = parts.join(".");
        proptest::prop_assert!(codec.decode(&token, AUD, now()).is_err());
    }
}
