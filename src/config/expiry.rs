//! The expiry and reminder settings of a function or a tenant (`expires_after`, `on_expiry`,
//! `remind_after`), and the `[tenants.NAME]` table that holds a tenant's defaults.

use serde::Deserialize;

use super::values::Seconds;
use crate::automation::{ExpiryPolicy, OnExpiry};

/// `[tenants.NAME]`: what a tenant's requests do when a function says nothing.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TenantConfig {
    /// How long a request waits for its decision before it expires (for ever unless set).
    pub expires_after: Option<Seconds>,
    /// What an expired request does: `"reject"` (the default) or `"fail"`.
    pub on_expiry: Option<OnExpiry>,
    /// How often the approvers are reminded while a request waits (never unless set).
    pub remind_after: Option<Seconds>,
}

impl TenantConfig {
    /// The settings as a policy.
    pub fn policy(&self) -> ExpiryPolicy {
        policy(self.expires_after, self.on_expiry, self.remind_after)
    }
}

/// The policy of the three settings, wherever they are given.
pub(super) fn policy(
    expires_after: Option<Seconds>,
    on_expiry: Option<OnExpiry>,
    remind_after: Option<Seconds>,
) -> ExpiryPolicy {
    ExpiryPolicy { expires_after: expires_after.map(|s| s.0), on_expiry, remind_after: remind_after.map(|s| s.0) }
}
