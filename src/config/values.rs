//! Values of the configuration file that are checked as they are read, so that the parser's
//! error names the line and the key.

use std::time::Duration;

use base64::Engine as _;
use serde::Deserialize;

/// An `http://` or `https://` URL that a connector calls.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(try_from = "String")]
pub struct Endpoint(pub reqwest::Url);

impl TryFrom<String> for Endpoint {
    type Error = String;

    fn try_from(text: String) -> Result<Endpoint, String> {
        // The URL is not repeated: it may hold credentials.
        let url = reqwest::Url::parse(&text).map_err(|e| format!("invalid URL: {e}"))?;
        if !matches!(url.scheme(), "http" | "https") || url.host_str().is_none() {
            return Err("expected an http:// or https:// URL with a host".to_owned());
        }
        if !url.username().is_empty() || url.password().is_some() {
            return Err("a URL must not hold credentials: the request is signed with the function's secret".into());
        }
        Ok(Endpoint(url))
    }
}

/// A Standard Webhooks signing secret: `whsec_` and the base64 of 24 to 64 random bytes.
#[derive(Clone, PartialEq, Eq, Deserialize)]
#[serde(try_from = "String")]
pub struct WebhookSecret(pub Vec<u8>);

impl std::fmt::Debug for WebhookSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("WebhookSecret(…)")
    }
}

impl TryFrom<String> for WebhookSecret {
    type Error = String;

    fn try_from(text: String) -> Result<WebhookSecret, String> {
        let expected = "expected whsec_ followed by the base64 of 24 to 64 bytes";
        let encoded = text.strip_prefix("whsec_").ok_or(expected)?;
        let bytes = base64::engine::general_purpose::STANDARD.decode(encoded).map_err(|_| expected)?;
        if !(24..=64).contains(&bytes.len()) {
            return Err(format!("{expected} (it has {} bytes)", bytes.len()));
        }
        Ok(WebhookSecret(bytes))
    }
}

/// A duration written the human way: `"5s"`, `"250ms"`, `"2m"`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(try_from = "String")]
pub struct Seconds(pub Duration);

impl TryFrom<String> for Seconds {
    type Error = String;

    fn try_from(text: String) -> Result<Seconds, String> {
        let duration = humantime::parse_duration(&text)
            .map_err(|e| format!("invalid duration {text:?} ({e}): expected a number and a unit, such as \"5s\""))?;
        if duration.is_zero() {
            return Err("a duration must be above zero".into());
        }
        Ok(Seconds(duration))
    }
}
