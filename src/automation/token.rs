//! Hook tokens of automations: derived from the server's secret, the automation and the round,
//! so the server can find the hook of a round again while nobody else can guess it.

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;

/// Derives hook tokens from a secret.
#[derive(Clone)]
pub struct HookTokens {
    secret: Vec<u8>,
}

impl std::fmt::Debug for HookTokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("HookTokens(..)")
    }
}

impl HookTokens {
    /// Tokens derived from `secret` (at least 32 bytes).
    pub fn new(secret: &[u8]) -> HookTokens {
        HookTokens { secret: secret.to_vec() }
    }

    /// The token of the hook of `round` of automation `automation_id`.
    pub fn for_round(&self, automation_id: &str, round: u32) -> String {
        let mut mac = <Hmac<Sha256> as KeyInit>::new_from_slice(&self.secret).expect("HMAC takes keys of any length");
        mac.update(b"resumable automation hook\0");
        mac.update(automation_id.as_bytes());
        mac.update(b"\0");
        mac.update(&round.to_be_bytes());
        format!("ah_{}", URL_SAFE_NO_PAD.encode(mac.finalize().into_bytes()))
    }

    /// The token of the hook through which session `session_id` receives its commands.
    pub fn for_session(&self, session_id: &str) -> String {
        let mut mac = <Hmac<Sha256> as KeyInit>::new_from_slice(&self.secret).expect("HMAC takes keys of any length");
        mac.update(b"resumable session hook\0");
        mac.update(session_id.as_bytes());
        format!("sh_{}", URL_SAFE_NO_PAD.encode(mac.finalize().into_bytes()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_depend_on_secret_automation_and_round() {
        let a = HookTokens::new(&[1; 32]);
        let b = HookTokens::new(&[2; 32]);
        assert_eq!(a.for_round("run_1", 1), a.for_round("run_1", 1));
        assert_ne!(a.for_round("run_1", 1), a.for_round("run_1", 2));
        assert_ne!(a.for_round("run_1", 1), a.for_round("run_2", 1));
        assert_ne!(a.for_round("run_1", 1), b.for_round("run_1", 1));
        assert!(a.for_round("run_1", 1).len() > 40);
        assert_ne!(a.for_session("run_1"), b.for_session("run_1"));
        assert_ne!(a.for_session("run_1"), a.for_session("run_2"));
    }
}
