use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;

use super::super::test_util::*;
use super::*;

impl_test_codec!(SignedCodec, TOKEN_ALGORITHM, sign_parts);

shared_codec_tests!(
    SignedCodec,
    hand_built: hand_signed_canonical_header_is_accepted,
    malformed_header: malformed_signed_header,
    mutation_seed: 0x5EED_0001,
    truncation_seed: 0x5EED_0002,
);

fn codec(secret: &[u8]) -> SignedCodec {
    super::super::test_util::codec(secret)
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
    check_nonces_are_fresh::<SignedCodec>();
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

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(128))]

    #[test]
    fn codec_prop_round_trip(
        state in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..2048),
        aud in ".{0,40}",
        offset in 0u64..=(HOUR + SKEW),
    ) {
        prop_round_trip::<SignedCodec>(&state, &aud, offset)?;
    }

    #[test]
    fn codec_prop_garbage_never_panics(token in ".{0,200}", aud in ".{0,8}") {
        prop_garbage_is_rejected::<SignedCodec>(&token, &aud)?;
    }

    #[test]
    fn codec_prop_dotted_garbage_never_panics(
        parts in proptest::collection::vec("[A-Za-z0-9_=é -]{0,60}", 0..5),
    ) {
        prop_dotted_garbage_is_rejected(&codec(SECRET_A), &parts)?;
    }
}

/// `decode_deferred`, then its check, then the state part: the state and the verdict, as
/// `decode` gives them.
fn deferred(codec: &SignedCodec, token: &str, audience: &str) -> Result<Vec<u8>, TokenError> {
    let token: Arc<str> = token.into();
    let (state_part, check) = codec.decode_deferred(&token, audience, now())?;
    check.verify()?;
    decode_state_part(&token, state_part)
}

/// Small and large tokens, valid, tampered, under another secret, expired, with a malformed
/// state part, for the right and another audience: the state returned early and its deferred
/// check answer exactly what `decode` answers.
#[test]
fn deferred_decoding_answers_as_decode_does() {
    let codec = codec(SECRET_A);
    for size in [100, 200_000] {
        let state = SplitMix64(size as u64).bytes(size);
        let token = codec.encode(&state, AUD, now());
        let inside_state = token.find('.').unwrap() + 10;
        let mut tampered = token.clone().into_bytes();
        tampered[inside_state] = if tampered[inside_state] == b'A' { b'B' } else { b'A' };
        let mut malformed = tampered.clone();
        malformed[inside_state] = b'!';
        let tokens = [
            token.clone(),
            String::from_utf8(tampered).unwrap(),
            self::codec(SECRET_B).encode(&state, AUD, now()),
            codec.encode(&state, AUD, at(NOW - 2 * HOUR)),
            String::from_utf8(malformed).unwrap(),
            "not.a.token".to_owned(),
        ];
        for token in tokens {
            for audience in [AUD, "another-audience"] {
                assert_eq!(
                    deferred(&codec, &token, audience),
                    codec.decode(&token, audience, now()),
                    "{size} bytes for {audience}"
                );
            }
        }
    }
}
