//! The sealed (AES-256-GCM) continuation codec. See the [module documentation](super) for
//! the token format, the key derivation and the verification order.

use std::fmt;
use std::time::{Duration, SystemTime};

use ring::aead::{self, AES_256_GCM, Aad, LessSafeKey, Nonce, UnboundKey};
use ring::{digest, hkdf};

use super::config::{CodecConfig, Policy};
use super::envelope::{self, TokenHeader, decode_part, decode_part_into, split_parts};
use super::error::{CodecConfigError, TokenError, TokenRejection};

/// The value of the sealed codec's header `alg` field: AES-256-GCM with a per-token key
/// (see the [module documentation](super)).
pub const SEALED_TOKEN_ALGORITHM: &str = "A256GCM";

/// HKDF-Extract salt that turns a configured secret into this codec's master key. The
/// signed codec uses the raw secret as an HMAC key and never runs HKDF, and every label
/// here names the sealed codec, so the two never share key material even when they are
/// configured with the same secret.
const HKDF_SALT: &[u8] = b"resumable-continuation/sealed/v1/hkdf-salt";

/// HKDF-Expand `info` prefix for the per-token key and nonce; followed by the SHA-256
/// digest of the token's header part.
const TOKEN_KEY_INFO: &[u8] = b"resumable-continuation/sealed/v1/A256GCM/token-key-and-nonce";

/// Length of an AES-256 key.
const KEY_BYTES: usize = 32;

/// Length of the derived per-token key and nonce.
const KEY_AND_NONCE_BYTES: usize = KEY_BYTES + aead::NONCE_LEN;

/// Length of an AES-GCM authentication tag.
const TAG_BYTES: usize = 16;

/// Configuration of a [`SealedCodec`] (the same type as
/// [`SignedCodecConfig`](super::SignedCodecConfig)).
pub type SealedCodecConfig = CodecConfig;

/// Encrypts continuation state into tokens and decrypts them (AES-256-GCM, keys derived
/// with HKDF-SHA256).
///
/// Unlike the [`SignedCodec`](super::SignedCodec), whoever holds a token learns nothing of
/// the state (beyond its length); the header (audience, times, nonce) stays readable and
/// is authenticated. Cheap to clone; `Debug` never shows secret material. The raw secrets
/// are not kept, only the HKDF master keys extracted from them.
#[derive(Clone)]
pub struct SealedCodec {
    /// Extracted from the current secret; encrypts and decrypts.
    current: hkdf::Prk,
    /// Extracted from the previous secrets; decrypt only.
    previous: Vec<hkdf::Prk>,
    /// Validated limits.
    policy: Policy,
}

impl fmt::Debug for SealedCodec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SealedCodec")
            .field("algorithm", &SEALED_TOKEN_ALGORITHM)
            .field("previous_secrets", &self.previous.len())
            .field("max_age", &self.policy.max_age())
            .field("clock_skew", &self.policy.clock_skew())
            .field("max_token_bytes", &self.policy.max_token_bytes())
            .finish_non_exhaustive()
    }
}

