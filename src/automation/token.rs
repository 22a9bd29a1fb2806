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
        self.derive("ah_", b"resumable automation hook", &[automation_id.as_bytes(), &round.to_be_bytes()])
    }

    /// The token of the hook through which session `session_id` receives its commands.
    pub fn for_session(&self, session_id: &str) -> String {
        self.derive("sh_", b"resumable session hook", &[session_id.as_bytes()])
    }

    /// The token of the hook through which the deliveries of webhook `subscription` for
    /// automation `automation_id` receive its events.
    pub fn for_webhook(&self, subscription: &str, automation_id: &str) -> String {
        self.derive("wh_", b"resumable webhook hook", &[subscription.as_bytes(), automation_id.as_bytes()])
    }

    /// `prefix` and the MAC of `label` and `parts`, each part after a NUL.
    fn derive(&self, prefix: &str, label: &[u8], parts: &[&[u8]]) -> String {
        let mut mac = <Hmac<Sha256> as KeyInit>::new_from_slice(&self.secret).expect("HMAC takes keys of any length");
        mac.update(label);
        for part in parts {
            mac.update(b"\0");
            mac.update(part);
        }
        format!("{prefix}{}", URL_SAFE_NO_PAD.encode(mac.finalize().into_bytes()))
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
        assert_ne!(a.for_webhook("ops", "run_1"), a.for_webhook("ops", "run_2"));
        assert_ne!(a.for_webhook("ops", "run_1"), a.for_webhook("dev", "run_1"));
    }
}
