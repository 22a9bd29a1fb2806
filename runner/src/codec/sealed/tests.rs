use std::collections::HashSet;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use base64::engine::general_purpose::{STANDARD, STANDARD_NO_PAD, URL_SAFE, URL_SAFE_NO_PAD};
use hmac::{Hmac, KeyInit, Mac};
use sha2::{Digest, Sha256};

use super::super::test_util::SplitMix64;
use super::super::{SignedCodec, SignedCodecConfig};
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

fn codec(secret: &[u8]) -> SealedCodec {
    SealedCodec::new(SealedCodecConfig::new(secret)).expect("valid config")
}

fn reason<T: fmt::Debug>(result: Result<T, TokenError>) -> TokenRejection {
    match result {
        Ok(value) => panic!("expected a rejection, got Ok({value:?})"),
        Err(err) => err.reason,
    }
}

/// Seals an arbitrary header text with the codec's current secret.
fn seal_raw(codec: &SealedCodec, header: &str, state: &[u8]) -> String {
    codec.seal_parts(header.as_bytes(), state)
}

/// A header in canonical form, like the encoder writes it (with a fixed nonce).
fn header_json(aud: &str, iat: u64, exp: u64) -> String {
    format!(
        r#"{{"alg":"A256GCM","aud":"{aud}","exp":{exp},"fmt":"resumable-continuation","iat":{iat},"nonce":"{FIXED_NONCE}","v":1}}"#
    )
}

fn parts(token: &str) -> (&str, &str) {
    token.split_once('.').expect("two parts")
}

/// The base64url alphabet plus the separator and characters a decoder must refuse.
const MUTATION_CHARS: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_.= ";

/// HKDF-SHA256 (RFC 5869) written with the `hmac` crate, independent of `ring`.
fn reference_hkdf(salt: &[u8], ikm: &[u8], info: &[u8], len: usize) -> Vec<u8> {
    let mut extract = Hmac::<Sha256>::new_from_slice(salt).unwrap();
    extract.update(ikm);
    let prk = extract.finalize().into_bytes();
    let mut okm = Vec::new();
    let mut block = Vec::new();
    let mut counter = 1u8;
    while okm.len() < len {
        let mut expand = Hmac::<Sha256>::new_from_slice(prk.as_slice()).unwrap();
        expand.update(&block);
        expand.update(info);
        expand.update(&[counter]);
        block = expand.finalize().into_bytes().to_vec();
        okm.extend_from_slice(&block);
        counter += 1;
    }
    okm.truncate(len);
    okm
}

fn from_hex(hex: &str) -> Vec<u8> {
    (0..hex.len()).step_by(2).map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap()).collect()
}

#[test]
fn reference_hkdf_matches_rfc_5869() {
    // RFC 5869, test case 1.
    let okm =
        reference_hkdf(&from_hex("000102030405060708090a0b0c"), &[0x0b; 22], &from_hex("f0f1f2f3f4f5f6f7f8f9"), 42);
    assert_eq!(okm, from_hex("3cb25f25faacd57a90434f64d0362f2a2d2d0a90cf1a5a4c5db02d56ecc4c5bf34007208d5b887185865"));
}

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
fn token_shape_and_key_derivation() {
    let codec = codec(SECRET_A);
    let state = b"hello, sealed world";
    let token = codec.encode(state, AUD, now());
    let (h, s) = parts(&token);
    assert!(!s.contains('.'));
    assert!(token.bytes().all(|b| b == b'.' || envelope::is_base64url_byte(b)));
    let sealed = URL_SAFE_NO_PAD.decode(s).unwrap();
    assert_eq!(sealed.len(), state.len() + TAG_BYTES);
    let header = String::from_utf8(URL_SAFE_NO_PAD.decode(h).unwrap()).unwrap();
    let (decoded, _) = codec.decode_unscoped(&token, now()).unwrap();
    assert_eq!(decoded.issued_at, NOW);
    assert_eq!(decoded.expires_at, NOW + HOUR);
    assert_eq!(decoded.audience, AUD);
    assert_eq!(decoded.nonce.len(), 22);
    assert_eq!(
        header,
        format!(
            r#"{{"alg":"A256GCM","aud":"{AUD}","exp":{},"fmt":"resumable-continuation","iat":{NOW},"nonce":"{}","v":1}}"#,
            NOW + HOUR,
            decoded.nonce
        )
    );
    // The documented construction, recomputed with an independent HKDF.
    let mut info = b"resumable-continuation/sealed/v1/A256GCM/token-key-and-nonce".to_vec();
    info.extend_from_slice(&Sha256::digest(h.as_bytes()));
    let okm = reference_hkdf(b"resumable-continuation/sealed/v1/hkdf-salt", SECRET_A, &info, 44);
    let key = LessSafeKey::new(UnboundKey::new(&AES_256_GCM, &okm[..32]).unwrap());
    let nonce = Nonce::try_assume_unique_for_key(&okm[32..]).unwrap();
    let mut buf = sealed.clone();
    let plaintext = key.open_in_place(nonce, Aad::from(h.as_bytes()), &mut buf).unwrap();
    assert_eq!(plaintext, state);
    // The associated data is the header part: any other AAD fails.
    let nonce = Nonce::try_assume_unique_for_key(&okm[32..]).unwrap();
    let mut buf = sealed;
    assert!(key.open_in_place(nonce, Aad::from(header.as_bytes()), &mut buf).is_err());
}

