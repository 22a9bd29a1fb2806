//! Errors of the continuation codecs.

use std::fmt;

/// A codec configuration that cannot be used (for example a secret that is too short).
///
/// The message says what is wrong; it never contains secret material.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CodecConfigError(pub String);

impl fmt::Display for CodecConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for CodecConfigError {}

/// Why a continuation token was rejected.
///
/// The variants are listed in the order in which a decoder checks them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum TokenRejection {
    /// The token is longer than the configured maximum size.
    TooLarge,
    /// The token is not three strict base64url parts, a part does not decode, the MAC has the
    /// wrong length, or the (authenticated) header is not a well-formed header.
    Malformed,
    /// The MAC does not match under the current secret nor any previous secret.
    BadSignature,
    /// The authenticated header names another format, version or algorithm, or has fields
    /// this version does not know.
    UnsupportedFormat,
    /// The authenticated header is not in canonical form (key order, whitespace, escaping,
    /// duplicate keys, ...).
    NonCanonical,
    /// The token was issued for another audience.
    WrongAudience,
    /// The token's expiry time (plus the allowed clock skew) has passed.
    Expired,
    /// The token's issue time is later than now plus the allowed clock skew.
    IssuedInFuture,
    /// The token was issued longer ago than the configured maximum age (plus clock skew).
    TooOld,
}

impl TokenRejection {
    /// Every rejection reason, in checking order.
    pub const ALL: [TokenRejection; 9] = [
        TokenRejection::TooLarge,
        TokenRejection::Malformed,
        TokenRejection::BadSignature,
        TokenRejection::UnsupportedFormat,
        TokenRejection::NonCanonical,
        TokenRejection::WrongAudience,
        TokenRejection::Expired,
        TokenRejection::IssuedInFuture,
        TokenRejection::TooOld,
    ];

    /// A stable `snake_case` identifier, suitable for logs, metrics and API error details.
    #[must_use]
    pub fn as_str(&self) -> &'static str {
        match self {
            TokenRejection::TooLarge => "too_large",
            TokenRejection::Malformed => "malformed",
            TokenRejection::BadSignature => "bad_signature",
            TokenRejection::UnsupportedFormat => "unsupported_format",
            TokenRejection::NonCanonical => "non_canonical",
            TokenRejection::WrongAudience => "wrong_audience",
            TokenRejection::Expired => "expired",
            TokenRejection::IssuedInFuture => "issued_in_future",
            TokenRejection::TooOld => "too_old",
        }
    }

    /// A short human-readable explanation.
    #[must_use]
    pub fn description(&self) -> &'static str {
        match self {
            TokenRejection::TooLarge => "token is larger than the maximum size",
            TokenRejection::Malformed => "token is malformed",
            TokenRejection::BadSignature => "token signature is invalid",
            TokenRejection::UnsupportedFormat => "token format or version is not supported",
            TokenRejection::NonCanonical => "token header is not canonical",
            TokenRejection::WrongAudience => "token was issued for another audience",
            TokenRejection::Expired => "token has expired",
            TokenRejection::IssuedInFuture => "token was issued in the future",
            TokenRejection::TooOld => "token is older than the maximum age",
        }
    }
}

impl fmt::Display for TokenRejection {
    /// Writes the stable identifier ([`TokenRejection::as_str`]).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A continuation token that was rejected by a codec.
///
/// Deliberately carries no detail beyond the reason: the token itself must never be logged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenError {
    /// Why the token was rejected.
    pub reason: TokenRejection,
}

impl TokenError {
    /// A rejection for `reason`.
    #[must_use]
    pub fn new(reason: TokenRejection) -> Self {
        Self { reason }
    }
}

impl From<TokenRejection> for TokenError {
    fn from(reason: TokenRejection) -> Self {
        Self { reason }
    }
}

impl fmt::Display for TokenError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "continuation rejected: {}", self.reason.description())
    }
}

impl std::error::Error for TokenError {}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn rejection_strings_are_stable_and_distinct() {
        let strs: Vec<&str> = TokenRejection::ALL.iter().map(TokenRejection::as_str).collect();
        assert_eq!(
            strs,
            [
                "too_large",
                "malformed",
                "bad_signature",
                "unsupported_format",
                "non_canonical",
                "wrong_audience",
                "expired",
                "issued_in_future",
                "too_old",
            ]
        );
        let unique: HashSet<&str> = strs.iter().copied().collect();
        assert_eq!(unique.len(), TokenRejection::ALL.len());
        let descriptions: HashSet<&str> = TokenRejection::ALL.iter().map(TokenRejection::description).collect();
        assert_eq!(descriptions.len(), TokenRejection::ALL.len());
    }

    #[test]
    fn token_error_display() {
        let err = TokenError::new(TokenRejection::Expired);
        assert_eq!(err.to_string(), "continuation rejected: token has expired");
        assert_eq!(TokenRejection::Expired.to_string(), "expired");
        let as_dyn: &dyn std::error::Error = &err;
        assert!(as_dyn.source().is_none());
        assert_eq!(TokenError::from(TokenRejection::TooOld).reason, TokenRejection::TooOld);
    }

    #[test]
    fn config_error_display() {
        let err = CodecConfigError("continuation secret must be at least 32 bytes (got 5)".into());
        assert_eq!(err.to_string(), "continuation secret must be at least 32 bytes (got 5)");
    }
}
