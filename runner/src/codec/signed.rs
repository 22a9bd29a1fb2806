//! The signed (HMAC-SHA256) continuation codec. See the [module documentation](super) for
//! the token format and the verification order.

use std::fmt;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use hmac::{Hmac, KeyInit, Mac};
use serde_json::Value;
use sha2::Sha256;

use super::error::{CodecConfigError, TokenError, TokenRejection};

/// The MAC of the `HS256` algorithm.
type HmacSha256 = Hmac<Sha256>;

/// The minimum length, in bytes, of every signing and verification secret.
pub const MIN_SECRET_BYTES: usize = 32;

/// The value of the header's `fmt` field.
pub const TOKEN_FORMAT: &str = "resumable-continuation";

/// The value of the header's `v` field.
pub const TOKEN_VERSION: u64 = 1;

/// The value of the header's `alg` field.
pub const TOKEN_ALGORITHM: &str = "HS256";

/// The keys of a header, in canonical (sorted) order.
const HEADER_KEYS: [&str; 7] = ["alg", "aud", "exp", "fmt", "iat", "nonce", "v"];

/// Length of an HMAC-SHA256 tag.
const MAC_BYTES: usize = 32;

/// Length of a base64url (no padding) HMAC-SHA256 tag.
const MAC_CHARS: usize = 43;

/// Number of random bytes in a nonce.
const NONCE_BYTES: usize = 16;

/// Length of a base64url (no padding) nonce.
const NONCE_CHARS: usize = 22;

/// Configuration of a [`SignedCodec`].
///
/// Its `Debug` output shows the lengths of the secrets, never their bytes.
#[derive(Clone)]
pub struct SignedCodecConfig {
    /// The current signing secret; at least [`MIN_SECRET_BYTES`] bytes.
    pub secret: Vec<u8>,
    /// Former secrets, accepted for verification only (key rotation); each at least
    /// [`MIN_SECRET_BYTES`] bytes.
    pub previous_secrets: Vec<Vec<u8>>,
    /// How long a token is valid: `exp = iat + max_age`, and a token whose `iat` is older
    /// than `max_age` (plus `clock_skew`) is rejected even if its `exp` says otherwise.
    /// Whole seconds are used; must be at least one second. Default: one hour.
    pub max_age: Duration,
    /// Tolerated difference between the clocks of the encoder and the decoder. Whole seconds
    /// are used. Default: 60 seconds.
    pub clock_skew: Duration,
    /// The largest token, in bytes, that is even looked at; must be greater than 0.
    /// Default: 48 MiB.
    pub max_token_bytes: usize,
}

impl SignedCodecConfig {
    /// Default [`max_age`](Self::max_age): one hour.
    pub const DEFAULT_MAX_AGE: Duration = Duration::from_secs(60 * 60);
    /// Default [`clock_skew`](Self::clock_skew): 60 seconds.
    pub const DEFAULT_CLOCK_SKEW: Duration = Duration::from_secs(60);
    /// Default [`max_token_bytes`](Self::max_token_bytes): 48 MiB.
    pub const DEFAULT_MAX_TOKEN_BYTES: usize = 48 * 1024 * 1024;

    /// A configuration with signing secret `secret`, no previous secrets and default limits.
    /// The secret is validated by [`SignedCodec::new`].
    pub fn new(secret: impl Into<Vec<u8>>) -> Self {
        Self {
            secret: secret.into(),
            previous_secrets: Vec::new(),
            max_age: Self::DEFAULT_MAX_AGE,
            clock_skew: Self::DEFAULT_CLOCK_SKEW,
            max_token_bytes: Self::DEFAULT_MAX_TOKEN_BYTES,
        }
    }

    /// Adds a former secret that is still accepted for verification (never used to sign).
    #[must_use]
    pub fn previous_secret(mut self, secret: impl Into<Vec<u8>>) -> Self {
        self.previous_secrets.push(secret.into());
        self
    }

    /// Sets [`max_age`](Self::max_age).
    #[must_use]
    pub fn max_age(mut self, max_age: Duration) -> Self {
        self.max_age = max_age;
        self
    }

    /// Sets [`clock_skew`](Self::clock_skew).
    #[must_use]
    pub fn clock_skew(mut self, clock_skew: Duration) -> Self {
        self.clock_skew = clock_skew;
        self
    }

