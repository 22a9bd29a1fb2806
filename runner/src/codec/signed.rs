//! The signed (HMAC-SHA256) continuation codec. See the [module documentation](super) for
//! the token format and the verification order.

use std::fmt;
use std::ops::Range;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;

use super::config::{CodecConfig, Policy};
use super::envelope::{self, TokenHeader, decode_part, split_parts};
#[cfg(test)]
use super::envelope::{TOKEN_FORMAT, is_base64url_byte};
use super::error::{CodecConfigError, TokenError, TokenRejection};

/// The MAC of the `HS256` algorithm.
type HmacSha256 = Hmac<Sha256>;

/// The value of the signed codec's header `alg` field.
pub const TOKEN_ALGORITHM: &str = "HS256";

/// Length of an HMAC-SHA256 tag.
const MAC_BYTES: usize = 32;

/// Length of a base64url (no padding) HMAC-SHA256 tag.
const MAC_CHARS: usize = 43;

/// Configuration of a [`SignedCodec`] (the same type as
/// [`SealedCodecConfig`](super::SealedCodecConfig)).
pub type SignedCodecConfig = CodecConfig;

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
    /// Validated limits.
    policy: Policy,
}

impl fmt::Debug for SignedCodec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SignedCodec")
            .field("algorithm", &TOKEN_ALGORITHM)
            .field("previous_secrets", &self.previous.len())
            .field("max_age", &self.policy.max_age())
            .field("clock_skew", &self.policy.clock_skew())
            .field("max_token_bytes", &self.policy.max_token_bytes())
            .finish_non_exhaustive()
    }
}

impl SignedCodec {
    /// Builds a codec, checking the configuration: every secret at least
    /// [`MIN_SECRET_BYTES`](super::MIN_SECRET_BYTES) bytes, `max_age` at least one second,
    /// `max_token_bytes` > 0.
    ///
    /// # Errors
    ///
    /// A [`CodecConfigError`] naming the first setting that is out of range (secrets are
    /// identified by position and length only).
    pub fn new(config: SignedCodecConfig) -> Result<Self, CodecConfigError> {
        let policy = Policy::new(&config)?;
        let signing = keyed(&config.secret)?;
        let previous = config.previous_secrets.iter().map(|secret| keyed(secret)).collect::<Result<Vec<_>, _>>()?;
        Ok(Self { signing, previous, policy })
    }

    /// The configured maximum token age (also the lifetime given to new tokens).
    #[must_use]
    pub fn max_age(&self) -> Duration {
        self.policy.max_age()
    }

    /// The configured clock skew tolerance.
    #[must_use]
    pub fn clock_skew(&self) -> Duration {
        self.policy.clock_skew()
    }

    /// The configured maximum token size in bytes.
    #[must_use]
    pub fn max_token_bytes(&self) -> usize {
        self.policy.max_token_bytes()
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
        let header = self.policy.new_header(TOKEN_ALGORITHM, audience, now);
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
        self.policy.accept(&header, Some(audience), now)?;
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
        self.policy.accept(&header, None, now)?;
        Ok((header, state))
    }

    /// `base64url(header).base64url(state).base64url(mac)`; the MAC is computed over the
    /// first two parts as they appear in the output, without an intermediate copy.
    fn sign_parts(&self, header: &[u8], state: &[u8]) -> String {
        let capacity = envelope::encoded_len(header.len())
            .saturating_add(envelope::encoded_len(state.len()))
            .saturating_add(2 + MAC_CHARS);
        let mut out = String::with_capacity(capacity);
        envelope::encode_part_into(header, &mut out);
        out.push('.');
        envelope::encode_part_into(state, &mut out);
        let mut mac = self.signing.clone();
        mac.update(out.as_bytes());
        let tag = mac.finalize().into_bytes();
        out.push('.');
        envelope::encode_part_into(tag.as_slice(), &mut out);
        out
    }

    /// Like [`decode`](Self::decode), but checks only the token's size and shape (the header
    /// and MAC parts decoded) at once, and returns where its state part lies, together with the
    /// check that authenticates it: the MAC, then the header (audience and times).
    ///
    /// The caller decodes the state part itself (see [`decode_state_part`]) and must run the
    /// check before anything of the state can matter (reach a script or a host function); a
    /// failed check is the token's rejection, whatever the caller made of the state, and it is
    /// the rejection `decode` gives (a malformed state part before a bad MAC). This lets a
    /// resume decode a large state on one thread while another verifies it.
    pub(crate) fn decode_deferred(
        &self,
        token: &Arc<str>,
        audience: &str,
        now: SystemTime,
    ) -> Result<(Range<usize>, DeferredCheck), TokenError> {
        let signed = self.split(token)?;
        let state_part = signed.state_part.clone();
        let check =
            DeferredCheck { codec: self.clone(), token: Arc::clone(token), signed, audience: audience.to_owned(), now };
        Ok((state_part, check))
    }

