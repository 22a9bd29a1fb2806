//! Continuation codecs.
//!
//! A continuation is the serialized state of a paused run. The runner hands it to an
//! untrusted party (a browser, an approval service, ...) and gets it back later to resume.
//! A codec turns the state bytes into a tamper-proof token and back.
//!
//! # The signed codec
//!
//! [`SignedCodec`] authenticates (but does not encrypt) the state with HMAC-SHA256.
//!
//! ## Token format
//!
//! A token is three base64url parts (RFC 4648 §5, URL-safe alphabet `A-Z a-z 0-9 - _`,
//! no padding, canonical trailing bits) joined by `.`:
//!
//! ```text
//! header.state.mac
//! ```
//!
//! * `header` encodes a canonical JSON object: keys sorted, no whitespace, strings escaped
//!   the way `serde_json` / `JSON.stringify` escape them, exactly these keys:
//!
//!   ```text
//!   {"alg":"HS256","aud":<string>,"exp":<u64>,"fmt":"resumable-continuation","iat":<u64>,"nonce":<string>,"v":1}
//!   ```
//!
//!   `iat` and `exp` are Unix seconds (`exp = iat + max_age`), `aud` is the audience the
//!   token is scoped to (for example a tenant and automation), `nonce` is the 22-character
//!   base64url encoding of 16 random bytes, so two tokens never coincide.
//! * `state` encodes the opaque state bytes.
//! * `mac` encodes `HMAC-SHA256(secret, ASCII(header_part + "." + state_part))` (32 bytes,
//!   43 characters).
//!
//! ## Verification order
//!
//! 1. the raw token length must not exceed `max_token_bytes` ([`TokenRejection::TooLarge`]);
//! 2. exactly three parts, each strict base64url, and a 32-byte MAC
//!    ([`TokenRejection::Malformed`]);
//! 3. the MAC must match under the current secret or one of the previous secrets, compared
//!    in constant time ([`TokenRejection::BadSignature`]);
//! 4. only then is the header parsed: JSON object with the keys above and the right types
//!    ([`TokenRejection::Malformed`]); `fmt`, `v`, `alg` exact and no unknown key
//!    ([`TokenRejection::UnsupportedFormat`]); re-serializing it canonically must reproduce
//!    the header bytes exactly ([`TokenRejection::NonCanonical`]); `exp >= iat`
//!    ([`TokenRejection::Malformed`]);
//! 5. `aud` must equal the expected audience ([`TokenRejection::WrongAudience`]);
//!    skipped by [`SignedCodec::decode_unscoped`];
//! 6. times, with `skew = clock_skew`: `now > exp + skew` is [`TokenRejection::Expired`],
//!    `iat > now + skew` is [`TokenRejection::IssuedInFuture`], `now - iat > max_age + skew`
//!    is [`TokenRejection::TooOld`].
//!
//! Decoding never panics, whatever the input.

mod error;
mod signed;

pub use error::{CodecConfigError, TokenError, TokenRejection};
pub use signed::{
    MIN_SECRET_BYTES, SignedCodec, SignedCodecConfig, TOKEN_ALGORITHM, TOKEN_FORMAT, TOKEN_VERSION, TokenHeader,
};
