//! The token envelope shared by the signed and the sealed codec: the canonical JSON header
//! (writer and parser), strict base64url parts and nonces. See the
//! [module documentation](super) for the format.

use std::time::{SystemTime, UNIX_EPOCH};

use base64_simd::URL_SAFE_NO_PAD;
use serde_json::Value;

use super::error::TokenRejection;

/// The minimum length, in bytes, of every secret of a codec.
pub const MIN_SECRET_BYTES: usize = 32;

/// The value of the header's `fmt` field.
pub const TOKEN_FORMAT: &str = "resumable-continuation";

/// The value of the header's `v` field.
pub const TOKEN_VERSION: u64 = 1;

/// The keys of a header, in canonical (sorted) order.
const HEADER_KEYS: [&str; 7] = ["alg", "aud", "exp", "fmt", "iat", "nonce", "v"];

/// Number of random bytes in a nonce.
const NONCE_BYTES: usize = 16;

/// Length of a base64url (no padding) nonce.
const NONCE_CHARS: usize = 22;

/// The authenticated header of a token, as returned by
/// [`SignedCodec::decode_unscoped`](super::SignedCodec::decode_unscoped) and
/// [`SealedCodec::decode_unscoped`](super::SealedCodec::decode_unscoped).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct TokenHeader {
    /// When the token was issued (`iat`), in Unix seconds.
    pub issued_at: u64,
    /// When the token expires (`exp`), in Unix seconds.
    pub expires_at: u64,
    /// The audience the token is scoped to (`aud`).
    pub audience: String,
    /// The random nonce (`nonce`): 22 base64url characters encoding 16 bytes.
    pub nonce: String,
}

/// Seconds since the Unix epoch; 0 for times before it.
pub(super) fn unix_seconds(time: SystemTime) -> u64 {
    time.duration_since(UNIX_EPOCH).map_or(0, |elapsed| elapsed.as_secs())
}

/// 16 random bytes from the operating system, base64url-encoded (22 characters).
///
/// # Panics
///
/// If the operating system's random number generator fails.
pub(super) fn new_nonce() -> String {
    let mut bytes = [0u8; NONCE_BYTES];
    if let Err(err) = getrandom::fill(&mut bytes) {
        panic!("operating system random number generator failed: {err}");
    }
    URL_SAFE_NO_PAD.encode_to_string(bytes)
}

/// Whether `byte` belongs to the base64url alphabet (RFC 4648 §5).
#[cfg(test)]
pub(super) fn is_base64url_byte(byte: u8) -> bool {
    byte.is_ascii_alphanumeric() || byte == b'-' || byte == b'_'
}

/// Splits `token` into exactly `N` `.`-separated parts (any of them may be empty).
///
/// Tokens can be large, so the separators are found with a vectorized search.
pub(super) fn split_parts<const N: usize>(token: &str) -> Result<[&str; N], TokenRejection> {
    let mut dots = memchr::memchr_iter(b'.', token.as_bytes());
    let mut parts = [""; N];
    let mut start = 0;
    for (i, part) in parts.iter_mut().enumerate() {
        let end = if i + 1 == N { token.len() } else { dots.next().ok_or(TokenRejection::Malformed)? };
        // `.` is ASCII, so both ends are character boundaries.
        *part = token.get(start..end).ok_or(TokenRejection::Malformed)?;
        start = end + 1;
    }
    if dots.next().is_some() {
        return Err(TokenRejection::Malformed);
    }
    Ok(parts)
}

/// Strict base64url: URL-safe alphabet only, no padding, no whitespace, canonical trailing
/// bits (so every byte string has exactly one accepted encoding).
///
/// Token parts are large (a ledger of big host results), so they go through a SIMD codec; a
/// property test checks that it accepts exactly what the `base64` crate's strict engine does.
pub(super) fn decode_part(part: &str) -> Result<Vec<u8>, TokenRejection> {
    // The non-forgiving decoder refuses every byte outside the URL-safe alphabet (padding and
    // whitespace included) and non-canonical trailing bits.
    URL_SAFE_NO_PAD.decode_to_vec(part).map_err(|_| TokenRejection::Malformed)
}

/// Like [`decode_part`], into `buf` (cleared first), reusing its allocation.
pub(super) fn decode_part_into(part: &str, buf: &mut Vec<u8>) -> Result<(), TokenRejection> {
    buf.clear();
    decode_part_append(part, buf)
}

/// Like [`decode_part`], appending to `buf`; on failure `buf` may hold part of the output.
pub(super) fn decode_part_append(part: &str, buf: &mut Vec<u8>) -> Result<(), TokenRejection> {
    URL_SAFE_NO_PAD.decode_append(part, buf).map_err(|_| TokenRejection::Malformed)
}

/// Appends the base64url (no padding) encoding of `bytes` to `out`.
pub(super) fn encode_part_into(bytes: &[u8], out: &mut String) {
    URL_SAFE_NO_PAD.encode_append(bytes, out);
}

/// The length of the base64url (no padding) encoding of `len` bytes; 0 on overflow (only
/// used for capacity hints).
pub(super) fn encoded_len(len: usize) -> usize {
    if len > usize::MAX / 2 { 0 } else { URL_SAFE_NO_PAD.encoded_length(len) }
}

