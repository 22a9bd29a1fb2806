//! Callers: bearer API keys from configuration, each naming an actor with a tenant and roles.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use axum::extract::FromRequestParts;
use axum::http::header::AUTHORIZATION;
use axum::http::request::Parts;
use std::borrow::Cow;
use std::fmt;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::AppState;
use super::error::ApiError;
use super::throttle::client_ip;
use crate::audit::Actor;

/// What a caller may do: a free-form name. Three are built in: [`Role::SUBMITTER`] submits and
/// cancels automations, [`Role::APPROVER`] lists and decides approvals, [`Role::AUDITOR`] reads
/// the audit log; a function's `approvers` may name others.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Deserialize, Serialize)]
#[serde(try_from = "String")]
pub struct Role(Cow<'static, str>);

impl Role {
    /// Submit and cancel automations, read them.
    pub const SUBMITTER: Role = Role(Cow::Borrowed("submitter"));
    /// List and decide approvals, read automations.
    pub const APPROVER: Role = Role(Cow::Borrowed("approver"));
    /// Read the tenant's audit log (`GET /v1/audit`).
    pub const AUDITOR: Role = Role(Cow::Borrowed("auditor"));

    /// The role's name.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl TryFrom<String> for Role {
    type Error = String;

    fn try_from(name: String) -> Result<Role, String> {
        if name.is_empty() || name.len() > 64 || name.chars().any(|c| c.is_control() || c.is_whitespace()) {
            return Err(format!("invalid role {name:?}: 1 to 64 characters, no spaces"));
        }
        Ok(Role(Cow::Owned(name)))
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// One configured API key.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ApiKeyConfig {
    /// The secret key a caller sends as `Authorization: Bearer KEY` (at least 8 characters).
    pub key: String,
    /// The actor's name, recorded with its decisions.
    pub actor: String,
    /// The tenant whose automations and data the actor works on.
    pub tenant: String,
    /// What the actor may do.
    pub roles: Vec<Role>,
}

/// A key known by its SHA-256 digest, with whom it names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ApiKeyEntry {
    /// The SHA-256 digest of the key.
    pub digest: [u8; 32],
    /// The actor's name.
    pub actor: String,
    /// Its tenant.
    pub tenant: String,
    /// Its roles.
    pub roles: Vec<Role>,
}

impl ApiKeyEntry {
    /// The digest of `key`, or `None` for a key shorter than 8 characters.
    pub fn digest_of(key: &str) -> Option<[u8; 32]> {
        (key.chars().count() >= 8).then(|| digest(key))
    }

    /// The key's id: see [`key_id`].
    pub fn key_id(&self) -> String {
        key_id(&self.digest)
    }
}

/// The hex digits of a key's SHA-256 digest that make its id.
pub const KEY_ID_HEX_DIGITS: usize = 12;

/// The id of the key whose SHA-256 digest is `digest`: the first [`KEY_ID_HEX_DIGITS`] hex digits
/// of the digest (`printf %s KEY | sha256sum | cut -c1-12`, or the start of a `key_sha256`).
/// Stable for as long as the key is, and not the key: the audit log records it with what the key
/// did.
pub fn key_id(digest: &[u8; 32]) -> String {
    let mut id = hex_simd::encode_to_string(digest, hex_simd::AsciiCase::Lower);
    id.truncate(KEY_ID_HEX_DIGITS);
    id
}

/// The keys file (`--keys FILE` or the `RESUMABLE_API_KEYS` environment variable): `{"keys": [...]}`.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ApiKeysConfig {
    /// The keys.
    pub keys: Vec<ApiKeyConfig>,
}

/// An authenticated caller.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Caller {
    /// The actor's name.
    pub actor: String,
    /// Its tenant.
    pub tenant: String,
    /// Its roles.
    pub roles: Vec<Role>,
    /// The id of the key it called with ([`key_id`]).
    pub key_id: String,
}

impl Caller {
    /// Who acts, for the audit log: the actor and the id of its key.
    pub fn actor(&self) -> Actor {
        Actor::new(self.actor.as_str()).with_key_id(self.key_id.as_str())
    }

    /// Fails with 403 unless the caller has `role`.
    pub fn require(&self, role: Role) -> Result<(), ApiError> {
        if self.roles.contains(&role) {
            Ok(())
        } else {
            Err(ApiError::forbidden(format!("this API key does not have the {role} role")))
        }
    }

    /// Whether the caller has one of `roles`.
    pub fn has_any(&self, roles: &[Role]) -> bool {
        roles.iter().any(|role| self.roles.contains(role))
    }

    /// Whether the caller reads automations' contents: their scripts, host calls and events
    /// (the submitter and the approver roles do; an auditor does not).
    pub fn reads_automations(&self) -> bool {
        self.has_any(&[Role::SUBMITTER, Role::APPROVER])
    }

