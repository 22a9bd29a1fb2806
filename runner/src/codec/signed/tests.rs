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
            alg: "HS256-CHUNKED",
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
    assert_eq!(URL_SAFE_NO_PAD.decode(parts[2]).unwrap().len(), 2 * MAC_BYTES, "a tag and one digest");
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
            r#"{{"alg":"HS256-CHUNKED","aud":"{AUD}","exp":{},"fmt":"resumable-continuation","iat":{NOW},"nonce":"{}","v":1}}"#,
            NOW + HOUR,
            decoded.nonce
        )
    );
    // The last part is the tag, HMAC-SHA256 over the ASCII of `header.` and the digests,
    // then the digests: SHA-256 of each 48 KiB of state.
    let digest = Sha256::digest(b"hello");
    let mut mac = HmacSha256::new_from_slice(SECRET_A).unwrap();
    mac.update(format!("{}.", parts[0]).as_bytes());
    mac.update(&digest);
    let expected = [mac.finalize().into_bytes().as_slice(), digest.as_slice()].concat();
    assert_eq!(URL_SAFE_NO_PAD.encode(expected), parts[2]);
}

/// A state of `n` chunks has `n` digests (an empty state one), and a token whose digests do not
/// number its chunks is malformed.
#[test]
fn one_digest_per_chunk() {
    let codec = codec(SECRET_A);
    for (len, chunks) in [(0, 1), (1, 1), (CHUNK_BYTES, 1), (CHUNK_BYTES + 1, 2), (5 * CHUNK_BYTES, 5)] {
        let state = SplitMix64(len as u64).bytes(len);
        let token = codec.encode(&state, AUD, now());
        let parts: Vec<&str> = token.split('.').collect();
        let tail = URL_SAFE_NO_PAD.decode(parts[2]).unwrap();
        assert_eq!(tail.len(), (1 + chunks) * MAC_BYTES, "{len} bytes");
        for (index, digest) in tail[MAC_BYTES..].chunks(MAC_BYTES).enumerate() {
            let chunk = &state[(index * CHUNK_BYTES).min(len)..((index + 1) * CHUNK_BYTES).min(len)];
            assert_eq!(digest, Sha256::digest(chunk).as_slice());
        }
        assert_eq!(codec.decode(&token, AUD, now()).unwrap(), state);
        for wrong in [&tail[..tail.len() - MAC_BYTES], &[&tail[..], &[0u8; MAC_BYTES]].concat()] {
            let forged = format!("{}.{}.{}", parts[0], parts[1], URL_SAFE_NO_PAD.encode(wrong));
            let expected =
                if wrong.len() == MAC_BYTES { TokenRejection::BadSignature } else { TokenRejection::Malformed };
            assert_eq!(
                reason(codec.decode(&forged, AUD, now())),
                expected,
                "{len} bytes, {} digests",
                wrong.len() / 32 - 1
            );
        }
    }
}