#[test]
fn nonces_are_fresh_and_encodings_differ() {
    let codec = codec(SECRET_A);
    let tokens: Vec<String> = (0..64).map(|_| codec.encode(b"same state", AUD, now())).collect();
    let nonces: HashSet<String> =
        tokens.iter().map(|token| codec.decode_unscoped(token, now()).unwrap().0.nonce).collect();
    assert_eq!(nonces.len(), 64);
    let sealed_parts: HashSet<&str> = tokens.iter().map(|token| parts(token).1).collect();
    assert_eq!(sealed_parts.len(), 64, "the same state never encrypts to the same bytes");
    for token in &tokens {
        assert_eq!(codec.decode(token, AUD, now()).unwrap(), b"same state");
    }
}

#[test]
fn confidentiality() {
    const NEEDLES: [&[u8]; 3] = [
        b"host-result-SECRET-1234",
        br#"{"account":"ACME-9931","amount_cents":125000,"approved_by":"alice@example.com"}"#,
        b"\x00\x01binary\xffsecret\xfe\x7f",
    ];
    let mut state = b"prefix ".to_vec();
    for needle in NEEDLES {
        state.extend_from_slice(needle);
        state.extend_from_slice(b" | ");
    }
    // Every encoding of every needle that could show through: raw, hex, and base64 in both
    // alphabets, for each of the three alignments of the needle against base64's 3-byte
    // groups (the stable middle of the encoding of `needle[a..]`).
    let mut forbidden: Vec<String> = Vec::new();
    for needle in NEEDLES.iter().copied().chain([state.as_slice()]) {
        if let Ok(text) = std::str::from_utf8(needle) {
            forbidden.push(text.to_owned());
        }
        forbidden.push(needle.iter().map(|b| format!("{b:02x}")).collect());
        forbidden.push(needle.iter().map(|b| format!("{b:02X}")).collect());
        for alignment in 0..3 {
            let rest = &needle[alignment..];
            let whole = &rest[..rest.len() / 3 * 3];
            for engine in [&STANDARD, &STANDARD_NO_PAD, &URL_SAFE, &URL_SAFE_NO_PAD] {
                forbidden.push(engine.encode(whole));
            }
        }
    }
    assert!(forbidden.iter().all(|f| f.len() >= 12));
    let codec = codec(SECRET_A);
    for _ in 0..8 {
        let token = codec.encode(&state, AUD, now());
        for f in &forbidden {
            assert!(!token.contains(f.as_str()), "{f:?} shows in the token");
        }
        let (h, s) = parts(&token);
        let header = URL_SAFE_NO_PAD.decode(h).unwrap();
        let sealed = URL_SAFE_NO_PAD.decode(s).unwrap();
        for needle in NEEDLES {
            for bytes in [&header, &sealed] {
                assert!(!bytes.windows(needle.len()).any(|window| window == needle));
            }
        }
        assert_eq!(codec.decode(&token, AUD, now()).unwrap(), state);
    }
    // The signed codec, by contrast, shows the state (sanity check of the test itself).
    let signed = SignedCodec::new(SignedCodecConfig::new(SECRET_A)).unwrap().encode(&state, AUD, now());
    assert!(forbidden.iter().any(|f| signed.contains(f.as_str())));
}

