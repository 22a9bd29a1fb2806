use std::collections::HashSet;

use base64::Engine as _;
use base64::engine::general_purpose::{STANDARD, STANDARD_NO_PAD, URL_SAFE, URL_SAFE_NO_PAD};
use hmac::{Hmac, KeyInit, Mac};
use sha2::{Digest, Sha256};

use super::super::test_util::*;
use super::super::{SignedCodec, SignedCodecConfig};
use super::*;

impl_test_codec!(SealedCodec, SEALED_TOKEN_ALGORITHM, seal_parts);

shared_codec_tests!(
    SealedCodec,
    hand_built: hand_sealed_canonical_header_is_accepted,
    malformed_header: malformed_sealed_header,
    mutation_seed: 0x5EED_1001,
    truncation_seed: 0x5EED_1002,
);

fn codec(secret: &[u8]) -> SealedCodec {
    super::super::test_util::codec(secret)
}

fn parts(token: &str) -> (&str, &str) {
    token.split_once('.').expect("two parts")
}

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
    let (_, tokens) = check_nonces_are_fresh::<SealedCodec>();
    let sealed_parts: HashSet<&str> = tokens.iter().map(|token| parts(token).1).collect();
    assert_eq!(sealed_parts.len(), 64, "the same state never encrypts to the same bytes");
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
    let hs256 = header_json::<SealedCodec>(AUD, NOW, NOW + HOUR).replace("A256GCM", "HS256");
    assert_eq!(
        reason(sealed.decode(&sealed.seal_parts(hs256.as_bytes(), b"state"), AUD, now())),
        TokenRejection::UnsupportedFormat
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

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(128))]

    #[test]
    fn sealed_prop_round_trip(
        state in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..2048),
        aud in ".{0,40}",
        offset in 0u64..=(HOUR + SKEW),
    ) {
        prop_round_trip::<SealedCodec>(&state, &aud, offset)?;
    }

    #[test]
    fn sealed_prop_garbage_never_panics(token in ".{0,200}", aud in ".{0,8}") {
        prop_garbage_is_rejected::<SealedCodec>(&token, &aud)?;
    }

    #[test]
    fn sealed_prop_dotted_garbage_never_panics(
        parts in proptest::collection::vec("[A-Za-z0-9_=é -]{0,60}", 0..4),
    ) {
        let codec = SealedCodec::new(SealedCodecConfig::new(SECRET_A).previous_secret(SECRET_B)).unwrap();
        prop_dotted_garbage_is_rejected(&codec, &parts)?;
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