/// Whether `nonce` is 22 strict base64url characters encoding 16 bytes.
fn is_valid_nonce(nonce: &str) -> bool {
    nonce.len() == NONCE_CHARS && decode_part(nonce).is_ok_and(|bytes| bytes.len() == NONCE_BYTES)
}

/// The canonical header JSON: keys sorted, no whitespace, `serde_json` string escaping.
pub(super) fn canonical_header(
    algorithm: &str,
    audience: &str,
    expires_at: u64,
    issued_at: u64,
    nonce: &str,
) -> String {
    let mut out = String::with_capacity(120 + algorithm.len() + audience.len());
    out.push_str("{\"alg\":");
    push_json_string(&mut out, algorithm);
    out.push_str(",\"aud\":");
    push_json_string(&mut out, audience);
    out.push_str(",\"exp\":");
    out.push_str(&expires_at.to_string());
    out.push_str(",\"fmt\":");
    push_json_string(&mut out, TOKEN_FORMAT);
    out.push_str(",\"iat\":");
    out.push_str(&issued_at.to_string());
    out.push_str(",\"nonce\":");
    push_json_string(&mut out, nonce);
    out.push_str(",\"v\":");
    out.push_str(&TOKEN_VERSION.to_string());
    out.push('}');
    out
}

/// Appends `value` as a JSON string, escaped exactly like `serde_json` (and
/// `JSON.stringify`): `"` and `\` backslash-escaped, `\b \f \n \r \t` short escapes, other
/// control characters as lowercase `\u00xx`, everything else verbatim.
fn push_json_string(out: &mut String, value: &str) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    out.push('"');
    for c in value.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\u{08}' => out.push_str("\\b"),
            '\u{0c}' => out.push_str("\\f"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if u32::from(c) < 0x20 => {
                let code = u32::from(c) as usize;
                out.push_str("\\u00");
                out.push(char::from(HEX[code >> 4]));
                out.push(char::from(HEX[code & 0xf]));
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// Parses an authenticated header whose `alg` must be `algorithm`. See the module
/// documentation for the rules.
pub(super) fn parse_header(bytes: &[u8], algorithm: &str) -> Result<TokenHeader, TokenRejection> {
    let value: Value = serde_json::from_slice(bytes).map_err(|_| TokenRejection::Malformed)?;
    let Value::Object(map) = value else {
        return Err(TokenRejection::Malformed);
    };
    let format_supported = map.get("fmt").and_then(Value::as_str) == Some(TOKEN_FORMAT)
        && map.get("v").and_then(Value::as_u64) == Some(TOKEN_VERSION)
        && map.get("alg").and_then(Value::as_str) == Some(algorithm)
        && map.keys().all(|key| HEADER_KEYS.contains(&key.as_str()));
    if !format_supported {
        return Err(TokenRejection::UnsupportedFormat);
    }
    let audience = map.get("aud").and_then(Value::as_str).ok_or(TokenRejection::Malformed)?;
    let expires_at = map.get("exp").and_then(Value::as_u64).ok_or(TokenRejection::Malformed)?;
    let issued_at = map.get("iat").and_then(Value::as_u64).ok_or(TokenRejection::Malformed)?;
    let nonce = map
        .get("nonce")
        .and_then(Value::as_str)
        .filter(|nonce| is_valid_nonce(nonce))
        .ok_or(TokenRejection::Malformed)?;
    if canonical_header(algorithm, audience, expires_at, issued_at, nonce).as_bytes() != bytes {
        return Err(TokenRejection::NonCanonical);
    }
    if expires_at < issued_at {
        return Err(TokenRejection::Malformed);
    }
    Ok(TokenHeader { issued_at, expires_at, audience: audience.to_owned(), nonce: nonce.to_owned() })
}

#[cfg(test)]
mod tests {
    use super::*;
    use base64::Engine as _;
    use proptest::prelude::*;

    const REFERENCE: base64::engine::GeneralPurpose = base64::engine::general_purpose::URL_SAFE_NO_PAD;

    proptest! {
        /// Any text, mostly near the alphabet: accepted and decoded exactly as the reference
        /// strict engine does (alphabet, padding, length, canonical trailing bits).
        #[test]
        fn parts_decode_as_the_reference_engine_does(text in "[A-Za-z0-9_=+/. -]{0,40}") {
            prop_assert_eq!(decode_part(&text).ok(), REFERENCE.decode(&text).ok());
            let mut buf = vec![1, 2, 3];
            let into = decode_part_into(&text, &mut buf).map(|()| buf);
            prop_assert_eq!(into.ok(), REFERENCE.decode(&text).ok());
        }

        /// Exactly `N` parts are accepted, split where `str::split` splits.
        #[test]
        fn parts_split_as_str_split_does(text in "[a.é]{0,12}") {
            let reference: Vec<&str> = text.split('.').collect();
            prop_assert_eq!(split_parts::<3>(&text).ok().map(Vec::from), (reference.len() == 3).then(|| reference.clone()));
            prop_assert_eq!(split_parts::<2>(&text).ok().map(Vec::from), (reference.len() == 2).then_some(reference));
        }

        /// Every byte string encodes as the reference does, with the predicted length.
        #[test]
        fn parts_encode_as_the_reference_engine_does(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
            let mut out = String::from("x.");
            encode_part_into(&bytes, &mut out);
            prop_assert_eq!(&out[2..], REFERENCE.encode(&bytes));
            prop_assert_eq!(encoded_len(bytes.len()), out.len() - 2);
        }
    }
}
