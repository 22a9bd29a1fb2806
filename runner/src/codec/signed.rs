//! The signed (HMAC-SHA256) continuation codec. See the [module documentation](super) for
//! the token format and the verification order.

use std::fmt;
use std::ops::Range;
use std::time::{Duration, SystemTime};

use hmac::{Hmac, KeyInit, Mac};
use sha2::{Digest, Sha256};

use super::config::{CodecConfig, Policy};
use super::envelope::{self, TokenHeader, decode_part, decode_part_append, split_parts};
#[cfg(test)]
use super::envelope::{TOKEN_FORMAT, is_base64url_byte};
use super::error::{CodecConfigError, TokenError, TokenRejection};

/// The MAC of the `HS256` algorithm.
type HmacSha256 = Hmac<Sha256>;

/// The value of the signed codec's header `alg` field: HMAC-SHA256 over the header and the
/// SHA-256 digests of the state's chunks (see the [module documentation](super)).
pub const TOKEN_ALGORITHM: &str = "HS256-CHUNKED";

/// The `alg` of tokens from earlier versions, whose HMAC-SHA256 covers the whole state part;
/// still verified.
pub(crate) const WHOLE_STATE_ALGORITHM: &str = "HS256";

/// Length of an HMAC-SHA256 tag, and of a SHA-256 digest.
const MAC_BYTES: usize = 32;

/// How many bytes of state each digest of a token covers (the last chunk may be shorter).
pub(crate) const CHUNK_BYTES: usize = 48 * 1024;

/// The base64url characters of a chunk: exactly 64 KiB, and a multiple of 4, so that chunks
/// decode one at a time.
const CHUNK_CHARS: usize = CHUNK_BYTES / 3 * 4;

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
        Ok(self.authenticate(token, Some(audience), now)?.1)
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
        self.authenticate(token, None, now)
    }

    /// `base64url(header).base64url(state).base64url(tag ‖ digests)`: one SHA-256 digest per
    /// [`CHUNK_BYTES`] of state, and the HMAC of the header part, a `.`, then the digests.
    fn sign_parts(&self, header: &[u8], state: &[u8]) -> String {
        let digests = chunk_digests(state);
        let capacity = envelope::encoded_len(header.len())
            .saturating_add(envelope::encoded_len(state.len()))
            .saturating_add(2 + envelope::encoded_len(MAC_BYTES + digests.len()));
        let mut out = String::with_capacity(capacity);
        envelope::encode_part_into(header, &mut out);
        out.push('.');
        let mut mac = self.signing.clone();
        mac.update(out.as_bytes());
        mac.update(&digests);
        let mut tail = mac.finalize().into_bytes().to_vec();
        tail.extend_from_slice(&digests);
        envelope::encode_part_into(state, &mut out);
        out.push('.');
        envelope::encode_part_into(&tail, &mut out);
        out
    }

    /// Verifies `token` for `audience` at time `now`, like [`decode`](Self::decode), but leaves
    /// the state of a current token to be decoded and authenticated chunk by chunk
    /// ([`SignedState::Chunked`]), for a reader that uses the start of a large state while the
    /// rest is still being decoded. A token of an earlier version, whose single MAC covers the
    /// whole state, comes decoded.
    ///
    /// # Errors
    ///
    /// The rejection [`decode`](Self::decode) gives the token, except for those of the chunks
    /// of its state, which [`ChunkedState`] gives.
    pub(crate) fn open(&self, token: &str, audience: &str, now: SystemTime) -> Result<SignedState, TokenError> {
        Ok(self.verify_all_but_chunks(token, Some(audience), now)?.1)
    }

    /// Size, shape, MAC, header, then (with `audience`, unless `None`) audience and times, then
    /// the state.
    fn authenticate(
        &self,
        token: &str,
        audience: Option<&str>,
        now: SystemTime,
    ) -> Result<(TokenHeader, Vec<u8>), TokenError> {
        let (header, state) = self.verify_all_but_chunks(token, audience, now)?;
        let state = match state {
            SignedState::Decoded(state) => state,
            SignedState::Chunked(mut chunked) => {
                let mut state = Vec::with_capacity(chunked.len());
                while chunked.next_chunk(token, &mut state)? {}
                state
            }
        };
        Ok((header, state))
    }

    /// Everything [`authenticate`](Self::authenticate) checks but the chunks of a current
    /// token's state; a token of an earlier version has its state part decoded before its MAC.
    fn verify_all_but_chunks(
        &self,
        token: &str,
        audience: Option<&str>,
        now: SystemTime,
    ) -> Result<(TokenHeader, SignedState), TokenError> {
        let signed = self.split(token)?;
        let (header, state) = if signed.digests.is_empty() {
            let state = decode_part(&token[signed.state_part.clone()])?;
            (self.verify(token, &signed)?, SignedState::Decoded(state))
        } else {
            (self.verify(token, &signed)?, SignedState::Chunked(ChunkedState::new(signed)))
        };
        self.policy.accept(&header, audience, now)?;
        Ok((header, state))
    }

    /// Size and shape: the header and MAC parts decoded, the digests as many as the state
    /// part has chunks, and where the state part lies in the token; nothing authenticated yet.
    fn split(&self, token: &str) -> Result<Signed, TokenRejection> {
        self.policy.check_size(token)?;
        let [header_part, state_part, mac_part] = split_parts(token)?;
        let header = decode_part(header_part)?;
        let mut mac = decode_part(mac_part)?;
        if mac.len() < MAC_BYTES || mac.len() % MAC_BYTES != 0 {
            return Err(TokenRejection::Malformed);
        }
        let digests = mac.split_off(MAC_BYTES);
        let tag = mac.try_into().map_err(|_| TokenRejection::Malformed)?;
        let state_bytes = decoded_len(state_part.len()).ok_or(TokenRejection::Malformed)?;
        if !digests.is_empty() && digests.len() != chunk_count(state_bytes) * MAC_BYTES {
            return Err(TokenRejection::Malformed);
        }
        let state_start = header_part.len() + 1;
        Ok(Signed { header, tag, digests, state_part: state_start..state_start + state_part.len() })
    }

    /// The MAC of `token` (split into `signed`), then its header, whose `alg` must name the
    /// MAC's construction.
    fn verify(&self, token: &str, signed: &Signed) -> Result<TokenHeader, TokenRejection> {
        let (covered, algorithm): ([&[u8]; 2], _) = if signed.digests.is_empty() {
            // `header_part.state_part` is a prefix of the token: MAC it in place.
            let prefix = token.as_bytes().get(..signed.state_part.end).ok_or(TokenRejection::Malformed)?;
            ([prefix, &[]], WHOLE_STATE_ALGORITHM)
        } else {
            // `header_part.` is a prefix of the token, the digests follow it.
            let prefix = token.as_bytes().get(..signed.state_part.start).ok_or(TokenRejection::Malformed)?;
            ([prefix, &signed.digests], TOKEN_ALGORITHM)
        };
        if !self.signature_matches(&covered, &signed.tag) {
            return Err(TokenRejection::BadSignature);
        }
        envelope::parse_header(&signed.header, algorithm)
    }

    /// Constant-time check of `tag` under the current secret, then each previous secret.
    fn signature_matches(&self, signed: &[&[u8]], tag: &[u8]) -> bool {
        std::iter::once(&self.signing).chain(self.previous.iter()).any(|key| {
            let mut mac = key.clone();
            for part in signed {
                mac.update(part);
            }
            mac.verify_slice(tag).is_ok()
        })
    }
}

