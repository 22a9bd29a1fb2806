//! An API key as the configuration file gives it: in clear, from the environment, or as its
//! SHA-256 digest, so that the file need hold no key at all.

use serde::Deserialize;

use crate::server::{ApiKeyEntry, Role};

/// One `[[keys]]` entry: exactly one of `key`, `key_env` and `key_sha256`, with who it is.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KeyConfig {
    /// The key itself (at least 8 characters).
    pub key: Option<String>,
    /// The environment variable that holds the key.
    pub key_env: Option<String>,
    /// The key's SHA-256 digest, as 64 hex digits (`printf %s KEY | sha256sum`).
    pub key_sha256: Option<String>,
    /// The actor's name, recorded with its decisions.
    pub actor: String,
    /// The tenant whose automations the actor works on.
    pub tenant: String,
    /// What the actor may do: free-form names (`submitter` and `approver` are the built-in ones,
    /// others are named by functions' `approvers`).
    pub roles: Vec<Role>,
}

impl KeyConfig {
    /// The entry with its key resolved to a digest.
    pub(super) fn resolve(&self) -> Result<ApiKeyEntry, String> {
        let digest = match (&self.key, &self.key_env, &self.key_sha256) {
            (Some(key), None, None) => ApiKeyEntry::digest_of(key).ok_or("key: at least 8 characters")?,
            (None, Some(name), None) => {
                let key =
                    std::env::var(name).map_err(|_| format!("key_env: the environment variable {name} is not set"))?;
                ApiKeyEntry::digest_of(&key).ok_or_else(|| format!("key_env {name}: at least 8 characters"))?
            }
            (None, None, Some(hex)) => parse_digest(hex).ok_or("key_sha256: expected 64 hexadecimal digits")?,
            _ => return Err("give exactly one of key, key_env and key_sha256".to_owned()),
        };
        if self.actor.is_empty() || self.tenant.is_empty() {
            return Err("actor and tenant must not be empty".to_owned());
        }
        if self.roles.is_empty() {
            return Err("roles: a key needs at least one role".to_owned());
        }
        Ok(ApiKeyEntry { digest, actor: self.actor.clone(), tenant: self.tenant.clone(), roles: self.roles.clone() })
    }
}

/// 64 hex digits as 32 bytes.
fn parse_digest(hex: &str) -> Option<[u8; 32]> {
    hex_simd::decode_to_vec(hex).ok()?.try_into().ok()
}