    /// Sets [`max_token_bytes`](Self::max_token_bytes).
    #[must_use]
    pub fn max_token_bytes(mut self, max_token_bytes: usize) -> Self {
        self.max_token_bytes = max_token_bytes;
        self
    }
}

impl fmt::Debug for SignedCodecConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let previous: Vec<Redacted> = self.previous_secrets.iter().map(|s| Redacted(s.len())).collect();
        f.debug_struct("SignedCodecConfig")
            .field("secret", &Redacted(self.secret.len()))
            .field("previous_secrets", &previous)
            .field("max_age", &self.max_age)
            .field("clock_skew", &self.clock_skew)
            .field("max_token_bytes", &self.max_token_bytes)
            .finish()
    }
}

/// Debug stand-in for a secret: shows only its length.
struct Redacted(usize);

impl fmt::Debug for Redacted {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "<redacted {} bytes>", self.0)
    }
}

/// The authenticated header of a token, as returned by [`SignedCodec::decode_unscoped`].
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

/// Signs continuation state into tokens and verifies them (HMAC-SHA256).
///
/// Tokens are authenticated, not encrypted: whoever holds a token can read the state.
/// Cheap to clone; `Debug` never shows secret material. The raw secrets are not kept, only
/// the keyed HMAC states derived from them.
#[derive(Clone)]
pub struct SignedCodec {
    /// Keyed with the current secret; signs and verifies.
    signing: HmacSha256,
    /// Keyed with the previous secrets; verify only.
    previous: Vec<HmacSha256>,
    /// As configured.
    max_age: Duration,
    /// As configured.
    clock_skew: Duration,
    /// `max_age` in whole seconds (token times are whole seconds).
    max_age_secs: u64,
    /// `clock_skew` in whole seconds.
    clock_skew_secs: u64,
    /// As configured; greater than 0.
    max_token_bytes: usize,
}

impl fmt::Debug for SignedCodec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SignedCodec")
            .field("algorithm", &TOKEN_ALGORITHM)
            .field("previous_secrets", &self.previous.len())
            .field("max_age", &self.max_age)
            .field("clock_skew", &self.clock_skew)
            .field("max_token_bytes", &self.max_token_bytes)
            .finish_non_exhaustive()
    }
}

impl SignedCodec {
    /// Builds a codec, checking the configuration: every secret at least
    /// [`MIN_SECRET_BYTES`] bytes, `max_age` at least one second, `max_token_bytes` > 0.
    ///
    /// # Errors
    ///
    /// A [`CodecConfigError`] naming the first setting that is out of range (secrets are
    /// identified by position and length only).
    pub fn new(config: SignedCodecConfig) -> Result<Self, CodecConfigError> {
        if config.secret.len() < MIN_SECRET_BYTES {
            return Err(CodecConfigError(format!(
                "continuation secret must be at least {MIN_SECRET_BYTES} bytes (got {})",
                config.secret.len()
            )));
        }
        for (index, secret) in config.previous_secrets.iter().enumerate() {
            if secret.len() < MIN_SECRET_BYTES {
                return Err(CodecConfigError(format!(
                    "previous continuation secret #{} must be at least {MIN_SECRET_BYTES} bytes (got {})",
                    index + 1,
                    secret.len()
                )));
            }
        }
        if config.max_token_bytes == 0 {
            return Err(CodecConfigError("continuation max_token_bytes must be greater than 0".to_owned()));
        }
        if config.max_age.as_secs() == 0 {
            return Err(CodecConfigError("continuation max_age must be at least 1 second".to_owned()));
        }
        let signing = keyed(&config.secret)?;
        let previous = config.previous_secrets.iter().map(|secret| keyed(secret)).collect::<Result<Vec<_>, _>>()?;
        Ok(Self {
            signing,
            previous,
            max_age: config.max_age,
            clock_skew: config.clock_skew,
            max_age_secs: config.max_age.as_secs(),
            clock_skew_secs: config.clock_skew.as_secs(),
            max_token_bytes: config.max_token_bytes,
        })
    }

    /// The configured maximum token age (also the lifetime given to new tokens).
    #[must_use]
    pub fn max_age(&self) -> Duration {
        self.max_age
    }

    /// The configured clock skew tolerance.
    #[must_use]
    pub fn clock_skew(&self) -> Duration {
        self.clock_skew
    }