#[test]
fn rotation() {
    let old = codec(SECRET_A);
    let rotated = SealedCodec::new(SealedCodecConfig::new(SECRET_B).previous_secret(SECRET_A)).expect("valid config");
    let from_old = old.encode(b"state", AUD, now());
    assert_eq!(rotated.decode(&from_old, AUD, now()).unwrap(), b"state");
    // The rotated codec seals with B, which the old codec does not know.
    let from_rotated = rotated.encode(b"state", AUD, now());
    assert_eq!(rotated.decode(&from_rotated, AUD, now()).unwrap(), b"state");
    assert_eq!(reason(old.decode(&from_rotated, AUD, now())), TokenRejection::BadSignature);
    // Rolling back (A current, B previous) still opens tokens sealed with B.
    let rolled_back = SealedCodec::new(SealedCodecConfig::new(SECRET_A).previous_secret(SECRET_B)).unwrap();
    assert_eq!(rolled_back.decode(&from_rotated, AUD, now()).unwrap(), b"state");
    assert_eq!(rolled_back.decode(&from_old, AUD, now()).unwrap(), b"state");
    // A codec that dropped A no longer accepts A's tokens.
    let b_only = codec(SECRET_B);
    assert_eq!(reason(b_only.decode(&from_old, AUD, now())), TokenRejection::BadSignature);
    // Several previous secrets: each is tried, and a large state survives the retries
    // (a failed attempt wipes the decryption buffer).
    let third = [3u8; 32];
    let multi =
        SealedCodec::new(SealedCodecConfig::new(third).previous_secret(SECRET_B).previous_secret(SECRET_A)).unwrap();
    assert_eq!(multi.decode(&from_old, AUD, now()).unwrap(), b"state");
    assert_eq!(multi.decode(&from_rotated, AUD, now()).unwrap(), b"state");
    let big = SplitMix64(9).bytes(300_000);
    let big_token = old.encode(&big, AUD, now());
    assert_eq!(multi.decode(&big_token, AUD, now()).unwrap(), big);
    let (header, state) = multi.decode_unscoped(&big_token, now()).unwrap();
    assert_eq!((header.audience.as_str(), state), (AUD, big));
}

#[test]
fn signed_and_sealed_do_not_mix() {
    let signed = SignedCodec::new(SignedCodecConfig::new(SECRET_A)).unwrap();
    let sealed = codec(SECRET_A);
    let signed_token = signed.encode(b"state", AUD, now());
    let sealed_token = sealed.encode(b"state", AUD, now());
    assert_eq!(reason(sealed.decode(&signed_token, AUD, now())), TokenRejection::Malformed);
    assert_eq!(reason(signed.decode(&sealed_token, AUD, now())), TokenRejection::Malformed);
    // A signed token's header with a sealed part made of its state and MAC still fails.
    let [h, s, m] = envelope::split_parts::<3>(&signed_token).unwrap();
    let mut joined = URL_SAFE_NO_PAD.decode(s).unwrap();
    joined.extend(URL_SAFE_NO_PAD.decode(m).unwrap());
    let forged = format!("{h}.{}", URL_SAFE_NO_PAD.encode(joined));
    assert_eq!(reason(sealed.decode(&forged, AUD, now())), TokenRejection::BadSignature);
    // A header with the signed codec's algorithm, sealed properly, is not this format.
    let hs256 = header_json(AUD, NOW, NOW + HOUR).replace("A256GCM", "HS256");
    assert_eq!(
        reason(sealed.decode(&seal_raw(&sealed, &hs256, b"state"), AUD, now())),
        TokenRejection::UnsupportedFormat
    );
}