/// Tokens of earlier versions, one MAC over `header.state` with `"alg":"HS256"`, are still
/// verified; the MAC's construction and the header's `alg` must agree.
#[test]
fn whole_state_tokens_are_still_verified() {
    let codec = codec(SECRET_A);
    let whole_state = |alg: &str, state: &[u8]| {
        let header = format!(
            r#"{{"alg":"{alg}","aud":"{AUD}","exp":{},"fmt":"resumable-continuation","iat":{NOW},"nonce":"{FIXED_NONCE}","v":1}}"#,
            NOW + HOUR
        );
        let signed = format!("{}.{}", URL_SAFE_NO_PAD.encode(header), URL_SAFE_NO_PAD.encode(state));
        let mut mac = HmacSha256::new_from_slice(SECRET_A).unwrap();
        mac.update(signed.as_bytes());
        format!("{signed}.{}", URL_SAFE_NO_PAD.encode(mac.finalize().into_bytes().as_slice()))
    };
    let state = SplitMix64(7).bytes(100_000);
    let token = whole_state(WHOLE_STATE_ALGORITHM, &state);
    assert_eq!(codec.decode(&token, AUD, now()).unwrap(), state);
    assert!(
        matches!(codec.open(&token, AUD, now()), Ok(SignedState::Decoded(decoded)) if decoded == state),
        "decoded whole"
    );
    let mut tampered = token.into_bytes();
    tampered[200] = if tampered[200] == b'A' { b'B' } else { b'A' };
    assert_eq!(reason(codec.decode(&String::from_utf8(tampered).unwrap(), AUD, now())), TokenRejection::BadSignature);
    // A whole-state MAC under the new `alg`, and the other way round: unsupported.
    let mislabelled = whole_state(TOKEN_ALGORITHM, &state);
    assert_eq!(reason(codec.decode(&mislabelled, AUD, now())), TokenRejection::UnsupportedFormat);
    let token = codec.encode(&state, AUD, now());
    let header = URL_SAFE_NO_PAD.decode(token.split('.').next().unwrap()).unwrap();
    let relabelled = String::from_utf8(header).unwrap().replace(TOKEN_ALGORITHM, WHOLE_STATE_ALGORITHM);
    let raw = codec.sign_parts(relabelled.as_bytes(), &state);
    assert_eq!(reason(codec.decode(&raw, AUD, now())), TokenRejection::UnsupportedFormat);
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
        format!("{h}.{s}.{}", &m[..85]),
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
    // All-zero MACs of the right lengths, with and without a digest.
    for len in [32, 64] {
        let forged = format!("{}.{}.{}", parts[0], parts[1], URL_SAFE_NO_PAD.encode(vec![0u8; len]));
        assert_eq!(reason(codec.decode(&forged, AUD, now())), TokenRejection::BadSignature);
    }
    // The right tag with a forged digest.
    let mut tail = URL_SAFE_NO_PAD.decode(parts[2]).unwrap();
    tail[40] ^= 1;
    let forged = format!("{}.{}.{}", parts[0], parts[1], URL_SAFE_NO_PAD.encode(&tail));
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

/// `open`, then the state part decoded and authenticated chunk by chunk, as a resume streams
/// it: the state and the verdict, as `decode` gives them.
fn chunked(codec: &SignedCodec, token: &str, audience: &str) -> Result<Vec<u8>, TokenError> {
    let mut chunked = match codec.open(token, audience, now())? {
        SignedState::Chunked(chunked) => chunked,
        SignedState::Decoded(state) => return Ok(state),
    };
    let mut state = Vec::new();
    while chunked.next_chunk(token, &mut state)? {
        assert!(state.len() <= chunked.len());
    }
    assert_eq!(state.len(), chunked.len());
    Ok(state)
}

/// Small and large tokens, valid, tampered in their state or digests, under another secret,
/// expired, with a malformed state part, for the right and another audience: opening them
/// chunk by chunk answers exactly what `decode` answers.
#[test]
fn chunked_opening_answers_as_decode_does() {
    let codec = codec(SECRET_A);
    for size in [0, 100, 200_000] {
        let state = SplitMix64(size as u64).bytes(size);
        let token = codec.encode(&state, AUD, now());
        let flip = |at: usize, to: u8| {
            let mut bytes = token.clone().into_bytes();
            bytes[at] = if bytes[at] == b'A' { to } else { b'A' };
            String::from_utf8(bytes).unwrap()
        };
        let state_start = token.find('.').unwrap() + 1;
        let last_digest = token.len() - 10;
        let mut tokens = vec![
            token.clone(),
            flip(last_digest, b'B'),
            self::codec(SECRET_B).encode(&state, AUD, now()),
            codec.encode(&state, AUD, at(NOW - 2 * HOUR)),
            "not.a.token".to_owned(),
        ];
        if size > 0 {
            tokens.extend([flip(state_start + 10, b'B'), flip(state_start + 10, b'!')]);
        }
        if size > CHUNK_BYTES {
            tokens.push(flip(token.len() - 5000, b'B'));
        }
        for token in tokens {
            for audience in [AUD, "another-audience"] {
                assert_eq!(
                    chunked(&codec, &token, audience),
                    codec.decode(&token, audience, now()),
                    "{size} bytes for {audience}"
                );
            }
        }
    }
}