    /// Fails with 403 unless the caller has one of `roles`.
    pub fn require_any(&self, roles: &[Role]) -> Result<(), ApiError> {
        if self.has_any(roles) {
            Ok(())
        } else {
            let names: Vec<&str> = roles.iter().map(Role::as_str).collect();
            Err(ApiError::forbidden(format!("this API key has none of the roles {}", names.join(", "))))
        }
    }
}

/// The configured keys, looked up by their SHA-256 digest (keys are not kept in clear).
///
/// Clones share one set: [`ApiKeys::replace_with`] changes it for every clone (a reload).
#[derive(Clone, Debug, Default)]
pub struct ApiKeys {
    by_digest: Arc<RwLock<Arc<CallersByDigest>>>,
}

/// The callers, by the SHA-256 digest of their key.
type CallersByDigest = HashMap<[u8; 32], Caller>;

fn digest(key: &str) -> [u8; 32] {
    Sha256::digest(key.as_bytes()).into()
}

/// Why a set of API keys was refused.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum KeysError {
    /// The keys are not JSON of the expected shape.
    #[error("invalid API keys: {0}")]
    Json(#[source] serde_json::Error),
    /// A key (counted from 1) is shorter than 8 characters.
    #[error("API key #{0} is shorter than 8 characters")]
    TooShort(usize),
    /// A key (counted from 1) has no role.
    #[error("API key #{0} has no role")]
    NoRoles(usize),
    /// A key (counted from 1) has no actor or no tenant.
    #[error("API key #{0} needs an actor and a tenant")]
    Incomplete(usize),
    /// A key (counted from 1) names the actor of the system's own decisions.
    #[error("API key #{0} names the actor \"system\", which is the server's own (its decisions on expiry)")]
    ReservedActor(usize),
    /// A key (counted from 1) is the same as an earlier one.
    #[error("API key #{0} is configured twice")]
    Duplicate(usize),
    /// The keys file cannot be read.
    #[error("cannot read {path}: {source}", path = .path.display())]
    Read {
        /// The file.
        path: std::path::PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The keys from `origin` (a file or an environment variable) are invalid.
    #[error("{origin}: {source}")]
    In {
        /// Where the keys came from.
        origin: String,
        /// What is wrong with them.
        source: Box<KeysError>,
    },
}

impl ApiKeys {
    /// The keys of `config`; refuses short keys, duplicates and empty tenants.
    pub fn new(config: ApiKeysConfig) -> Result<ApiKeys, KeysError> {
        let mut entries = Vec::with_capacity(config.keys.len());
        for (i, k) in config.keys.into_iter().enumerate() {
            let digest = ApiKeyEntry::digest_of(&k.key).ok_or(KeysError::TooShort(i + 1))?;
            entries.push(ApiKeyEntry { digest, actor: k.actor, tenant: k.tenant, roles: k.roles });
        }
        ApiKeys::from_entries(entries)
    }

    /// The keys of `entries` (known by their digests); refuses duplicates, empty tenants or
    /// actors, and keys without roles.
    pub fn from_entries(entries: Vec<ApiKeyEntry>) -> Result<ApiKeys, KeysError> {
        let mut by_digest = HashMap::new();
        for (i, k) in entries.into_iter().enumerate() {
            if k.tenant.is_empty() || k.actor.is_empty() {
                return Err(KeysError::Incomplete(i + 1));
            }
            if k.roles.is_empty() {
                return Err(KeysError::NoRoles(i + 1));
            }
            if k.actor.trim().eq_ignore_ascii_case(crate::automation::SYSTEM_ACTOR) {
                return Err(KeysError::ReservedActor(i + 1));
            }
            let caller = Caller { key_id: k.key_id(), actor: k.actor, tenant: k.tenant, roles: k.roles };
            if by_digest.insert(k.digest, caller).is_some() {
                return Err(KeysError::Duplicate(i + 1));
            }
        }
        Ok(ApiKeys::of(by_digest))
    }

    fn of(by_digest: CallersByDigest) -> ApiKeys {
        ApiKeys { by_digest: Arc::new(RwLock::new(Arc::new(by_digest))) }
    }

    fn snapshot(&self) -> Arc<CallersByDigest> {
        Arc::clone(&self.by_digest.read().unwrap_or_else(|e| e.into_inner()))
    }

    /// Makes this set (and every clone of it) the keys of `other` from now on.
    pub fn replace_with(&self, other: &ApiKeys) {
        let keys = other.snapshot();
        *self.by_digest.write().unwrap_or_else(|e| e.into_inner()) = keys;
    }

    /// Parses the JSON of a keys file.
    pub fn from_json(json: &str) -> Result<ApiKeys, KeysError> {
        let config: ApiKeysConfig = serde_json::from_str(json).map_err(KeysError::Json)?;
        ApiKeys::new(config)
    }

    /// The documented demo keys: `demo-acme` (submitter and approver in `acme`) and `demo-globex`
    /// (approver in `globex`).
    pub fn demo() -> ApiKeys {
        let key = |key: &str, actor: &str, tenant: &str, roles: Vec<Role>| ApiKeyConfig {
            key: key.into(),
            actor: actor.into(),
            tenant: tenant.into(),
            roles,
        };
        ApiKeys::new(ApiKeysConfig {
            keys: vec![
                key("demo-acme", "acme-demo", "acme", vec![Role::SUBMITTER, Role::APPROVER]),
                key("demo-globex", "globex-demo", "globex", vec![Role::APPROVER]),
            ],
        })
        .unwrap_or_default()
    }

    /// Adds the keys of `other` (later ones win).
    pub fn merge(self, other: ApiKeys) -> ApiKeys {
        let mut map = (*self.snapshot()).clone();
        map.extend(other.snapshot().iter().map(|(k, v)| (*k, v.clone())));
        ApiKeys::of(map)
    }

    /// How many keys are configured.
    pub fn len(&self) -> usize {
        self.snapshot().len()
    }

    /// Whether no key is configured.
    pub fn is_empty(&self) -> bool {
        self.snapshot().is_empty()
    }

    /// The caller a presented key belongs to.
    pub fn caller(&self, key: &str) -> Option<Caller> {
        self.snapshot().get(&digest(key)).cloned()
    }
}

/// The key of an `Authorization: Bearer KEY` header; the scheme name is case-insensitive.
fn bearer_key(header: &str) -> Option<&str> {
    let (scheme, key) = header.split_once(' ')?;
    let key = key.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !key.is_empty()).then_some(key)
}

