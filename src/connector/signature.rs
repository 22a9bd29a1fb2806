//! Standard Webhooks signatures: `v1,` and the base64 of HMAC-SHA256 over `id.timestamp.body`.

use base64::Engine as _;
use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;

/// The HMAC of `id.timestamp.body` under `secret`, not finalized.
fn mac(secret: &[u8], id: &str, timestamp: u64, body: &[u8]) -> Hmac<Sha256> {
    let mut mac = Hmac::<Sha256>::new_from_slice(secret).expect("HMAC takes a key of any length");
    mac.update(format!("{id}.{timestamp}.").as_bytes());
    mac.update(body);
    mac
}

/// The `webhook-signature` header value for a message.
pub fn sign(secret: &[u8], id: &str, timestamp: u64, body: &[u8]) -> String {
    let signature = mac(secret, id, timestamp, body).finalize().into_bytes();
    format!("v1,{}", base64::engine::general_purpose::STANDARD.encode(signature))
}

/// How far a signed message's timestamp may be from now, in seconds, either way.
pub const TOLERANCE_SECS: u64 = 300;

/// Whether `signature` (a `webhook-signature` header: space-separated `v1,<base64>` values)
/// signs `id.timestamp.body` with `secret`, and the timestamp is within [`TOLERANCE_SECS`] of
/// `now` (seconds since the Unix epoch). The comparison takes the same time wherever it differs.
pub fn verify(secret: &[u8], id: &str, timestamp: &str, body: &[u8], signature: &str, now: u64) -> bool {
    let Ok(time) = timestamp.parse::<u64>() else { return false };
    if time.abs_diff(now) > TOLERANCE_SECS {
        return false;
    }
    signature.split(' ').filter_map(|s| s.strip_prefix("v1,")).any(|encoded| {
        let Ok(expected) = base64::engine::general_purpose::STANDARD.decode(encoded) else { return false };
        mac(secret, id, time, body).verify_slice(&expected).is_ok()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_the_standard_webhooks_example() {
        // The example of the Standard Webhooks specification's reference libraries.
        let secret = base64::engine::general_purpose::STANDARD.decode("MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").unwrap();
        let body = br#"{"test": 2432232314}"#;
        let signature = sign(&secret, "msg_p5jXN8AQM9LWM0D4loKWxJek", 1614265330, body);
        assert_eq!(signature, "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=");
        let id = "msg_p5jXN8AQM9LWM0D4loKWxJek";
        assert!(verify(&secret, id, "1614265330", body, &format!("v1,bm90IGl0 {signature}"), 1614265400));
        assert!(!verify(&secret, id, "1614265330", body, &signature, 1614265330 + TOLERANCE_SECS + 1), "stale");
        assert!(!verify(&secret, id, "1614265330", b"{}", &signature, 1614265330), "another body");
        assert!(!verify(b"another key", id, "1614265330", body, &signature, 1614265330));
    }
}