    /// The configured maximum token size in bytes.
    #[must_use]
    pub fn max_token_bytes(&self) -> usize {
        self.max_token_bytes
    }

    /// Signs `state` (opaque bytes) for `audience` at time `now`, with the current secret.
    ///
    /// The token expires at `now + max_age`. A token longer than `max_token_bytes` can be
    /// produced but will be rejected by [`decode`](Self::decode); callers that must know
    /// beforehand can compare the returned length.
    ///
    /// # Panics
    ///
    /// Only if the operating system's random number generator fails (needed for the nonce).
    #[must_use]
    pub fn encode(&self, state: &[u8], audience: &str, now: SystemTime) -> String {
        let issued_at = unix_seconds(now);
        let expires_at = issued_at.saturating_add(self.max_age_secs);
        let nonce = new_nonce();
        let header = canonical_header(audience, expires_at, issued_at, &nonce);
        self.sign_parts(header.as_bytes(), state)
    }

    /// Verifies `token` for `audience` at time `now` and returns the state bytes.
    ///
    /// # Errors
    ///
    /// A [`TokenError`] whose [`reason`](TokenError::reason) is the first check that failed,
    /// in the order given in the [module documentation](super).
    pub fn decode(&self, token: &str, audience: &str, now: SystemTime) -> Result<Vec<u8>, TokenError> {
        let (header, state) = self.authenticate(token)?;
        if header.audience != audience {
            return Err(TokenRejection::WrongAudience.into());
        }
        self.check_times(&header, now)?;
        Ok(state)
    }

    /// Verifies `token` at time `now` like [`decode`](Self::decode), but without checking the
    /// audience, and returns the header along with the state (for inspection, or to route a
    /// token to its tenant before a scoped decode).
    ///
    /// # Errors
    ///
    /// As for [`decode`](Self::decode), except that [`TokenRejection::WrongAudience`] is never
    /// returned.
    pub fn decode_unscoped(&self, token: &str, now: SystemTime) -> Result<(TokenHeader, Vec<u8>), TokenError> {
        let (header, state) = self.authenticate(token)?;
        self.check_times(&header, now)?;
        Ok((header, state))
    }

    /// `base64url(header).base64url(state).base64url(mac)`; the MAC is computed over the
    /// first two parts as they appear in the output, without an intermediate copy.
    fn sign_parts(&self, header: &[u8], state: &[u8]) -> String {
        let capacity = base64::encoded_len(header.len(), false)
            .zip(base64::encoded_len(state.len(), false))
            .and_then(|(h, s)| h.checked_add(s)?.checked_add(2 + MAC_CHARS))
            .unwrap_or(0);
        let mut out = String::with_capacity(capacity);
        URL_SAFE_NO_PAD.encode_string(header, &mut out);
        out.push('.');
        URL_SAFE_NO_PAD.encode_string(state, &mut out);
        let mut mac = self.signing.clone();
        mac.update(out.as_bytes());
        let tag = mac.finalize().into_bytes();
        out.push('.');
        URL_SAFE_NO_PAD.encode_string(tag.as_slice(), &mut out);
        out
    }

    /// Size, shape, MAC, then header; everything except audience and times.
    fn authenticate(&self, token: &str) -> Result<(TokenHeader, Vec<u8>), TokenRejection> {
        if token.len() > self.max_token_bytes {
            return Err(TokenRejection::TooLarge);
        }
        let (header_part, rest) = token.split_once('.').ok_or(TokenRejection::Malformed)?;
        let (state_part, mac_part) = rest.split_once('.').ok_or(TokenRejection::Malformed)?;
        if mac_part.contains('.') {
            return Err(TokenRejection::Malformed);
        }
        let header_bytes = decode_part(header_part)?;
        let state = decode_part(state_part)?;
        let tag = decode_part(mac_part)?;
        if tag.len() != MAC_BYTES {
            return Err(TokenRejection::Malformed);
        }
        // `header_part.state_part` is a prefix of the token: MAC it in place.
        let signed_len = header_part.len() + 1 + state_part.len();
        let signed = token.as_bytes().get(..signed_len).ok_or(TokenRejection::Malformed)?;
        if !self.signature_matches(signed, &tag) {
            return Err(TokenRejection::BadSignature);
        }
        let header = parse_header(&header_bytes)?;
        Ok((header, state))
    }