impl FromRequestParts<AppState> for Caller {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Caller, ApiError> {
        let client = client_ip(parts);
        state.throttle.check(client).map_err(ApiError::throttled)?;
        let header =
            parts.headers.get(AUTHORIZATION).and_then(|v| v.to_str().ok()).ok_or_else(ApiError::unauthorized)?;
        let key = bearer_key(header).ok_or_else(ApiError::unauthorized)?;
        match state.keys.caller(key) {
            Some(caller) => Ok(caller),
            None => {
                state.throttle.failed(client);
                Err(ApiError::unauthorized())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bearer_scheme_is_case_insensitive() {
        assert_eq!(bearer_key("Bearer demo-acme"), Some("demo-acme"));
        assert_eq!(bearer_key("bearer  demo-acme "), Some("demo-acme"));
        assert_eq!(bearer_key("Basic demo-acme"), None);
        assert_eq!(bearer_key("Bearer "), None);
        assert_eq!(bearer_key("demo-acme"), None);
    }

    #[test]
    fn keys_are_validated_and_looked_up() {
        let keys = ApiKeys::demo();
        assert_eq!(keys.len(), 2);
        let acme = keys.caller("demo-acme").unwrap();
        assert_eq!((acme.tenant.as_str(), acme.require(Role::APPROVER)), ("acme", Ok(())));
        // The key's id is the start of its SHA-256 digest, not the key.
        let digest = hex_simd::encode_to_string(digest("demo-acme"), hex_simd::AsciiCase::Lower);
        assert_eq!(acme.key_id, digest[..12]);
        assert_eq!(acme.actor(), Actor::new("acme-demo").with_key_id(&digest[..12]));
        assert!(keys.caller("demo-globex").unwrap().require(Role::SUBMITTER).is_err());
        assert!(keys.caller("demo-acm").is_none());
        assert!(ApiKeys::from_json(r#"{"keys":[{"key":"short","actor":"a","tenant":"t","roles":[]}]}"#).is_err());
        let free_form = r#"{"keys":[{"key":"longenough","actor":"a","tenant":"t","roles":["finance"]}]}"#;
        let finance = ApiKeys::from_json(free_form).unwrap();
        assert_eq!(finance.caller("longenough").unwrap().roles[0].as_str(), "finance");
        assert!(
            ApiKeys::from_json(r#"{"keys":[{"key":"longenough","actor":"a","tenant":"t","roles":[""]}]}"#).is_err()
        );
        let no_roles = r#"{"keys":[{"key":"longenough","actor":"a","tenant":"t","roles":[]}]}"#;
        assert!(ApiKeys::from_json(no_roles).unwrap_err().to_string().contains("no role"));
        let twice = r#"{"keys":[{"key":"longenough","actor":"a","tenant":"t","roles":["approver"]},
                                {"key":"longenough","actor":"b","tenant":"t","roles":["approver"]}]}"#;
        assert!(ApiKeys::from_json(twice).unwrap_err().to_string().contains("twice"));
    }
}
