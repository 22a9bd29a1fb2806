//! Configuration shared by the signed and the sealed codec, its validation, and the checks
//! that depend on it (token size, audience, times).

use std::fmt;
use std::time::{Duration, SystemTime};

use super::envelope::{self, MIN_SECRET_BYTES, TokenHeader};
use super::error::{CodecConfigError, TokenRejection};

/// Configuration of a continuation codec: [`SignedCodecConfig`](super::SignedCodecConfig)
/// and [`SealedCodecConfig`](super::SealedCodecConfig) are both this type, so one
/// configuration can build either codec.
///
/// Its `Debug` output shows the lengths of the secrets, never their bytes.
#[derive(Clone)]
pub struct CodecConfig {
    /// The current secret (signs or encrypts); at least [`MIN_SECRET_BYTES`] bytes.
    pub secret: Vec<u8>,
    /// Former secrets, accepted for verification / decryption only (key rotation); each at
    /// least [`MIN_SECRET_BYTES`] bytes.
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

impl CodecConfig {
    /// Default [`max_age`](Self::max_age): one hour.
    pub const DEFAULT_MAX_AGE: Duration = Duration::from_secs(60 * 60);
    /// Default [`clock_skew`](Self::clock_skew): 60 seconds.
    pub const DEFAULT_CLOCK_SKEW: Duration = Duration::from_secs(60);
    /// Default [`max_token_bytes`](Self::max_token_bytes): 48 MiB.
    pub const DEFAULT_MAX_TOKEN_BYTES: usize = 48 * 1024 * 1024;

    /// A configuration with current secret `secret`, no previous secrets and default limits.
    /// The secret is validated when a codec is built from it.
    pub fn new(secret: impl Into<Vec<u8>>) -> Self {
        Self {
            secret: secret.into(),
            previous_secrets: Vec::new(),
            max_age: Self::DEFAULT_MAX_AGE,
            clock_skew: Self::DEFAULT_CLOCK_SKEW,
            max_token_bytes: Self::DEFAULT_MAX_TOKEN_BYTES,
        }
    }

    /// Adds a former secret that is still accepted for verification / decryption (never used
    /// to issue tokens).
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

impl fmt::Debug for CodecConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let previous: Vec<Redacted> = self.previous_secrets.iter().map(|s| Redacted(s.len())).collect();
        f.debug_struct("CodecConfig")
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

/// The validated, secret-free part of a [`CodecConfig`]: the limits every codec enforces.
#[derive(Debug, Clone)]
pub(super) struct Policy {
    /// As configured.
    max_age: Duration,
    /// As configured.
    clock_skew: Duration,
    /// `max_age` in whole seconds (token times are whole seconds); at least 1.
    max_age_secs: u64,
    /// `clock_skew` in whole seconds.
    clock_skew_secs: u64,
    /// As configured; greater than 0.
    max_token_bytes: usize,
}

impl Policy {
    /// Checks `config`: every secret at least [`MIN_SECRET_BYTES`] bytes, `max_token_bytes`
    /// greater than 0, `max_age` at least one second (in this order).
    pub(super) fn new(config: &CodecConfig) -> Result<Self, CodecConfigError> {
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
        Ok(Self {
            max_age: config.max_age,
            clock_skew: config.clock_skew,
            max_age_secs: config.max_age.as_secs(),
            clock_skew_secs: config.clock_skew.as_secs(),
            max_token_bytes: config.max_token_bytes,
        })
    }

    /// The configured maximum token age.
    pub(super) fn max_age(&self) -> Duration {
        self.max_age
    }

    /// The configured clock skew tolerance.
    pub(super) fn clock_skew(&self) -> Duration {
        self.clock_skew
    }

    /// The configured maximum token size in bytes.
    pub(super) fn max_token_bytes(&self) -> usize {
        self.max_token_bytes
    }

    /// The canonical header of a new token with algorithm `algorithm`, issued for `audience`
    /// at `now`, expiring `max_age` later, with a fresh random nonce.
    ///
    /// # Panics
    ///
    /// Only if the operating system's random number generator fails.
    pub(super) fn new_header(&self, algorithm: &str, audience: &str, now: SystemTime) -> String {
        let issued_at = envelope::unix_seconds(now);
        let expires_at = issued_at.saturating_add(self.max_age_secs);
        envelope::canonical_header(algorithm, audience, expires_at, issued_at, &envelope::new_nonce())
    }

    /// The first check of every decode: the raw token length.
    pub(super) fn check_size(&self, token: &str) -> Result<(), TokenRejection> {
        if token.len() > self.max_token_bytes { Err(TokenRejection::TooLarge) } else { Ok(()) }
    }

    /// The last checks of every decode, on an authenticated header: the audience (unless
    /// `audience` is `None`), then expiry, issue time in the future, and maximum age.
    pub(super) fn accept(
        &self,
        header: &TokenHeader,
        audience: Option<&str>,
        now: SystemTime,
    ) -> Result<(), TokenRejection> {
        if audience.is_some_and(|audience| header.audience != audience) {
            return Err(TokenRejection::WrongAudience);
        }
        let now = envelope::unix_seconds(now);
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