    /// Constant-time check of `tag` under the current secret, then each previous secret.
    fn signature_matches(&self, signed: &[u8], tag: &[u8]) -> bool {
        std::iter::once(&self.signing).chain(self.previous.iter()).any(|key| {
            let mut mac = key.clone();
            mac.update(signed);
            mac.verify_slice(tag).is_ok()
        })
    }

    /// Expiry, then issue time in the future, then maximum age.
    fn check_times(&self, header: &TokenHeader, now: SystemTime) -> Result<(), TokenRejection> {
        let now = unix_seconds(now);
        let skew = self.clock_skew_secs;
        if now > header.expires_at.saturating_add(skew) {
            return Err(TokenRejection::Expired);
        }
        if header.issued_at > now.saturating_add(skew) {
            return Err(TokenRejection::IssuedInFuture);
        }
        if now.saturating_sub(header.issued_at) > self.max_age_secs.saturating_add(skew) {
            return Err(TokenRejection::TooOld);
        }
        Ok(())
    }
}

/// An HMAC-SHA256 state keyed with `secret`.
fn keyed(secret: &[u8]) -> Result<HmacSha256, CodecConfigError> {
    HmacSha256::new_from_slice(secret)
        .map_err(|_| CodecConfigError("continuation secret cannot key HMAC-SHA256".to_owned()))
}

/// Seconds since the Unix epoch; 0 for times before it.
fn unix_seconds(time: SystemTime) -> u64 {
    time.duration_since(UNIX_EPOCH).map_or(0, |elapsed| elapsed.as_secs())
}

/// 16 random bytes from the operating system, base64url-encoded (22 characters).
fn new_nonce() -> String {
    let mut bytes = [0u8; NONCE_BYTES];
    if let Err(err) = getrandom::fill(&mut bytes) {
        panic!("operating system random number generator failed: {err}");
    }
    URL_SAFE_NO_PAD.encode(bytes)
}

/// Whether `byte` belongs to the base64url alphabet (RFC 4648 §5).
#[cfg(test)]
fn is_base64url_byte(byte: u8) -> bool {
    byte.is_ascii_alphanumeric() || byte == b'-' || byte == b'_'
}

/// Strict base64url: URL-safe alphabet only, no padding, no whitespace, canonical trailing
/// bits (so every byte string has exactly one accepted encoding).
fn decode_part(part: &str) -> Result<Vec<u8>, TokenRejection> {
    // The engine refuses every byte outside the URL-safe alphabet (padding and
    // whitespace included) and non-canonical trailing bits.
    URL_SAFE_NO_PAD.decode(part).map_err(|_| TokenRejection::Malformed)
}

/// Whether `nonce` is 22 strict base64url characters encoding 16 bytes.
fn is_valid_nonce(nonce: &str) -> bool {
    nonce.len() == NONCE_CHARS && decode_part(nonce).is_ok_and(|bytes| bytes.len() == NONCE_BYTES)
}

/// The canonical header JSON: keys sorted, no whitespace, `serde_json` string escaping.
fn canonical_header(audience: &str, expires_at: u64, issued_at: u64, nonce: &str) -> String {
    let mut out = String::with_capacity(120 + audience.len());
    out.push_str("{\"alg\":");
    push_json_string(&mut out, TOKEN_ALGORITHM);
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

/// Parses an authenticated header. See the module documentation for the rules.
fn parse_header(bytes: &[u8]) -> Result<TokenHeader, TokenRejection> {
    let value: Value = serde_json::from_slice(bytes).map_err(|_| TokenRejection::Malformed)?;
    let Value::Object(map) = value else {
        return Err(TokenRejection::Malformed);
    };
    let format_supported = map.get("fmt").and_then(Value::as_str) == Some(TOKEN_FORMAT)
        && map.get("v").and_then(Value::as_u64) == Some(TOKEN_VERSION)
        && map.get("alg").and_then(Value::as_str) == Some(TOKEN_ALGORITHM)
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
    if canonical_header(audience, expires_at, issued_at, nonce).as_bytes() != bytes {
        return Err(TokenRejection::NonCanonical);
    }
    if expires_at < issued_at {
        return Err(TokenRejection::Malformed);
    }
    Ok(TokenHeader { issued_at, expires_at, audience: audience.to_owned(), nonce: nonce.to_owned() })
}

#[cfg(test)]
mod tests;