#[test]
fn config_validation() {
    let err = SealedCodec::new(SealedCodecConfig::new(vec![1u8; 31])).unwrap_err();
    assert_eq!(err.to_string(), "continuation secret must be at least 32 bytes (got 31)");
    let err = SealedCodec::new(SealedCodecConfig::new(b"short".to_vec())).unwrap_err();
    assert_eq!(err, CodecConfigError("continuation secret must be at least 32 bytes (got 5)".into()));
    let err =
        SealedCodec::new(SealedCodecConfig::new(SECRET_A).previous_secret(SECRET_B).previous_secret(vec![1u8; 31]))
            .unwrap_err();
    assert_eq!(err.to_string(), "previous continuation secret #2 must be at least 32 bytes (got 31)");
    let err = SealedCodec::new(SealedCodecConfig::new(SECRET_A).max_token_bytes(0)).unwrap_err();
    assert!(err.to_string().contains("max_token_bytes"), "{err}");
    let err = SealedCodec::new(SealedCodecConfig::new(SECRET_A).max_age(Duration::from_millis(999))).unwrap_err();
    assert!(err.to_string().contains("max_age"), "{err}");

    assert!(SealedCodec::new(SealedCodecConfig::new(vec![1u8; 32])).is_ok());
    assert!(SealedCodec::new(SealedCodecConfig::new(vec![1u8; 32]).previous_secret(vec![2u8; 32])).is_ok());
    assert!(SealedCodec::new(SealedCodecConfig::new(SECRET_A).max_token_bytes(1)).is_ok());
}

#[test]
fn config_defaults_and_setters() {
    let config = SealedCodecConfig::new(SECRET_A);
    assert_eq!(config.max_age, Duration::from_secs(3600));
    assert_eq!(config.clock_skew, Duration::from_secs(60));
    assert_eq!(config.max_token_bytes, 48 * 1024 * 1024);
    assert!(config.previous_secrets.is_empty());
    let config = config
        .max_age(Duration::from_secs(5))
        .clock_skew(Duration::from_secs(1))
        .max_token_bytes(10)
        .previous_secret(SECRET_B);
    let codec = SealedCodec::new(config).unwrap();
    assert_eq!(codec.max_age(), Duration::from_secs(5));
    assert_eq!(codec.clock_skew(), Duration::from_secs(1));
    assert_eq!(codec.max_token_bytes(), 10);
}