    /// Size, shape, MAC, then header; everything except audience and times.
    fn authenticate(&self, token: &str) -> Result<(TokenHeader, Vec<u8>), TokenRejection> {
        let signed = self.split(token)?;
        let state = decode_part(&token[signed.state_part.clone()])?;
        let header = self.verify(token, &signed)?;
        Ok((header, state))
    }

    /// Size and shape: the header and MAC parts decoded, and where the state part lies in the
    /// token; nothing authenticated yet.
    fn split(&self, token: &str) -> Result<Signed, TokenRejection> {
        self.policy.check_size(token)?;
        let [header_part, state_part, mac_part] = split_parts(token)?;
        let header = decode_part(header_part)?;
        let tag = decode_part(mac_part)?.try_into().map_err(|_| TokenRejection::Malformed)?;
        let state_start = header_part.len() + 1;
        Ok(Signed { header, tag, state_part: state_start..state_start + state_part.len() })
    }

    /// The MAC of `token` (split into `signed`), then its header.
    fn verify(&self, token: &str, signed: &Signed) -> Result<TokenHeader, TokenRejection> {
        // `header_part.state_part` is a prefix of the token: MAC it in place.
        let covered = token.as_bytes().get(..signed.state_part.end).ok_or(TokenRejection::Malformed)?;
        if !self.signature_matches(covered, &signed.tag) {
            return Err(TokenRejection::BadSignature);
        }
        envelope::parse_header(&signed.header, TOKEN_ALGORITHM)
    }

    /// Constant-time check of `tag` under the current secret, then each previous secret.
    fn signature_matches(&self, signed: &[u8], tag: &[u8]) -> bool {
        std::iter::once(&self.signing).chain(self.previous.iter()).any(|key| {
            let mut mac = key.clone();
            mac.update(signed);
            mac.verify_slice(tag).is_ok()
        })
    }
}

/// The authentication of a token whose state [`SignedCodec::decode_deferred`] returned early.
pub(crate) struct DeferredCheck {
    codec: SignedCodec,
    token: Arc<str>,
    signed: Signed,
    audience: String,
    now: SystemTime,
}

impl DeferredCheck {
    /// The MAC, then the header, its audience and times.
    ///
    /// # Errors
    ///
    /// The rejection [`SignedCodec::decode`] would give the token.
    pub(crate) fn verify(self) -> Result<(), TokenError> {
        let header = match self.codec.verify(&self.token, &self.signed) {
            Ok(header) => header,
            // `decode` reports a malformed state part before a bad MAC.
            Err(rejection) => {
                return Err(decode_state_part(&self.token, self.signed.state_part).err().unwrap_or(rejection.into()));
            }
        };
        self.codec.policy.accept(&header, Some(&self.audience), self.now)?;
        Ok(())
    }
}

/// The bytes of the state part of `token` at `range` (as [`SignedCodec::decode_deferred`]
/// gives it): strict base64url.
///
/// # Errors
///
/// [`TokenRejection::Malformed`] for anything else.
pub(crate) fn decode_state_part(token: &str, range: Range<usize>) -> Result<Vec<u8>, TokenError> {
    let part = token.get(range).ok_or(TokenRejection::Malformed)?;
    Ok(decode_part(part)?)
}

/// What the MAC of a token covers and claims, decoded but not authenticated.
struct Signed {
    /// The decoded header part.
    header: Vec<u8>,
    /// The decoded MAC.
    tag: [u8; MAC_BYTES],
    /// Where the state part lies in the token; the MAC covers the token up to its end
    /// (`header_part.state_part`).
    state_part: Range<usize>,
}

/// An HMAC-SHA256 state keyed with `secret`.
fn keyed(secret: &[u8]) -> Result<HmacSha256, CodecConfigError> {
    HmacSha256::new_from_slice(secret)
        .map_err(|_| CodecConfigError("continuation secret cannot key HMAC-SHA256".to_owned()))
}

/// The canonical `HS256` header (see [`envelope::canonical_header`]).
#[cfg(test)]
fn canonical_header(audience: &str, expires_at: u64, issued_at: u64, nonce: &str) -> String {
    envelope::canonical_header(TOKEN_ALGORITHM, audience, expires_at, issued_at, nonce)
}

#[cfg(test)]
mod tests;
