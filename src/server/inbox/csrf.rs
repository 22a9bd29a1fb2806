//! CSRF tokens of the inbox's forms: an HMAC of the session cookie's value under a key derived
//! from the server's secret, so a token is valid exactly for the signed-in key that it was made
//! for, survives restarts, and cannot be computed by a page of another site.

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;

/// The name of the hidden form field carrying the token.
pub const FIELD: &str = "csrf";

/// The key CSRF tokens are made with.
#[derive(Clone)]
pub struct CsrfKey([u8; 32]);

impl std::fmt::Debug for CsrfKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("CsrfKey(..)")
    }
}

fn mac(key: &[u8]) -> Hmac<Sha256> {
    <Hmac<Sha256> as KeyInit>::new_from_slice(key).expect("HMAC takes keys of any length")
}

impl CsrfKey {
    /// The key derived from the server's `secret` (domain-separated from the hook tokens).
    pub fn derive(secret: &[u8]) -> CsrfKey {
        let mut m = mac(secret);
        m.update(b"resumable inbox csrf key\0v1");
        CsrfKey(m.finalize().into_bytes().into())
    }

    /// A fresh random key: tokens made with it stop working when the process ends.
    pub fn random() -> CsrfKey {
        let mut key = [0u8; 32];
        if getrandom::fill(&mut key).is_err() {
            // No OS randomness: fall back to the standard library's per-process hash seed and the time.
            use std::hash::{BuildHasher, Hasher};
            let seeded = std::collections::hash_map::RandomState::new().build_hasher().finish();
            let seed = format!("{seeded}:{:?}:{}", std::time::SystemTime::now(), std::process::id());
            return CsrfKey::derive(seed.as_bytes());
        }
        CsrfKey(key)
    }

    fn mac_of(&self, session: &str) -> Hmac<Sha256> {
        let mut m = mac(&self.0);
        m.update(b"csrf\0");
        m.update(session.as_bytes());
        m
    }

    /// The token of the forms shown to the holder of the session cookie value `session`.
    pub fn token(&self, session: &str) -> String {
        URL_SAFE_NO_PAD.encode(self.mac_of(session).finalize().into_bytes())
    }

    /// Whether `token` is the token of `session` (compared in constant time).
    pub fn verify(&self, session: &str, token: &str) -> bool {
        match URL_SAFE_NO_PAD.decode(token.as_bytes()) {
            Ok(bytes) => self.mac_of(session).verify_slice(&bytes).is_ok(),
            Err(_) => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_bound_to_the_session_and_the_key() {
        let key = CsrfKey::derive(&[7; 32]);
        let token = key.token("session-a");
        assert!(key.verify("session-a", &token));
        assert!(!key.verify("session-b", &token));
        assert!(!key.verify("session-a", ""));
        assert!(!key.verify("session-a", "not base64 !"));
        assert!(!key.verify("session-a", &token[..token.len() - 2]));
        assert!(!CsrfKey::derive(&[8; 32]).verify("session-a", &token));
        assert!(!CsrfKey::random().verify("session-a", &token));
        assert_eq!(CsrfKey::derive(&[7; 32]).token("session-a"), token, "derived keys survive restarts");
    }
}