#[test]
fn debug_output_hides_secrets() {
    let codec = SealedCodec::new(SealedCodecConfig::new(SECRET_A).previous_secret(SECRET_B)).unwrap();
    let config = SealedCodecConfig::new(SECRET_A).previous_secret(SECRET_B);
    let debugs = [format!("{codec:?}"), format!("{codec:#?}"), format!("{config:?}"), format!("{config:#?}")];
    assert!(debugs[0].contains("A256GCM") && debugs[0].contains("previous_secrets: 1"), "{}", debugs[0]);
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

#[test]
fn too_large() {
    let probe = codec(SECRET_A).encode(b"state", AUD, now());
    let exact = SealedCodec::new(SealedCodecConfig::new(SECRET_A).max_token_bytes(probe.len())).unwrap();
    let token = exact.encode(b"state", AUD, now());
    assert_eq!(token.len(), probe.len());
    assert_eq!(exact.decode(&token, AUD, now()).unwrap(), b"state");
    let bigger = exact.encode(b"state!", AUD, now());
    assert_eq!(reason(exact.decode(&bigger, AUD, now())), TokenRejection::TooLarge);
    // The size check comes before anything else, even for garbage.
    let tiny = SealedCodec::new(SealedCodecConfig::new(SECRET_A).max_token_bytes(3)).unwrap();
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
    let strict = SealedCodec::new(SealedCodecConfig::new(SECRET_A).max_age(Duration::from_secs(10 * 60))).unwrap();
    let token = issuer.encode(b"state", AUD, now());
    assert!(strict.decode(&token, AUD, at(NOW + 600 + SKEW)).is_ok());
    assert_eq!(reason(strict.decode(&token, AUD, at(NOW + 600 + SKEW + 1))), TokenRejection::TooOld);
    assert_eq!(reason(strict.decode_unscoped(&token, at(NOW + 20 * 60))), TokenRejection::TooOld);
    // A far-future exp (validly sealed) does not extend the lifetime.
    let header = header_json(AUD, NOW, u64::MAX);
    let long_lived = seal_raw(&issuer, &header, b"state");
    assert!(issuer.decode(&long_lived, AUD, at(NOW + HOUR)).is_ok());
    assert_eq!(reason(issuer.decode(&long_lived, AUD, at(NOW + HOUR + SKEW + 1))), TokenRejection::TooOld);
}

#[test]
fn hand_sealed_canonical_header_is_accepted() {
    let codec = codec(SECRET_A);
    let token = seal_raw(&codec, &header_json(AUD, NOW, NOW + HOUR), b"state");
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
    let (h, s) = parts(&token);
    assert_eq!(s.len(), 28);
    let tag_only = URL_SAFE_NO_PAD.encode([0u8; TAG_BYTES - 1]);
    let cases = [
        String::new(),
        ".".into(),
        "..".into(),
        h.to_owned(),
        format!("{h}."),
        format!("{h}.{s}."),
        format!("{h}.{s}.{s}"),
        format!(".{h}.{s}"),
        format!("{h}.{s}="),
        format!("{h}=.{s}"),
        format!("{h}.{s} "),
        format!(" {h}.{s}"),
        format!("{h}.{s}\n"),
        format!("{h}.+{}", &s[1..]),
        format!("{h}./{}", &s[1..]),
        // 28 characters minus 3: a length no byte string encodes to.
        format!("{h}.{}", &s[..s.len() - 3]),
        format!("{h}.{s}A"),
        format!("{h}.{s}é"),
        format!("{h}é.{s}"),
        // A sealed part shorter than a tag.
        format!("{h}.{tag_only}"),
        "é.é".into(),
        "\u{0}.\u{0}".into(),
    ];
    for case in &cases {
        assert_eq!(reason(codec.decode(case, AUD, now())), TokenRejection::Malformed, "{case:?}");
        assert_eq!(reason(codec.decode_unscoped(case, now())), TokenRejection::Malformed, "{case:?}");
    }
}

#[test]
fn non_canonical_base64_is_malformed() {
    let codec = codec(SECRET_A);
    // An empty state seals to the 16-byte tag alone: 22 characters, the last carrying 4
    // unused bits, so only 4 of the 64 letters are canonical there.
    let token = codec.encode(b"", AUD, now());
    let (h, s) = parts(&token);
    assert_eq!(s.len(), 22);
    let last = s.as_bytes()[s.len() - 1];
    let mut canonical_others = 0;
    for &c in MUTATION_CHARS.iter().filter(|&&c| c != last) {
        let forged = format!("{h}.{}{}", &s[..s.len() - 1], char::from(c));
        let rejection = reason(codec.decode(&forged, AUD, now()));
        if URL_SAFE_NO_PAD.decode(&forged[h.len() + 1..]).is_ok() {
            canonical_others += 1;
            assert_eq!(rejection, TokenRejection::BadSignature, "{forged}");
        } else {
            assert_eq!(rejection, TokenRejection::Malformed, "{forged}");
        }
    }
    assert_eq!(canonical_others, 3);
    for suffix in ["=", "==", "A", "AAAA"] {
        assert!(codec.decode(&format!("{h}.{s}{suffix}"), AUD, now()).is_err());
    }
}

#[test]
fn bad_signature() {
    let codec = codec(SECRET_A);
    let token = codec.encode(b"some state", AUD, now());
    let (h, s) = parts(&token);
    let sealed = URL_SAFE_NO_PAD.decode(s).unwrap();
    let forge = |header: &str, bytes: &[u8]| format!("{header}.{}", URL_SAFE_NO_PAD.encode(bytes));
    // Every single bit flip, in the ciphertext and in the tag.
    for index in 0..sealed.len() {
        for bit in 0..8 {
            let mut flipped = sealed.clone();
            flipped[index] ^= 1 << bit;
            assert_eq!(reason(codec.decode(&forge(h, &flipped), AUD, now())), TokenRejection::BadSignature);
        }
    }
    // Another token's sealed part, or its header part, with this token's other half.
    let other = codec.encode(b"some state", AUD, now());
    let (oh, os) = parts(&other);
    assert_eq!(reason(codec.decode(&format!("{h}.{os}"), AUD, now())), TokenRejection::BadSignature);
    assert_eq!(reason(codec.decode(&format!("{oh}.{s}"), AUD, now())), TokenRejection::BadSignature);
    // Dropped or added ciphertext bytes, an all-zero tag, a bare zero tag.
    assert_eq!(reason(codec.decode(&forge(h, &sealed[1..]), AUD, now())), TokenRejection::BadSignature);
    assert_eq!(reason(codec.decode(&forge(h, &sealed[..sealed.len() - 1]), AUD, now())), TokenRejection::BadSignature);
    let mut longer = sealed.clone();
    longer.push(0);
    assert_eq!(reason(codec.decode(&forge(h, &longer), AUD, now())), TokenRejection::BadSignature);
    let mut zero_tag = sealed.clone();
    let tag_start = zero_tag.len() - TAG_BYTES;
    zero_tag[tag_start..].fill(0);
    assert_eq!(reason(codec.decode(&forge(h, &zero_tag), AUD, now())), TokenRejection::BadSignature);
    assert_eq!(reason(codec.decode(&forge(h, &[0u8; TAG_BYTES]), AUD, now())), TokenRejection::BadSignature);
    // A header that would be rejected for other reasons is never looked at without
    // authentication; neither is a valid-looking header that differs from the sealed one.
    let empty_header = URL_SAFE_NO_PAD.encode("{}");
    assert_eq!(reason(codec.decode(&format!("{empty_header}.{s}"), AUD, now())), TokenRejection::BadSignature);
    let header = String::from_utf8(URL_SAFE_NO_PAD.decode(h).unwrap()).unwrap();
    let widened = header.replace(&format!("\"exp\":{}", NOW + HOUR), &format!("\"exp\":{}", NOW + 2 * HOUR));
    assert_ne!(widened, header);
    let forged = format!("{}.{s}", URL_SAFE_NO_PAD.encode(&widened));
    assert_eq!(reason(codec.decode(&forged, AUD, now())), TokenRejection::BadSignature);
    let other_aud = format!("{}.{s}", URL_SAFE_NO_PAD.encode(header.replace(AUD, "tenant-2/automation-7")));
    assert_eq!(reason(codec.decode(&other_aud, "tenant-2/automation-7", now())), TokenRejection::BadSignature);
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
        canonical.replace(r#""alg":"A256GCM""#, r#""alg":"none""#),
        canonical.replace(r#""alg":"A256GCM""#, r#""alg":"HS256""#),
        canonical.replace(r#""alg":"A256GCM""#, r#""alg":"C20P""#),
        canonical.replace(r#""alg":"A256GCM""#, r#""alg":"a256gcm""#),
        // Extra field.
        canonical.replace(r#","v":1}"#, r#","v":1,"x":0}"#),
        canonical.replace(r#"{"alg""#, r#"{"aaa":null,"alg""#),
        // Missing identification fields.
        canonical.replace(r#""fmt":"resumable-continuation","#, ""),
        canonical.replace(r#","v":1"#, ""),
        canonical.replace(r#""alg":"A256GCM","#, ""),
    ];
    for header in &cases {
        let token = seal_raw(&codec, header, b"state");
        assert_eq!(reason(codec.decode(&token, AUD, now())), TokenRejection::UnsupportedFormat, "{header}");
    }
}

#[test]
fn non_canonical_header() {
    let codec = codec(SECRET_A);
    let exp = NOW + HOUR;
    let canonical = header_json(AUD, NOW, exp);
    let reordered = format!(
        r#"{{"aud":"{AUD}","alg":"A256GCM","exp":{exp},"fmt":"resumable-continuation","iat":{NOW},"nonce":"{FIXED_NONCE}","v":1}}"#
    );
    let cases = [
        reordered,
        canonical.replace(',', ", "),
        canonical.replace(':', " : "),
        format!(" {canonical}"),
        format!("{canonical}\n"),
        canonical.replace("tenant-1", "tenant\\u002d1"),
        canonical.replace('/', r"\/"),
        // Duplicate key (the last value wins in the parser, so re-serialization differs).
        canonical.replace(r#""aud":"#, r#""aud":"tenant-2/automation-7","aud":"#),
    ];
    for header in &cases {
        let token = seal_raw(&codec, header, b"state");
        assert_eq!(reason(codec.decode(&token, AUD, now())), TokenRejection::NonCanonical, "{header}");
    }
}

#[test]
fn malformed_sealed_header() {
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
        let token = seal_raw(&codec, header, b"state");
        assert_eq!(reason(codec.decode(&token, AUD, now())), TokenRejection::Malformed, "{header}");
    }
    // Non-UTF-8 header bytes.
    let token = codec.seal_parts(&[0xff, 0xfe, b'{', b'}'], b"state");
    assert_eq!(reason(codec.decode(&token, AUD, now())), TokenRejection::Malformed);
}

#[test]
fn every_reason_is_reachable_and_distinct() {
    let issuer = codec(SECRET_A);
    let strict =
        SealedCodec::new(SealedCodecConfig::new(SECRET_A).max_age(Duration::from_secs(600)).max_token_bytes(4096))
            .unwrap();
    let token = issuer.encode(b"state", AUD, now());
    let canonical = header_json(AUD, NOW, NOW + HOUR);
    let reasons = [
        reason(strict.decode(&"A".repeat(4097), AUD, now())),
        reason(strict.decode("a.b.c", AUD, now())),
        reason(codec(SECRET_B).decode(&token, AUD, now())),
        reason(strict.decode(&seal_raw(&issuer, &canonical.replace(r#""v":1"#, r#""v":2"#), b""), AUD, now())),
        reason(strict.decode(&seal_raw(&issuer, &canonical.replace(',', ", "), b""), AUD, now())),
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
    let mut rng = SplitMix64(0x5EED_1001);
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
    let mut rng = SplitMix64(0x5EED_1002);
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
    assert_traits::<SealedCodec>();
    assert_traits::<SealedCodecConfig>();
    let codec = codec(SECRET_A);
    let token = codec.encode(b"state", AUD, now());
    let clone = codec.clone();
    assert_eq!(clone.decode(&token, AUD, now()).unwrap(), b"state");
    assert_eq!(codec.decode(&clone.encode(b"state", AUD, now()), AUD, now()).unwrap(), b"state");
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(128))]

    #[test]
    fn sealed_prop_round_trip(
        state in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..2048),
        aud in ".{0,40}",
        offset in 0u64..=(HOUR + SKEW),
    ) {
        let codec = codec(SECRET_A);
        let token = codec.encode(&state, &aud, now());
        proptest::prop_assert_eq!(codec.decode(&token, &aud, at(NOW + offset)).unwrap(), state);
    }

    #[test]
    fn sealed_prop_garbage_never_panics(token in ".{0,200}", aud in ".{0,8}") {
        let codec = codec(SECRET_A);
        proptest::prop_assert!(codec.decode(&token, &aud, now()).is_err());
        proptest::prop_assert!(codec.decode_unscoped(&token, now()).is_err());
    }

    #[test]
    fn sealed_prop_dotted_garbage_never_panics(
        parts in proptest::collection::vec("[A-Za-z0-9_=é -]{0,60}", 0..4),
    ) {
        let codec = SealedCodec::new(SealedCodecConfig::new(SECRET_A).previous_secret(SECRET_B)).unwrap();
        let token = parts.join(".");
        proptest::prop_assert!(codec.decode(&token, AUD, now()).is_err());
    }

    #[test]
    fn sealed_prop_random_sealed_part_is_rejected(
        bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 16..256),
    ) {
        let codec = codec(SECRET_A);
        let token = codec.encode(b"state", AUD, now());
        let forged = format!("{}.{}", parts(&token).0, URL_SAFE_NO_PAD.encode(&bytes));
        proptest::prop_assert_eq!(reason(codec.decode(&forged, AUD, now())), TokenRejection::BadSignature);
    }
}