impl SealedCodec {
    /// Builds a codec, checking the configuration: every secret at least
    /// [`MIN_SECRET_BYTES`](super::MIN_SECRET_BYTES) bytes, `max_age` at least one second,
    /// `max_token_bytes` > 0.
    ///
    /// # Errors
    ///
    /// A [`CodecConfigError`] naming the first setting that is out of range (secrets are
    /// identified by position and length only).
    pub fn new(config: SealedCodecConfig) -> Result<Self, CodecConfigError> {
        let policy = Policy::new(&config)?;
        let salt = hkdf::Salt::new(hkdf::HKDF_SHA256, HKDF_SALT);
        let current = salt.extract(&config.secret);
        let previous = config.previous_secrets.iter().map(|secret| salt.extract(secret)).collect();
        Ok(Self { current, previous, policy })
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

    /// Encrypts `state` (opaque bytes) for `audience` at time `now`, under the current
    /// secret.
    ///
    /// The token expires at `now + max_age`. A token longer than `max_token_bytes` can be
    /// produced but will be rejected by [`decode`](Self::decode); callers that must know
    /// beforehand can compare the returned length.
    ///
    /// # Panics
    ///
    /// Only if the operating system's random number generator fails (needed for the nonce),
    /// or if `state` is longer than AES-GCM allows (about 64 GiB).
    #[must_use]
    pub fn encode(&self, state: &[u8], audience: &str, now: SystemTime) -> String {
        let header = self.policy.new_header(SEALED_TOKEN_ALGORITHM, audience, now);
        self.seal_parts(header.as_bytes(), state)
    }

    /// Decrypts and verifies `token` for `audience` at time `now` and returns the state
    /// bytes.
    ///
    /// # Errors
    ///
    /// A [`TokenError`] whose [`reason`](TokenError::reason) is the first check that failed,
    /// in the order given in the [module documentation](super). A token that does not
    /// decrypt under any secret is [`TokenRejection::BadSignature`].
    pub fn decode(&self, token: &str, audience: &str, now: SystemTime) -> Result<Vec<u8>, TokenError> {
        let (header, state) = self.open(token)?;
        self.policy.accept(&header, Some(audience), now)?;
        Ok(state)
    }

    /// Decrypts and verifies `token` at time `now` like [`decode`](Self::decode), but without
    /// checking the audience, and returns the header along with the state (for inspection,
    /// or to route a token to its tenant before a scoped decode).
    ///
    /// # Errors
    ///
    /// As for [`decode`](Self::decode), except that [`TokenRejection::WrongAudience`] is never
    /// returned.
    pub fn decode_unscoped(&self, token: &str, now: SystemTime) -> Result<(TokenHeader, Vec<u8>), TokenError> {
        let (header, state) = self.open(token)?;
        self.policy.accept(&header, None, now)?;
        Ok((header, state))
    }

    /// `base64url(header).base64url(ciphertext || tag)`, with the key and nonce derived
    /// from the header part and the header part as associated data.
    fn seal_parts(&self, header: &[u8], state: &[u8]) -> String {
        let sealed_len = state.len().saturating_add(TAG_BYTES);
        let capacity =
            envelope::encoded_len(header.len()).saturating_add(1).saturating_add(envelope::encoded_len(sealed_len));
        let mut out = String::with_capacity(capacity);
        envelope::encode_part_into(header, &mut out);
        let Some((key, nonce)) = token_key(&self.current, out.as_bytes()) else {
            unreachable!("HKDF-SHA256 yields a 44-byte AES-256-GCM key and nonce")
        };
        let mut sealed = Vec::with_capacity(sealed_len);
        sealed.extend_from_slice(state);
        if key.seal_in_place_append_tag(nonce, Aad::from(out.as_bytes()), &mut sealed).is_err() {
            panic!("continuation state of {} bytes is too long for AES-256-GCM", state.len());
        }
        out.push('.');
        envelope::encode_part_into(&sealed, &mut out);
        out
    }

    /// Size, shape, decryption, then header; everything except audience and times.
    fn open(&self, token: &str) -> Result<(TokenHeader, Vec<u8>), TokenRejection> {
        self.policy.check_size(token)?;
        let [header_part, sealed_part] = split_parts(token)?;
        let header_bytes = decode_part(header_part)?;
        let mut buf = decode_part(sealed_part)?;
        if buf.len() < TAG_BYTES {
            return Err(TokenRejection::Malformed);
        }
        let aad = header_part.as_bytes();
        for (index, master) in std::iter::once(&self.current).chain(self.previous.iter()).enumerate() {
            if index > 0 {
                // A failed `open_in_place` zeroes the buffer: decode the ciphertext again.
                decode_part_into(sealed_part, &mut buf)?;
            }
            let Some((key, nonce)) = token_key(master, aad) else {
                return Err(TokenRejection::BadSignature);
            };
            if let Ok(plaintext) = key.open_in_place(nonce, Aad::from(aad), &mut buf) {
                let len = plaintext.len();
                buf.truncate(len);
                let header = envelope::parse_header(&header_bytes, SEALED_TOKEN_ALGORITHM)?;
                return Ok((header, buf));
            }
        }
        Err(TokenRejection::BadSignature)
    }
}

/// The AES-256-GCM key and nonce of the token whose header part (base64url text) is
/// `header_part`: `HKDF-Expand(master, TOKEN_KEY_INFO || SHA-256(header_part), 44)`, the
/// first 32 bytes being the key and the last 12 the nonce. `None` never happens (the
/// lengths are fixed and valid).
fn token_key(master: &hkdf::Prk, header_part: &[u8]) -> Option<(LessSafeKey, Nonce)> {
    let header_digest = digest::digest(&digest::SHA256, header_part);
    let info = [TOKEN_KEY_INFO, header_digest.as_ref()];
    let mut okm = [0u8; KEY_AND_NONCE_BYTES];
    master.expand(&info, OkmLen(KEY_AND_NONCE_BYTES)).ok()?.fill(&mut okm).ok()?;
    let (key, nonce) = okm.split_at(KEY_BYTES);
    let key = LessSafeKey::new(UnboundKey::new(&AES_256_GCM, key).ok()?);
    let nonce = Nonce::try_assume_unique_for_key(nonce).ok()?;
    Some((key, nonce))
}

/// An HKDF output length.
struct OkmLen(usize);

impl hkdf::KeyType for OkmLen {
    fn len(&self) -> usize {
        self.0
    }
}

#[cfg(test)]
mod tests;