/// The state of a token that [`SignedCodec::open`] verified.
#[derive(Debug)]
pub(crate) enum SignedState {
    /// Decoded and authenticated (a token of an earlier version).
    Decoded(Vec<u8>),
    /// Still to decode and authenticate, chunk by chunk.
    Chunked(ChunkedState),
}

/// The state of a token that [`SignedCodec::open`] authenticated but for its state
/// part, which is decoded and authenticated a chunk at a time as it is needed.
#[derive(Debug)]
pub(crate) struct ChunkedState {
    /// Where the state part lies in the token.
    state_part: Range<usize>,
    /// The authenticated SHA-256 digest of each chunk, one after the other.
    digests: Vec<u8>,
    /// How many chunks are decoded and authenticated.
    verified: usize,
    /// Why a chunk was refused; every later call refuses with it.
    refused: Option<TokenRejection>,
}

impl ChunkedState {
    fn new(signed: Signed) -> Self {
        ChunkedState { state_part: signed.state_part, digests: signed.digests, verified: 0, refused: None }
    }

    /// How many bytes the whole state has.
    pub(crate) fn len(&self) -> usize {
        decoded_len(self.state_part.len()).unwrap_or(0)
    }

    /// Decodes the next chunk of the state part of `token` (the token this was opened from),
    /// appends it to `state` (which holds the chunks before it) and authenticates it; `false`
    /// once every chunk is.
    ///
    /// # Errors
    ///
    /// [`TokenRejection::Malformed`] if the chunk is not strict base64url,
    /// [`TokenRejection::BadSignature`] if it is not the chunk the token was signed with; then
    /// the same error for every later call.
    pub(crate) fn next_chunk(&mut self, token: &str, state: &mut Vec<u8>) -> Result<bool, TokenRejection> {
        if let Some(refused) = self.refused {
            return Err(refused);
        }
        let index = self.verified;
        let Some(expected) = self.digests.get(index * MAC_BYTES..(index + 1) * MAC_BYTES) else {
            return Ok(false);
        };
        let start = self.state_part.start + index * CHUNK_CHARS;
        let text = token.get(start..self.state_part.end.min(start + CHUNK_CHARS));
        let decoded = state.len();
        let checked = match text.map(|text| decode_part_append(text, state)) {
            Some(Ok(())) if Sha256::digest(&state[decoded..]).as_slice() == expected => Ok(true),
            Some(Ok(())) => Err(TokenRejection::BadSignature),
            Some(Err(rejection)) => Err(rejection),
            None => Err(TokenRejection::Malformed),
        };
        match checked {
            Ok(_) => self.verified += 1,
            Err(rejection) => self.refused = Some(rejection),
        }
        checked
    }
}

/// The SHA-256 digests of the chunks of `state`, one after the other (an empty state is one
/// empty chunk).
fn chunk_digests(state: &[u8]) -> Vec<u8> {
    if state.is_empty() {
        return Sha256::digest(state).to_vec();
    }
    state.chunks(CHUNK_BYTES).flat_map(Sha256::digest).collect()
}

/// How many chunks a state of `len` bytes has (an empty state has one).
fn chunk_count(len: usize) -> usize {
    len.div_ceil(CHUNK_BYTES).max(1)
}

/// The length of what `chars` characters of base64url (no padding) decode to; `None` for a
/// length that no encoding has.
fn decoded_len(chars: usize) -> Option<usize> {
    match chars % 4 {
        1 => None,
        rest => Some(chars / 4 * 3 + rest.saturating_sub(1)),
    }
}

/// What the MAC of a token covers and claims, decoded but not authenticated.
struct Signed {
    /// The decoded header part.
    header: Vec<u8>,
    /// The decoded MAC.
    tag: [u8; MAC_BYTES],
    /// The digests of the state's chunks; empty for a token of an earlier version, whose MAC
    /// covers the whole state part.
    digests: Vec<u8>,
    /// Where the state part lies in the token.
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
